defmodule ExPhil.Native.Blocks do
  @moduledoc false
  # The block nodes of a traced expression, with the operands and the output
  # EXLA hands EXLA.CustomCall.call/4 (the node's input expressions and its
  # default function's traced result); and an EXLA client to ask call/4 with.

  alias Nx.Defn.Expr

  @doc "`[{block, operands, out}]` of the ExPhil.Native.Block nodes that `fun.(args...)` traces."
  def capture(fun, args),
    do: fun |> Nx.Defn.debug_expr() |> apply(args) |> find(ExPhil.Native.Block)

  @doc """
  `[{struct, operands, out}]` of the block nodes tagged with a `module`
  struct in a traced container, each node once, in the order first met.
  """
  def find(container, module) do
    {found, _seen} =
      Nx.Defn.Composite.reduce(container, {[], MapSet.new()}, &walk(&1, &2, module))

    Enum.reverse(found)
  end

  defp walk(
         %Nx.Tensor{data: %Expr{id: id, op: op, args: args}} = tensor,
         {found, seen} = acc,
         module
       ) do
    if MapSet.member?(seen, id) do
      acc
    else
      found =
        case {op, args} do
          {:block, [%^module{} = struct, operands, out, _fun]} ->
            [{struct, operands, out} | found]

          _ ->
            found
        end

      {_, acc} =
        Nx.Defn.Tree.apply_args(tensor, {found, MapSet.put(seen, id)}, fn arg, acc ->
          {arg, walk(arg, acc, module)}
        end)

      acc
    end
  end

  defp walk(_other, acc, _module), do: acc

  @doc "The flat list of result templates of a block's output."
  def results(out) when is_tuple(out), do: out |> Tuple.to_list() |> Enum.flat_map(&results/1)
  def results(tensor), do: [tensor]

  @doc """
  An `%EXLA.Client{}` of `platform` with no runtime behind it, for
  `EXLA.CustomCall.call/4`. Built with `struct/2`: the support files also
  compile in projects without EXLA (mix_stub/scripts/torchx_project).
  """
  def client(platform) do
    struct(EXLA.Client,
      ref: nil,
      platform: platform,
      name: :test,
      device_count: 1,
      default_device_id: 0,
      automatic_transfers: false
    )
  end
end
