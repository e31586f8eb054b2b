defmodule ExPhil.Native.ErrorsTest do
  # Every error path that needs no GPU: malformed arguments raise
  # ArgumentError naming the argument, the expected and the received value;
  # a well-formed call on a machine without a GPU returns {:error, :no_cuda_device}.
  use ExUnit.Case, async: true
  alias ExPhil.Native

  defp local(address, bytes), do: %{kind: :local, address: address, data_size: bytes}
  defp tensor(address, shape \\ {2, 5, 4}, type \\ {:f, 32}) do
    bytes = Tuple.product(shape) * if(type == {:f, 32}, do: 4, else: 2)
    {local(address, bytes), type, shape}
  end

  defp gpu?, do: Native.device_count() > 0

  test "types, shapes and data_size are checked" do
    assert_raise ArgumentError, ~r/argument 'gate': expected type \{:f, 32\}, \{:f, 16\} or \{:bf, 16\}, got \{:s, 32\}/, fn ->
      Native.min_gru_forward({local(4096, 160), {:s, 32}, {2, 5, 4}}, tensor(8192))
    end

    assert_raise ArgumentError, ~r/argument 'candidate': expected data_size 120 \(type \{:f, 32\} and shape \{2, 5, 3\}\), got 160/, fn ->
      Native.min_gru_forward(tensor(4096), {local(8192, 160), {:f, 32}, {2, 5, 3}})
    end

    assert_raise ArgumentError, ~r/argument 'a': expected a shape tuple of non-negative integers, got \{2, -1, 4\}/, fn ->
      Native.linear_scan_forward({local(4096, 0), {:f, 32}, {2, -1, 4}}, tensor(8192))
    end

    assert_raise ArgumentError, ~r/argument 'tau': expected a tensor \{pointer, type, shape\} or an ExPhil.Native.Buffer, got :nope/, fn ->
      Native.liquid_forward(:nope, tensor(8192))
    end

    assert_raise ArgumentError, ~r/argument 'forget': expected rank 3 \[B, T, H\], got shape \{2, 5\}/, fn ->
      Native.min_lstm_forward(tensor(4096, {2, 5}), tensor(8192), tensor(12288))
    end
  end

  test "pointer maps are checked" do
    assert_raise ArgumentError, ~r/expected a pointer map with :kind \(:local or :ipc\) and :data_size, got %\{address: 4096\}/, fn ->
      Native.min_gru_forward({%{address: 4096}, {:f, 32}, {2, 5, 4}}, tensor(8192))
    end

    assert_raise ArgumentError, ~r/expected pointer :kind :local or :ipc, got :remote/, fn ->
      Native.min_gru_forward({%{kind: :remote, data_size: 160}, {:f, 32}, {2, 5, 4}}, tensor(8192))
    end

    assert_raise ArgumentError, ~r/expected an :address that is a non-negative 64-bit integer, got -1/, fn ->
      Native.min_gru_forward({local(-1, 160), {:f, 32}, {2, 5, 4}}, tensor(8192))
    end

    assert_raise ArgumentError, ~r/expected an :ipc pointer map with a 64-byte :handle/, fn ->
      Native.min_gru_forward({%{kind: :ipc, handle: "short", data_size: 160}, {:f, 32}, {2, 5, 4}}, tensor(8192))
    end
  end

  test "options are checked" do
    assert_raise ArgumentError, ~r/argument 'opts': expected option names among :h0, :outputs, :sync, :stream, :state_type, got :bogus/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), bogus: 1)
    end

    assert_raise ArgumentError, ~r/argument 'opts': expected a keyword list or a map, got "opts"/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), "opts")
    end

    assert_raise ArgumentError, ~r/argument 'sync': expected true or false, got :maybe/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), sync: :maybe)
    end

    assert_raise ArgumentError, ~r/argument 'stream': expected :managed or an ExPhil.Native.Stream, got 140000000000/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), stream: 140_000_000_000)
    end

    assert_raise ArgumentError, ~r/argument 'state_type': expected type/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), state_type: {:f, 64})
    end

    assert_raise ArgumentError, ~r/argument 'outputs': expected a tensor for :y/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), outputs: [h_final: tensor(12288, {2, 4})])
    end

    assert_raise ArgumentError, ~r/argument 'outputs': expected a tensor for :grad_candidate/, fn ->
      Native.min_gru_backward(tensor(4096), tensor(8192), tensor(12288), tensor(16384),
        outputs: %{grad_gate: tensor(20480)}
      )
    end

    assert_raise ArgumentError, ~r/argument 'opts': expected option names among .*, got :y/, fn ->
      Native.min_gru_forward(tensor(4096), tensor(8192), outputs: [y: tensor(12288)], y: 1)
    end
  end

  test "buffer functions check their arguments" do
    assert_raise ArgumentError, ~r/argument 'shape': expected a shape with at least one element, got \{2, 0\}/, fn ->
      Native.allocate({:f, 32}, {2, 0})
    end

    assert_raise ArgumentError, ~r/argument 'data': expected 24 bytes \(type \{:f, 32\} and shape \{2, 3\}\), got 3/, fn ->
      Native.upload(<<1, 2, 3>>, {:f, 32}, {2, 3})
    end

    assert_raise ArgumentError, ~r/argument 'device': expected an integer/, fn ->
      Native.allocate({:f, 32}, {2}, device: -1)
    end

    for f <- [&Native.free/1, &Native.download/1, &Native.pointer/1, &Native.export_ipc/1] do
      assert_raise ArgumentError, ~r/argument 'buffer': expected (a tensor .* or )?an ExPhil.Native.Buffer, got :nope/, fn -> f.(:nope) end
    end

    fake = %ExPhil.Native.Buffer{ref: make_ref(), type: {:f, 32}, shape: {2}, device: 0}
    assert_raise ArgumentError, ~r/expected an ExPhil.Native.Buffer/, fn -> Native.free(fake) end

    assert_raise ArgumentError, ~r/argument 'pointer': expected an :ipc pointer map/, fn ->
      Native.import_ipc(local(4096, 8), {:f, 32}, {2})
    end

    assert_raise ArgumentError, ~r/argument 'event': expected an ExPhil.Native.Event, got :nope/, fn ->
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
      assert Native.device_count() == 0
    end
  end

  test "the library's own checks come before any device access and name the argument" do
    assert_raise ArgumentError,
                 ~r/min_gru forward: argument 'candidate': expected shape \[2, 5, 4\] \(\[B, T, H\] of 'gate'\), got \[2, 6, 4\]/,
                 fn ->
                   Native.min_gru_forward(tensor(4096), tensor(8192, {2, 6, 4}), outputs: [y: tensor(12288)])
                 end

    assert_raise ArgumentError, ~r/liquid backward: argument 'grad_y': expected dtype f32/, fn ->
      Native.liquid_backward(tensor(4096), tensor(8192), tensor(12288), tensor(16384, {2, 5, 4}, {:bf, 16}),
        outputs: [grad_tau: tensor(20480), grad_target: tensor(24576)]
      )
    end
  end
end
