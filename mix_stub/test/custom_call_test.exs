defmodule ExPhil.Native.CustomCallTest do
  # The custom calls the ops ask EXLA for, checked against the targets' table
  # (include/exphil/xla_ffi_targets.h, the C++ handlers' own): for every op,
  # type and option set, forward and backward, the blocks traced inside
  # defn and a gradient. No EXLA runtime is needed: EXLA.CustomCall.call/4
  # is answered from the block, its operands and its traced output.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias ExPhil.Native.{Block, Blocks, CustomCall, Ops, Targets}

  defp cuda_client, do: Blocks.client(:cuda)
  defp client(platform), do: Blocks.client(platform)

  defp random(shape, type, seed) do
    key = Nx.Random.key(seed)
    {t, _} = Nx.Random.uniform(key, 0.5, 1.5, shape: shape, type: :f32)
    Nx.as_type(t, type)
  end

  # The forward and backward blocks of `op_fun` traced with a gradient of
  # every output into every tensor input.
  defp forward_and_backward(op_fun, inputs) do
    fun = fn inputs ->
      loss = fn inputs ->
        inputs
        |> op_fun.()
        |> List.wrap()
        |> Enum.flat_map(&List.wrap(if is_tuple(&1), do: Tuple.to_list(&1), else: &1))
        |> Enum.map(&Nx.sum(Nx.as_type(&1, :f32)))
        |> Enum.reduce(&Nx.add/2)
      end

      # The forward too: a backward that recomputes (the selective scan's)
      # leaves it out of the gradient's expression.
      {op_fun.(inputs), Nx.Defn.grad(inputs, loss)}
    end

    blocks = Blocks.capture(fun, [inputs])
    forward = Enum.filter(blocks, &String.ends_with?(elem(&1, 0).target, "_fwd"))
    backward = Enum.filter(blocks, &String.ends_with?(elem(&1, 0).target, "_bwd"))
    # The forward is traced twice (the output, and inside the gradient).
    assert [_ | _] = forward
    assert forward |> Enum.map(&elem(&1, 0)) |> Enum.uniq() |> length() == 1
    assert [_] = backward, "one backward block, got #{length(backward)}"
    {hd(forward), hd(backward)}
  end

  # Everything a handler binds: target, operand and result counts, each
  # attribute's name and MLIR type; an absent optional operand and its
  # gradient are f32 scalars, a present one is not.
  defp assert_matches_target({%Block{} = block, operands, out}, expected_target) do
    assert block.target == expected_target
    assert block.eager == false
    assert block.unsupported == nil
    target = Targets.fetch!(expected_target)
    results = Blocks.results(out)
    assert length(operands) == length(target.operands)
    assert length(results) == length(target.results)

    fields = CustomCall.fields(block, out, operands)
    assert fields.call_target_name == expected_target

    names = Enum.map(fields.attributes, &elem(&1, 0))

    assert names == Enum.map(target.attributes, &elem(&1, 0)),
           "every attribute, in the table's order"

    for {{name, text}, {name, type, _presence}} <- Enum.zip(fields.attributes, target.attributes) do
      case type do
        "i1" -> assert text in ["true", "false"], "#{name}: #{text}"
        "i32" -> assert text =~ ~r/^-?\d+ : i32$/, "#{name}: #{text}"
        "f32" -> assert text =~ ~r/^-?\d+\.\d+(e-?\d+)? : f32$/, "#{name}: #{text}"
      end
    end

    for {{name, presence}, operand} <- Enum.zip(target.operands, operands),
        presence == :optional do
      present? = block.attributes["has_" <> name]
      assert is_boolean(present?), "has_#{name} is always passed"

      if present? do
        assert Nx.rank(operand) > 0, "#{name} is present"
      else
        assert {Nx.shape(operand), Nx.type(operand)} == {{}, {:f, 32}}, "#{name} is a placeholder"
      end
    end

    for {{_name, {:gradient_of, input}}, result} <- Enum.zip(target.results, results) do
      unless block.attributes["has_" <> input] do
        assert {Nx.shape(result), Nx.type(result)} == {{}, {:f, 32}}
      end
    end

    {target, operands, results}
  end

  describe "scans" do
    for op <- [:linear_scan, :min_gru, :min_lstm, :liquid],
        type <- [{:f, 32}, {:bf, 16}, {:f, 16}],
        h0? <- [false, true],
        final_state? <- [false, true] do
      test "#{op} #{inspect(type)} h0: #{h0?} final state: #{final_state?}" do
        op = unquote(op)
        type = unquote(type)
        arity = ExPhil.Native.Pure.Scan.input_count(op)
        {b, t, h} = {2, 5, 3}
        inputs = for i <- 1..arity, do: random({b, t, h}, type, i)
        h0 = if unquote(h0?), do: random({b, h}, :f32, 9)

        op_fun = fn inputs ->
          {seq, [h0]} = Enum.split(Tuple.to_list(inputs), -1)
          opts = [h0: if(unquote(h0?), do: h0), final_state: unquote(final_state?)]
          apply(Ops, op, seq ++ [opts])
        end

        h0_arg = h0 || Nx.tensor(0.0)
        {forward, backward} = forward_and_backward(op_fun, List.to_tuple(inputs ++ [h0_arg]))

        {_, _, [y, h_final]} = assert_matches_target(forward, "exphil_#{op}_fwd")
        assert {Nx.shape(y), Nx.type(y)} == {{b, t, h}, type}
        assert {Nx.shape(h_final), Nx.type(h_final)} == {{b, h}, {:f, 32}}
        assert elem(forward, 0).attributes == %{"has_h0" => unquote(h0?)}

        {_, operands, results} = assert_matches_target(backward, "exphil_#{op}_bwd")
        # Without the final state in the loss its gradient is a zero constant: absent.
        assert elem(backward, 0).attributes["has_grad_h_final"] == unquote(final_state?)

        for {result, input} <- Enum.zip(Enum.take(results, arity), inputs) do
          assert {Nx.shape(result), Nx.type(result)} == {Nx.shape(input), type}
        end

        # y and grad_y in the sequence type.
        assert Nx.type(Enum.at(operands, arity + 1)) == type
        assert Nx.type(Enum.at(operands, arity + 2)) == type
      end
    end
  end

  describe "selective scan" do
    for type <- [{:f, 32}, {:bf, 16}, {:f, 16}],
        optional <- [[], [:dt_bias, :d, :z, :h0], [:z], [:dt_bias, :d], [:h0]],
        {softplus, clamp} <- [{false, nil}, {true, {0.001, 0.1}}] do
      test "#{inspect(type)} with #{inspect(optional)} softplus: #{softplus} clamp: #{inspect(clamp)}" do
        type = unquote(type)
        optional = unquote(optional)
        {b, t, d, n} = {2, 4, 3, 5}

        tensors = %{
          x: random({b, t, d}, type, 1),
          dt: random({b, t, d}, type, 2),
          a: Nx.negate(random({d, n}, :f32, 3)),
          b: random({b, t, n}, type, 4),
          c: random({b, t, n}, type, 5),
          dt_bias: random({d}, :f32, 6),
          d: random({d}, :f32, 7),
          z: random({b, t, d}, type, 8),
          h0: random({b, d, n}, :f32, 9)
        }

        op_fun = fn tensors ->
          opts =
            Enum.map(optional, &{&1, tensors[&1]}) ++
              [
                softplus: unquote(softplus),
                clamp: unquote(Macro.escape(clamp)),
                final_state: true
              ]

          Ops.selective_scan(tensors.x, tensors.dt, tensors.a, tensors.b, tensors.c, opts)
        end

        {forward, backward} = forward_and_backward(op_fun, tensors)
        {_, _, [y, h_final]} = assert_matches_target(forward, "exphil_selective_scan_fwd")
        assert {Nx.shape(y), Nx.type(y)} == {{b, t, d}, type}
        assert {Nx.shape(h_final), Nx.type(h_final)} == {{b, d, n}, {:f, 32}}

        attributes = elem(forward, 0).attributes
        assert attributes["softplus"] == unquote(softplus)
        assert attributes["clamp"] == (unquote(Macro.escape(clamp)) != nil)

        for {key, name} <- [dt_bias: "dt_bias", d: "D", z: "z", h0: "h0"] do
          assert attributes["has_" <> name] == key in optional
        end

        {_, _, results} = assert_matches_target(backward, "exphil_selective_scan_bwd")
        assert elem(backward, 0).attributes["has_grad_h_final"] == true

        expected = [x: type, dt: type, a: {:f, 32}, b: type, c: type]

        for {{key, expected_type}, result} <- Enum.zip(expected, results) do
          assert {Nx.shape(result), Nx.type(result)} == {Nx.shape(tensors[key]), expected_type}
        end
      end
    end
  end

  # A function of the cell, not a test body with it unquoted: the compiler
  # would see a literal cell compared with the other.
  defp assert_gated_rnn_blocks(cell, type, optional, final_state?) do
    g = ExPhil.Native.Pure.GatedRnn.gates(cell)
    states = ExPhil.Native.Pure.GatedRnn.states(cell)
    {b, t, h} = {2, 4, 3}

    tensors = %{
      wx: random({b, t, g * h}, type, 1),
      r: random({h, g * h}, :f32, 2),
      bias: random({g * h}, :f32, 3),
      h0: random({b, h}, :f32, 4),
      c0: random({b, h}, :f32, 5),
      n0: random({b, h}, :f32, 6),
      m0: random({b, h}, :f32, 7)
    }

    op_fun = fn tensors ->
      opts = Enum.map(optional, &{&1, tensors[&1]}) ++ [final_state: final_state?]
      apply(Ops, cell, [tensors.wx, tensors.r, opts])
    end

    {forward, backward} = forward_and_backward(op_fun, Map.take(tensors, [:wx, :r | optional]))
    {_, _, [y | finals]} = assert_matches_target(forward, "exphil_#{cell}_fwd")
    assert {Nx.shape(y), Nx.type(y)} == {{b, t, h}, type}
    final_names = for s <- states, do: "#{s}_final"
    assert length(finals) == length(final_names)

    for state <- finals do
      assert {Nx.shape(state), Nx.type(state)} == {{b, h}, {:f, 32}}
    end

    keys = [:bias | for(s <- states, do: :"#{s}0")]
    # The GRU's and LSTM's precision, exact by default; the sLSTM has none.
    own = if cell == :slstm, do: %{}, else: %{"precision" => 0}
    has = Map.merge(Map.new(keys, &{"has_#{&1}", &1 in optional}), own)
    assert elem(forward, 0).attributes == has

    {_, operands, results} = assert_matches_target(backward, "exphil_#{cell}_bwd")
    # Without the final states in the loss their gradients are zero constants: absent.
    has_finals = Map.new(final_names, &{"has_grad_#{&1}", final_state?})
    assert elem(backward, 0).attributes == Map.merge(has, has_finals)

    # wx, R, y, grad_y first; y and grad_y in the sequence type.
    assert Enum.map(Enum.slice(operands, 2, 2), &{Nx.shape(&1), Nx.type(&1)}) ==
             [{{b, t, h}, type}, {{b, t, h}, type}]

    # Every result, whether or not its input was given: grad_wx, grad_R,
    # grad_bias, grad_h0, (grad_c0, grad_n0, grad_m0,) grad_rh.
    state = {{b, h}, {:f, 32}}

    expected =
      [{{b, t, g * h}, type}, {{h, g * h}, {:f, 32}}, {{g * h}, {:f, 32}}] ++
        List.duplicate(state, length(final_names)) ++ [{{b, t, g * h}, type}]

    assert Enum.map(results, &{Nx.shape(&1), Nx.type(&1)}) == expected
  end

  describe "gru, lstm and slstm" do
    for cell <- [:gru, :lstm, :slstm],
        type <- [{:f, 32}, {:bf, 16}, {:f, 16}],
        optional <- [
          [],
          [:bias, :h0],
          [:h0, :c0],
          [:bias, :h0, :c0],
          [:n0, :m0],
          [:bias, :h0, :c0, :n0, :m0]
        ],
        cell == :slstm or optional -- [:bias, :h0, :c0] == [],
        cell != :gru or :c0 not in optional,
        final_state? <- [false, true] do
      test "#{cell} #{inspect(type)} with #{inspect(optional)} final state: #{final_state?}" do
        assert_gated_rnn_blocks(
          unquote(cell),
          unquote(type),
          unquote(optional),
          unquote(final_state?)
        )
      end
    end

    test "precision: :tf32 is the targets' attribute 1 with f32 wx, 0 with a 16-bit one; a bad one is named" do
      for cell <- [:gru, :lstm], {type, want} <- [{{:f, 32}, 1}, {{:bf, 16}, 0}, {{:f, 16}, 0}] do
        g = ExPhil.Native.Pure.GatedRnn.gates(cell)
        tensors = %{wx: random({2, 4, g * 3}, type, 1), r: random({3, g * 3}, :f32, 2)}
        op_fun = fn t -> apply(Ops, cell, [t.wx, t.r, [precision: :tf32]]) end
        {forward, backward} = forward_and_backward(op_fun, tensors)
        assert elem(forward, 0).attributes["precision"] == want
        assert elem(backward, 0).attributes["precision"] == want
      end

      wx = random({2, 4, 9}, :f32, 1)
      r = random({3, 9}, :f32, 2)

      assert_raise ArgumentError,
                   "ExPhil.Native.Ops.gru/3: option :precision expected :exact or :tf32, got: :tf32x3",
                   fn -> Ops.gru(wx, r, precision: :tf32x3) end

      # The sLSTM has no such option.
      assert_raise ArgumentError,
                   ~r/ExPhil.Native.Ops.slstm\/3: unknown options \[:precision\]/,
                   fn ->
                     Ops.slstm(random({2, 4, 12}, :f32, 1), random({3, 12}, :f32, 2),
                       precision: :exact
                     )
                   end
    end

    test "r, bias and the initial states reach the targets in f32 whatever their type" do
      tensors = %{
        wx: random({1, 2, 8}, :bf16, 1),
        r: random({2, 8}, :bf16, 2),
        bias: random({8}, :f16, 3),
        h0: random({1, 2}, :bf16, 4),
        c0: random({1, 2}, :f64, 5),
        n0: random({1, 2}, :f16, 6),
        m0: random({1, 2}, :f64, 7)
      }

      for {cell, keys} <- [lstm: [:bias, :h0, :c0], slstm: [:bias, :h0, :c0, :n0, :m0]] do
        op_fun = fn t -> apply(Ops, cell, [t.wx, t.r, Enum.map(keys, &{&1, t[&1]})]) end

        {{block, operands, _}, _backward} =
          forward_and_backward(op_fun, Map.take(tensors, [:wx, :r | keys]))

        assert block.unsupported == nil

        assert Enum.map(operands, &Nx.type/1) ==
                 [{:bf, 16} | List.duplicate({:f, 32}, 1 + length(keys))]
      end
    end
  end

  defp attention_shape(:bhtd, b, heads, steps, d), do: {b, heads, steps, d}
  defp attention_shape(:bthd, b, heads, steps, d), do: {b, steps, heads, d}

  describe "attention" do
    for type <- [{:f, 32}, {:bf, 16}, {:f, 16}],
        {mask, window} <- [{:none, nil}, {:causal, nil}, {:window, 3}],
        layout <- [:bhtd, :bthd],
        {hq, hkv} <- [{2, 2}, {4, 1}] do
      test "#{inspect(type)} #{mask} #{layout} heads #{hq}/#{hkv}" do
        type = unquote(type)
        layout = unquote(layout)
        {b, t, s, d} = {2, 3, 5, 32}

        shape = &attention_shape(layout, b, &1, &2, d)

        inputs =
          {random(shape.(unquote(hq), t), type, 1), random(shape.(unquote(hkv), s), type, 2),
           random(shape.(unquote(hkv), s), type, 3)}

        opts = [
          mask: unquote(mask),
          window: unquote(window),
          layout: layout,
          scale: 0.3,
          precision: :tf32x3
        ]

        op_fun = fn {q, k, v} -> Ops.attention(q, k, v, opts) end
        {forward, backward} = forward_and_backward(op_fun, inputs)

        {_, _, [o, lse]} = assert_matches_target(forward, "exphil_attention_fwd")
        assert {Nx.shape(o), Nx.type(o)} == {Nx.shape(elem(inputs, 0)), type}
        assert {Nx.shape(lse), Nx.type(lse)} == {{b, unquote(hq), t}, {:f, 32}}

        assert elem(forward, 0).attributes == %{
                 "mask" => %{none: 0, causal: 1, window: 2}[unquote(mask)],
                 "window" => unquote(window) || 0,
                 "layout" => %{bhtd: 0, bthd: 1}[layout],
                 "scale" => 0.3,
                 "precision" => 1
               }

        {_, _, results} = assert_matches_target(backward, "exphil_attention_bwd")

        for {result, input} <- Enum.zip(results, Tuple.to_list(inputs)) do
          assert {Nx.shape(result), Nx.type(result)} == {Nx.shape(input), type}
        end
      end
    end
  end

  describe "attribute text" do
    test "typed as the handler decodes it, f32 values exact" do
      assert CustomCall.mlir_attribute("t", "a", "i1", true) == "true"
      assert CustomCall.mlir_attribute("t", "a", "i32", -7) == "-7 : i32"
      assert CustomCall.mlir_attribute("t", "a", "f32", 0.125) == "0.125 : f32"
      # 0.1 is not an f32: the text is the f32 nearest to it, which MLIR reads back exactly.
      assert CustomCall.mlir_attribute("t", "a", "f32", 0.1) == "0.10000000149011612 : f32"
    end

    test "a value of the wrong kind raises, naming the attribute" do
      assert_raise ArgumentError,
                   ~r/t attribute a expected a value of MLIR type i32, got: 1.5/,
                   fn ->
                     CustomCall.mlir_attribute("t", "a", "i32", 1.5)
                   end

      assert_raise ArgumentError, ~r/i32/, fn ->
        CustomCall.mlir_attribute("t", "a", "i32", 2 ** 31)
      end
    end

    test "an attribute the target does not take, or a missing one, is a library bug and raises" do
      block = %Block{
        target: "exphil_min_gru_fwd",
        attributes: %{"has_h0" => false, "typo" => 1},
        eager: true
      }

      out = {Nx.template({1, 2, 3}, :f32), Nx.template({1, 3}, :f32)}

      operands = [
        Nx.template({1, 2, 3}, :f32),
        Nx.template({1, 2, 3}, :f32),
        Nx.template({}, :f32)
      ]

      assert_raise ArgumentError, ~r/takes no attributes \["typo"\]/, fn ->
        CustomCall.fields(block, out, operands)
      end

      block = %Block{target: "exphil_attention_fwd", attributes: %{"mask" => 0}, eager: true}

      assert_raise ArgumentError, ~r/needs attribute window/, fn ->
        CustomCall.fields(block, out, operands)
      end
    end
  end

  describe "spec/4" do
    setup do
      block = %Block{target: "exphil_min_gru_fwd", attributes: %{"has_h0" => false}, eager: true}
      out = {Nx.template({1, 2, 3}, :f32), Nx.template({1, 3}, :f32)}

      operands = [
        Nx.template({1, 2, 3}, :f32),
        Nx.template({1, 2, 3}, :f32),
        Nx.template({}, :f32)
      ]

      %{block: block, out: out, operands: operands}
    end

    test "skips every client but CUDA", %{block: block, out: out, operands: operands} do
      assert CustomCall.spec(block, out, operands, client(:host)) == :skip
      assert CustomCall.spec(block, out, operands, client(:rocm)) == :skip
    end

    test "skips inputs the kernels cannot take", %{block: block, out: out, operands: operands} do
      block = %{block | unsupported: "the kernels take f32, bf16 and f16, not {:f, 64}"}
      assert CustomCall.spec(block, out, operands, cuda_client()) == :skip
    end

    test "skips in-graph blocks unless EXLA pins the layouts", %{
      block: block,
      out: out,
      operands: operands
    } do
      refute CustomCall.layouts_pinned?(), "the vendored EXLA has no layout field"
      assert CustomCall.spec(%{block | eager: false}, out, operands, cuda_client()) == :skip
    end

    test "an eager block without registered handlers skips, with one warning",
         %{block: block, out: out, operands: operands} do
      ExPhil.Native.XlaRegistration.forget()

      log =
        capture_log(fn ->
          assert CustomCall.spec(block, out, operands, cuda_client()) == :skip
          assert CustomCall.spec(block, out, operands, cuda_client()) == :skip
        end)

      assert length(String.split(log, "could not be registered")) == 2, "warned once: #{log}"
      assert log =~ "run their pure-Nx default functions"
    end

    test "EXLA dispatches the library's block to spec/4", %{
      block: block,
      out: out,
      operands: operands
    } do
      assert EXLA.CustomCall.impl_for(block) == EXLA.CustomCall.ExPhil.Native.Block
      assert EXLA.CustomCall.call(block, out, operands, client(:host)) == :skip
    end
  end

  test "kernel limits run the default function: f64, head width 48, 257 states" do
    x = random({1, 2, 3}, :f64, 1)
    [{block, _, _}] = Blocks.capture(&Ops.min_gru(&1, &1), [x])
    assert block.unsupported =~ "{:f, 64}"

    q = random({1, 1, 2, 48}, :f32, 2)
    [{block, _, _}] = Blocks.capture(&Ops.attention(&1, &1, &1), [q])
    assert block.unsupported =~ "head widths"

    a = random({3, 257}, :f32, 3)
    b = random({1, 2, 257}, :f32, 4)

    [{block, _, _}] =
      Blocks.capture(&Ops.selective_scan(&1, &1, &2, &3, &3), [random({1, 2, 3}, :f32, 5), a, b])

    assert block.unsupported =~ "257"

    wx = random({1, 2, 6}, :f64, 6)
    [{block, _, _}] = Blocks.capture(&Ops.gru(&1, &2), [wx, random({2, 6}, :f64, 7)])
    assert block.unsupported =~ "{:f, 64}"
  end

  test "gated RNNs: an H above what the device's multiprocessors hold runs the default function" do
    alias ExPhil.Native.Ops.GatedRnn

    # A block holds div(256, G) units, a multiprocessor a block: 132 hold a
    # GRU of H = 11,220 and an LSTM or sLSTM of 8,448; no count, no bound.
    assert GatedRnn.hidden_unsupported(3, 11_220, 132) == nil

    assert GatedRnn.hidden_unsupported(3, 11_221, 132) =~
             "H = 11221 is more than the device's 132"

    assert GatedRnn.hidden_unsupported(4, 8_448, 132) == nil
    assert GatedRnn.hidden_unsupported(4, 8_449, 132) =~ "(8448, div(256, 4) units each)"
    assert GatedRnn.hidden_unsupported(4, 1_000_000, nil) == nil

    # The ops' forward and backward blocks, with device 0 taken to have 2
    # multiprocessors (GRU up to 170, LSTM and sLSTM up to 128).
    key = {GatedRnn, :multiprocessors}
    saved = :persistent_term.get(key, :unknown)
    :persistent_term.put(key, 2)

    try do
      for {cell, gates, fits} <- [{:gru, 3, 170}, {:lstm, 4, 128}, {:slstm, 4, 128}],
          hidden <- [fits, fits + 1] do
        wx = random({1, 2, gates * hidden}, :f32, hidden)
        r = random({hidden, gates * hidden}, :f32, hidden + 1)
        loss = fn wx, r -> Nx.sum(apply(Ops, cell, [wx, r])) end
        grad = fn wx, r -> Nx.Defn.grad({wx, r}, fn {wx, r} -> loss.(wx, r) end) end

        blocks = Blocks.capture(grad, [wx, r])
        assert length(blocks) == 2, "#{cell}: the forward and the backward block"

        for {block, _, _} <- blocks do
          if hidden == fits,
            do: assert(block.unsupported == nil, "#{cell} H #{hidden}"),
            else: assert(block.unsupported =~ "H = #{hidden} is more than the device's 2")
        end
      end
    after
      if saved == :unknown,
        do: :persistent_term.erase(key),
        else: :persistent_term.put(key, saved)
    end
  end
end
