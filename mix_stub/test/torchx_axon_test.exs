defmodule ExPhil.Native.TorchxAxonTest do
  # Each ExPhil.Native.Axon layer trains with Axon.Loop on Torchx CUDA
  # tensors through the native path (issue 28): 50 Adam steps from the same
  # initial parameters, natively (the fused kernels through the NIF, forward
  # and backward, counted by telemetry) and with the kernels off
  # (ExPhil.Native.Eager.pure/1, the pure-Nx default on the same backend);
  # the two loss curves and the trained models' predictions must agree.
  #
  # Tagged :torchx: run by scripts/torchx_gpu.sh, excluded elsewhere.
  use ExUnit.Case, async: false

  alias ExPhil.Native.Axon, as: Layers
  alias ExPhil.Native.Eager

  @cuda {Torchx.Backend, device: :cuda}
  @steps 50
  # The losses of the two paths, step by step: f32 kernels against f32 pure
  # code whose sums run in another order, through 50 Adam steps.
  @rtol 1.0e-3

  @layers [:min_gru, :min_lstm, :liquid, :mamba, :attention]

  defp layer(input, :min_gru), do: Layers.min_gru(input, 16, name: "layer")
  defp layer(input, :min_lstm), do: Layers.min_lstm(input, 16, name: "layer")
  defp layer(input, :liquid), do: Layers.liquid(input, 16, name: "layer")
  defp layer(input, :mamba), do: Layers.mamba(input, state_size: 8, name: "layer")

  defp layer(input, :attention),
    do: Layers.attention(input, num_heads: 2, head_size: 32, causal: true, name: "layer")

  setup do
    Nx.default_backend(@cuda)
    test = self()
    id = {__MODULE__, make_ref()}
    :ok = :telemetry.attach_many(id, [Eager.call_event()], &__MODULE__.relay/4, test)
    on_exit(fn -> :telemetry.detach(id) end)
    :ok
  end

  def relay(_event, _measurements, metadata, test) do
    if self() == test, do: send(test, {:native_call, metadata.direction})
  end

  defp native_calls(acc \\ %{forward: 0, backward: 0}) do
    receive do
      {:native_call, direction} -> native_calls(Map.update!(acc, direction, &(&1 + 1)))
    after
      0 -> acc
    end
  end

  defp random(shape, seed) do
    Nx.with_default_backend(Nx.BinaryBackend, fn ->
      {t, _} = Nx.Random.normal(Nx.Random.key(seed), shape: shape, type: :f32)
      t
    end)
    |> Nx.backend_transfer(@cuda)
  end

  # {losses, predictions}: 50 steps of Axon.Loop from `params`.
  defp train(model, params, x, y) do
    losses = :ets.new(:losses, [:ordered_set, :public])

    loop =
      model
      |> Axon.Loop.trainer(:mean_squared_error, Polaris.Optimizers.adam(learning_rate: 1.0e-2),
        log: 0
      )
      |> Axon.Loop.handle_event(:iteration_completed, fn state ->
        :ets.insert(losses, {state.iteration, Nx.to_number(state.step_state.loss)})
        {:continue, state}
      end)

    data = Stream.repeatedly(fn -> {x, y} end)

    trained =
      Axon.Loop.run(loop, data, params,
        epochs: 1,
        iterations: @steps,
        compiler: Nx.Defn.Evaluator
      )

    {_init, predict} = Axon.build(model, compiler: Nx.Defn.Evaluator)
    predictions = predict.(trained, x) |> Nx.backend_transfer(Nx.BinaryBackend)
    curve = losses |> :ets.tab2list() |> Enum.map(&elem(&1, 1))
    :ets.delete(losses)
    {curve, predictions}
  end

  for name <- @layers do
    @tag :torchx
    test "#{name}: 50 Axon.Loop steps natively follow the pure path's loss curve" do
      model =
        Axon.input("x", shape: {nil, 12, 32})
        |> layer(unquote(name))
        |> Axon.nx(fn sequence -> sequence[[.., -1, ..]] end)
        |> Axon.dense(1, name: "head")

      {init, _} = Axon.build(model, compiler: Nx.Defn.Evaluator)
      params = init.(Nx.template({4, 12, 32}, :f32), Axon.ModelState.empty())
      x = random({4, 12, 32}, 1)
      y = random({4, 1}, 2)

      native_calls()
      {native, native_predictions} = train(model, params, x, y)
      calls = native_calls()
      # every step runs the layer's forward and backward kernels (and the
      # predictions one forward more)
      assert calls.forward >= @steps + 1 and calls.backward >= @steps,
             "#{unquote(name)}: NIF calls #{inspect(calls)}"

      {pure, pure_predictions} = Eager.pure(fn -> train(model, params, x, y) end)
      assert native_calls() == %{forward: 0, backward: 0}

      assert length(native) == @steps and length(pure) == @steps
      assert List.last(native) < hd(native), "#{unquote(name)}: the loss did not go down"

      for {n, p, step} <- Enum.zip([native, pure, 1..@steps]) do
        assert abs(n - p) <= @rtol * max(abs(p), 1.0e-3),
               "#{unquote(name)} step #{step}: native loss #{n}, pure #{p}"
      end

      diff = Nx.subtract(native_predictions, pure_predictions) |> Nx.abs() |> Nx.reduce_max()
      scale = pure_predictions |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
      assert Nx.to_number(diff) <= @rtol * max(scale, 1.0e-3)
    end
  end
end
