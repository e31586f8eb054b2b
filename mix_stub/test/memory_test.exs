defmodule ExPhil.Native.MemoryTest do
  use ExUnit.Case, async: false
  @moduletag :gpu
  alias ExPhil.Native

  defp free_memory do
    :ok = Native.synchronize(0)
    {:ok, %{free_memory: free}} = Native.device_info(0)
    free
  end

  @tag timeout: 600_000
  test "100,000 allocate/free cycles and garbage-collected buffers give all device memory back" do
    before = free_memory()

    for _ <- 1..100_000 do
      {:ok, buffer} = Native.allocate({:f, 32}, {256})
      :ok = Native.free(buffer)
    end

    # 2,000 buffers of 256 KiB never freed explicitly: they go with the
    # process that held them.
    task =
      Task.async(fn ->
        for(_ <- 1..2000, do: {:ok, _} = Native.allocate({:f, 32}, {256, 256})) && :ok
      end)

    assert Task.await(task, 120_000) == :ok
    :erlang.garbage_collect()

    # The driver keeps some bookkeeping of its own; 512 MiB went through.
    assert abs(free_memory() - before) <= 64 * 1024 * 1024
  end
end
