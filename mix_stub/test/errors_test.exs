defmodule ExPhil.Native.ErrorsTest do
  # Every error path that needs no GPU: malformed arguments raise
  # ArgumentError naming the argument, the expected and the received value;
  # a well-formed call on a machine without a GPU returns {:error, :no_cuda_device}.
  use ExUnit.Case, async: true
  import Bitwise
  alias ExPhil.Native

  defp local(address, bytes), do: %{kind: :local, address: address, data_size: bytes}

  defp tensor(address, shape \\ {2, 5, 4}, type \\ {:f, 32}) do
    bytes = Tuple.product(shape) * if(type == {:f, 32}, do: 4, else: 2)
    {local(address, bytes), type, shape}
  end

  defp gpu?, do: Native.device_count() > 0

  # A well-formed call on fake addresses gets past every check before the
  # device's: the library's device check refuses it on a GPU machine
  # (naming `argument` when given), and it is :no_cuda_device without one.
  defp assert_reaches_device(call, argument \\ nil) do
    if gpu?() do
      prefix = if argument, do: "argument '#{argument}': ", else: ""
      assert_raise ArgumentError, ~r/#{prefix}expected device memory/, call
    else
      assert {:error, :no_cuda_device} = call.()
    end
  end

  test "types, shapes and data_size are checked" do
    assert_raise ArgumentError,
                 ~r/argument 'gate': expected type \{:f, 32\}, \{:f, 16\} or \{:bf, 16\}, got \{:s, 32\}/,
                 fn ->
                   Native.min_gru_forward({local(4096, 160), {:s, 32}, {2, 5, 4}}, tensor(8192))
                 end

    assert_raise ArgumentError,
                 ~r/argument 'candidate': expected data_size 120 \(type \{:f, 32\} and shape \{2, 5, 3\}\), got 160/,
                 fn ->
                   Native.min_gru_forward(tensor(4096), {local(8192, 160), {:f, 32}, {2, 5, 3}})
                 end

    assert_raise ArgumentError,
                 ~r/argument 'a': expected a shape tuple of non-negative integers, got \{2, -1, 4\}/,
                 fn ->
                   Native.linear_scan_forward(
                     {local(4096, 0), {:f, 32}, {2, -1, 4}},
                     tensor(8192)
                   )
                 end

    assert_raise ArgumentError,
                 ~r/argument 'tau': expected a tensor \{pointer, type, shape\} or an ExPhil.Native.Buffer, got :nope/,
                 fn ->
                   Native.liquid_forward(:nope, tensor(8192))
                 end

    assert_raise ArgumentError,
                 ~r/argument 'forget': expected rank 3 \[B, T, H\], got shape \{2, 5\}/,
                 fn ->
                   Native.min_lstm_forward(tensor(4096, {2, 5}), tensor(8192), tensor(12288))
                 end
  end

  test "pointer maps are checked" do
    assert_raise ArgumentError,
                 ~r/expected a pointer map with :kind \(:local or :ipc\) and :data_size, got %\{address: 4096\}/,
                 fn ->
                   Native.min_gru_forward({%{address: 4096}, {:f, 32}, {2, 5, 4}}, tensor(8192))
                 end

    assert_raise ArgumentError, ~r/expected pointer :kind :local or :ipc, got :remote/, fn ->
      Native.min_gru_forward(
        {%{kind: :remote, data_size: 160}, {:f, 32}, {2, 5, 4}},
        tensor(8192)
      )
    end

    assert_raise ArgumentError,
                 ~r/expected an :address that is a non-negative 64-bit integer, got -1/,
                 fn ->
                   Native.min_gru_forward({local(-1, 160), {:f, 32}, {2, 5, 4}}, tensor(8192))
                 end

    assert_raise ArgumentError, ~r/expected an :ipc pointer map with a 64-byte :handle/, fn ->
      Native.min_gru_forward(
        {%{kind: :ipc, handle: "short", data_size: 160}, {:f, 32}, {2, 5, 4}},
        tensor(8192)
      )
    end
  end

  test "options are checked" do
    assert_raise ArgumentError,
                 ~r/argument 'opts': expected option names among :h0, :outputs, :sync, :stream, :state_type, got :bogus/,
                 fn ->
                   Native.min_gru_forward(tensor(4096), tensor(8192), bogus: 1)
                 end

    assert_raise ArgumentError,
                 ~r/argument 'opts': expected a keyword list or a map, got "opts"/,
                 fn ->
                   Native.min_gru_forward(tensor(4096), tensor(8192), "opts")
                 end

    assert_raise ArgumentError, ~r/argument 'sync': expected true or false, got :maybe/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), sync: :maybe)
    end

    assert_raise ArgumentError,
                 ~r/argument 'stream': expected :managed, :legacy_default or an ExPhil.Native.Stream, got 140000000000/,
                 fn ->
                   Native.min_gru_forward(tensor(4096), tensor(8192), stream: 140_000_000_000)
                 end

    assert_raise ArgumentError, ~r/argument 'state_type': expected type/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), state_type: {:f, 64})
    end

    assert_raise ArgumentError, ~r/argument 'outputs': expected a tensor for :y/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192),
        outputs: [h_final: tensor(12288, {2, 4})]
      )
    end

    assert_raise ArgumentError,
                 ~r/argument 'outputs': expected a tensor for :grad_candidate/,
                 fn ->
                   Native.min_gru_backward(
                     tensor(4096),
                     tensor(8192),
                     tensor(12288),
                     tensor(16384),
                     outputs: %{grad_gate: tensor(20480)}
                   )
                 end

    assert_raise ArgumentError, ~r/argument 'opts': expected option names among .*, got :y/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), outputs: [y: tensor(12288)], y: 1)
    end
  end

  # stream: :legacy_default (cudaStreamLegacy, libtorch's stream) is taken by
  # every op, in both directions; anything else but :managed and a Stream is
  # refused by value, before any device access.
  defp stream_calls(opts) do
    grads = [grad_gate: tensor(20480), grad_candidate: tensor(24576)]

    [
      fn ->
        Native.min_gru_forward(tensor(4096), tensor(8192), opts ++ [outputs: [y: tensor(12288)]])
      end,
      fn ->
        Native.min_gru_backward(
          tensor(4096),
          tensor(8192),
          tensor(12288),
          tensor(16384),
          opts ++ [outputs: grads]
        )
      end,
      fn -> ss_forward(opts ++ [outputs: ss_y()]) end,
      fn -> ss_backward(opts ++ [outputs: [grad_x: tensor(28672, {2, 5, 3})]]) end,
      fn -> rnn_forward(:gru, opts ++ [outputs: [y: rnn_y()]]) end,
      fn -> rnn_backward(:lstm, opts ++ [outputs: [grad_wx: tensor(20480, {2, 5, 16})]]) end,
      fn -> rnn_forward(:slstm, opts ++ [outputs: [y: rnn_y()]]) end,
      fn ->
        q = tensor(4096, {1, 2, 3, 32})

        Native.attention_forward(
          q,
          tensor(8192, {1, 2, 3, 32}),
          tensor(12288, {1, 2, 3, 32}),
          opts ++ [outputs: [o: tensor(16384, {1, 2, 3, 32})]]
        )
      end,
      fn ->
        t = fn address -> tensor(address, {1, 2, 3, 32}) end

        Native.attention_backward(
          t.(4096),
          t.(8192),
          t.(12288),
          t.(16384),
          tensor(20480, {1, 2, 3}),
          t.(24576),
          opts ++ [outputs: [grad_q: t.(28672)]]
        )
      end
    ]
  end

  test "stream: :legacy_default is accepted by every op; other values are refused, naming them" do
    for bad <- [
          :legacy,
          :default,
          :per_thread,
          :legacy_stream,
          nil,
          true,
          "legacy_default",
          0,
          1,
          2,
          {:legacy_default},
          [:legacy_default],
          %{},
          make_ref()
        ] do
      for call <- stream_calls(stream: bad) do
        assert_raise ArgumentError,
                     ~r/argument 'stream': expected :managed, :legacy_default or an ExPhil.Native.Stream, got #{Regex.escape(inspect(bad))}/,
                     call
      end
    end

    # Well-formed: the call gets past the option and fails only where the
    # fake addresses do (no device here; the library's device check there).
    for opts <- [
          [stream: :legacy_default],
          [stream: :legacy_default, sync: false],
          [stream: :managed]
        ],
        call <- stream_calls(opts) do
      assert_reaches_device(call)
    end
  end

  test "buffer functions check their arguments" do
    assert_raise ArgumentError,
                 ~r/argument 'shape': expected a shape with at least one element, got \{2, 0\}/,
                 fn ->
                   Native.allocate({:f, 32}, {2, 0})
                 end

    assert_raise ArgumentError,
                 ~r/argument 'data': expected 24 bytes \(type \{:f, 32\} and shape \{2, 3\}\), got 3/,
                 fn ->
                   Native.upload(<<1, 2, 3>>, {:f, 32}, {2, 3})
                 end

    assert_raise ArgumentError, ~r/argument 'device': expected an integer/, fn ->
      Native.allocate({:f, 32}, {2}, device: -1)
    end

    for f <- [&Native.free/1, &Native.download/1, &Native.pointer/1, &Native.export_ipc/1] do
      assert_raise ArgumentError,
                   ~r/argument 'buffer': expected (a tensor .* or )?an ExPhil.Native.Buffer, got :nope/,
                   fn -> f.(:nope) end
    end

    fake = %ExPhil.Native.Buffer{ref: make_ref(), type: {:f, 32}, shape: {2}, device: 0}
    assert_raise ArgumentError, ~r/expected an ExPhil.Native.Buffer/, fn -> Native.free(fake) end

    assert_raise ArgumentError, ~r/argument 'pointer': expected an :ipc pointer map/, fn ->
      Native.import_ipc(local(4096, 8), {:f, 32}, {2})
    end

    assert_raise ArgumentError,
                 ~r/argument 'event': expected an ExPhil.Native.Event, got :nope/,
                 fn ->
                   Native.await(:nope)
                 end
  end

  test "well-formed calls fail cleanly where there is no GPU memory" do
    args = [tensor(4096), tensor(8192), [outputs: [y: tensor(12288)]]]

    if gpu?() do
      # fake addresses: rejected by the library's device check
      assert_raise ArgumentError, ~r/argument 'gate': expected device memory/, fn ->
        apply(Native, :min_gru_forward, args)
      end
    else
      assert {:error, :no_cuda_device} = apply(Native, :min_gru_forward, args)
      assert {:error, :no_cuda_device} = Native.min_gru_forward(tensor(4096), tensor(8192))
      assert {:error, :no_cuda_device} = Native.allocate({:f, 32}, {2, 3})
      assert {:error, :no_cuda_device} = Native.upload(<<0::size(192)>>, {:f, 32}, {2, 3})
      assert {:error, :no_cuda_device} = Native.synchronize()
      assert {:error, :no_cuda_device} = Native.new_stream()
      assert {:error, :no_cuda_device} = Native.device_info(0)
      assert {:error, :no_cuda_device} = Native.memory_held(0)
      assert {:error, :no_cuda_device} = Native.allocation_offset(4096)
      assert Native.device_count() == 0
    end
  end

  test "the library's own checks come before any device access and name the argument" do
    assert_raise ArgumentError,
                 ~r/min_gru forward: argument 'candidate': expected shape \[2, 5, 4\] \(\[B, T, H\] of 'gate'\), got \[2, 6, 4\]/,
                 fn ->
                   Native.min_gru_forward(tensor(4096), tensor(8192, {2, 6, 4}),
                     outputs: [y: tensor(12288)]
                   )
                 end

    assert_raise ArgumentError, ~r/liquid backward: argument 'grad_y': expected dtype f32/, fn ->
      Native.liquid_backward(
        tensor(4096),
        tensor(8192),
        tensor(12288),
        tensor(16384, {2, 5, 4}, {:bf, 16}),
        outputs: [grad_tau: tensor(20480), grad_target: tensor(24576)]
      )
    end
  end

  # Without outputs: the NIF allocates them, and checks the call first: bad
  # input gets its message on a machine without a GPU too, never
  # {:error, :no_cuda_device}, and no memory is taken on one with a GPU.
  test "calls whose outputs the NIF allocates are checked before it allocates them" do
    assert_raise ArgumentError,
                 ~r/min_gru forward: argument 'candidate': expected shape \[2, 5, 4\] \(\[B, T, H\] of 'gate'\), got \[2, 6, 4\]/,
                 fn -> Native.min_gru_forward(tensor(4096), tensor(8192, {2, 6, 4})) end

    assert_raise ArgumentError, ~r/min_gru forward: argument 'h0': expected shape \[2, 4\]/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), h0: tensor(12288, {2, 5}))
    end

    assert_raise ArgumentError,
                 ~r/linear_scan backward: argument 'grad_y': expected dtype f32/,
                 fn ->
                   Native.linear_scan_backward(
                     tensor(4096),
                     tensor(8192),
                     tensor(12288),
                     tensor(16384, {2, 5, 4}, {:bf, 16})
                   )
                 end

    assert_raise ArgumentError, ~r/selective_scan forward: argument 'B': expected shape/, fn ->
      [x, dt, a, _b, c] = ss_inputs()
      ss_forward([], [x, dt, a, tensor(16384, {2, 5, 5}), c])
    end

    assert_raise ArgumentError, ~r/selective_scan backward: argument 'grad_y'/, fn ->
      apply(Native, :selective_scan_backward, ss_inputs() ++ [tensor(24576, {2, 4, 3}), []])
    end

    q = tensor(1 <<< 20, {1, 2, 4, 32})
    k = tensor(2 <<< 20, {1, 1, 6, 32})

    assert_raise ArgumentError, ~r/attention forward: argument 'v': expected shape/, fn ->
      Native.attention_forward(q, k, tensor(3 <<< 20, {1, 1, 6, 16}))
    end
  end

  ## Selective scan

  # Well-formed selective-scan tensors at B2 T5 D3 N4, at fake addresses 4 KiB
  # apart (so that none overlaps): x, dt, a, b, c; then grad_y.
  defp ss_inputs do
    [
      tensor(4096, {2, 5, 3}),
      tensor(8192, {2, 5, 3}),
      tensor(12288, {3, 4}),
      tensor(16384, {2, 5, 4}),
      tensor(20480, {2, 5, 4})
    ]
  end

  defp ss_forward(opts, inputs \\ ss_inputs()),
    do: apply(Native, :selective_scan_forward, inputs ++ [opts])

  defp ss_backward(opts, inputs \\ ss_inputs()),
    do: apply(Native, :selective_scan_backward, inputs ++ [tensor(24576, {2, 5, 3}), opts])

  defp ss_y, do: [y: tensor(28672, {2, 5, 3})]

  test "selective scan: options are checked, naming the option" do
    assert_raise ArgumentError,
                 ~r/argument 'opts': expected option names among :dt_bias, :d, :z, :h0, :softplus, :clamp, :outputs, :sync, :stream, got :state_type/,
                 fn -> ss_forward(state_type: {:f, 32}) end

    # the backward recomputes the states: it takes no y
    assert_raise ArgumentError,
                 ~r/argument 'opts': expected option names among .*:grad_h_final.*, got :y/,
                 fn ->
                   ss_backward(y: tensor(28672, {2, 5, 3}))
                 end

    for bad <- [:yes, nil, 1, "true"] do
      assert_raise ArgumentError,
                   ~r/argument 'softplus': expected true or false, got #{Regex.escape(inspect(bad))}/,
                   fn ->
                     ss_forward(softplus: bad)
                   end
    end

    for bad <- [
          0.5,
          {0.1},
          {0.1, 0.5, 0.9},
          [0.1, 0.5],
          {0.1, :x},
          {"0.1", 0.5},
          {0.9, 0.1},
          {2, 1},
          {0.0, 1.0e39},
          {-1.0e300, 0.0},
          {0, 1 <<< 64}
        ] do
      assert_raise ArgumentError,
                   ~r/argument 'clamp': expected nil or \{dt_min, dt_max\} with dt_min <= dt_max, two numbers within f32's range \(floats or 64-bit integers\), got #{Regex.escape(inspect(bad))}/,
                   fn -> ss_backward(clamp: bad) end
    end

    for name <- [:dt_bias, :d, :z, :h0] do
      assert_raise ArgumentError,
                   ~r/argument '#{name}': expected a tensor \{pointer, type, shape\} or an ExPhil.Native.Buffer, got :nope/,
                   fn ->
                     ss_forward([{name, :nope}])
                   end
    end

    assert_raise ArgumentError, ~r/argument 'grad_h_final': expected a tensor/, fn ->
      ss_backward(grad_h_final: {})
    end

    assert_raise ArgumentError, ~r/argument 'sync': expected true or false, got :maybe/, fn ->
      ss_forward(sync: :maybe)
    end

    assert_raise ArgumentError,
                 ~r/argument 'stream': expected :managed, :legacy_default or an ExPhil.Native.Stream, got 1/,
                 fn ->
                   ss_backward(stream: 1)
                 end
  end

  test "selective scan: tensor arguments, the ranks output shapes rest on, and outputs: are checked" do
    [x, dt, a, b, c] = ss_inputs()

    assert_raise ArgumentError,
                 ~r/argument 'c': expected a tensor \{pointer, type, shape\} or an ExPhil.Native.Buffer, got :nope/,
                 fn ->
                   ss_forward([], [x, dt, a, b, :nope])
                 end

    assert_raise ArgumentError, ~r/argument 'grad_y': expected a tensor/, fn ->
      Native.selective_scan_backward(x, dt, a, b, c, :nope)
    end

    for opts <- [[], [outputs: ss_y()]] do
      assert_raise ArgumentError,
                   ~r/argument 'x': expected rank 3 \[B, T, D\], got shape \{2, 5\}/,
                   fn ->
                     ss_forward(opts, [tensor(4096, {2, 5}), dt, a, b, c])
                   end

      assert_raise ArgumentError,
                   ~r/argument 'a': expected rank 2 \[D, N\], got shape \{3\}/,
                   fn ->
                     ss_backward(opts, [x, dt, tensor(12288, {3}), b, c])
                   end
    end

    assert_raise ArgumentError, ~r/argument 'outputs': expected a tensor for :y/, fn ->
      ss_forward(outputs: [h_final: tensor(28672, {2, 3, 4})])
    end

    for empty <- [[], %{}] do
      assert_raise ArgumentError,
                   ~r/argument 'outputs': expected at least one output among :grad_x, :grad_dt, :grad_a, :grad_b, :grad_c, :grad_dt_bias, :grad_d, :grad_z, :grad_h0, got #{Regex.escape(inspect(empty))}/,
                   fn -> ss_backward(outputs: empty) end
    end

    # Elixir's names, not the library's
    assert_raise ArgumentError,
                 ~r/argument 'outputs': expected output names among :grad_x, .*, got :grad_A/,
                 fn ->
                   ss_backward(outputs: [grad_A: tensor(28672, {3, 4})])
                 end
  end

  test "selective scan: well-formed calls fail cleanly where there is no GPU memory" do
    grads = [grad_x: tensor(28672, {2, 5, 3})]
    absent = [dt_bias: nil, d: nil, z: nil, h0: nil, clamp: nil]

    calls = [
      fn -> ss_forward(outputs: ss_y()) end,
      fn -> ss_forward(absent ++ [outputs: ss_y()]) end,
      fn -> ss_forward(softplus: true, clamp: {0.001, 0.1}) end,
      fn -> ss_backward(outputs: grads) end,
      fn -> ss_backward(absent ++ [grad_h_final: nil, outputs: grads]) end,
      fn -> ss_backward(%{clamp: {0, 1}}) end
    ]

    for call <- calls do
      assert_reaches_device(call, "x")
    end
  end

  test "selective scan: the library's own checks come before any device access and name the argument" do
    [x, dt, a, b, _c] = ss_inputs()
    out = [outputs: ss_y()]

    assert_raise ArgumentError,
                 ~r/argument 'C': expected shape \[2, 5, 4\] \(\[B, T, N\] from 'x' and 'A'\), got \[2, 5, 3\]/,
                 fn ->
                   ss_forward(out, [x, dt, a, b, tensor(20480, {2, 5, 3})])
                 end

    assert_raise ArgumentError, ~r/argument 'A': expected dtype f32, got bf16/, fn ->
      ss_forward(out, [x, dt, tensor(12288, {3, 4}, {:bf, 16}), b, tensor(20480, {2, 5, 4})])
    end

    assert_raise ArgumentError, ~r/argument 'dt_bias': expected shape \[3\]/, fn ->
      ss_forward(out ++ [dt_bias: tensor(32768, {4})])
    end

    assert_raise ArgumentError, ~r/argument 'grad_z': expected NULL, since 'z' is absent/, fn ->
      ss_backward(outputs: [grad_z: tensor(28672, {2, 5, 3})])
    end

    assert_raise ArgumentError, ~r/argument 'A': N = 300 states per channel/, fn ->
      ss_forward(out, [
        x,
        dt,
        tensor(12288, {3, 300}),
        tensor(16384, {2, 5, 300}),
        tensor(65536, {2, 5, 300})
      ])
    end
  end

  ## GRU, LSTM and sLSTM

  # Well-formed tensors at B2 T5 H4, at fake addresses 4 KiB apart: wx and r
  # of `cell`; y, grad_y [B, T, H].
  defp rnn_inputs(cell) do
    g = ExPhil.Native.Pure.GatedRnn.gates(cell)
    [tensor(4096, {2, 5, g * 4}), tensor(8192, {4, g * 4})]
  end

  defp rnn_y, do: tensor(12288, {2, 5, 4})

  defp rnn_forward(cell, opts, inputs \\ nil),
    do: apply(Native, :"#{cell}_forward", (inputs || rnn_inputs(cell)) ++ [opts])

  defp rnn_backward(cell, opts, inputs \\ nil),
    do:
      apply(
        Native,
        :"#{cell}_backward",
        (inputs || rnn_inputs(cell)) ++ [rnn_y(), tensor(16384, {2, 5, 4}), opts]
      )

  # Each {pattern, call}: the call raises an ArgumentError whose message matches.
  defp assert_argument_errors(cases) do
    for {pattern, call} <- cases, do: assert_raise(ArgumentError, pattern, call)
  end

  test "gru, lstm and slstm: options, outputs and the ranks output shapes rest on are checked, naming them" do
    state = fn -> tensor(20480, {2, 4}) end

    assert_argument_errors([
      {~r/argument 'opts': expected option names among :bias, :h0, :precision, :outputs, :sync, :stream, got :c0/,
       fn -> rnn_forward(:gru, c0: state.()) end},
      {~r/argument 'opts': expected option names among :bias, :h0, :c0, :precision, :outputs, :sync, :stream, got :state_type/,
       fn -> rnn_forward(:lstm, state_type: {:f, 32}) end},
      {~r/argument 'opts': expected option names among :bias, :h0, :grad_h_final, :precision, :outputs, :sync, :stream, got :grad_c_final/,
       fn -> rnn_backward(:gru, grad_c_final: state.()) end},
      {~r/argument 'opts': expected option names among :bias, :h0, :c0, :n0, :m0, :outputs, :sync, :stream, got :grad_n_final/,
       fn -> rnn_forward(:slstm, grad_n_final: state.()) end},
      {~r/argument 'opts': expected option names among :bias, :h0, :c0, :grad_h_final, :grad_c_final, :precision, :outputs, :sync, :stream, got :m0/,
       fn -> rnn_backward(:lstm, m0: state.()) end},
      {~r/argument 'r': expected a tensor/,
       fn -> rnn_forward(:gru, [], [tensor(4096, {2, 5, 12}), :nope]) end},
      {~r/argument 'wx': expected rank 3 \[B, T, 3H\], got shape \{2, 5\}/,
       fn -> rnn_forward(:gru, [], [tensor(4096, {2, 5}), tensor(8192, {4, 12})]) end},
      {~r/argument 'wx': expected rank 3 \[B, T, 4H\], got shape \{2, 5\}/,
       fn -> rnn_forward(:slstm, [], [tensor(4096, {2, 5}), tensor(8192, {4, 16})]) end},
      {~r/argument 'outputs': expected output names among :grad_wx, :grad_r, :grad_bias, :grad_h0, :grad_rh, got :grad_c0/,
       fn -> rnn_backward(:gru, outputs: [grad_c0: state.()]) end},
      {~r/argument 'outputs': expected output names among :y, :h_final, :c_final, :n_final, :m_final, got :grad_n0/,
       fn -> rnn_forward(:slstm, outputs: [grad_n0: state.()]) end},
      {~r/argument 'outputs': expected at least one output among :grad_wx, :grad_r, :grad_bias, :grad_h0, :grad_c0, :grad_rh, got \[\]/,
       fn -> rnn_backward(:lstm, outputs: []) end},
      {~r/argument 'outputs': expected at least one output among :grad_wx, :grad_r, :grad_bias, :grad_h0, :grad_c0, :grad_n0, :grad_m0, :grad_rh, got \[\]/,
       fn -> rnn_backward(:slstm, outputs: []) end},
      {~r/argument 'outputs': expected a tensor for :y/,
       fn -> rnn_forward(:lstm, outputs: [h_final: state.()]) end},
      {~r/argument 'outputs': expected a tensor for :y/,
       fn -> rnn_forward(:slstm, outputs: [m_final: state.()]) end}
    ])
  end

  test "gru, lstm and slstm: the library's own checks come before any device access and name the argument" do
    bf16_state = fn -> tensor(24576, {2, 4}, {:bf, 16}) end

    # Without outputs: too (the NIF allocates them after the check).
    for opts <- [[], [outputs: [y: rnn_y()]]] do
      assert_argument_errors([
        {~r/gru forward: argument 'R': expected shape \[H, 3H\] with 3H = 12 \(the last dimension of 'wx'\), 3 times H, got \[4, 16\]/,
         fn -> rnn_forward(:gru, opts, [tensor(4096, {2, 5, 12}), tensor(8192, {4, 16})]) end},
        {~r/slstm forward: argument 'R': expected shape \[H, 4H\] with 4H = 16 \(the last dimension of 'wx'\), 4 times H, got \[4, 12\]/,
         fn -> rnn_forward(:slstm, opts, [tensor(4096, {2, 5, 16}), tensor(8192, {4, 12})]) end},
        {~r/gru forward: argument 'h0': expected shape \[2, 4\] \(\[B, H\] from 'wx' and 'R'\), got \[2, 3\]/,
         fn -> rnn_forward(:gru, opts ++ [h0: tensor(20480, {2, 3})]) end},
        {~r/slstm forward: argument 'm0': expected shape \[2, 4\] \(\[B, H\] from 'wx' and 'R'\), got \[2, 3\]/,
         fn -> rnn_forward(:slstm, opts ++ [m0: tensor(20480, {2, 3})]) end},
        {~r/lstm forward: argument 'bias': expected shape \[16\] \(\[4H\] from 'R'\), got \[12\]/,
         fn -> rnn_forward(:lstm, opts ++ [bias: tensor(20480, {12})]) end},
        {~r/lstm forward: argument 'c0': expected dtype f32 \(the dtype of 'h0'\), got bf16/,
         fn -> rnn_forward(:lstm, opts ++ [h0: tensor(20480, {2, 4}), c0: bf16_state.()]) end},
        {~r/slstm forward: argument 'n0': expected dtype f32 \(the dtype of 'c0'\), got bf16/,
         fn -> rnn_forward(:slstm, opts ++ [c0: tensor(20480, {2, 4}), n0: bf16_state.()]) end}
      ])
    end

    assert_argument_errors([
      {~r/gru forward: argument 'R': expected dtype f32/,
       fn ->
         rnn_forward(:gru, [], [tensor(4096, {2, 5, 12}), tensor(8192, {4, 12}, {:bf, 16})])
       end},
      {~r/gru backward: argument 'grad_y': expected shape \[2, 5, 4\] \(\[B, T, H\] from 'wx' and 'R'\), got \[2, 5, 3\]/,
       fn ->
         apply(Native, :gru_backward, rnn_inputs(:gru) ++ [rnn_y(), tensor(16384, {2, 5, 3}), []])
       end},
      {~r/lstm backward: argument 'grad_R': expected shape \[4, 16\] \(\[H, 4H\] of 'R'\), got \[4, 12\]/,
       fn -> rnn_backward(:lstm, outputs: [grad_r: tensor(20480, {4, 12})]) end},
      {~r/slstm backward: argument 'grad_n0': expected shape \[2, 4\] \(\[B, H\] from 'wx' and 'R'\), got \[4, 2\]/,
       fn -> rnn_backward(:slstm, outputs: [grad_n0: tensor(20480, {4, 2})]) end},
      {~r/slstm backward: argument 'grad_m_final': expected dtype f32 \(the dtype of 'h0'\), got bf16/,
       fn -> rnn_backward(:slstm, h0: tensor(20480, {2, 4}), grad_m_final: bf16_state.()) end}
    ])
  end

  test "gru, lstm and slstm: well-formed calls fail cleanly where there is no GPU memory" do
    state = tensor(20480, {2, 4})

    calls = [
      fn -> rnn_forward(:gru, outputs: [y: rnn_y()]) end,
      fn -> rnn_forward(:gru, bias: tensor(24576, {12}), h0: state) end,
      fn -> rnn_forward(:lstm, h0: nil, c0: state, outputs: [y: rnn_y()]) end,
      fn ->
        rnn_backward(:gru, grad_h_final: state, outputs: [grad_r: tensor(24576, {4, 12})])
      end,
      fn -> rnn_backward(:lstm, c0: state) end,
      fn -> rnn_forward(:slstm, n0: state, outputs: [y: rnn_y()]) end,
      fn -> rnn_forward(:slstm, bias: tensor(24576, {16}), h0: nil, m0: state) end,
      fn ->
        rnn_backward(:slstm, grad_n_final: state, outputs: [grad_m0: tensor(24576, {2, 4})])
      end,
      fn -> rnn_backward(:slstm, c0: state, n0: state, m0: state, grad_m_final: state) end
    ]

    for call <- calls do
      assert_reaches_device(call, "wx")
    end
  end

  # ExPhil.Native.Eager's NIF call for a GRU, LSTM or sLSTM block (on Torchx
  # CUDA tensors): every tensor by its name, every result of the target as
  # an output. Here it must pass every check the NIF and the library make
  # before the device's.
  test "gru, lstm and slstm: the call Eager makes for a block is well-formed" do
    for cell <- [:gru, :lstm, :slstm],
        direction <- [:forward, :backward],
        given? <- [false, true] do
      states = ExPhil.Native.Pure.GatedRnn.states(cell)
      g = ExPhil.Native.Pure.GatedRnn.gates(cell)
      {b, t, h} = {2, 5, 4}
      # 1 MiB apart: no two overlap
      fake = fn shape -> tensor(:erlang.unique_integer([:positive, :monotonic]) <<< 20, shape) end
      state = fn -> if given?, do: fake.({b, h}) end
      backward? = direction == :backward
      each_state = fn name -> for s <- states, do: {:"#{name.(s)}", state.()} end

      named =
        [wx: fake.({b, t, g * h}), r: fake.({h, g * h})] ++
          if(backward?, do: [y: fake.({b, t, h}), grad_y: fake.({b, t, h})], else: []) ++
          [bias: if(given?, do: fake.({g * h}))] ++
          each_state.(&"#{&1}0") ++
          if(backward?, do: each_state.(&"grad_#{&1}_final"), else: [])

      carries = for _ <- states, do: fake.({b, h})

      outputs =
        case direction do
          :forward ->
            [fake.({b, t, h}) | carries]

          :backward ->
            [fake.({b, t, g * h}), fake.({h, g * h}), fake.({g * h})] ++
              carries ++ [fake.({b, t, g * h})]
        end

      {fun, args} = ExPhil.Native.Eager.gated_rnn_call(cell, direction, named, outputs)
      assert fun == :"#{cell}_#{direction}"
      call = fn -> apply(Native, fun, args) end

      assert_reaches_device(call, "wx")
    end
  end

  # The same for the stacks' blocks (ExPhil.Native.Ops.gru_stack/4,
  # lstm_stack/4): L = 3 layers, the stacked shapes; every result of the
  # target an output.
  test "gru_stack and lstm_stack: the call Eager makes for a block is well-formed" do
    for cell <- [:gru, :lstm],
        direction <- [:forward, :backward],
        given? <- [false, true] do
      states = ExPhil.Native.Pure.GatedRnn.states(cell)
      g = ExPhil.Native.Pure.GatedRnn.gates(cell)
      {l, b, t, h} = {3, 2, 5, 4}
      fake = fn shape -> tensor(:erlang.unique_integer([:positive, :monotonic]) <<< 20, shape) end
      maybe = fn shape -> if given?, do: fake.(shape) end
      backward? = direction == :backward
      each_state = fn name -> for s <- states, do: {:"#{name.(s)}", maybe.({l, b, h})} end

      named =
        [wx: fake.({b, t, g * h}), r: fake.({l, h, g * h}), w: fake.({l - 1, h, g * h})] ++
          if(backward?,
            do: [y: fake.({b, t, h}), y_lower: fake.({l - 1, b, t, h}), grad_y: fake.({b, t, h})],
            else: []
          ) ++
          [bias: maybe.({l, g * h}), w_bias: maybe.({l - 1, g * h})] ++
          each_state.(&"#{&1}0") ++
          if(backward?,
            do: [grad_y_lower: maybe.({l - 1, b, t, h})] ++ each_state.(&"grad_#{&1}_final"),
            else: []
          )

      carries = for _ <- states, do: fake.({l, b, h})

      outputs =
        case direction do
          :forward ->
            [fake.({b, t, h}), fake.({l - 1, b, t, h}) | carries]

          :backward ->
            [
              fake.({b, t, g * h}),
              fake.({l, h, g * h}),
              fake.({l - 1, h, g * h}),
              fake.({l, g * h}),
              fake.({l - 1, g * h})
            ] ++ carries
        end

      {fun, args} =
        ExPhil.Native.Eager.gated_rnn_call(:"#{cell}_stack", direction, named, outputs)

      assert fun == :"#{cell}_stack_#{direction}"
      call = fn -> apply(Native, fun, args) end

      assert_reaches_device(call, "wx")
    end
  end
end
