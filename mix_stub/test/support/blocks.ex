defmodule ExPhil.Native.Blocks do
  @moduledoc false
  # The ExPhil.Native.Block nodes of a traced expression, with the operands
  # and the output EXLA hands EXLA.CustomCall.call/4 (the block node's input
  # expressions and its default function's traced result).

  alias Nx.Defn.Expr

  @doc "`[{block, operands, out}]` of the expressions that `fun.(args...)` traces, each node once."
  def capture(fun, args) do
    expr = apply(Nx.Defn.debug_expr(fun), args)
    {found, _seen} = Nx.Defn.Composite.reduce(expr, {[], MapSet.new()}, &walk/2)
    Enum.reverse(found)
  end

  defp walk(%Nx.Tensor{data: %Expr{id: id, op: op, args: args}} = tensor, {found, seen} = acc) do
    if MapSet.member?(seen, id) do
      acc
    else
      found =
        case {op, args} do
          {:block, [%ExPhil.Native.Block{} = block, operands, out, _fun]} ->
            [{block, operands, out} | found]

          _ ->
            found
        end

      {_, acc} =
        Nx.Defn.Tree.apply_args(tensor, {found, MapSet.put(seen, id)}, fn arg, acc ->
          {arg, walk(arg, acc)}
        end)

      acc
    end
  end

  defp walk(_other, acc), do: acc

  @doc "The flat list of result templates of a block's output."
  def results(out) when is_tuple(out), do: out |> Tuple.to_list() |> Enum.flat_map(&results/1)
  def results(tensor), do: [tensor]
end
