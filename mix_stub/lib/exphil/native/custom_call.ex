defmodule ExPhil.Native.CustomCall do
  @moduledoc """
  How an `ExPhil.Native.Block` becomes an XLA custom call under EXLA.

  `spec/4` answers `EXLA.CustomCall.call/4` for the library's blocks (the
  protocol implementation for `ExPhil.Native.Block` calls it; other libraries
  may too): `{:ok, %EXLA.CustomCall.Spec{}}` for the block's target, with its
  attributes typed as the handler decodes them, or `:skip`, and EXLA then
  compiles the block's pure-Nx default function. It returns the Spec only
  when all of these hold:

    * the client is a CUDA client;
    * the kernels take the inputs (`Block.unsupported` is `nil`);
    * the handlers are registered with the XLA that EXLA loaded
      (`ExPhil.Native.XlaRegistration`, done here on first use);
    * the handler will see row-major buffers. A typed FFI handler is given
      dimensions, not layouts, and XLA's layout assignment may hand a custom
      call that states no layouts transposed operands or results: wrong
      results, silently (measured, README). EXLA states them only with the
      `EXLA.CustomCall.Spec` field that a proposed upstream change adds
      (`mix_stub/upstream/exla/`); `layouts_pinned?/0` says whether the EXLA
      this library was compiled against has it. Without it only eager calls
      are native: EXLA compiles an eager block as a wrapper whose operands and
      results are the entry's own, which XLA keeps row-major.
  """

  alias ExPhil.Native.{Block, Targets, XlaRegistration}

  @spec_module EXLA.CustomCall.Spec
  @layouts_pinned Code.ensure_loaded?(@spec_module) and
                    Map.has_key?(@spec_module.__struct__(), :operand_layouts)

  @doc """
  Whether the EXLA this library was compiled against can pin a custom call's
  operand and result layouts to row-major (`EXLA.CustomCall.Spec`'s
  `:operand_layouts` and `:result_layouts` fields). Without it, blocks inside `defn` run their default
  functions under EXLA; eager calls stay native.
  """
  @spec layouts_pinned?() :: boolean()
  def layouts_pinned?, do: @layouts_pinned

  @doc """
  The answer to `EXLA.CustomCall.call(block, out, args, client)`.
  """
  def spec(%Block{} = block, out, args, client) do
    cond do
      not match?(%{platform: :cuda}, client) -> :skip
      block.unsupported != nil -> :skip
      not (block.eager or @layouts_pinned) -> :skip
      XlaRegistration.ensure_registered() != :ok -> :skip
      true -> {:ok, build(block, out, args)}
    end
  end

  @doc """
  The `EXLA.CustomCall.Spec` fields of `block`'s custom call, as a map:
  `:call_target_name`, `:attributes` (`[{name, "value : type"}]`, in the
  target's order) and, where EXLA supports them, `:operand_layouts` and
  `:result_layouts` (`:row_major`). Checks the operand
  and result counts against the target; a mismatch is a bug of this library
  and raises.
  """
  def fields(%Block{target: name, attributes: values}, out, args) do
    target = Targets.fetch!(name)
    results = out |> List.wrap() |> Enum.flat_map(&leaves/1)

    if length(args) != length(target.operands) or length(results) != length(target.results) do
      raise ArgumentError,
            "ExPhil.Native: block for #{name} has #{length(args)} operands and " <>
              "#{length(results)} results, the target takes #{length(target.operands)} and " <>
              "returns #{length(target.results)}"
    end

    attributes =
      Enum.flat_map(target.attributes, fn {attribute, type, presence} ->
        case attribute_value!(name, values, attribute, presence) do
          nil -> []
          value -> [{attribute, mlir_attribute(name, attribute, type, value)}]
        end
      end)

    unknown = Map.keys(values) -- Enum.map(target.attributes, &elem(&1, 0))

    if unknown != [] do
      raise ArgumentError, "ExPhil.Native: #{name} takes no attributes #{inspect(unknown)}"
    end

    fields = %{call_target_name: name, attributes: attributes}

    if @layouts_pinned,
      do: Map.merge(fields, %{operand_layouts: :row_major, result_layouts: :row_major}),
      else: fields
  end

  defp build(block, out, args), do: struct!(@spec_module, fields(block, out, args))

  defp leaves(tuple) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> Enum.flat_map(&leaves/1)

  defp leaves(tensor), do: [tensor]

  defp attribute_value!(target, values, attribute, presence) do
    case {Map.fetch(values, attribute), presence} do
      {{:ok, value}, _} ->
        value

      {:error, :optional} ->
        nil

      {:error, :required} ->
        raise ArgumentError, "ExPhil.Native: #{target} needs attribute #{attribute}"
    end
  end

  @doc false
  # MLIR attribute text, typed exactly as the handler decodes it.
  def mlir_attribute(_target, _attribute, "i1", value) when is_boolean(value),
    do: Atom.to_string(value)

  def mlir_attribute(_target, _attribute, "i32", value)
      when is_integer(value) and value >= -2_147_483_648 and value <= 2_147_483_647,
      do: "#{value} : i32"

  def mlir_attribute(_target, _attribute, "f32", value) when is_float(value) do
    # The value f32 holds, printed exactly (shortest round-trip of that double),
    # so the handler gets the same f32 as the pure default computes with.
    <<f32::float-32>> = <<value::float-32>>
    :erlang.float_to_binary(f32, [:short]) <> " : f32"
  end

  def mlir_attribute(target, attribute, type, value) do
    raise ArgumentError,
          "ExPhil.Native: #{target} attribute #{attribute} expected a value of MLIR type #{type}, " <>
            "got: #{inspect(value)}"
  end
end

if Code.ensure_loaded?(EXLA.CustomCall) do
  defimpl EXLA.CustomCall, for: ExPhil.Native.Block do
    def call(block, out, args, client),
      do: ExPhil.Native.CustomCall.spec(block, out, args, client)
  end
end
