defmodule ExPhil.Native.NxOpsTest do
  # ExPhil.Native.Ops on the BinaryBackend, where every block runs its
  # default function: the values are the pure implementations' (tested
  # against the double-precision references in the pure_*_test files), the
  # gradients through custom_grad and the backward block equal Nx's own
  # derivative of the pure forward, and bad arguments raise naming what
  # was expected and what came.
  use ExUnit.Case, async: true

  alias ExPhil.Native.{Ops, Pure}
  alias ExPhil.Native.Ops.Args

  # f32 gradients by two routes (a hand-written backward, Nx's autodiff of
  # the forward) differ by rounding only: relative to the family's largest
  # magnitude, as the reference comparisons measure it.
  @grad_tolerance 2.0e-5

  defp random(shape, type, seed, range \\ {-1.0, 1.0}) do
    {lo, hi} = range
    {t, _} = Nx.Random.uniform(Nx.Random.key(seed), lo, hi, shape: shape, type: :f32)
    Nx.as_type(t, type)
  end

  defp assert_close(got, expected, tolerance \\ @grad_tolerance) do
    assert Nx.shape(got) == Nx.shape(expected)
    assert Nx.type(got) == Nx.type(expected)
    got = Nx.as_type(got, :f64)
    expected = Nx.as_type(expected, :f64)
    scale = max(Nx.to_number(Nx.reduce_max(Nx.abs(expected))), 1.0e-30)
    error = Nx.to_number(Nx.reduce_max(Nx.abs(Nx.subtract(got, expected))))
    assert error <= tolerance * scale, "max error #{error}, scale #{scale}"
  end

  # Each {fun, message}: fun raises an ArgumentError whose message holds message.
  defp assert_errors(errors) do
    for {fun, message} <- errors do
      error = assert_raise ArgumentError, fun
      assert error.message =~ message
    end
  end

  defp assert_all_close(got, expected) do
    Enum.zip_with(List.wrap(got), List.wrap(expected), &assert_close/2)
  end

  @scan_inputs %{
    linear_scan: [{-1.0, 1.0}, {-1.0, 1.0}],
    min_gru: [{-4.0, 4.0}, {-2.0, 2.0}],
    min_lstm: [{-4.0, 4.0}, {-4.0, 4.0}, {-2.0, 2.0}],
    liquid: [{0.5, 8.0}, {-2.0, 2.0}]
  }

  defp scan_inputs(op, shape, type) do
    @scan_inputs[op]
    |> Enum.with_index(1)
    |> Enum.map(fn {range, i} -> random(shape, type, i, range) end)
  end

  describe "scans" do
    for op <- [:linear_scan, :min_gru, :min_lstm, :liquid] do
      test "#{op}: eager values are the pure implementation's, with and without h0" do
        op = unquote(op)

        for type <- [{:f, 32}, {:bf, 16}], h0 <- [nil, random({2, 3}, :f32, 9)] do
          inputs = scan_inputs(op, {2, 7, 3}, type)
          {y, h_final} = apply(Ops, op, inputs ++ [[h0: h0, final_state: true]])
          assert {y, h_final} == Pure.Scan.forward(op, inputs, h0)
          assert apply(Ops, op, inputs ++ [[h0: h0]]) == y
        end
      end

      test "#{op}: inside defn, and its gradient equals Nx's derivative of the pure forward" do
        op = unquote(op)
        inputs = scan_inputs(op, {2, 9, 3}, {:f, 32})
        h0 = random({2, 3}, :f32, 9)
        weights = {random({2, 9, 3}, :f32, 10), random({2, 3}, :f32, 11)}

        loss = fn forward ->
          fn {inputs, h0} ->
            {y, h_final} = forward.(Tuple.to_list(inputs), h0)
            {wy, wh} = weights
            Nx.add(Nx.sum(Nx.multiply(y, wy)), Nx.sum(Nx.multiply(h_final, wh)))
          end
        end

        native =
          loss.(fn inputs, h0 -> apply(Ops, op, inputs ++ [[h0: h0, final_state: true]]) end)

        pure = loss.(fn inputs, h0 -> Pure.Scan.forward(op, inputs, h0) end)
        args = {List.to_tuple(inputs), h0}

        assert_close(Nx.Defn.jit(native).(args), pure.(args))
        {grad_inputs, grad_h0} = Nx.Defn.grad(args, native)
        {expected_inputs, expected_h0} = Nx.Defn.grad(args, pure)
        assert_all_close(Tuple.to_list(grad_inputs), Tuple.to_list(expected_inputs))
        assert_close(grad_h0, expected_h0)
      end
    end

    test "h0 of another float type is converted to f32" do
      [gate, candidate] = scan_inputs(:min_gru, {1, 4, 2}, {:f, 32})
      h0 = random({1, 2}, :bf16, 3)
      expected = Ops.min_gru(gate, candidate, h0: Nx.as_type(h0, :f32))
      assert Ops.min_gru(gate, candidate, h0: h0) == expected

      # Nx passes a gradient through as_type unconverted: it stays f32.
      grad = Nx.Defn.grad(h0, fn h0 -> Nx.sum(Ops.min_gru(gate, candidate, h0: h0)) end)

      expected =
        Nx.Defn.grad(h0, fn h0 ->
          Nx.sum(Ops.min_gru(gate, candidate, h0: Nx.as_type(h0, :f32)))
        end)

      assert grad == expected
    end

    test "f64, which only the default function takes, keeps f64 states" do
      [a, b] = scan_inputs(:linear_scan, {1, 5, 2}, {:f, 64})
      {y, h_final} = Ops.linear_scan(a, b, final_state: true)
      assert {Nx.type(y), Nx.type(h_final)} == {{:f, 64}, {:f, 64}}
      assert {y, h_final} == Pure.Scan.forward(:linear_scan, [a, b], nil)
    end

    test "bad arguments raise, naming the argument, the expected and the received value" do
      [g, c] = scan_inputs(:min_gru, {2, 3, 4}, {:f, 32})

      errors = [
        {fn -> Ops.min_gru(Nx.reshape(g, {6, 4}), c) end,
         "ExPhil.Native.Ops.min_gru/3: argument 'gate' expected rank 3 ({batch, steps, hidden}), got shape: {6, 4}"},
        {fn -> Ops.min_gru(g, Nx.slice(c, [0, 0, 0], [2, 3, 3])) end,
         "argument 'candidate' expected shape {2, 3, 4} (the shape of 'gate'), got: {2, 3, 3}"},
        {fn -> Ops.min_gru(g, Nx.as_type(c, :bf16)) end,
         "argument 'candidate' expected type {:f, 32} (the type of 'gate'), got: {:bf, 16}"},
        {fn -> Ops.min_gru(Nx.as_type(g, :s32), Nx.as_type(c, :s32)) end,
         "argument 'gate' expected a floating-point tensor, got type: {:s, 32}"},
        {fn -> Ops.min_gru(1.0, c) end, "argument 'gate' expected a tensor, got: 1.0"},
        {fn -> Ops.min_gru(g, c, h0: Nx.iota({4, 2}, type: :f32)) end,
         "argument 'h0' expected shape {2, 4} ({batch, hidden} of 'gate'), got: {4, 2}"},
        {fn -> Ops.min_gru(g, c, state: true) end,
         "ExPhil.Native.Ops.min_gru/3: unknown options [:state], expected one of [:h0, :final_state]"},
        {fn -> Ops.min_lstm(g, c, c, h0: 1) end,
         "ExPhil.Native.Ops.min_lstm/4: argument 'h0' expected a tensor, got: 1"}
      ]

      assert_errors(errors)
    end
  end

  describe "selective scan" do
    setup do
      {b, t, d, n} = {2, 6, 3, 4}

      %{
        x: random({b, t, d}, :f32, 1),
        dt: random({b, t, d}, :f32, 2, {-1.0, 0.5}),
        a: random({d, n}, :f32, 3, {-2.0, -0.1}),
        b: random({b, t, n}, :f32, 4),
        c: random({b, t, n}, :f32, 5),
        dt_bias: random({d}, :f32, 6),
        d: random({d}, :f32, 7),
        z: random({b, t, d}, :f32, 8),
        h0: random({b, d, n}, :f32, 9)
      }
    end

    test "eager values are the pure implementation's, for each option set", t do
      for optional <- [[], [:dt_bias, :d, :z, :h0], [:z, :h0]], softplus <- [false, true] do
        opts = Enum.map(optional, &{&1, t[&1]}) ++ [softplus: softplus, clamp: {0.01, 0.5}]
        {y, h_final} = Ops.selective_scan(t.x, t.dt, t.a, t.b, t.c, opts ++ [final_state: true])
        assert {y, h_final} == Pure.SelectiveScan.forward(t.x, t.dt, t.a, t.b, t.c, opts)
      end
    end

    test "its gradient in every input equals Nx's derivative of the pure forward", t do
      opts = fn inputs ->
        [dt_bias: inputs.dt_bias, d: inputs.d, z: inputs.z, h0: inputs.h0, softplus: true]
      end

      weights = {random({2, 6, 3}, :f32, 10), random({2, 3, 4}, :f32, 11)}

      loss = fn forward ->
        fn inputs ->
          {y, h_final} = forward.(inputs)
          {wy, wh} = weights
          Nx.add(Nx.sum(Nx.multiply(y, wy)), Nx.sum(Nx.multiply(h_final, wh)))
        end
      end

      native =
        loss.(fn i ->
          Ops.selective_scan(i.x, i.dt, i.a, i.b, i.c, opts.(i) ++ [final_state: true])
        end)

      pure = loss.(fn i -> Pure.SelectiveScan.forward(i.x, i.dt, i.a, i.b, i.c, opts.(i)) end)
      inputs = Map.new(t, & &1) |> Map.take([:x, :dt, :a, :b, :c, :dt_bias, :d, :z, :h0])

      assert_close(Nx.Defn.jit(native).(inputs), pure.(inputs))
      grads = Nx.Defn.grad(inputs, native)
      expected = Nx.Defn.grad(inputs, pure)

      for key <- Map.keys(inputs) do
        assert_close(grads[key], expected[key])
      end
    end

    test "bad arguments raise", t do
      errors = [
        {fn -> Ops.selective_scan(t.x, t.dt, Nx.transpose(t.a), t.b, t.c) end,
         "argument 'a' expected shape {3, 3} ({channels, states}, channels from 'x'), got: {4, 3}"},
        {fn -> Ops.selective_scan(t.x, t.dt, t.a, t.x, t.c) end,
         "argument 'b' expected shape {2, 6, 4} ({batch, steps, states} of 'x' and 'a'), got: {2, 6, 3}"},
        {fn -> Ops.selective_scan(t.x, t.dt, t.a, t.b, t.c, d: t.a) end,
         "argument 'd' expected shape {3} ({channels} of 'x'), got: {3, 4}"},
        {fn -> Ops.selective_scan(t.x, t.dt, t.a, t.b, t.c, clamp: {1.0, 0.5}) end,
         "option :clamp expected nil or {dt_min, dt_max} with dt_min <= dt_max, got: {1.0, 0.5}"},
        {fn -> Ops.selective_scan(t.x, t.dt, t.a, t.b, t.c, softplus: 1) end,
         "option :softplus expected a boolean, got: 1"}
      ]

      assert_errors(errors)
    end
  end

  describe "attention" do
    setup do
      %{
        q: random({2, 4, 5, 8}, :f32, 1),
        k: random({2, 2, 6, 8}, :f32, 2),
        v: random({2, 2, 6, 8}, :f32, 3)
      }
    end

    test "eager values are the pure implementation's, for every mask", t do
      for opts <- [[], [mask: :causal], [mask: :window, window: 2, scale: 0.5]] do
        {o, _lse} = Pure.Attention.forward(t.q, t.k, t.v, opts)
        assert Ops.attention(t.q, t.k, t.v, opts) == o
      end
    end

    test "its gradient equals Nx's derivative of the pure forward", t do
      w = random({2, 4, 5, 8}, :f32, 4)
      opts = [mask: :causal, scale: 0.4]
      native = fn {q, k, v} -> Nx.sum(Nx.multiply(Ops.attention(q, k, v, opts), w)) end

      pure = fn {q, k, v} ->
        {o, _lse} = Pure.Attention.forward(q, k, v, opts)
        Nx.sum(Nx.multiply(o, w))
      end

      args = {t.q, t.k, t.v}
      assert_close(Nx.Defn.jit(native).(args), pure.(args))

      assert_all_close(
        Tuple.to_list(Nx.Defn.grad(args, native)),
        Tuple.to_list(Nx.Defn.grad(args, pure))
      )
    end

    test "bad arguments raise", t do
      errors = [
        {fn ->
           Ops.attention(
             t.q,
             Nx.slice_along_axis(t.k, 0, 1, axis: 1) |> Nx.tile([1, 3, 1, 1]),
             t.v
           )
         end, "argument 'k' expected a number of heads that divides the 4 of 'q', got: 3"},
        {fn -> Ops.attention(t.q, t.k, t.v, mask: :window) end,
         "option :window expected a positive integer with mask: :window, got: nil"},
        {fn -> Ops.attention(t.q, t.k, t.v, window: 3) end,
         "option :window is for mask: :window only"},
        {fn -> Ops.attention(t.q, t.k, t.v, layout: :tbhd) end,
         "option :layout expected :bhtd or :bthd, got: :tbhd"},
        {fn -> Ops.attention(t.q, t.k, t.v, scale: 0) end,
         "option :scale expected nil or a nonzero number, got: 0"},
        {fn -> Ops.attention(t.q, Nx.as_type(t.k, :f16), t.v) end,
         "argument 'k' expected type {:f, 32} (the type of 'q'), got: {:f, 16}"}
      ]

      assert_errors(errors)
    end
  end

  describe "gru, lstm and slstm" do
    # {batch, steps, hidden}; the optional inputs of each cell.
    @rnn_dims {2, 6, 3}
    @rnn_optional %{
      gru: [:bias, :h0],
      lstm: [:bias, :h0, :c0],
      slstm: [:bias, :h0, :c0, :n0, :m0]
    }

    # wx, r and every optional input of `cell`, of sequence type `type`.
    defp rnn_inputs(cell, type, {b, t, h} \\ @rnn_dims) do
      g = Pure.GatedRnn.gates(cell)

      optional = %{
        bias: random({g * h}, type, 3, {-0.5, 0.5}),
        h0: random({b, h}, type, 4),
        c0: random({b, h}, type, 5),
        n0: random({b, h}, type, 6, {1.0, 2.0}),
        m0: random({b, h}, type, 7)
      }

      %{
        wx: random({b, t, g * h}, type, 1, {-2.0, 2.0}),
        r: random({h, g * h}, type, 2, {-0.6, 0.6})
      }
      |> Map.merge(Map.take(optional, @rnn_optional[cell]))
    end

    # The op's call on `inputs` (a map), with the optional inputs among `keys`.
    defp rnn_call(cell, inputs, keys, opts \\ []) do
      optional = for key <- keys, do: {key, inputs[key]}
      apply(Ops, cell, [inputs.wx, inputs.r, optional ++ opts])
    end

    # The pure forward's results as the op returns them with final_state: true.
    defp rnn_pure(cell, inputs, keys) do
      state = Args.state_type(Nx.type(inputs.wx))
      up = &Nx.as_type(&1, state)
      optional = for key <- keys, do: {key, up.(inputs[key])}
      out = Pure.GatedRnn.forward(cell, inputs.wx, up.(inputs.r), optional)
      finals = for key <- [:h_final, :c_final, :n_final, :m_final], out[key], do: out[key]
      List.to_tuple([out.y | finals])
    end

    for cell <- [:gru, :lstm, :slstm] do
      test "#{cell}: eager values are the pure implementation's, with and without the optional inputs" do
        cell = unquote(cell)

        for type <- [{:f, 32}, {:bf, 16}], keys <- [[], [:h0], @rnn_optional[cell]] do
          inputs = rnn_inputs(cell, type)
          out = rnn_call(cell, inputs, keys, final_state: true)
          assert out == rnn_pure(cell, inputs, keys)
          assert rnn_call(cell, inputs, keys) == elem(out, 0)
          assert Nx.type(elem(out, 0)) == type
          assert Nx.type(elem(out, 1)) == {:f, 32}
        end
      end

      test "#{cell}: inside defn, its gradient in every input equals Nx's derivative of the pure forward" do
        cell = unquote(cell)
        {b, t, h} = @rnn_dims

        # every optional input and final state; none; h0 alone without the final states
        for {keys, finals?} <- [{@rnn_optional[cell], true}, {[], true}, {[:h0], false}] do
          inputs = rnn_inputs(cell, {:f, 32}) |> Map.take([:wx, :r | keys])
          w_y = random({b, t, h}, :f32, 10)

          w_finals = if finals?, do: Enum.map(11..14, &random({b, h}, :f32, &1)), else: []

          loss = fn forward ->
            fn inputs ->
              [y | finals] = inputs |> forward.() |> Tuple.to_list()

              Enum.zip_with(finals, w_finals, &Nx.sum(Nx.multiply(&1, &2)))
              |> Enum.reduce(Nx.sum(Nx.multiply(y, w_y)), &Nx.add/2)
            end
          end

          native = loss.(&rnn_call(cell, &1, keys, final_state: true))
          pure = loss.(&rnn_pure(cell, &1, keys))

          assert_close(Nx.Defn.jit(native).(inputs), pure.(inputs))
          grads = Nx.Defn.grad(inputs, native)
          expected = Nx.Defn.grad(inputs, pure)
          assert Map.keys(grads) == Map.keys(inputs)

          for key <- Map.keys(inputs) do
            assert_close(grads[key], expected[key])
          end
        end
      end

      test "#{cell}: f64 (the default function only) keeps f64, and its gradient is the pure forward's derivative" do
        cell = unquote(cell)
        keys = @rnn_optional[cell]
        inputs = rnn_inputs(cell, {:f, 64})
        out = rnn_call(cell, inputs, keys, final_state: true)
        assert Enum.map(Tuple.to_list(out), &Nx.type/1) |> Enum.uniq() == [{:f, 64}]

        {b, t, h} = @rnn_dims
        w_y = random({b, t, h}, :f64, 20)
        w_f = random({b, h}, :f64, 21)

        loss = fn forward ->
          fn inputs ->
            [y | finals] = Tuple.to_list(forward.(inputs))

            Enum.reduce(finals, Nx.sum(Nx.multiply(y, w_y)), fn f, acc ->
              Nx.add(acc, Nx.sum(Nx.multiply(f, w_f)))
            end)
          end
        end

        grads = Nx.Defn.grad(inputs, loss.(&rnn_call(cell, &1, keys, final_state: true)))
        expected = Nx.Defn.grad(inputs, loss.(&rnn_pure(cell, &1, keys)))

        for key <- Map.keys(inputs) do
          assert Nx.type(grads[key]) == {:f, 64}
          assert_close(grads[key], expected[key], 1.0e-12)
        end
      end
    end

    test "r, bias and the initial states of another float type are converted to f32" do
      for cell <- [:lstm, :slstm] do
        inputs = rnn_inputs(cell, {:f, 32})
        keys = @rnn_optional[cell]

        half =
          Map.new(inputs, fn {k, t} -> {k, if(k == :wx, do: t, else: Nx.as_type(t, :bf16))} end)

        f32 = Map.new(half, fn {k, t} -> {k, Nx.as_type(t, :f32)} end)

        assert rnn_call(cell, half, keys, final_state: true) ==
                 rnn_call(cell, f32, keys, final_state: true)

        # Nx passes a gradient through as_type unconverted: it stays f32.
        grads = Nx.Defn.grad(half, &Nx.sum(rnn_call(cell, &1, keys)))

        expected =
          Nx.Defn.grad(
            half,
            &Nx.sum(rnn_call(cell, Map.new(&1, fn {k, t} -> {k, Nx.as_type(t, :f32)} end), keys))
          )

        assert grads == expected
      end
    end

    test "bad arguments raise, naming the argument, the expected and the received value" do
      %{wx: wx, r: r, h0: h0} = rnn_inputs(:gru, {:f, 32})
      %{wx: wx4, r: r4} = rnn_inputs(:lstm, {:f, 32})

      errors = [
        {fn -> Ops.gru(Nx.reshape(wx, {12, 9}), r) end,
         "ExPhil.Native.Ops.gru/3: argument 'wx' expected rank 3 ({batch, steps, 3 * hidden}), got shape: {12, 9}"},
        {fn -> Ops.gru(wx, Nx.reshape(r, {27})) end,
         "argument 'r' expected rank 2 ({hidden, 3 * hidden}), got shape: {27}"},
        {fn -> Ops.gru(wx, r4) end,
         "argument 'r' expected shape {3, 9} ({hidden, 3 * hidden}, hidden from its first axis), got: {3, 12}"},
        {fn -> Ops.lstm(wx, r4) end,
         "ExPhil.Native.Ops.lstm/3: argument 'wx' expected shape {2, 6, 12} ({batch, steps, 4 * hidden}, hidden from 'r'), got: {2, 6, 9}"},
        {fn -> Ops.gru(Nx.as_type(wx, :s32), r) end,
         "argument 'wx' expected a floating-point tensor, got type: {:s, 32}"},
        {fn -> Ops.gru(wx, Nx.as_type(r, :s32)) end,
         "argument 'r' expected a floating-point tensor, got type: {:s, 32}"},
        {fn -> Ops.gru([1.0], r) end, "argument 'wx' expected a tensor, got: [1.0]"},
        {fn -> Ops.gru(wx, r, bias: Nx.iota({3}, type: :f32)) end,
         "argument 'bias' expected shape {9} ({3 * hidden} of 'r'), got: {3}"},
        {fn -> Ops.gru(wx, r, h0: Nx.transpose(h0)) end,
         "argument 'h0' expected shape {2, 3} ({batch, hidden} of 'wx' and 'r'), got: {3, 2}"},
        {fn -> Ops.lstm(wx4, r4, c0: false) end,
         "ExPhil.Native.Ops.lstm/3: argument 'c0' expected a tensor, got: false"},
        {fn -> Ops.gru(wx, r, c0: h0) end,
         "ExPhil.Native.Ops.gru/3: unknown options [:c0], expected one of [:bias, :h0, :final_state, :precision]"},
        {fn -> Ops.gru(wx, r, final_state: :yes) end,
         "ExPhil.Native.Ops.gru/3: option :final_state expected a boolean, got: :yes"},
        {fn -> Ops.slstm(wx, r) end,
         "ExPhil.Native.Ops.slstm/3: argument 'r' expected shape {3, 12} ({hidden, 4 * hidden}, hidden from its first axis), got: {3, 9}"},
        {fn -> Ops.slstm(wx4, r4, n0: :one) end,
         "ExPhil.Native.Ops.slstm/3: argument 'n0' expected a tensor, got: :one"},
        {fn -> Ops.slstm(wx4, r4, m0: Nx.transpose(h0)) end,
         "ExPhil.Native.Ops.slstm/3: argument 'm0' expected shape {2, 3} ({batch, hidden} of 'wx' and 'r'), got: {3, 2}"},
        {fn -> Ops.slstm(wx4, r4, n0: Nx.as_type(h0, :s32)) end,
         "argument 'n0' expected a floating-point tensor, got type: {:s, 32}"},
        {fn -> Ops.lstm(wx4, r4, n0: h0) end,
         "ExPhil.Native.Ops.lstm/3: unknown options [:n0], expected one of [:bias, :h0, :c0, :final_state, :precision]"},
        {fn -> Ops.slstm(wx4, r4, grad_m_final: h0) end,
         "ExPhil.Native.Ops.slstm/3: unknown options [:grad_m_final], expected one of [:bias, :h0, :c0, :n0, :m0, :final_state]"}
      ]

      assert_errors(errors)
    end
  end

  describe "gradients against central finite differences, in f64" do
    # In f64 (which the pure implementations compute in f64) a central
    # difference with step 1e-6 is good to about 1e-10 of the gradients'
    # scale (seen: at most 5e-10): the gradients through custom_grad and the
    # backward block's default must agree to 1e-8 of the largest gradient.
    @fd_step 1.0e-6
    @fd_tolerance 1.0e-8

    defp finite_differences(inputs, loss) do
      Map.new(inputs, fn {key, tensor} ->
        values = Nx.to_flat_list(tensor)

        grads =
          for i <- 0..(length(values) - 1) do
            at = fn delta ->
              bumped = List.update_at(values, i, &(&1 + delta))

              inputs
              |> Map.put(key, Nx.tensor(bumped, type: :f64) |> Nx.reshape(Nx.shape(tensor)))
              |> loss.()
            end

            (Nx.to_number(at.(@fd_step)) - Nx.to_number(at.(-@fd_step))) / (2 * @fd_step)
          end

        {key, Nx.tensor(grads, type: :f64) |> Nx.reshape(Nx.shape(tensor))}
      end)
    end

    defp assert_matches_finite_differences(inputs, loss) do
      analytic = Nx.Defn.grad(inputs, loss)
      numeric = finite_differences(inputs, loss)

      scale =
        numeric
        |> Map.values()
        |> Enum.map(&Nx.to_number(Nx.reduce_max(Nx.abs(&1))))
        |> Enum.max()

      for {key, expected} <- numeric do
        error = Nx.to_number(Nx.reduce_max(Nx.abs(Nx.subtract(analytic[key], expected))))
        assert error <= @fd_tolerance * scale, "#{key}: max error #{error}, scale #{scale}"
      end
    end

    for op <- [:linear_scan, :min_gru, :min_lstm, :liquid] do
      test "#{op}, with h0 and both outputs" do
        op = unquote(op)
        [first | _] = inputs = scan_inputs(op, {2, 5, 3}, {:f, 64})
        names = Enum.map(1..length(inputs), &:"input#{&1}")
        w_y = random(Nx.shape(first), :f64, 20)
        w_h = random({2, 3}, :f64, 21)

        loss = fn args ->
          seq = Enum.map(names, &args[&1])
          {y, h_final} = apply(Ops, op, seq ++ [[h0: args.h0, final_state: true]])
          Nx.add(Nx.sum(Nx.multiply(y, w_y)), Nx.sum(Nx.multiply(h_final, w_h)))
        end

        args = names |> Enum.zip(inputs) |> Map.new() |> Map.put(:h0, random({2, 3}, :f64, 9))
        assert_matches_finite_differences(args, loss)
      end
    end

    test "selective scan, every input, softplus" do
      {b, t, d, n} = {1, 4, 2, 3}

      args = %{
        x: random({b, t, d}, :f64, 1),
        dt: random({b, t, d}, :f64, 2, {-1.0, 0.5}),
        a: random({d, n}, :f64, 3, {-2.0, -0.1}),
        b: random({b, t, n}, :f64, 4),
        c: random({b, t, n}, :f64, 5),
        dt_bias: random({d}, :f64, 6),
        d: random({d}, :f64, 7),
        z: random({b, t, d}, :f64, 8),
        h0: random({b, d, n}, :f64, 9)
      }

      w_y = random({b, t, d}, :f64, 10)
      w_h = random({b, d, n}, :f64, 11)

      loss = fn i ->
        opts = [dt_bias: i.dt_bias, d: i.d, z: i.z, h0: i.h0, softplus: true, final_state: true]
        {y, h_final} = Ops.selective_scan(i.x, i.dt, i.a, i.b, i.c, opts)
        Nx.add(Nx.sum(Nx.multiply(y, w_y)), Nx.sum(Nx.multiply(h_final, w_h)))
      end

      assert_matches_finite_differences(args, loss)
    end

    test "attention, grouped heads, causal" do
      args = %{
        q: random({1, 2, 3, 4}, :f64, 1),
        k: random({1, 1, 4, 4}, :f64, 2),
        v: random({1, 1, 4, 4}, :f64, 3)
      }

      w = random({1, 2, 3, 4}, :f64, 4)
      loss = fn i -> Nx.sum(Nx.multiply(Ops.attention(i.q, i.k, i.v, mask: :causal), w)) end
      assert_matches_finite_differences(args, loss)
    end
  end

  test "a VM with Nx alone (no EXLA, no Axon) loads the library, and the ops run pure" do
    paths =
      for app <- [:nx, :complex, :telemetry, :exphil_native],
          do: ["-pa", Path.join(:code.lib_dir(app), "ebin")]

    script = """
    {:ok, _} = Application.ensure_all_started(:nx)
    x = Nx.iota({1, 3, 2}, type: :f32) |> Nx.divide(6)
    false = Code.ensure_loaded?(EXLA.CustomCall)
    false = Code.ensure_loaded?(Axon)
    y = ExPhil.Native.Ops.min_gru(x, x)
    IO.puts(inspect(Nx.to_flat_list(y)))
    """

    {output, status} =
      System.cmd(System.find_executable("elixir"), List.flatten(paths) ++ ["-e", script],
        stderr_to_stdout: true
      )

    assert status == 0, output

    [gate, candidate] = [
      Nx.iota({1, 3, 2}, type: :f32) |> Nx.divide(6),
      Nx.iota({1, 3, 2}, type: :f32) |> Nx.divide(6)
    ]

    assert output =~
             inspect(
               Nx.to_flat_list(Pure.Scan.forward(:min_gru, [gate, candidate], nil) |> elem(0))
             )
  end
end
