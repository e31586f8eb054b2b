defmodule ExPhil.Native.OpDescriptions do
  @moduledoc """
  Every op direction of the library as data, read when this module compiles
  from `include/exphil/op_descriptions.h`, the one description the C++ API,
  the NIF, the XLA FFI targets and this layer are checked against (that
  header gives the rules).

  Each description is a map:

    * `:op` - the op's name, an atom (`:min_gru`)
    * `:direction` - `:forward` or `:backward`
    * `:tensors` - in the header's order, each
      `%{name: "gate", optional: false, role: :input | :output,
         dtype: :seq | :state | :weight | :carry | :f32, dims: ["B", "T", "H"], only_with: nil | "h0"}`
    * `:options` - each `%{name: "window", type: "i32", default: "0",
      range: nil | "finite" | "1..2147483647", only_if: nil | "mask=window"}`
    * `:bindings` - the ways in, among `:cpp`, `:c`, `:nif` and `:xla`
  """

  @header Path.expand("../../../../include/exphil/op_descriptions.h", __DIR__)
  @external_resource @header

  # One row per line:
  # EXPHIL_OP_DIRECTION(op, direction, "tensors", "options", "bindings")
  @row ~r/^\s*EXPHIL_OP_DIRECTION\((\w+),\s*(\w+),\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)"\)/m

  tensor = fn op, word ->
    {name, role, dtype, dims, only_with} =
      case String.split(word, ":") do
        [name, role, dtype, dims] -> {name, role, dtype, dims, nil}
        [name, role, dtype, dims, input] -> {name, role, dtype, dims, input}
        _ -> raise "#{@header}: #{op}: tensor #{inspect(word)} is not name:role:dtype:shape"
      end

    unless role in ~w(in out) and dtype in ~w(seq state weight carry f32),
      do:
        raise(
          "#{@header}: #{op}: tensor #{inspect(word)}: role in|out, dtype seq|state|weight|carry|f32"
        )

    bare = String.trim_trailing(name, "?")

    %{
      name: bare,
      optional: bare != name,
      role: if(role == "in", do: :input, else: :output),
      dtype: String.to_atom(dtype),
      dims: String.split(dims, ","),
      only_with: only_with
    }
  end

  descriptions =
    for [_, op, direction, tensors, options, bindings] <- Regex.scan(@row, File.read!(@header)) do
      unless direction in ~w(forward backward),
        do: raise("#{@header}: #{op}: direction #{direction}")

      options =
        for word <- String.split(options, " ", trim: true) do
          # name:type=default[:range][:if(cond)]
          [name, rest] = String.split(word, ":", parts: 2)
          [type, rest] = String.split(rest, "=", parts: 2)
          [default | qualifiers] = String.split(rest, ":")

          {conditions, ranges} =
            Enum.split_with(qualifiers, &String.match?(&1, ~r/^if\(.+\)$/))

          unless length(conditions) <= 1 and length(ranges) <= 1,
            do:
              raise(
                "#{@header}: #{op}: option #{inspect(word)} is not name:type=default[:range][:if(cond)]"
              )

          only_if =
            case conditions do
              [condition] -> condition |> String.trim_leading("if(") |> String.trim_trailing(")")
              [] -> nil
            end

          %{name: name, type: type, default: default, range: List.first(ranges), only_if: only_if}
        end

      %{
        op: String.to_atom(op),
        direction: String.to_atom(direction),
        tensors: Enum.map(String.split(tensors, " ", trim: true), &tensor.(op, &1)),
        options: options,
        bindings: bindings |> String.split(" ", trim: true) |> Enum.map(&String.to_atom/1)
      }
    end

  # Every line that opens a row must have parsed as a whole row.
  rows = length(Regex.scan(~r/^\s*EXPHIL_OP_DIRECTION\(/m, File.read!(@header)))

  if length(descriptions) != rows do
    raise "#{@header}: #{rows} rows, parsed #{length(descriptions)}: is every row on one line?"
  end

  @descriptions descriptions
  @by_op_direction Map.new(descriptions, &{{&1.op, &1.direction}, &1})

  @doc "Every op direction, in the header's order."
  @spec all() :: [map()]
  def all, do: @descriptions

  @doc "The description of `op` in `direction`; raises for an unknown one."
  @spec fetch!(atom(), :forward | :backward) :: map()
  def fetch!(op, direction) do
    case @by_op_direction do
      %{{^op, ^direction} => description} -> description
      _ -> raise ArgumentError, "no op direction #{inspect(op)} #{inspect(direction)}"
    end
  end

  @doc """
  The NIF's arguments and options of a description's tensors (the header's
  rule): `{positional, optional_inputs, outputs}`, names lower-cased as the
  NIF spells them.
  """
  @spec nif_signature(map()) :: {[String.t()], [String.t()], [String.t()]}
  def nif_signature(%{tensors: tensors}) do
    inputs = Enum.filter(tensors, &(&1.role == :input))
    last_required = inputs |> Enum.reverse() |> Enum.find(&(not &1.optional))

    {positional, options} =
      Enum.split(inputs, Enum.find_index(inputs, &(&1 == last_required)) + 1)

    outputs = for t <- tensors, t.role == :output, do: String.downcase(t.name)

    {Enum.map(positional, &String.downcase(&1.name)),
     Enum.map(options, &String.downcase(&1.name)), outputs}
  end

  @doc """
  The values of an option's type in order, the C++ enumerators' (`"enum(none|causal|window)"`
  gives `["none", "causal", "window"]`), or `[]` for a type that is not an enum.
  """
  @spec enum_values(String.t()) :: [String.t()]
  def enum_values("enum(" <> values), do: values |> String.trim_trailing(")") |> String.split("|")
  def enum_values(_type), do: []
end
