defmodule ExPhil.Native.Targets do
  @moduledoc """
  The XLA FFI custom-call targets of `libexphil_xla_ffi.so`: their operands,
  results and attributes, read when this module compiles from the one table
  the C++ handlers are built from, `include/exphil/xla_ffi_targets.h`.

  Each target is a map:

    * `:name` - the target name (`"exphil_min_gru_fwd"`)
    * `:operands` - `[{name, :required | :optional}]` in order
    * `:results` - `[{name, :always | {:gradient_of, operand}}]` in order
    * `:attributes` - `[{name, mlir_type, :required | :optional}]`, `mlir_type`
      one of `"i1"`, `"i32"`, `"f32"`

  An optional operand `h0` goes with the optional attribute `has_h0`; the
  Elixir layer always passes it (Nx has no zero-size tensors, so an absent
  operand is a scalar placeholder that the handler never reads).
  """

  @header Path.expand("../../../../include/exphil/xla_ffi_targets.h", __DIR__)
  @external_resource @header

  # One row per line: EXPHIL_XLA_FFI_TARGET(name, "operands", "results", "attributes")
  @row ~r/^\s*EXPHIL_XLA_FFI_TARGET\((\w+),\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)"\)/m

  parse_words = fn string -> String.split(string, " ", trim: true) end

  optional = fn word ->
    case String.trim_trailing(word, "?") do
      ^word -> {word, :required}
      name -> {name, :optional}
    end
  end

  targets =
    for [_, name, operands, results, attributes] <- Regex.scan(@row, File.read!(@header)) do
      operands = Enum.map(parse_words.(operands), optional)

      results =
        for word <- parse_words.(results) do
          case optional.(word) do
            {result, :required} ->
              {result, :always}

            {"grad_" <> input = result, :optional} ->
              unless {input, :optional} in operands do
                raise "#{@header}: #{name}: #{word} is not the gradient of an optional operand"
              end

              {result, {:gradient_of, input}}
          end
        end

      attributes =
        for word <- parse_words.(attributes) do
          [attribute, type] = String.split(word, ":")

          unless type in ~w(i1 i32 f32) do
            raise "#{@header}: #{name}: attribute #{attribute} has type #{type}, expected i1, i32 or f32"
          end

          {attribute, presence} = optional.(attribute)
          {attribute, type, presence}
        end

      %{name: name, operands: operands, results: results, attributes: attributes}
    end

  # The rows the header holds, counted by their opening alone.
  rows = length(Regex.scan(~r/^\s*EXPHIL_XLA_FFI_TARGET\(exphil_/m, File.read!(@header)))

  if length(targets) != rows do
    raise "#{@header}: #{rows} rows, parsed #{length(targets)}: is every row on one line?"
  end

  @targets Map.new(targets, &{&1.name, &1})

  @doc "Every target, by name."
  @spec all() :: %{String.t() => map()}
  def all, do: @targets

  @doc "The target `name`; raises for an unknown one."
  @spec fetch!(String.t()) :: map()
  def fetch!(name) do
    case @targets do
      %{^name => target} -> target
      _ -> raise ArgumentError, "unknown ExPhil.Native custom-call target #{inspect(name)}"
    end
  end

  @doc "The target of `op` in `direction` (`:forward` or `:backward`)."
  @spec name(atom(), :forward | :backward) :: String.t()
  def name(op, :forward), do: "exphil_#{op}_fwd"
  def name(op, :backward), do: "exphil_#{op}_bwd"
end
