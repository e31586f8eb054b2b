# Time of one ExPhil.Native call from Elixir, including the wait for the GPU,
# at the user's inference shape: min_gru forward, B1 T32 H256, f32.
#
#   mix run bench/call_overhead.exs [KERNEL_US]
#
# KERNEL_US: the kernel's own time from the C++ benchmark in the same
# session (exphil_bench, graph replay); the overhead is the median call
# minus that. Runs in one process, like the game loop it stands for.
alias ExPhil.Native

if Native.device_count() == 0 do
  IO.puts("call_overhead: no CUDA device; nothing measured")
  System.halt(0)
end

kernel_us =
  case System.argv() do
    [us] -> String.to_float(us)
    _ -> nil
  end

dims = {1, 32, 256}
n = Tuple.product(dims)

upload = fn lo, hi ->
  elem(
    Native.upload(
      for(_ <- 1..n, into: <<>>, do: <<lo + (hi - lo) * :rand.uniform()::float-32-native>>),
      {:f, 32},
      dims
    ),
    1
  )
end

gate = upload.(-4.0, 4.0)
cand = upload.(-2.0, 2.0)
{:ok, y} = Native.allocate({:f, 32}, dims)
{:ok, h_final} = Native.allocate({:f, 32}, {1, 256})
{:ok, h0} = Native.allocate({:f, 32}, {1, 256})
pointer = fn b, shape -> {Native.pointer(b), {:f, 32}, shape} end
{:ok, stream} = Native.new_stream()

variants = [
  {"buffers, destination passing",
   fn -> Native.min_gru_forward(gate, cand, h0: h0, outputs: [y: y, h_final: h_final]) end},
  {"Nx pointer maps, destination passing",
   fn ->
     Native.min_gru_forward(pointer.(gate, dims), pointer.(cand, dims),
       h0: pointer.(h0, {1, 256}),
       outputs: [y: pointer.(y, dims), h_final: pointer.(h_final, {1, 256})]
     )
   end},
  {"NIF-owned outputs (allocates 2 buffers)",
   fn -> Native.min_gru_forward(gate, cand, h0: h0) end},
  {"own ExPhil.Native.Stream, destination passing",
   fn ->
     Native.min_gru_forward(gate, cand, h0: h0, outputs: [y: y, h_final: h_final], stream: stream)
   end},
  {"sync: false, then await/1",
   fn ->
     {:ok, event} =
       Native.min_gru_forward(gate, cand, h0: h0, outputs: [y: y, h_final: h_final], sync: false)

     Native.await(event)
   end}
]

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end
percentile = fn xs, p -> xs |> Enum.sort() |> Enum.at(trunc(length(xs) * p)) end

IO.puts(
  "min_gru forward B1 T32 H256 f32 from Elixir: wall time per call, including the wait (us)"
)

IO.puts(String.pad_trailing("variant", 42) <> "  median     p10     p90   overhead")

for {name, call} <- variants do
  for _ <- 1..2000, do: {:ok, _} = call.()

  times =
    for _ <- 1..20_000 do
      t0 = System.monotonic_time(:nanosecond)
      {:ok, _} = call.()
      (System.monotonic_time(:nanosecond) - t0) / 1000
    end

  m = median.(times)
  fmt = fn x -> x |> :erlang.float_to_binary(decimals: 2) |> String.pad_leading(8) end
  overhead = if kernel_us, do: fmt.(m - kernel_us), else: String.pad_leading("-", 8)

  IO.puts(
    String.pad_trailing(name, 42) <>
      fmt.(m) <>
      fmt.(percentile.(times, 0.1)) <> fmt.(percentile.(times, 0.9)) <> "   " <> overhead
  )
end
