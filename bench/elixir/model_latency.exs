# Model-level latency from Elixir (issue 28, benchmarks 1 and 2), on Torchx
# CUDA tensors: a 2-layer MinGRU model built from ExPhil.Native.Axon layers
# (an input projection from 64 features to 256, two MinGRU layers of 256:
# the shape of Edifice's MinGRU backbone), answering one frame at batch 1.
#
#   1. predict over the last T frames (T = 32, and 1 to 1024 for the curve),
#      the output of the last step;
#   2. one frame (T = 1) with both layers' states carried between calls, as
#      a game loop runs it.
#
# Each call is timed all-in from Elixir: a host frame (a BinaryBackend
# tensor) to the output back in host memory (Nx.backend_transfer to the
# BinaryBackend, which waits for the device). Native: the ops' default
# functions run the fused kernels on the tensors' memory through the NIF
# (ExPhil.Native.Eager); pure: the same model, parameters and inputs inside
# ExPhil.Native.Eager.pure/1, the ops' pure-Nx implementation on the same
# backend. Both through Nx.Defn.Evaluator (Torchx has no defn compiler:
# every Nx operation is one libtorch call). Warm-up calls first; then
# medians and the 10th/90th percentiles of every timed call, and the largest
# difference between the two paths' outputs. Native calls are counted by the
# library's telemetry (every MinGRU layer call must take the NIF, and none
# under pure/1).
#
# Run inside mix_stub/scripts/torchx_project on the GPU machine
# (mix_stub/scripts/torchx_gpu.sh --bench runs it):
#
#   MIX_ENV=test mix run ../../../bench/elixir/model_latency.exs [--quick] [--csv PATH]
#
# --quick: fewer calls and T values; --csv: one line per (T, path) of the
# curve, for bench/plot_model_latency.py.

defmodule ModelLatency do
  alias ExPhil.Native.Axon, as: Layers
  alias ExPhil.Native.Eager

  @features 64
  @hidden 256
  @cuda {Torchx.Backend, device: :cuda}

  def main(argv) do
    {opts, _, _} = OptionParser.parse(argv, strict: [quick: :boolean, csv: :string])
    quick = Keyword.get(opts, :quick, false)
    Nx.default_backend(@cuda)
    counter = count_native_calls()

    header()
    {params, predict} = model(32)
    check_paths(params, predict, counter)

    runs = if quick, do: 20, else: 200
    IO.puts("\n== 1. predict, B1 T32 (#{runs} timed calls each, after 20 warm-up calls)")
    native = time_predict(params, predict, 32, runs, counter, :native)
    pure = time_predict(params, predict, 32, runs, counter, :pure)
    report("native", native)
    report("pure", pure)
    IO.puts("speed-up (median): #{Float.round(median(pure) / median(native), 1)}x")

    IO.puts("\n== 2. one frame, T = 1, both layers' states carried (#{runs} steps each)")
    {step_params, step} = stepper(params)
    native = time_steps(step_params, step, runs, counter, :native)
    pure = time_steps(step_params, step, runs, counter, :pure)
    report("native", native)
    report("pure", pure)
    IO.puts("speed-up (median): #{Float.round(median(pure) / median(native), 1)}x")

    steps = if quick, do: [1, 32, 256], else: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    curve_runs = if quick, do: 10, else: 50

    IO.puts(
      "\n== predict latency against T (#{curve_runs} timed calls each; median, p10-p90, us)"
    )

    IO.puts("T\tnative\tpure\tspeed-up")

    rows =
      for t <- steps do
        n = time_predict(params, predict, t, curve_runs, counter, :native)
        p = time_predict(params, predict, t, curve_runs, counter, :pure)

        IO.puts(
          "#{t}\t#{us(median(n))} (#{us(pct(n, 10))}-#{us(pct(n, 90))})\t" <>
            "#{us(median(p))} (#{us(pct(p, 10))}-#{us(pct(p, 90))})\t" <>
            "#{Float.round(median(p) / median(n), 1)}x"
        )

        {t, n, p}
      end

    if path = opts[:csv] do
      lines =
        for {t, n, p} <- rows, {name, s} <- [native: n, pure: p] do
          "#{t},#{name},#{median(s)},#{pct(s, 10)},#{pct(s, 90)}"
        end

      File.write!(path, Enum.join(["T,path,median_ns,p10_ns,p90_ns" | lines], "\n") <> "\n")
      IO.puts("wrote #{path}")
    end
  end

  # --- the models --------------------------------------------------------------

  defp trunk(frames, opts \\ []) do
    frames
    |> Axon.dense(@hidden, name: "projection")
    |> Layers.min_gru(@hidden, [name: "min_gru_1"] ++ Keyword.get(opts, :first, []))
  end

  # The output of the last step of the last layer.
  defp model(steps) do
    model =
      Axon.input("frames", shape: {nil, nil, @features})
      |> trunk()
      |> Layers.min_gru(@hidden, name: "min_gru_2")
      |> Axon.nx(fn sequence -> sequence[[.., -1, ..]] end)

    {init, predict} = Axon.build(model, compiler: Nx.Defn.Evaluator)
    params = init.(Nx.template({1, steps, @features}, :f32), Axon.ModelState.empty())
    {params, predict}
  end

  # One frame with the states of both layers in and out; the same parameter
  # names as model/1, so its parameters serve.
  defp stepper(params) do
    frames = Axon.input("frames", shape: {nil, 1, @features})
    h1 = Axon.input("h1", shape: {nil, @hidden})
    h2 = Axon.input("h2", shape: {nil, @hidden})
    first = trunk(frames, first: [initial_state: h1, return_state: true])
    sequence1 = Axon.nx(first, &elem(&1, 0))

    second =
      Layers.min_gru(sequence1, @hidden, name: "min_gru_2", initial_state: h2, return_state: true)

    out =
      Axon.container(
        {Axon.nx(second, fn {sequence, _} -> sequence[[.., -1, ..]] end),
         Axon.nx(first, &elem(&1, 1)), Axon.nx(second, &elem(&1, 1))}
      )

    {_init, step} = Axon.build(out, compiler: Nx.Defn.Evaluator)
    {params, step}
  end

  # --- timing -------------------------------------------------------------------

  defp frames(steps, seed) do
    Nx.with_default_backend(Nx.BinaryBackend, fn ->
      {t, _} = Nx.Random.normal(Nx.Random.key(seed), shape: {1, steps, @features}, type: :f32)
      t
    end)
  end

  defp path(:native, fun), do: fun.()
  defp path(:pure, fun), do: Eager.pure(fun)

  # One all-in call: host frame in, host output out.
  defp predict_once(params, predict, host_frame) do
    out = predict.(params, Nx.backend_transfer(host_frame, @cuda))
    Nx.backend_transfer(out, Nx.BinaryBackend)
  end

  defp time_predict(params, predict, steps, runs, counter, which) do
    host = frames(steps, steps)
    path(which, fn -> for _ <- 1..20, do: predict_once(params, predict, host) end)
    before = native_calls(counter)

    times =
      path(which, fn ->
        for _ <- 1..runs do
          t0 = System.monotonic_time(:nanosecond)
          predict_once(params, predict, host)
          System.monotonic_time(:nanosecond) - t0
        end
      end)

    expect_calls(counter, before, if(which == :native, do: 2 * runs, else: 0), "T=#{steps}")
    times
  end

  defp time_steps(params, step, runs, counter, which) do
    zeros = Nx.broadcast(Nx.tensor(0.0, type: :f32), {1, @hidden})
    host = for i <- 1..8, do: frames(1, 100 + i)

    run = fn state, k ->
      {h1, h2} = state
      frame = Nx.backend_transfer(Enum.at(host, rem(k, 8)), @cuda)
      {out, h1, h2} = step.(params, %{"frames" => frame, "h1" => h1, "h2" => h2})
      Nx.backend_transfer(out, Nx.BinaryBackend)
      {h1, h2}
    end

    path(which, fn ->
      state = Enum.reduce(1..20, {zeros, zeros}, &run.(&2, &1))
      before = native_calls(counter)

      {times, _} =
        Enum.map_reduce(1..runs, state, fn k, state ->
          t0 = System.monotonic_time(:nanosecond)
          state = run.(state, k)
          {System.monotonic_time(:nanosecond) - t0, state}
        end)

      expect_calls(counter, before, if(which == :native, do: 2 * runs, else: 0), "T=1 steps")
      times
    end)
  end

  # The two paths agree (and each takes the path it names).
  defp check_paths(params, predict, counter) do
    host = frames(32, 7)
    before = native_calls(counter)
    native = predict_once(params, predict, host)
    expect_calls(counter, before, 2, "check")
    pure = Eager.pure(fn -> predict_once(params, predict, host) end)
    expect_calls(counter, before + 2, 0, "check (pure)")
    diff = Nx.subtract(native, pure) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
    scale = pure |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
    IO.puts("outputs: native and pure differ by at most #{diff} (max |pure| #{scale})")
    if diff > 1.0e-4 * max(scale, 1.0), do: raise("native and pure outputs differ by #{diff}")
  end

  # --- telemetry: the NIF calls of this process ----------------------------------

  defp count_native_calls do
    counter = :counters.new(1, [])

    :telemetry.attach("model-latency", Eager.call_event(), &__MODULE__.count/4, counter)
    counter
  end

  @doc false
  def count(_event, _measurements, _metadata, counter), do: :counters.add(counter, 1, 1)

  defp native_calls(counter), do: :counters.get(counter, 1)

  defp expect_calls(counter, before, want, label) do
    got = native_calls(counter) - before

    if got != want,
      do: raise("#{label}: #{got} calls through the NIF, expected #{want}")
  end

  # --- statistics and output ---------------------------------------------------

  defp median(times), do: pct(times, 50)

  defp pct(times, p) do
    sorted = Enum.sort(times)
    Enum.at(sorted, min(length(sorted) - 1, div(p * length(sorted), 100)))
  end

  defp us(ns), do: Float.round(ns / 1000, 1)

  defp report(name, times) do
    IO.puts(
      "#{name}: median #{us(median(times))} us, p10 #{us(pct(times, 10))} us, " <>
        "p90 #{us(pct(times, 90))} us, min #{us(Enum.min(times))} us"
    )
  end

  defp header do
    {sha, _} = System.cmd("git", ["rev-parse", "--short", "HEAD"], stderr_to_stdout: true)

    gpu =
      with smi when smi != nil <- System.find_executable("nvidia-smi"),
           {name, 0} <- System.cmd(smi, ["--query-gpu=name", "--format=csv,noheader"]) do
        String.trim(name)
      else
        _ -> "no nvidia-smi"
      end

    IO.puts(
      "model_latency: #{gpu}; #{DateTime.utc_now() |> DateTime.to_iso8601()}; " <>
        "tree #{String.trim(sha)}; Elixir #{System.version()}, OTP #{System.otp_release()}; " <>
        "Torchx CUDA, Nx.Defn.Evaluator; 2 x MinGRU #{@hidden} over a #{@features}-feature projection"
    )
  end
end

ModelLatency.main(System.argv())
