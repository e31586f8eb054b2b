defmodule ExPhil.Native.OpsTest do
  # Every op, forward and backward, on the GPU against the Elixir reference,
  # through each way in: NIF-owned buffers, destination passing with
  # Nx-style pointer maps, sync: false with await/1, and bf16.
  use ExUnit.Case, async: false
  @moduletag :gpu
  import ExPhil.Native.GPUCase
  alias ExPhil.Native
  alias ExPhil.Native.Reference, as: R

  @dims {2, 33, 20}

  for op <- [:linear_scan, :min_gru, :min_lstm, :liquid] do
    test "#{op}: NIF-owned outputs match the reference" do
      p = problem(unquote(op), @dims)
      assert {:ok, %{y: %Native.Buffer{} = y} = fwd} = forward(p.op, p.buffers, h0: p.h0_buffer)

      assert {:ok, bwd} =
               backward(p.op, p.buffers, y, p.gy_buffer,
                 h0: p.h0_buffer,
                 grad_h_final: p.gf_buffer
               )

      assert Map.keys(bwd) |> Enum.sort() == Enum.sort([:grad_h0 | R.grad_names(p.op)])
      assert check_outputs(p, fwd, bwd) <= 1.0
    end

    test "#{op}: destination passing into pointer maps, as Nx.to_pointer gives them" do
      p = problem(unquote(op), @dims)
      {b, _, h} = @dims
      # Pointer maps borrow memory, as EXLA's do: the buffers behind them
      # must stay alive (and unfreed) until the last use of the pointers.
      owners = [p.buffers, p.h0_buffer, p.gy_buffer, p.gf_buffer]
      outputs = %{y: poisoned!(@dims), h_final: poisoned!({b, h}), grad_h0: poisoned!({b, h})}
      outputs = Enum.reduce(R.grad_names(p.op), outputs, &Map.put(&2, &1, poisoned!(@dims)))
      view = fn buffer -> {Native.pointer(buffer), {:f, 32}, buffer.shape} end
      inputs = Enum.map(p.buffers, view)
      outs = %{y: view.(outputs.y), h_final: view.(outputs.h_final)}
      assert {:ok, ^outs} = forward(p.op, inputs, h0: view.(p.h0_buffer), outputs: outs)

      grads = Map.new([:grad_h0 | R.grad_names(p.op)], &{&1, view.(outputs[&1])})

      assert {:ok, ^grads} =
               backward(p.op, inputs, outs.y, view.(p.gy_buffer),
                 h0: view.(p.h0_buffer),
                 grad_h_final: view.(p.gf_buffer),
                 outputs: grads
               )

      assert check_outputs(p, outs, grads) <= 1.0
      Enum.each(List.flatten([owners | Map.values(outputs)]), &(:ok = Native.free(&1)))
    end
  end

  test "sync: false returns an event; await/1 gives the outputs, twice" do
    p = problem(:min_gru, @dims)
    assert {:ok, %Native.Event{} = event} = forward(p.op, p.buffers, h0: p.h0_buffer, sync: false)
    assert {:ok, %{y: y} = fwd} = Native.await(event)
    assert {:ok, ^fwd} = Native.await(event)

    assert {:ok, event} =
             backward(p.op, p.buffers, y, p.gy_buffer,
               h0: p.h0_buffer,
               grad_h_final: p.gf_buffer,
               sync: false
             )

    assert {:ok, bwd} = Native.await(event)
    assert check_outputs(p, fwd, bwd) <= 1.0
  end

  test "ops on a stream of their own, and download of an Nx-style pointer map" do
    p = problem(:min_lstm, @dims)
    assert {:ok, %Native.Stream{} = stream} = Native.new_stream(device: 0)
    assert {:ok, %{y: y} = fwd} = forward(p.op, p.buffers, h0: p.h0_buffer, stream: stream)

    assert {:ok, bwd} =
             backward(p.op, p.buffers, y, p.gy_buffer,
               h0: p.h0_buffer,
               grad_h_final: p.gf_buffer,
               stream: stream
             )

    assert check_outputs(p, fwd, bwd) <= 1.0
    view = {Native.pointer(y), {:f, 32}, @dims}
    assert download!(view) == download!(y)
    # export_ipc needs memory the NIF allocated
    assert_raise ArgumentError, ~r/argument 'buffer': expected an ExPhil.Native.Buffer/, fn ->
      Native.export_ipc(view)
    end
  end

  test "an event dropped before its work finished is harmless" do
    p = problem(:liquid, {4, 500, 64})

    task =
      Task.async(fn ->
        {:ok, _event} = forward(p.op, p.buffers, sync: false)
        :dropped
      end)

    assert Task.await(task) == :dropped
    :erlang.garbage_collect()
    assert :ok = Native.synchronize(0)
    assert {:ok, %{y: y}} = forward(p.op, p.buffers, h0: p.h0_buffer)
    assert R.error_ratio(download!(y), p.ref_y, p.state_scale) <= 1.0
  end

  test "bf16 tensors with f32 state" do
    dims = {2, 40, 24}
    n = Tuple.product(dims)
    {gate, _} = R.to_bf16(R.random(n, -4.0, 4.0))
    {cand, _} = R.to_bf16(R.random(n, -2.0, 2.0))
    inputs = [upload!(gate, dims, {:bf, 16}), upload!(cand, dims, {:bf, 16})]

    assert {:ok, %{y: y, h_final: hf}} =
             Native.min_gru_forward(Enum.at(inputs, 0), Enum.at(inputs, 1))

    assert y.type == {:bf, 16} and hf.type == {:f, 32}
    {ry, rhf} = R.forward(:min_gru, [gate, cand], dims)
    scale = R.scale([ry, rhf])
    assert R.error_ratio(download!(y, {:bf, 16}), ry, scale, 3.0e-2, 2.0e-2) <= 1.0
    assert R.error_ratio(download!(hf), rhf, scale) <= 1.0
  end

  test "freed buffers are refused as arguments, and a second free says so" do
    {:ok, buffer} = Native.allocate({:f, 32}, {2, 5, 4})
    assert :ok = Native.free(buffer)
    assert {:error, :already_freed} = Native.free(buffer)

    assert_raise ArgumentError, ~r/argument 'gate': the ExPhil.Native.Buffer was freed/, fn ->
      Native.min_gru_forward(buffer, buffer)
    end
  end

  test "device_info and synchronize" do
    assert {:ok,
            %{name: name, total_memory: total, free_memory: free, compute_capability: {major, _}}} =
             Native.device_info(0)

    assert is_binary(name) and free <= total and major >= 8

    assert {:ok,
            %{workspace_reserved: reserved, workspace_in_use: in_use, capture_blocks: blocks}} =
             Native.memory_held(0)

    assert in_use <= reserved and is_integer(blocks) and blocks >= 0
    assert :ok = Native.synchronize()
    assert :ok = Native.synchronize(0)

    assert_raise ArgumentError, ~r/does not exist/, fn ->
      Native.device_info(Native.device_count())
    end

    assert_raise ArgumentError, ~r/does not exist/, fn ->
      Native.memory_held(Native.device_count())
    end
  end
end
