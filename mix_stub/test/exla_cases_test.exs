defmodule ExPhil.Native.ExlaCasesTest do
  # `mix exphil.exla_cases` (the cases test/xla_ffi/exla_form/check_exla_form.py
  # runs on a GPU): its JSON parses, and its GRU and LSTM cases are the
  # ones the script's references expect. Not async: the task sets the Mix
  # shell's output.
  use ExUnit.Case, async: false

  setup_all do
    dir = Path.join(System.tmp_dir!(), "exphil_exla_cases_#{System.unique_integer([:positive])}")
    path = Path.join(dir, "cases.json")
    shell = Mix.shell()
    Mix.shell(Mix.Shell.Process)

    try do
      Mix.Tasks.Exphil.ExlaCases.run([path])
    after
      Mix.shell(shell)
    end

    spec = path |> File.read!() |> JSON.decode!()
    File.rm_rf!(dir)
    %{spec: spec}
  end

  defp of(spec, ops), do: Enum.filter(spec["cases"], &(&1["op"] in ops))

  test "the file: row-major layouts, unique names, the ops' case counts", %{spec: spec} do
    assert spec["layouts"] == "row_major"
    names = Enum.map(spec["cases"], & &1["name"])
    assert names == Enum.uniq(names)
    counts = spec["cases"] |> Enum.frequencies_by(& &1["op"]) |> Map.delete("edifice")

    assert counts == %{
             "linear_scan" => 12,
             "min_gru" => 12,
             "min_lstm" => 12,
             "liquid" => 12,
             "selective_scan" => 15,
             "attention" => 24,
             "gru" => 14,
             "lstm" => 16,
             "slstm" => 16,
             "gru_stack" => 6,
             "lstm_stack" => 6
           }
  end

  # Each cell's optional inputs and final states, in the targets' order.
  @optional %{
    "gru" => ["bias", "h0"],
    "lstm" => ["bias", "h0", "c0"],
    "slstm" => ["bias", "h0", "c0", "n0", "m0"]
  }
  @finals %{
    "gru" => ["h_final"],
    "lstm" => ["h_final", "c_final"],
    "slstm" => ["h_final", "c_final", "n_final", "m_final"]
  }

  test "gated RNNs: targets, attributes from the options, placeholders", %{spec: spec} do
    for c <- of(spec, ["gru", "lstm", "slstm"]) do
      cell = c["op"]
      o = c["options"]
      optional = @optional[cell]
      finals = @finals[cell]

      assert (Map.keys(o) -- ["precision"]) |> Enum.sort() ==
               Enum.sort(["final_state" | optional]),
             c["name"]

      has = for name <- optional, do: ["has_#{name}", to_string(o[name])]
      has_finals = for name <- finals, do: ["has_grad_#{name}", to_string(o["final_state"])]

      # The GRU's and LSTM's precision last: 1 for the case at tf32, else 0.
      own =
        cond do
          cell == "slstm" -> []
          o["precision"] == "tf32" -> [["precision", "1 : i32"]]
          true -> [["precision", "0 : i32"]]
        end

      %{"forward" => fwd, "backward" => bwd} = c
      assert fwd["target"] == "exphil_#{cell}_fwd"
      assert bwd["target"] == "exphil_#{cell}_bwd"
      assert fwd["attributes"] == has ++ own, c["name"]
      assert bwd["attributes"] == has ++ has_finals ++ own, c["name"]

      # Placeholders exactly for the operands not given; every result written.
      given =
        Map.new(optional, &{&1, o[&1]})
        |> Map.merge(Map.new(finals, &{"grad_#{&1}", o["final_state"]}))

      for call <- [fwd, bwd], operand <- call["operands"] do
        assert operand["placeholder"] == (Map.get(given, operand["name"], true) == false),
               "#{c["name"]}: #{operand["name"]}"

        if operand["placeholder"], do: assert({operand["shape"], operand["dtype"]} == {[], "f32"})
      end

      refute Enum.any?(fwd["results"] ++ bwd["results"], & &1["placeholder"]), c["name"]

      %{"batch" => b, "steps" => t, "hidden" => h} = c["shape"]
      gh = if(cell == "gru", do: 3, else: 4) * h
      dtype = c["dtype"]

      shapes =
        Map.new(bwd["operands"] ++ bwd["results"], &{&1["name"], {&1["shape"], &1["dtype"]}})

      assert shapes["wx"] == {[b, t, gh], dtype}
      assert shapes["R"] == {[h, gh], "f32"}
      assert shapes["y"] == {[b, t, h], dtype}
      assert shapes["grad_wx"] == {[b, t, gh], dtype}
      assert shapes["grad_rh"] == {[b, t, gh], dtype}
      assert shapes["grad_R"] == {[h, gh], "f32"}
      assert shapes["grad_bias"] == {[gh], "f32"}
      assert shapes["grad_h0"] == {[b, h], "f32"}
    end
  end

  test "gated RNNs: what the cases cover", %{spec: spec} do
    for cell <- ["gru", "lstm", "slstm"] do
      cases = of(spec, [cell])
      optional = @optional[cell]
      given = fn c -> Enum.filter(optional, &c["options"][&1]) end

      assert cases |> Enum.map(& &1["dtype"]) |> Enum.uniq() |> Enum.sort() ==
               ["bf16", "f16", "f32"]

      assert Enum.any?(cases, &(&1["shape"]["steps"] == 1))
      assert Enum.any?(cases, &(&1["shape"]["hidden"] == 37))
      assert Enum.any?(cases, &(&1["shape"]["hidden"] > 128))
      assert Enum.any?(cases, &(given.(&1) == []))
      assert Enum.any?(cases, &(given.(&1) == optional))
      for name <- optional, do: assert(Enum.any?(cases, &(given.(&1) == [name])), name)
      # The sLSTM without its final states (their gradients jump at ties
      # of m's max(); the task's comment says why).
      final_states =
        cases |> Enum.map(& &1["options"]["final_state"]) |> Enum.uniq() |> Enum.sort()

      assert final_states == if(cell == "slstm", do: [false], else: [false, true])

      # f32 and bf16 share every option set and shape (the sLSTM's bf16 a
      # subset of its f32), but for the f32 case at precision tf32, one per
      # GRU and LSTM.
      tf32 = for c <- cases, c["options"]["precision"] == "tf32", do: c

      assert length(tf32) == if(cell == "slstm", do: 0, else: 1)
      assert Enum.all?(tf32, &(&1["dtype"] == "f32" and &1["shape"]["hidden"] == 48))

      sets = fn dtype ->
        for c <- cases -- tf32, c["dtype"] == dtype, do: {c["shape"], c["options"]}
      end

      if cell == "slstm",
        do: assert(sets.("bf16") -- sets.("f32") == []),
        else: assert(sets.("f32") == sets.("bf16"))
    end
  end

  # The stacks' optional inputs as the options name them and as the
  # targets spell them.
  @stack_optional %{
    "gru_stack" => [{"bias", "bias"}, {"w_bias", "W_bias"}, {"h0", "h0"}],
    "lstm_stack" => [{"bias", "bias"}, {"w_bias", "W_bias"}, {"h0", "h0"}, {"c0", "c0"}]
  }

  test "the stacks: targets, attributes from the options, placeholders, shapes", %{spec: spec} do
    for c <- of(spec, ["gru_stack", "lstm_stack"]) do
      op = c["op"]
      o = c["options"]
      optional = @stack_optional[op]
      finals = if op == "gru_stack", do: ["h_final"], else: ["h_final", "c_final"]

      assert Map.keys(o) |> Enum.sort() ==
               Enum.sort(["final_state" | Enum.map(optional, &elem(&1, 0))])

      has = for {option, name} <- optional, do: ["has_#{name}", to_string(o[option])]

      # y_lower stays inside the op: its cotangent is never given.
      has_grads =
        [["has_grad_y_lower", "false"]] ++
          for name <- finals, do: ["has_grad_#{name}", to_string(o["final_state"])]

      %{"forward" => fwd, "backward" => bwd} = c
      assert fwd["target"] == "exphil_#{op}_fwd"
      assert bwd["target"] == "exphil_#{op}_bwd"
      assert fwd["attributes"] == has ++ [["precision", "0 : i32"]], c["name"]
      assert bwd["attributes"] == has ++ has_grads ++ [["precision", "0 : i32"]], c["name"]

      given =
        Map.new(optional, fn {option, name} -> {name, o[option]} end)
        |> Map.merge(Map.new(finals, &{"grad_#{&1}", o["final_state"]}))
        |> Map.put("grad_y_lower", false)

      for call <- [fwd, bwd], operand <- call["operands"] do
        assert operand["placeholder"] == (Map.get(given, operand["name"], true) == false),
               "#{c["name"]}: #{operand["name"]}"
      end

      refute Enum.any?(fwd["results"] ++ bwd["results"], & &1["placeholder"]), c["name"]

      %{"layers" => l, "batch" => b, "steps" => t, "hidden" => h} = c["shape"]
      gh = if(op == "gru_stack", do: 3, else: 4) * h
      dtype = c["dtype"]

      shapes =
        Map.new(
          fwd["results"] ++ bwd["operands"] ++ bwd["results"],
          &{&1["name"], {&1["shape"], &1["dtype"]}}
        )

      assert shapes["wx"] == {[b, t, gh], dtype}
      assert shapes["R"] == {[l, h, gh], "f32"}
      assert shapes["W"] == {[l - 1, h, gh], "f32"}
      assert shapes["y"] == {[b, t, h], dtype}
      assert shapes["y_lower"] == {[l - 1, b, t, h], dtype}
      assert shapes["h_final"] == {[l, b, h], "f32"}
      assert shapes["grad_wx"] == {[b, t, gh], dtype}
      assert shapes["grad_R"] == {[l, h, gh], "f32"}
      assert shapes["grad_W"] == {[l - 1, h, gh], "f32"}
      assert shapes["grad_W_bias"] == {[l - 1, gh], "f32"}
      assert shapes["grad_h0"] == {[l, b, h], "f32"}
    end
  end
end
