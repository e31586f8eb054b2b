defmodule ExPhil.Native.OpDescriptionsTest do
  # The bindings against include/exphil/op_descriptions.h (read by
  # ExPhil.Native.OpDescriptions), the one description of each op direction
  # (the C++ API's checks are held to it by test/abi/test_op_descriptions.cpp):
  #
  #   * the NIF: which ops it has, each function's arguments in order (each
  #     named by the NIF's own message when it is not a tensor), its options
  #     and its outputs (from the NIF's message for an unknown one);
  #   * the C ABI's op functions: their tensor parameters; its options
  #     structs: their fields, types and enumerators;
  #   * the XLA FFI targets of the ops that have them: operands, results,
  #     attributes and the attributes' MLIR types; every other target, by its
  #     name a form of one op direction for Edifice, against the rules of
  #     those forms;
  #   * ExPhil.Native.Edifice's op table: each row's op of ours, each native
  #     row's target and where its operands and results sit;
  #   * ExPhil.Native.Ops: one function per op, the required inputs first;
  #   * the README's table of scans, its tables of the selective scan's and
  #     attention's tensors and options, and what it says of the options'
  #     types in the C ABI and the XLA FFI.
  #
  # Runs without a GPU: nothing reaches a device.
  use ExUnit.Case, async: true

  alias ExPhil.Native
  alias ExPhil.Native.{DescribedTensors, OpDescriptions, Targets}
  alias ExPhil.Native.Edifice, as: NativeEdifice

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
  # The C ABI's options struct of each op, by the name it has after
  # exphil_ (the gated RNNs' ops share one).
  @c_options_structs %{
    gru: :gated_rnn,
    lstm: :gated_rnn,
    gru_stack: :gated_rnn,
    lstm_stack: :gated_rnn
  }

  @readme Path.expand("../../README.md", __DIR__)
  @exphil_h Path.expand("../../include/exphil/exphil.h", __DIR__)

  # What the README's tables say of each tensor and option: all that a
  # description does.
  @tensor_fields [:name, :role, :optional, :only_with, :dtype, :dims]
  @option_fields [:name, :type, :default, :range, :only_if]

  # The ops the NIF has, as the descriptions say (the loop below needs them
  # when it compiles).
  @nif_ops for d <- OpDescriptions.all(), :nif in d.bindings, uniq: true, do: d.op

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

  # How an XLA FFI attribute of an option of this type is decoded.
  defp mlir_type("bool"), do: "i1"
  defp mlir_type("i32"), do: "i32"
  defp mlir_type("f32"), do: "f32"
  defp mlir_type("enum(" <> _), do: "i32"

  # The type of a C ABI options struct's field for an option of this type.
  defp c_type("f32"), do: "float"
  defp c_type(_bool_i32_or_enum), do: "int32_t"

  # The README's text under heading `heading` (with its #s), up to the next
  # heading.
  defp readme_section(heading) do
    [_, section] = String.split(File.read!(@readme), "\n#{heading}\n", parts: 2)
    section |> String.split(~r/\n#+ /, parts: 2) |> hd()
  end

  # The cells of each row of the Markdown table whose header row is `header`.
  defp markdown_table(text, header) do
    rows =
      text
      |> String.split("\n")
      |> Enum.drop_while(&(&1 != header))
      |> Enum.drop(2)
      |> Enum.take_while(&String.starts_with?(&1, "| "))

    assert rows != [], "no table #{header}"

    for row <- rows,
        do: row |> String.trim("|") |> String.split(" | ") |> Enum.map(&String.trim/1)
  end

  defp code(cell), do: String.trim(cell, "`")

  defp assert_same_elements(listed, described, what) do
    assert Enum.sort(listed) == Enum.sort(described),
           "#{what}: the README alone has #{inspect(listed -- described)}, " <>
             "the description alone #{inspect(described -- listed)}"
  end

  # A row of a README table of tensors, as the description's tensor in one
  # direction (its cell: "in" or "out", then ", optional", ", only with
  # `input`"), or nil where the cell is "-".
  defp readme_tensor(_row, "-"), do: nil

  defp readme_tensor([name, shape, dtype | _], cell) do
    [role | qualifiers] = String.split(cell, ", ")

    only_with =
      for "only with " <> input <- qualifiers, do: code(input)

    assert qualifiers -- ["optional" | Enum.map(only_with, &"only with `#{&1}`")] == [], cell

    %{
      name: code(name),
      role: Map.fetch!(%{"in" => :input, "out" => :output}, role),
      optional: "optional" in qualifiers,
      only_with: List.first(only_with),
      # the README's words for the description's dtype rules
      dtype: Map.fetch!(%{"sequence" => :seq, "f32" => :f32, "f32 or sequence" => :state}, dtype),
      dims:
        shape
        |> code()
        |> String.trim_leading("[")
        |> String.trim_trailing("]")
        |> String.split(", ")
    }
  end

  # A row of a README table of options, as the description's option: its
  # type "`f32`" or "enum: `a` (0), `b` (1)", in the enumerators' order; its
  # values "any" or "`range`", then ", read only with `condition`".
  defp readme_option([name, type, default, values | _]) do
    {range, only_if} =
      case String.split(values, ", read only with ") do
        [range] -> {range, nil}
        [range, condition] -> {range, code(condition)}
      end

    type =
      case type do
        "enum: " <> enumerators ->
          numbered = Regex.scan(~r/`(\w+)` \((\d+)\)/, enumerators, capture: :all_but_first)

          assert Enum.map(numbered, &String.to_integer(Enum.at(&1, 1))) ==
                   Enum.to_list(0..(length(numbered) - 1)),
                 type

          "enum(#{Enum.map_join(numbered, "|", &hd/1)})"

        type ->
          code(type)
      end

    range = if range == "any", do: nil, else: code(range)
    %{name: code(name), type: type, default: code(default), range: range, only_if: only_if}
  end

  defp required_outputs(%{tensors: tensors}),
    do: for(t <- tensors, t.role == :output, not t.optional, do: t.name)

  # The target of op direction `d` (Targets.name/2), or of its form that
  # keeps forward result `kept` alone: exphil_<op>_<kept>_fwd or _bwd.
  defp target_name(d, nil), do: Targets.name(d.op, d.direction)

  defp target_name(d, kept),
    do: String.replace(target_name(d, nil), ~r/_(fwd|bwd)$/, "_#{kept}_\\1")

  # The op direction XLA FFI target `name` belongs to, by its name, and the
  # forward result that the name says it keeps (or nil): {description, kept}.
  defp target_owner(name) do
    owners =
      for d <- OpDescriptions.all(),
          forward = OpDescriptions.fetch!(d.op, :forward),
          kept <- [nil | for(t <- forward.tensors, t.role == :output, do: t.name)],
          target_name(d, kept) == name,
          do: {d, kept}

    case owners do
      [owner] -> owner
      _ -> flunk("#{name}: the target of #{length(owners)} described op directions")
    end
  end

  # The target of an op with the XLA FFI binding, exphil_<op>_fwd or _bwd:
  # the full form, which takes every described tensor.
  defp full_target?(d, kept), do: kept == nil and :xla in d.bindings

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

      tensors =
        slots |> Enum.with_index() |> Enum.map(fn {s, i} -> DescribedTensors.fake(s, i) end)

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

      # state_type: sets the dtype of state tensors (f32 or the sequence's,
      # each its own); ops without them have none.
      state_type = if Enum.any?(d.tensors, &(&1.dtype == :state)), do: ["state_type"], else: []
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
    header = File.read!(@exphil_h)

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

  test "every XLA FFI target's attributes have the MLIR types of the options' types" do
    for {name, target} <- Targets.all(), {attribute, type, _} <- target.attributes do
      {d, _kept} = target_owner(name)

      case Enum.find(d.options, &(&1.name == attribute)) do
        # has_<input>: whether an optional operand is present
        nil -> assert type == "i1" and String.starts_with?(attribute, "has_"), "#{name}"
        option -> assert type == mlir_type(option.type), "#{name}: #{attribute}"
      end
    end
  end

  test "every other XLA FFI target is a form of a described op direction for Edifice" do
    for {name, target} <- Targets.all(),
        {d, kept} = target_owner(name),
        not full_target?(d, kept) do
      forward = OpDescriptions.fetch!(d.op, :forward)
      kept_results = required_outputs(forward)
      inputs = for t <- d.tensors, t.role == :input, into: %{}, do: {t.name, t}
      outputs = for t <- d.tensors, t.role == :output, into: %{}, do: {t.name, t}
      # "flag": an operand the handler never reads (xla_ffi_targets.h)
      operands = for {operand, _} <- target.operands, operand != "flag", do: operand
      results = Enum.map(target.results, &elem(&1, 0))
      options = Enum.map(d.options, & &1.name)
      attributes = for {attribute, _, _} <- target.attributes, do: attribute

      # Edifice passes every operand and attribute: none is optional, and
      # there is no has_<name>.
      assert Enum.all?(target.operands, &match?({_, :required}, &1)), name
      assert Enum.all?(target.results, &match?({_, :always}, &1)), name
      assert Enum.all?(target.attributes, &match?({_, _, :required}, &1)), name
      assert attributes -- options == [], "#{name}: #{inspect(attributes -- options)}"

      assert operands -- Map.keys(inputs) == [], "#{name}: #{inspect(operands)}"
      assert results -- Map.keys(outputs) == [], "#{name}: #{inspect(results)}"

      # A required input is an operand unless an option of the op recomputes
      # it (attention's backward: lse, with recompute_lse).
      for {input, %{optional: false}} <- inputs, input not in operands do
        assert "recompute_#{input}" in options, "#{name}: required input #{input} left out"
      end

      for {output, t} <- outputs do
        assert t.optional or output in results, "#{name}: required output #{output} left out"

        assert output not in results or t.only_with in [nil | operands],
               "#{name}: #{output} without #{t.only_with}"
      end

      # The form returns the forward's required results alone (y; o), and its
      # backward takes no gradient of the others (grad_h_final); a name that
      # says which result it keeps (exphil_<op>_y_fwd) names that one.
      assert kept in [nil | kept_results] and length(kept_results) == 1, name

      case d.direction do
        :forward ->
          assert results == kept_results, "#{name}: #{inspect(results)}"

        :backward ->
          for %{role: :output, name: output} <- forward.tensors, output not in kept_results do
            refute ("grad_" <> output) in operands, "#{name}: takes grad_#{output}"
          end
      end
    end
  end

  test "Edifice's op table: each row's op of ours is described, each native row's target is a form of it" do
    described = for d <- OpDescriptions.all(), do: {d.op, d.direction}

    for row <- NativeEdifice.ops(), row.ours != nil do
      assert {row.ours, row.direction} in described, "#{row.op}: ours #{inspect(row.ours)}"
    end

    for %{status: :native} = row <- NativeEdifice.ops() do
      assert Map.has_key?(Targets.all(), row.target), "#{row.op}: #{inspect(row.target)}"
      {d, _kept} = target_owner(row.target)

      assert {d.op, d.direction} == {row.ours, row.direction},
             "#{row.op} (#{row.ours} #{row.direction}): #{row.target} is #{d.op} #{d.direction}"

      assert String.starts_with?(row.change, row.target), "#{row.op}: change #{row.change}"

      # Where Edifice's name of an operand or result is the target's name of
      # one (lower-cased, as the NIF spells them), it is that one, in its place.
      target = Targets.fetch!(row.target)

      for {edifice, ours} <- [{row.operands, target.operands}, {row.results, target.results}] do
        ours = Enum.map(ours, &String.downcase(elem(&1, 0)))

        for {name, i} <- Enum.with_index(edifice),
            j = Enum.find_index(ours, &(&1 == Atom.to_string(name))) do
          assert i == j, "#{row.op}: #{name} is #{row.target}'s #{Enum.at(ours, j)}, at #{j}"
        end
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

  for {heading, op} <- [
        {"### Selective scan (Mamba's S6)", :selective_scan},
        {"### Attention", :attention}
      ] do
    test "the README's tables of #{op}: its tensors and options in each direction, as described" do
      section = readme_section(unquote(heading))
      tensors = markdown_table(section, "| tensor | shape | dtype | forward | backward |")

      options =
        markdown_table(
          section,
          "| option | type | default | values | forward | backward | what it does |"
        )

      for {direction, tensor_column, option_column} <- [{:forward, 3, 4}, {:backward, 4, 5}] do
        d = OpDescriptions.fetch!(unquote(op), direction)
        listed = for row <- tensors, t = readme_tensor(row, Enum.at(row, tensor_column)), do: t
        described = Enum.map(d.tensors, &Map.take(&1, @tensor_fields))
        assert_same_elements(listed, described, "#{direction} tensors")

        assert Enum.all?(options, &(Enum.at(&1, option_column) in ["yes", "-"]))
        listed = for row <- options, Enum.at(row, option_column) == "yes", do: readme_option(row)
        described = Enum.map(d.options, &Map.take(&1, @option_fields))
        assert_same_elements(listed, described, "#{direction} options")
      end

      for [name | _] = row <- options do
        assert String.contains?(List.last(row), "Not in the C ABI or the NIF") ==
                 code(name) in @cpp_only_options,
               "#{name}: the C ABI and the NIF have every option but #{inspect(@cpp_only_options)}"
      end
    end
  end

  test "each C ABI options struct has the described options but the C++ API's own" do
    header = File.read!(@exphil_h)

    for op <-
          Enum.uniq(for d <- OpDescriptions.all(), :c in d.bindings, d.options != [], do: d.op) do
      options =
        for direction <- [:forward, :backward],
            option <- OpDescriptions.fetch!(op, direction).options,
            option.name not in @cpp_only_options,
            uniq: true,
            do: option

      struct = Map.get(@c_options_structs, op, op)

      [_, body] =
        Regex.run(
          ~r/typedef struct exphil_#{struct}_options \{(.*?)\} exphil_#{struct}_options;/s,
          header
        )

      fields =
        for [_, type, name] <- Regex.scan(~r/^\s*(int32_t|float) (\w+);/m, body), do: {name, type}

      assert fields == for(o <- options, do: {o.name, c_type(o.type)}), "exphil_#{struct}_options"

      for %{name: name, type: type, default: default} <- options do
        # NULL or zero-initialised options are the defaults (README, "C ABI")
        case OpDescriptions.enum_values(type) do
          [] ->
            assert default == if(type == "bool", do: "false", else: "0"), name

          values ->
            assert default == hd(values), name

            # its C enumerators, EXPHIL_..._<VALUE> = its number
            [_, body] =
              Regex.run(
                ~r/typedef enum exphil_#{struct}_#{name} \{(.*?)\} exphil_#{struct}_#{name};/s,
                header
              )

            enumerators = Regex.scan(~r/(EXPHIL_\w+) = (\d+)/, body, capture: :all_but_first)
            assert length(enumerators) == length(values), name

            for {[enumerator, number], {value, index}} <-
                  Enum.zip(enumerators, Enum.with_index(values)) do
              assert String.ends_with?(enumerator, "_" <> String.upcase(value)) and
                       number == Integer.to_string(index),
                     "#{name}: #{enumerator} = #{number}, #{value} is #{index}"
            end
        end
      end
    end
  end

  test "the README says how the C ABI and the XLA FFI take options of each type, as the tests hold them" do
    for {heading, type_of} <- [
          {"## C ABI (`include/exphil/exphil.h`)", &c_type/1},
          {"## In-graph: XLA FFI handlers (`libexphil_xla_ffi.so`, `include/exphil/xla_ffi.h`)",
           &mlir_type/1}
        ] do
      text = readme_section(heading) |> String.replace(~r/\s+/, " ")

      for {words, type} <- [
            {"a `bool`", "bool"},
            {"an `i32`", "i32"},
            {"an enum", "enum("},
            {"an `f32`", "f32"}
          ] do
        assert text =~ "#{words} as `#{type_of.(type)}`", "#{heading}: #{words}"
      end
    end
  end

  test "the README's table of scans names each scan's inputs as described" do
    table = markdown_table(readme_section("## Ops"), "| op | inputs `[B, T, H]` | step |")

    rows =
      for [op, inputs | _] <- table,
          into: %{},
          do:
            {String.to_atom(code(op)),
             Regex.scan(~r/`(\w+)`/, inputs) |> Enum.map(&Enum.at(&1, 1))}

    for op <- [:linear_scan, :min_gru, :min_lstm, :liquid] do
      d = OpDescriptions.fetch!(op, :forward)
      inputs = for t <- d.tensors, t.role == :input, not t.optional, do: t.name
      assert rows[op] == inputs, "README row of #{op}: #{inspect(rows[op])}"
    end
  end
end
