defmodule ExPhil.Native.OpDescriptionsTest do
  # The bindings against include/exphil/op_descriptions.h (read by
  # ExPhil.Native.OpDescriptions), the one description of each op direction
  # (the C++ API's checks are held to it by test/abi/test_op_descriptions.cpp):
  #
  #   * the NIF: which ops it has, each function's arguments in order (each
  #     named by the NIF's own message when it is not a tensor), its options
  #     and its outputs (from the NIF's message for an unknown one);
  #   * the C ABI's op functions: their tensor parameters;
  #   * the XLA FFI targets of the ops that have them: operands, results,
  #     attributes and the attributes' MLIR types;
  #   * ExPhil.Native.Ops: one function per op, the required inputs first;
  #   * the README's table of scans.
  #
  # Runs without a GPU: nothing reaches a device.
  use ExUnit.Case, async: true

  alias ExPhil.Native
  alias ExPhil.Native.{OpDescriptions, Targets}

  # Options of the bindings themselves, not of the op.
  @call_options ~w(outputs sync stream)
  # How the NIF spells the description's options: the selective scan's clamp
  # and bounds are one option, {dt_min, dt_max}; input_scale and
  # recompute_lse are the C++ API's only.
  @nif_options %{
    "clamp" => "clamp",
    "dt_min" => "clamp",
    "dt_max" => "clamp",
    "softplus" => "softplus",
    "mask" => "mask",
    "window" => "window",
    "layout" => "layout",
    "scale" => "scale",
    "precision" => "precision"
  }
  @cpp_only_options ~w(input_scale recompute_lse)

  # The ops the NIF has, as the descriptions say (the loop below needs them
  # when it compiles).
  @nif_ops for d <- OpDescriptions.all(), :nif in d.bindings, uniq: true, do: d.op

  @extents %{
    "B" => 2,
    "T" => 5,
    "H" => 4,
    "D" => 3,
    "N" => 4,
    "Hq" => 2,
    "Hkv" => 1,
    "S" => 6,
    "d" => 32
  }

  # A fake device tensor of the slot's shape at a distinct address.
  defp fake(%{dims: dims}, index) do
    shape = dims |> Enum.map(&Map.fetch!(@extents, &1)) |> List.to_tuple()
    bytes = Tuple.product(shape) * 4
    {%{kind: :local, address: (index + 1) * 1_048_576, data_size: bytes}, {:f, 32}, shape}
  end

  defp function(%{op: op, direction: direction}), do: :"#{op}_#{direction}"

  defp positional_slots(description) do
    {names, _, _} = OpDescriptions.nif_signature(description)

    Enum.map(names, fn name ->
      Enum.find(description.tensors, &(String.downcase(&1.name) == name))
    end)
  end

  defp message(fun) do
    try do
      fun.()
      flunk("expected an ArgumentError")
    rescue
      e in ArgumentError -> Exception.message(e)
    end
  end

  defp listed(message) do
    [_, names] = Regex.run(~r/expected (?:option|output) names among (.*), got :/, message)
    names |> String.split(", ") |> Enum.map(&String.trim_leading(&1, ":"))
  end

  test "the NIF has a function for each op direction of its ops, and none for the others" do
    functions = Native.__info__(:functions)

    for d <- OpDescriptions.all() do
      name = function(d)
      {positional, _, _} = OpDescriptions.nif_signature(d)

      if :nif in d.bindings do
        assert {name, length(positional) + 1} in functions,
               "ExPhil.Native.#{name}/#{length(positional) + 1}: #{inspect(positional)} and opts"
      else
        refute Keyword.has_key?(functions, name)
      end
    end
  end

  for op <- @nif_ops, direction <- [:forward, :backward] do
    test "ExPhil.Native.#{op}_#{direction}: arguments, options and outputs as described" do
      d = OpDescriptions.fetch!(unquote(op), unquote(direction))
      {positional, optional_inputs, outputs} = OpDescriptions.nif_signature(d)
      slots = positional_slots(d)
      tensors = slots |> Enum.with_index() |> Enum.map(fn {s, i} -> fake(s, i) end)
      call = fn args, opts -> apply(Native, function(d), args ++ [opts]) end

      # each argument, in order, is the tensor the description names there
      for {name, i} <- Enum.with_index(positional) do
        text = message(fn -> call.(List.replace_at(tensors, i, :nope), []) end)
        assert text =~ "argument '#{name}': expected a tensor", text
      end

      # an optional one before a required one takes nil
      for {slot, i} <- Enum.with_index(slots), slot.optional do
        result =
          try do
            call.(List.replace_at(tensors, i, nil), [])
          rescue
            e in ArgumentError -> Exception.message(e)
          end

        refute is_binary(result) and result =~ "argument '#{String.downcase(slot.name)}'",
               "nil for #{slot.name}: #{inspect(result)}"
      end

      # the options: the optional inputs, the op's own, the call's
      op_options =
        for %{name: name} <- d.options,
            name not in @cpp_only_options,
            uniq: true,
            do: Map.fetch!(@nif_options, name)

      state_type = if d.op in [:selective_scan, :attention], do: [], else: ["state_type"]
      want = optional_inputs ++ op_options ++ @call_options ++ state_type
      got = listed(message(fn -> call.(tensors, bogus: 1) end))
      assert Enum.sort(got) == Enum.sort(want)

      # the outputs, named as such
      text = message(fn -> call.(tensors, outputs: [bogus: hd(tensors)]) end)
      assert text =~ "argument 'outputs': expected output names among"
      assert listed(text) == outputs
    end
  end

  test "the XLA FFI targets of the ops that have them take the described tensors and options" do
    for d <- OpDescriptions.all(), :xla in d.bindings do
      target = Targets.fetch!(Targets.name(d.op, d.direction))

      inputs =
        for t <- d.tensors,
            t.role == :input,
            do: {t.name, if(t.optional, do: :optional, else: :required)}

      # linear_scan's backward target always takes b (JAX passes it)
      inputs =
        if d.op == :linear_scan,
          do: List.keyreplace(inputs, "b", 0, {"b", :required}),
          else: inputs

      assert Enum.sort(target.operands) == Enum.sort(inputs), "#{target.name}"

      outputs = for t <- d.tensors, t.role == :output, do: t.name
      assert Enum.map(target.results, &elem(&1, 0)) |> Enum.sort() == Enum.sort(outputs)

      # the attributes: the op's options (as the target's contract spells
      # them), and has_<name> for each optional operand
      attributes = for {name, _type, _} <- target.attributes, do: name
      options = for %{name: name} <- d.options, name not in @cpp_only_options, do: name
      has = for {name, :optional} <- inputs, do: "has_" <> name
      assert Enum.sort(attributes) == Enum.sort(options ++ has), "#{target.name}"
    end
  end

  test "each C ABI op function takes the described tensors, inputs before outputs" do
    header = File.read!(Path.expand("../../include/exphil/exphil.h", __DIR__))

    for d <- OpDescriptions.all(), :c in d.bindings do
      name = "exphil_#{d.op}_#{d.direction}"
      [_, params] = Regex.run(~r/exphil_status #{name}\(([^;]*)\);/s, header)
      tensors = for [_, p] <- Regex.scan(~r/const exphil_tensor\* (\w+)/, params), do: p
      described = Enum.map(d.tensors, & &1.name)
      assert Enum.sort(tensors) == Enum.sort(described), "#{name}: #{inspect(tensors)}"

      outputs = for t <- d.tensors, t.role == :output, do: t.name
      {before, from_first_output} = Enum.split_while(tensors, &(&1 not in outputs))
      assert Enum.sort(from_first_output) == Enum.sort(outputs), "#{name}: inputs after outputs"
      assert length(before) + length(outputs) == length(described)
    end
  end

  test "the XLA FFI targets' attribute types are the MLIR types of the options' types" do
    mlir = fn
      "bool" -> "i1"
      "i32" -> "i32"
      "f32" -> "f32"
      "enum(" <> _ -> "i32"
    end

    for d <- OpDescriptions.all(),
        :xla in d.bindings,
        {name, type, _} <- Targets.fetch!(Targets.name(d.op, d.direction)).attributes do
      case Enum.find(d.options, &(&1.name == name)) do
        # has_<input>: whether an optional operand is present
        nil -> assert type == "i1" and String.starts_with?(name, "has_")
        option -> assert type == mlir.(option.type), "#{d.op} #{d.direction}: #{name}"
      end
    end
  end

  test "ExPhil.Native.Ops has one function per NIF op, taking its required inputs and opts" do
    functions = ExPhil.Native.Ops.__info__(:functions)

    for op <- @nif_ops do
      d = OpDescriptions.fetch!(op, :forward)
      required = for t <- d.tensors, t.role == :input, not t.optional, do: t
      assert {op, length(required) + 1} in functions, "Ops.#{op}/#{length(required) + 1}"
    end
  end

  test "the README's table of scans names each scan's inputs as described" do
    readme = File.read!(Path.expand("../../README.md", __DIR__))

    rows =
      for [_, op, inputs] <- Regex.scan(~r/^\| `(\w+)` \| ([^|]+) \|/m, readme),
          into: %{},
          do: {String.to_atom(op), Regex.scan(~r/`(\w+)`/, inputs) |> Enum.map(&Enum.at(&1, 1))}

    for op <- [:linear_scan, :min_gru, :min_lstm, :liquid] do
      d = OpDescriptions.fetch!(op, :forward)
      inputs = for t <- d.tensors, t.role == :input, not t.optional, do: t.name
      assert rows[op] == inputs, "README row of #{op}: #{inspect(rows[op])}"
    end
  end
end
