# Model-level figures from Elixir (issue 28, benchmarks 1 to 3), on Torchx
# CUDA tensors: 2-layer models built from ExPhil.Native.Axon layers (an
# input projection from 64 features to 256, then two layers of width 256:
# the shape of Edifice's backbones), MinGRU (the default), MinLSTM, Mamba
# (state 16) or causal attention (4 heads of 64), with --model:
#
#   1. predict over the last T frames (T = 32, and 1 to 1024 for the curve),
#      the output of the last step, at batch 1;
#   2. one frame (T = 1) with both layers' states carried between calls, as
#      a game loop runs it (MinGRU only);
#   3. a training step at B32 T64: forward, backward (Nx.Defn.value_and_grad)
#      and an Adam update of every parameter (Polaris), mean squared error
#      of the last step against a target, the new parameters left on the
#      device and the loss brought to the host.
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
# library's telemetry (every layer call must take the NIF, and none under
# pure/1), and the tensors moved to or from the host by Torchx's calls that
# move them (ExPhil.Native.HostTransfers, Erlang's call-count tracing): the
# native path must move no more than the frame in and the answer out.
#
# Run inside mix_stub/scripts/torchx_project on the GPU machine
# (mix_stub/scripts/torchx_gpu.sh --bench runs it):
#
#   MIX_ENV=test mix run ../../../bench/elixir/model_latency.exs \
#     [--model min_gru|min_lstm|mamba|attention] [--quick] [--csv PATH] [--max-steps T]
#
# --quick: fewer calls and T values; --csv: one line per (T, path) of the
# curve, for bench/elixir/plot_model_latency.py; --max-steps: the curve's
# longest T (default 1024).

defmodule ModelLatency do
  alias ExPhil.Native.Axon, as: Layers
  alias ExPhil.Native.{Eager, HostTransfers}

  @features 64
  @hidden 256
  @cuda {Torchx.Backend, device: :cuda}

  def main(argv) do
    {opts, _, _} =
      OptionParser.parse(argv,
        strict: [quick: :boolean, csv: :string, model: :string, max_steps: :integer]
      )

    quick = Keyword.get(opts, :quick, false)
    kind = String.to_existing_atom(Keyword.get(opts, :model, "min_gru"))
    unless kind in [:min_gru, :min_lstm, :mamba, :attention], do: raise("--model: #{kind}?")
    Nx.default_backend(@cuda)
    counter = count_native_calls()

    header(kind)
    {params, predict} = model(kind, 32)
    check_paths(params, predict, counter)

    runs = if quick, do: 20, else: 200
    IO.puts("\n== 1. predict, B1 T32 (#{runs} timed calls each, after 20 warm-up calls)")
    native = time_predict(params, predict, 32, runs, counter, :native)
    pure = time_predict(params, predict, 32, runs, counter, :pure)
    report("native", native)
    report("pure", pure)
    IO.puts("speed-up (median): #{Float.round(median(pure) / median(native), 1)}x")

    if kind == :min_gru do
      IO.puts("\n== 2. one frame, T = 1, both layers' states carried (#{runs} steps each)")
      {step_params, step} = stepper(params)
      native = time_steps(step_params, step, runs, counter, :native)
      pure = time_steps(step_params, step, runs, counter, :pure)
      report("native", native)
      report("pure", pure)
      IO.puts("speed-up (median): #{Float.round(median(pure) / median(native), 1)}x")
    end

    train_runs = if quick, do: 3, else: 20
    IO.puts("\n== 3. training step, B32 T64 (#{train_runs} timed steps each, after 3)")
    {native, calls} = time_training(kind, train_runs, counter, :native)
    IO.puts("native: #{calls} calls through the NIF per step")
    {pure, 0} = time_training(kind, train_runs, counter, :pure)
    report("native", native)
    report("pure", pure)
    IO.puts("speed-up (median): #{Float.round(median(pure) / median(native), 1)}x")

    max_steps = Keyword.get(opts, :max_steps, 1024)

    steps =
      if(quick, do: [1, 32, 256], else: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
      |> Enum.filter(&(&1 <= max_steps))

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

  defp layer(input, :min_gru, n), do: Layers.min_gru(input, @hidden, name: "min_gru_#{n}")
  defp layer(input, :min_lstm, n), do: Layers.min_lstm(input, @hidden, name: "min_lstm_#{n}")
  defp layer(input, :mamba, n), do: Layers.mamba(input, state_size: 16, name: "mamba_#{n}")

  defp layer(input, :attention, n),
    do: Layers.attention(input, num_heads: 4, head_size: 64, causal: true, name: "attention_#{n}")

  # The output of the last step of the last layer (for MinGRU the parameter
  # names of stepper/1).
  defp network(kind) do
    Axon.input("frames", shape: {nil, nil, @features})
    |> Axon.dense(@hidden, name: "projection")
    |> layer(kind, 1)
    |> layer(kind, 2)
    |> Axon.nx(fn sequence -> sequence[[.., -1, ..]] end)
  end

  defp model(kind, steps) do
    {init, predict} = Axon.build(network(kind), compiler: Nx.Defn.Evaluator)
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

  defp frames(steps, seed, batch \\ 1) do
    Nx.with_default_backend(Nx.BinaryBackend, fn ->
      {t, _} =
        Nx.Random.normal(Nx.Random.key(seed), shape: {batch, steps, @features}, type: :f32)

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

  # Benchmark 3: {times, NIF calls per step}. One step: the loss and the
  # gradients of every parameter, then Adam's update, as one function under
  # Nx.Defn.Evaluator; the parameters stay on the device, the loss goes to
  # the host (which waits for the step's kernels).
  defp time_training(kind, runs, counter, which) do
    {batch, steps} = {32, 64}
    {params, predict} = model(kind, steps)
    {init_optimizer, update} = Polaris.Optimizers.adam(learning_rate: 1.0e-3)

    step =
      Nx.Defn.jit(
        fn data, optimizer, x, target ->
          {loss, grads} =
            Nx.Defn.value_and_grad(data, fn data ->
              out = predict.(%{params | data: data}, x)
              out |> Nx.subtract(target) |> Nx.pow(2) |> Nx.mean()
            end)

          {updates, optimizer} = update.(grads, optimizer, data)
          {loss, Polaris.Updates.apply_updates(data, updates), optimizer}
        end,
        compiler: Nx.Defn.Evaluator
      )

    x = Nx.backend_transfer(frames(steps, 3, batch), @cuda)
    target = Nx.backend_transfer(targets(batch), @cuda)

    path(which, fn ->
      run = fn {data, optimizer} ->
        {loss, data, optimizer} = step.(data, optimizer, x, target)
        Nx.to_number(loss)
        {data, optimizer}
      end

      state = {params.data, init_optimizer.(params.data)}
      state = Enum.reduce(1..3, state, fn _, s -> run.(s) end)
      before = native_calls(counter)

      {times, _} =
        Enum.map_reduce(1..runs, state, fn _, s ->
          t0 = System.monotonic_time(:nanosecond)
          s = run.(s)
          {System.monotonic_time(:nanosecond) - t0, s}
        end)

      calls = native_calls(counter) - before
      if rem(calls, runs) != 0, do: raise("#{calls} NIF calls over #{runs} steps")
      {_, moved} = HostTransfers.count(fn -> run.(state) end)
      IO.puts("#{which}: tensors moved to or from the host per step: #{transfers(moved)}")
      {times, div(calls, runs)}
    end)
  end

  defp targets(batch) do
    Nx.with_default_backend(Nx.BinaryBackend, fn ->
      {t, _} = Nx.Random.normal(Nx.Random.key(4), shape: {batch, @hidden}, type: :f32)
      t
    end)
  end

  # The two paths agree (and each takes the path it names).
  defp check_paths(params, predict, counter) do
    host = frames(32, 7)
    before = native_calls(counter)
    {native, moved} = HostTransfers.count(fn -> predict_once(params, predict, host) end)
    expect_calls(counter, before, 2, "check")
    {pure, moved_pure} = HostTransfers.count(fn -> Eager.pure(fn -> predict_once(params, predict, host) end) end)
    expect_calls(counter, before + 2, 0, "check (pure)")
    IO.puts("tensors moved to or from the host per predict: native #{transfers(moved)}; pure #{transfers(moved_pure)}")

    # the frame in (from_blob) and the answer out (to_blob), nothing else
    if moved != %{{Torchx, :from_blob, 4} => 1, {Torchx, :to_blob, 1} => 1},
      do: raise("the native predict moved tensors besides its frame and answer: #{inspect(moved)}")
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

  defp transfers(moved) when moved == %{}, do: "none"

  defp transfers(moved),
    do: Enum.map_join(moved, ", ", fn {{m, f, a}, n} -> "#{n} x #{inspect(m)}.#{f}/#{a}" end)

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

  defp header(kind) do
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
        "Torchx CUDA, Nx.Defn.Evaluator; 2 x #{kind} #{@hidden} over a #{@features}-feature projection"
    )
  end
end

ModelLatency.main(System.argv())
