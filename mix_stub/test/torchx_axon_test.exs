defmodule ExPhil.Native.TorchxAxonTest do
  # Each ExPhil.Native.Axon layer (GRU and LSTM: Axon's own graphs on the
  # fused ops) trains with Axon.Loop on Torchx CUDA
  # tensors through the native path (issue 28): 50 Adam steps from the same
  # initial parameters, natively (the fused kernels through the NIF, forward
  # and backward, counted by telemetry) and with the kernels off
  # (ExPhil.Native.Eager.pure/1, the pure-Nx default on the same backend);
  # the two loss curves and the trained models' predictions must agree. Then
  # the same for models of the shape of Edifice's MinGRU, MinLSTM, Mamba and
  # attention backbones built from our layers.
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

  @layers [:min_gru, :min_lstm, :liquid, :mamba, :attention, :gru, :lstm]

  defp layer(input, :min_gru), do: Layers.min_gru(input, 16, name: "layer")
  defp layer(input, :min_lstm), do: Layers.min_lstm(input, 16, name: "layer")
  defp layer(input, :liquid), do: Layers.liquid(input, 16, name: "layer")
  defp layer(input, :mamba), do: Layers.mamba(input, state_size: 8, name: "layer")

  defp layer(input, :attention),
    do: Layers.attention(input, num_heads: 2, head_size: 32, causal: true, name: "layer")

  # Axon.gru's and Axon.lstm's layers and parameters: {sequence, carry}; a fixed seed for
  # their initial state (Axon draws it from the system time otherwise).
  defp layer(input, cell) when cell in [:gru, :lstm],
    do: elem(apply(Layers, cell, [input, 16, [name: "layer", seed: 7]]), 0)

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

  # {losses, predictions}: `steps` steps of Axon.Loop from `params`.
  defp train(model, params, x, y, steps, learning_rate) do
    losses = :ets.new(:losses, [:ordered_set, :public])

    loop =
      model
      |> Axon.Loop.trainer(
        :mean_squared_error,
        Polaris.Optimizers.adam(learning_rate: learning_rate),
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
        iterations: steps,
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

      assert_trains_as_pure(unquote(name), model, random({4, 12, 32}, 1), random({4, 1}, 2),
        layers: 1,
        steps: @steps,
        learning_rate: 1.0e-2,
        rtol: @rtol
      )
    end
  end

  # Edifice's backbones (Edifice.Recurrent.MinGRU.build/1 and its MinLSTM,
  # Mamba and attention siblings): a projection of the frames to the hidden
  # width 256, two layers of that width, a final layer norm and the last
  # step; here each layer one of ours, trained at B8 T32 on 64 features.
  # Adam divides each gradient by its own running scale, so rounding-level
  # differences of near-zero gradients become steps of the learning rate:
  # at width 256 and 1e-2 the two paths' losses drifted 1% apart by step 16
  # (a run on an H200). Hence a smaller rate, 20 steps and 1e-2 relative.
  @backbone_hidden 256

  defp backbone_layer(input, :min_gru, n),
    do: Layers.min_gru(input, @backbone_hidden, name: "min_gru_#{n}")

  defp backbone_layer(input, :min_lstm, n),
    do: Layers.min_lstm(input, @backbone_hidden, name: "min_lstm_#{n}")

  defp backbone_layer(input, :mamba, n),
    do: Layers.mamba(input, state_size: 16, name: "mamba_#{n}")

  defp backbone_layer(input, :attention, n),
    do: Layers.attention(input, num_heads: 4, head_size: 64, causal: true, name: "attention_#{n}")

  for name <- [:min_gru, :min_lstm, :mamba, :attention] do
    @tag :torchx
    test "Edifice's #{name} backbone shape built from our layers trains as the pure path does" do
      model =
        Axon.input("state_sequence", shape: {nil, 32, 64})
        |> Axon.dense(@backbone_hidden, name: "input_projection")
        |> backbone_layer(unquote(name), 1)
        |> backbone_layer(unquote(name), 2)
        |> Axon.layer_norm(name: "final_norm")
        |> Axon.nx(fn sequence -> sequence[[.., -1, ..]] end)

      x = random({8, 32, 64}, 3)
      y = random({8, @backbone_hidden}, 4)

      assert_trains_as_pure(unquote(name), model, x, y,
        layers: 2,
        steps: 20,
        learning_rate: 1.0e-3,
        rtol: 1.0e-2
      )
    end
  end

  # Trains `model` on (x, y) natively and with the kernels off, from the same
  # parameters: every step takes the NIF (`layers` forward and backward calls
  # at least), the loss goes down, and the losses and predictions agree
  # within `rtol`.
  defp assert_trains_as_pure(name, model, x, y, opts) do
    [layers: layers, steps: steps, learning_rate: rate, rtol: rtol] = opts
    {init, _} = Axon.build(model, compiler: Nx.Defn.Evaluator)
    params = init.(Nx.template(Nx.shape(x), :f32), Axon.ModelState.empty())

    native_calls()
    {native, native_predictions} = train(model, params, x, y, steps, rate)
    calls = native_calls()
    # every step runs each layer's forward and backward kernels (and the
    # predictions one forward more)
    assert calls.forward >= layers * (steps + 1) and calls.backward >= layers * steps,
           "#{name}: NIF calls #{inspect(calls)}"

    {pure, pure_predictions} = Eager.pure(fn -> train(model, params, x, y, steps, rate) end)
    assert native_calls() == %{forward: 0, backward: 0}

    assert length(native) == steps and length(pure) == steps
    assert List.last(native) < hd(native), "#{name}: the loss did not go down"

    for {n, p, step} <- Enum.zip([native, pure, 1..steps]) do
      assert abs(n - p) <= rtol * max(abs(p), 1.0e-3),
             "#{name} step #{step}: native loss #{n}, pure #{p}"
    end

    diff = Nx.subtract(native_predictions, pure_predictions) |> Nx.abs() |> Nx.reduce_max()
    scale = pure_predictions |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
    assert Nx.to_number(diff) <= rtol * max(scale, 1.0e-3)
  end
end
