defmodule ExPhil.Native.ConcurrencyTest do
  use ExUnit.Case, async: false
  @moduletag :gpu
  import ExPhil.Native.GPUCase

  test "50 Erlang processes calling at once all get correct results" do
    ops = [:linear_scan, :min_gru, :min_lstm, :liquid]

    tasks =
      for i <- 1..50 do
        Task.async(fn ->
          p = problem(Enum.at(ops, rem(i, 4)), {1 + rem(i, 3), 17 + i, 8 + rem(i, 5)})
          {:ok, %{y: y} = fwd} = forward(p.op, p.buffers, h0: p.h0_buffer)

          {:ok, bwd} =
            backward(p.op, p.buffers, y, p.gy_buffer, h0: p.h0_buffer, grad_h_final: p.gf_buffer)

          {p.op, check_outputs(p, fwd, bwd)}
        end)
      end

    for {op, ratio} <- Task.await_many(tasks, 300_000),
        do: assert(ratio <= 1.0, "#{op}: #{ratio}")
  end
end
