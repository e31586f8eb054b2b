defmodule ExPhil.Native.AxonTest do
  # ExPhil.Native.Axon's layers on the BinaryBackend (every op runs its pure
  # default): each builds with the documented parameters, predicts what the
  # ops give when fed the same parameters by hand (which proves the wiring),
  # trains, honours :initial_state and :return_state, and rejects bad options.
  use ExUnit.Case, async: true

  import ExUnit.CaptureIO

  alias ExPhil.Native.Axon, as: Layer
  alias ExPhil.Native.Axon.Layers
  alias ExPhil.Native.Ops

  @batch 2
  @steps 5
  @features 4
  @units 6

  defp random(shape, seed, scale \\ 1.0) do
    {t, _} = Nx.Random.uniform(Nx.Random.key(seed), -scale, scale, shape: shape, type: :f32)
    t
  end

  defp input, do: Axon.input("x", shape: {nil, @steps, @features})
  defp h0_input(width), do: Axon.input("h0", shape: {nil, width})
  defp x, do: random({@batch, @steps, @features}, 1)

  # Params from a fixed seed; biases get random values too (their default
  # initializer is zeros, which would hide a bias that is not wired).
  defp init(model, templates \\ %{}) do
    {init_fn, predict_fn} = Axon.build(model, seed: 7)
    templates = Map.put_new(templates, "x", Nx.template({@batch, @steps, @features}, :f32))
    {init_fn.(templates, Axon.ModelState.empty()), predict_fn}
  end

  defp shapes(model_state) do
    Map.new(model_state.data, fn {layer, params} ->
      {layer, Map.new(params, fn {name, t} -> {name, Nx.shape(t)} end)}
    end)
  end

  # Relative to the largest magnitude expected.
  defp assert_close(got, expected, tolerance \\ 1.0e-6) do
    assert Nx.shape(got) == Nx.shape(expected)
    assert Nx.type(got) == Nx.type(expected)
    scale = Nx.to_number(Nx.reduce_max(Nx.abs(expected)))
    error = Nx.to_number(Nx.reduce_max(Nx.abs(Nx.subtract(got, expected))))
    assert error <= tolerance * scale, "max error #{error}, scale #{scale}"
  end

  defp project(x, params, prefix),
    do: Nx.add(Nx.dot(x, params[prefix <> "_kernel"]), params[prefix <> "_bias"])

  defp mse(predict_fn, model_state, x, y) do
    predict_fn.(model_state, %{"x" => x})
    |> Nx.subtract(y)
    |> Nx.pow(2)
    |> Nx.mean()
    |> Nx.to_number()
  end

  # Trains `model` for a few Adam steps on one fixed batch; the loss before
  # and after, computed with the initial and the returned parameters.
  defp train(model, output_width) do
    x = x()
    y = random({@batch, @steps, output_width}, 2, 0.5)
    {model_state, predict_fn} = init(model)

    loop =
      model
      |> Axon.Loop.trainer(:mean_squared_error, Polaris.Optimizers.adam(learning_rate: 0.01),
        log: 0
      )

    data = List.duplicate({%{"x" => x}, y}, 15)

    {trained, _output} =
      with_io(fn -> Axon.Loop.run(loop, data, model_state, epochs: 1, iterations: 15) end)

    {mse(predict_fn, model_state, x, y), mse(predict_fn, trained, x, y)}
  end

  describe "min_gru/3" do
    test "builds the documented parameters and predicts Ops.min_gru of the projections" do
      model = Layer.min_gru(input(), @units, name: "cell", bias_initializer: :normal)
      {model_state, predict_fn} = init(model)

      assert shapes(model_state) == %{
               "cell" => %{
                 "gate_kernel" => {4, 6},
                 "gate_bias" => {6},
                 "candidate_kernel" => {4, 6},
                 "candidate_bias" => {6}
               }
             }

      p = model_state.data["cell"]
      y = predict_fn.(model_state, %{"x" => x()})
      assert Nx.shape(y) == {@batch, @steps, @units}
      assert Nx.type(y) == {:f, 32}
      assert_close(y, Ops.min_gru(project(x(), p, "gate"), project(x(), p, "candidate")))
    end

    test "initial_state and return_state" do
      h0 = random({@batch, @units}, 3)

      model =
        Layer.min_gru(input(), @units,
          name: "cell",
          initial_state: h0_input(@units),
          return_state: true
        )

      {model_state, predict_fn} = init(model, %{"h0" => Nx.template({@batch, @units}, :f32)})
      p = model_state.data["cell"]
      {y, h_final} = predict_fn.(model_state, %{"x" => x(), "h0" => h0})
      assert Nx.type(h_final) == {:f, 32}

      {expected_y, expected_h} =
        Ops.min_gru(project(x(), p, "gate"), project(x(), p, "candidate"),
          h0: h0,
          final_state: true
        )

      assert_close(y, expected_y)
      assert_close(h_final, expected_h)
      assert Nx.shape(h_final) == {@batch, @units}

      # Zeros as h0 is the layer without :initial_state, with the same params.
      {zero_y, _} = predict_fn.(model_state, %{"x" => x(), "h0" => Nx.broadcast(0.0, h0)})
      refute zero_y == y
      {_, plain_predict} = Axon.build(Layer.min_gru(input(), @units, name: "cell"))
      assert_close(plain_predict.(model_state, %{"x" => x()}), zero_y)
    end

    test "trains" do
      {before, later} = train(Layer.min_gru(input(), @units), @units)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end
  end

  describe "min_lstm/3" do
    test "builds the documented parameters and predicts Ops.min_lstm of the projections" do
      model = Layer.min_lstm(input(), @units, bias_initializer: :normal)
      {model_state, predict_fn} = init(model)

      assert shapes(model_state) == %{
               "min_lstm_0" => %{
                 "forget_kernel" => {4, 6},
                 "forget_bias" => {6},
                 "input_kernel" => {4, 6},
                 "input_bias" => {6},
                 "candidate_kernel" => {4, 6},
                 "candidate_bias" => {6}
               }
             }

      p = model_state.data["min_lstm_0"]
      y = predict_fn.(model_state, %{"x" => x()})

      expected =
        Ops.min_lstm(
          project(x(), p, "forget"),
          project(x(), p, "input"),
          project(x(), p, "candidate")
        )

      assert_close(y, expected)
    end

    test "initial_state and return_state" do
      model =
        Layer.min_lstm(input(), @units, initial_state: h0_input(@units), return_state: true)

      {model_state, predict_fn} = init(model, %{"h0" => Nx.template({@batch, @units}, :f32)})
      h0 = random({@batch, @units}, 4)
      {y, h_final} = predict_fn.(model_state, %{"x" => x(), "h0" => h0})
      assert {Nx.shape(y), Nx.shape(h_final)} == {{@batch, @steps, @units}, {@batch, @units}}
      {zero_y, _} = predict_fn.(model_state, %{"x" => x(), "h0" => Nx.broadcast(0.0, h0)})
      refute zero_y == y
    end

    test "trains" do
      {before, later} = train(Layer.min_lstm(input(), @units), @units)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end
  end

  describe "liquid/3" do
    test "builds the documented parameters and predicts Ops.liquid with tau = softplus + min_tau" do
      model = Layer.liquid(input(), @units, min_tau: 0.5, bias_initializer: :normal)
      {model_state, predict_fn} = init(model)

      assert shapes(model_state) == %{
               "liquid_0" => %{
                 "tau_kernel" => {4, 6},
                 "tau_bias" => {6},
                 "target_kernel" => {4, 6},
                 "target_bias" => {6}
               }
             }

      p = model_state.data["liquid_0"]
      pre_tau = project(x(), p, "tau")
      # softplus(t) = log(1 + e^t)
      tau = pre_tau |> Nx.exp() |> Nx.log1p() |> Nx.add(0.5)
      y = predict_fn.(model_state, %{"x" => x()})
      assert_close(y, Ops.liquid(tau, project(x(), p, "target")))
    end

    test "initial_state and return_state" do
      model = Layer.liquid(input(), @units, initial_state: h0_input(@units), return_state: true)
      {model_state, predict_fn} = init(model, %{"h0" => Nx.template({@batch, @units}, :f32)})
      h0 = random({@batch, @units}, 5)
      {y, h_final} = predict_fn.(model_state, %{"x" => x(), "h0" => h0})
      assert {Nx.shape(y), Nx.shape(h_final)} == {{@batch, @steps, @units}, {@batch, @units}}
      assert Nx.type(h_final) == {:f, 32}
      {zero_y, _} = predict_fn.(model_state, %{"x" => x(), "h0" => Nx.broadcast(0.0, h0)})
      refute zero_y == y
    end

    test "trains" do
      {before, later} = train(Layer.liquid(input(), @units), @units)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end
  end

  describe "mamba/2" do
    # inner = expand * features = 8; dt_rank = ceil(4 / 16) = 1.
    @inner 8
    @state_size 3

    test "builds the documented parameters and initialises A, D and dt_bias as Mamba does" do
      {model_state, _} = init(Layer.mamba(input(), state_size: @state_size, name: "ssm"))

      assert shapes(model_state) == %{
               "ssm" => %{
                 "in_proj_kernel" => {4, 16},
                 "conv_kernel" => {4, 8},
                 "conv_bias" => {8},
                 "x_proj_kernel" => {8, 1 + 2 * @state_size},
                 "dt_proj_kernel" => {1, 8},
                 "dt_bias" => {8},
                 "a_log" => {8, @state_size},
                 "d" => {8},
                 "out_proj_kernel" => {8, 4}
               }
             }

      p = model_state.data["ssm"]
      assert_close(p["a_log"], Nx.log(Nx.tensor([[1.0, 2.0, 3.0]])) |> Nx.broadcast({8, 3}))
      assert p["d"] == Nx.broadcast(1.0, {8})
      # softplus(dt_bias) is the initial dt, log-uniform in [0.001, 0.1].
      dt = p["dt_bias"] |> Nx.exp() |> Nx.log1p()
      assert Nx.to_number(Nx.reduce_min(dt)) >= 0.999e-3
      assert Nx.to_number(Nx.reduce_max(dt)) <= 0.1001
      assert Nx.to_number(Nx.reduce_max(dt)) > Nx.to_number(Nx.reduce_min(dt))

      {wide, _} = init(Layer.mamba(input(), expand: 1, conv_size: 2, dt_rank: 3, state_size: 2))

      assert %{
               "in_proj_kernel" => {4, 8},
               "conv_kernel" => {2, 4},
               "x_proj_kernel" => {4, 7},
               "dt_proj_kernel" => {3, 4}
             } = shapes(wide)["mamba_0"]
    end

    test "predicts the block computed by hand (conv as Nx.conv, one group per channel)" do
      model =
        Layer.mamba(input(),
          state_size: @state_size,
          bias_initializer: Axon.Initializers.uniform(scale: 0.5),
          kernel_initializer: Axon.Initializers.uniform(scale: 0.5)
        )

      {model_state, predict_fn} = init(model)
      p = model_state.data["mamba_0"]
      y = predict_fn.(model_state, %{"x" => x()})
      assert {Nx.shape(y), Nx.type(y)} == {{@batch, @steps, @features}, {:f, 32}}

      xz = Nx.dot(x(), p["in_proj_kernel"])
      xs = Nx.slice_along_axis(xz, 0, @inner, axis: 2)
      z = Nx.slice_along_axis(xz, @inner, @inner, axis: 2)

      # PyTorch's Conv1d(groups = channels, padding = 3), first `steps` outputs.
      conv_kernel = p["conv_kernel"] |> Nx.transpose() |> Nx.reshape({@inner, 1, 4})

      conv =
        xs
        |> Nx.transpose(axes: [0, 2, 1])
        |> Nx.conv(conv_kernel, padding: [{3, 0}], feature_group_size: @inner)
        |> Nx.transpose(axes: [0, 2, 1])
        |> Nx.add(p["conv_bias"])

      xc = Nx.multiply(conv, Nx.sigmoid(conv))
      dt_b_c = Nx.dot(xc, p["x_proj_kernel"])
      dt = Nx.dot(Nx.slice_along_axis(dt_b_c, 0, 1, axis: 2), p["dt_proj_kernel"])
      b = Nx.slice_along_axis(dt_b_c, 1, @state_size, axis: 2)
      c = Nx.slice_along_axis(dt_b_c, 1 + @state_size, @state_size, axis: 2)

      scanned =
        Ops.selective_scan(xc, dt, Nx.negate(Nx.exp(p["a_log"])), b, c,
          dt_bias: p["dt_bias"],
          d: p["d"],
          z: z,
          softplus: true
        )

      assert_close(y, Nx.dot(scanned, p["out_proj_kernel"]), 1.0e-5)
    end

    test "initial_state and return_state" do
      model =
        Layer.mamba(input(),
          state_size: @state_size,
          initial_state: Axon.input("h0", shape: {nil, @inner, @state_size}),
          return_state: true
        )

      {model_state, predict_fn} =
        init(model, %{"h0" => Nx.template({@batch, @inner, @state_size}, :f32)})

      h0 = random({@batch, @inner, @state_size}, 6)
      {y, h_final} = predict_fn.(model_state, %{"x" => x(), "h0" => h0})
      assert Nx.shape(y) == {@batch, @steps, @features}
      assert {Nx.shape(h_final), Nx.type(h_final)} == {{@batch, @inner, @state_size}, {:f, 32}}
      {zero_y, _} = predict_fn.(model_state, %{"x" => x(), "h0" => Nx.broadcast(0.0, h0)})
      refute zero_y == y
    end

    test "trains" do
      {before, later} = train(Layer.mamba(input(), state_size: @state_size), @features)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end
  end

  describe "attention/2" do
    test "builds the documented parameters and predicts Ops.attention of the projections" do
      model =
        Layer.attention(input(),
          num_heads: 2,
          num_kv_heads: 1,
          head_size: 4,
          causal: true,
          window: 2,
          bias_initializer: :normal
        )

      {model_state, predict_fn} = init(model)

      assert shapes(model_state) == %{
               "attention_0" => %{
                 "query_kernel" => {4, 8},
                 "query_bias" => {8},
                 "key_kernel" => {4, 4},
                 "key_bias" => {4},
                 "value_kernel" => {4, 4},
                 "value_bias" => {4},
                 "output_kernel" => {8, 4},
                 "output_bias" => {4}
               }
             }

      p = model_state.data["attention_0"]
      y = predict_fn.(model_state, %{"x" => x()})
      assert {Nx.shape(y), Nx.type(y)} == {{@batch, @steps, @features}, {:f, 32}}

      # By the other layout: {batch, heads, steps, head_size}.
      heads = fn prefix, count ->
        x()
        |> project(p, prefix)
        |> Nx.reshape({@batch, @steps, count, 4})
        |> Nx.transpose(axes: [0, 2, 1, 3])
      end

      expected =
        Ops.attention(heads.("query", 2), heads.("key", 1), heads.("value", 1),
          mask: :window,
          window: 2
        )
        |> Nx.transpose(axes: [0, 2, 1, 3])
        |> Nx.reshape({@batch, @steps, 8})
        |> project(p, "output")

      assert_close(y, expected)
    end

    test ":causal and :window decide which steps each step sees" do
      # Changing the last step changes only the last output when causal;
      # changing the first changes only the first two with a window of 2.
      changed = fn step -> Nx.put_slice(x(), [0, step, 0], Nx.broadcast(3.0, {1, 1, 4})) end

      changed_steps = fn opts, step ->
        model = Layer.attention(input(), [num_heads: 2, head_size: 4] ++ opts)
        {model_state, predict_fn} = init(model)
        y = predict_fn.(model_state, %{"x" => x()})
        y_changed = predict_fn.(model_state, %{"x" => changed.(step)})

        Nx.not_equal(y, y_changed)
        |> Nx.any(axes: [0, 2])
        |> Nx.to_flat_list()
      end

      assert changed_steps.([], 4) == [1, 1, 1, 1, 1]
      assert changed_steps.([causal: true], 4) == [0, 0, 0, 0, 1]
      assert changed_steps.([causal: true], 0) == [1, 1, 1, 1, 1]
      assert changed_steps.([causal: true, window: 2], 0) == [1, 1, 0, 0, 0]
    end

    test "trains" do
      model = Layer.attention(input(), num_heads: 2, head_size: 4, causal: true)
      {before, later} = train(model, @features)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end
  end

  test "the Layers functions run outside defn, as the layers do inside" do
    {model_state, predict_fn} = init(Layer.min_gru(input(), @units, name: "cell"))
    p = model_state.data["cell"]

    eager =
      Layers.min_gru(
        x(),
        p["gate_kernel"],
        p["gate_bias"],
        p["candidate_kernel"],
        p["candidate_bias"]
      )

    assert_close(eager, predict_fn.(model_state, %{"x" => x()}))

    assert_raise ArgumentError, ~r/min_gru\/6: unknown options \[:units\]/, fn ->
      Layers.min_gru(
        x(),
        p["gate_kernel"],
        p["gate_bias"],
        p["candidate_kernel"],
        p["candidate_bias"],
        units: 3
      )
    end
  end

  # Axon.gru/Axon.lstm and ours, built alike: `{sequence, carry}` in one container.
  defp axon_rnn(module, cell, opts, hidden_state \\ nil) do
    {sequence, carry} =
      if hidden_state,
        do: apply(module, cell, [input(), hidden_state, @units, opts]),
        else: apply(module, cell, [input(), @units, opts])

    Axon.container({sequence, carry})
  end

  # The ExPhil.Native.Block nodes (targets) a model's prediction traces.
  defp block_targets(predict_fn, model_state, inputs) do
    predict_fn |> blocks(model_state, inputs) |> Enum.map(& &1.target)
  end

  defp blocks(predict_fn, model_state, inputs) do
    fn state, inputs -> predict_fn.(state, inputs) end
    |> Nx.Defn.debug_expr()
    |> apply([model_state, inputs])
    |> ExPhil.Native.Blocks.find(ExPhil.Native.Block)
    |> Enum.map(&elem(&1, 0))
  end

  defp flat(container), do: Nx.Defn.Composite.flatten_list([container])

  defp deep_shapes(%Nx.Tensor{} = t), do: Nx.shape(t)
  defp deep_shapes(%{} = map), do: Map.new(map, fn {k, v} -> {k, deep_shapes(v)} end)

  # Biases of a visible size (Axon's :normal draws them at a scale of 0.01).
  defp uniform_bias(shape, type, key),
    do: key |> Nx.Random.uniform(-0.5, 0.5, shape: shape, type: type) |> elem(0)

  # The layer options both sides are built with.
  defp rnn_opts(use_bias),
    do: [name: "rnn", seed: 5, use_bias: use_bias, bias_initializer: &uniform_bias/3]

  # Functions of the cell, not test bodies with it unquoted: the compiler
  # would see a literal cell compared with the other.
  defp loads_axon_parameters(cell, use_bias) do
    opts = rnn_opts(use_bias)

    theirs = axon_rnn(Axon, cell, opts)
    ours = axon_rnn(Layer, cell, opts)
    {model_state, predict_theirs} = init(theirs)
    {ours_state, predict_ours} = init(ours)

    # the same parameters, by name and shape, as Axon's (and the same
    # values from the same seed)
    assert deep_shapes(ours_state.data) == deep_shapes(model_state.data)
    assert ours_state.data == model_state.data
    assert Map.keys(model_state.data["rnn"]) -- ["bias"] == ["hidden_kernel", "input_kernel"]

    inputs = %{"x" => x()}
    assert block_targets(predict_ours, model_state, inputs) == ["exphil_#{cell}_fwd"]
    assert block_targets(predict_theirs, model_state, inputs) == []

    expected = flat(predict_theirs.(model_state, inputs))
    got = flat(predict_ours.(model_state, inputs))
    assert length(got) == if(cell == :gru, do: 2, else: 3)
    Enum.zip_with(got, expected, &assert_close(&1, &2, 2.0e-6))
  end

  defp gradients_agree_with_axon(cell, use_bias) do
    opts = rnn_opts(use_bias)

    {model_state, predict_theirs} = init(axon_rnn(Axon, cell, opts))
    {_, predict_ours} = init(axon_rnn(Layer, cell, opts))
    inputs = %{"x" => x()}

    weights =
      predict_theirs.(model_state, inputs)
      |> flat()
      |> Enum.with_index(30)
      |> Enum.map(fn {out, seed} -> random(Nx.shape(out), seed) end)

    loss = fn predict_fn ->
      fn params ->
        state = put_in(model_state.data["rnn"], params)

        predict_fn.(state, inputs)
        |> flat()
        |> Enum.zip_with(weights, &Nx.sum(Nx.multiply(&1, &2)))
        |> Enum.reduce(&Nx.add/2)
      end
    end

    params = model_state.data["rnn"]
    expected = Nx.Defn.grad(params, loss.(predict_theirs))
    got = Nx.Defn.grad(params, loss.(predict_ours))

    for {group, by_name} <- expected, {name, grad} <- by_name do
      assert_close(got[group][name], grad, 2.0e-5)
    end
  end

  describe "gru/3 and lstm/3: Axon's layers on the fused ops" do
    for cell <- [:gru, :lstm], use_bias <- [true, false] do
      test "#{cell} use_bias: #{use_bias}: Axon.#{cell}'s parameters load unchanged and give its output",
        do: loads_axon_parameters(unquote(cell), unquote(use_bias))

      test "#{cell} use_bias: #{use_bias}: gradients in every parameter agree with Axon's",
        do: gradients_agree_with_axon(unquote(cell), unquote(use_bias))
    end

    test "from a given hidden state (gru/4, lstm/4), and trains" do
      h = Axon.input("h", shape: {nil, @units})
      c = Axon.input("c", shape: {nil, @units})

      templates = %{
        "h" => Nx.template({@batch, @units}, :f32),
        "c" => Nx.template({@batch, @units}, :f32)
      }

      inputs = %{
        "x" => x(),
        "h" => random({@batch, @units}, 8),
        "c" => random({@batch, @units}, 9)
      }

      for {cell, state} <- [gru: {h}, lstm: {c, h}] do
        {model_state, predict_theirs} =
          init(axon_rnn(Axon, cell, [name: "rnn"], state), templates)

        {_, predict_ours} = init(axon_rnn(Layer, cell, [name: "rnn"], state), templates)
        assert block_targets(predict_ours, model_state, inputs) == ["exphil_#{cell}_fwd"]

        Enum.zip_with(
          flat(predict_ours.(model_state, inputs)),
          flat(predict_theirs.(model_state, inputs)),
          &assert_close(&1, &2, 2.0e-6)
        )
      end

      # A fixed seed: Axon draws the initial state from the system time otherwise.
      {sequence, _carry} = Layer.lstm(input(), @units, seed: 7)
      {before, later} = train(sequence, @units)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end

    test "precision: :tf32 reaches the fused op's blocks, leaves the output of the default functions as it is" do
      inputs = %{"x" => x()}

      for {layer, target} <- [
            {&Layer.gru/3, "exphil_gru_fwd"},
            {&Layer.lstm/3, "exphil_lstm_fwd"},
            {&Layer.gru_stack(&1, &2, [layers: 2] ++ &3), "exphil_gru_stack_fwd"},
            {&Layer.lstm_stack(&1, &2, [layers: 2] ++ &3), "exphil_lstm_stack_fwd"}
          ] do
        sequence = fn opts ->
          case layer.(input(), @units, [name: "rnn"] ++ opts) do
            {sequence, _carry} -> sequence
            sequence -> sequence
          end
        end

        {model_state, exact} = init(sequence.([]))
        {_, tf32} = init(sequence.(precision: :tf32))

        assert [%{target: ^target, attributes: %{"precision" => 0}}] =
                 blocks(exact, model_state, inputs)

        assert [%{target: ^target, attributes: %{"precision" => 1}}] =
                 blocks(tf32, model_state, inputs)

        Enum.zip_with(
          flat(tf32.(model_state, inputs)),
          flat(exact.(model_state, inputs)),
          &assert_close(&1, &2, 0.0)
        )
      end

      for call <- [
            fn -> Layer.gru(input(), @units, precision: :fast) end,
            fn -> Layer.lstm_stack(input(), @units, precision: :fast) end
          ] do
        error = assert_raise ArgumentError, call
        assert error.message =~ "option :precision expected :exact or :tf32, got: :fast"
      end
    end

    test "a mask, or a gate or activation of another kind, runs Axon's own cells" do
      mask = Axon.input("mask", shape: {nil, @steps})
      m = Nx.tensor([[0, 0, 1, 0, 1], [1, 0, 0, 0, 0]])
      templates = %{"mask" => Nx.template({@batch, @steps}, :s64)}
      inputs = %{"x" => x(), "mask" => m}

      for cell <- [:gru, :lstm],
          opts <- [[mask: mask], [activation: :relu], [gate: :hard_sigmoid]] do
        opts = [name: "rnn", seed: 5] ++ opts
        {model_state, predict_theirs} = init(axon_rnn(Axon, cell, opts), templates)
        {_, predict_ours} = init(axon_rnn(Layer, cell, opts), templates)
        assert block_targets(predict_ours, model_state, inputs) == []
        assert predict_ours.(model_state, inputs) == predict_theirs.(model_state, inputs)
      end
    end

    test "Layers.gru/7 and lstm/7 take Axon.Layers' arguments, with a default mask too" do
      {ih, hh, b} =
        {%{"wir" => random({4, 3}, 1), "wiz" => random({4, 3}, 2), "win" => random({4, 3}, 3)},
         %{"whr" => random({3, 3}, 4), "whz" => random({3, 3}, 5), "whn" => random({3, 3}, 6)},
         %{
           "br" => random({3}, 7),
           "bz" => random({3}, 8),
           "bin" => random({3}, 9),
           "bhn" => random({3}, 10)
         }}

      h0 = {random({@batch, 3}, 11)}

      for mask <- [0, Nx.tensor(0)], bias <- [b, []] do
        args = [x(), h0, mask, ih, hh] ++ if(bias == [], do: [], else: [bias])
        {y, {h}} = apply(Layers, :gru, args ++ [[unroll: :dynamic]])

        {ey, {eh}} =
          apply(
            Axon.Layers,
            :gru,
            [x(), h0, Nx.tensor(mask), ih, hh] ++
              if(bias == [], do: [], else: [bias]) ++ [[unroll: :static]]
          )

        assert_close(y, ey, 2.0e-6)
        assert_close(h, eh, 2.0e-6)
      end
    end

    test "bad arguments raise ArgumentError naming them" do
      for cell <- [:gru, :lstm] do
        fun = "ExPhil.Native.Axon.#{cell}/3"

        assert_raise ArgumentError,
                     "#{fun}: argument 'input' expected an Axon node, got: 3",
                     fn ->
                       apply(Layer, cell, [3, @units])
                     end

        assert_raise ArgumentError,
                     "#{fun}: argument 'units' expected a positive integer, got: 0",
                     fn -> apply(Layer, cell, [input(), 0]) end

        assert_raise ArgumentError,
                     ~r/#{fun}: unknown options \[:initial_state\], expected one of/,
                     fn ->
                       apply(Layer, cell, [input(), @units, [initial_state: input()]])
                     end

        assert_raise ArgumentError,
                     ~r/#{fun}: option :kernel_initializer expected one of .* got: :bogus/,
                     fn -> apply(Layer, cell, [input(), @units, [kernel_initializer: :bogus]]) end

        assert_raise ArgumentError, ~r/#{cell}\/4: unknown options \[:seed\]/, fn ->
          apply(Layer, cell, [input(), {input()}, @units, [seed: 1]])
        end
      end

      assert_raise ArgumentError,
                   "ExPhil.Native.Axon.lstm/4: argument 'hidden_state' expected {c, h}, Axon nodes, got: {3}",
                   fn -> Layer.lstm(input(), {3}, @units, []) end
    end
  end

  # Two (or three) Axon layers chained, each on the sequence of the one
  # before, from given initial states (Axon's own draw them at random): the
  # model gru_stack/3 and lstm_stack/3 stand for. `states`: the states'
  # input nodes per layer ({h} or {c, h}).
  defp axon_chain(cell, layers) do
    {sequence, finals} =
      Enum.reduce(0..(layers - 1), {input(), []}, fn l, {seq, finals} ->
        state = chain_state(cell, l)

        {seq, carry} =
          apply(Axon, cell, [
            seq,
            state,
            @units,
            [name: "rnn_#{l}", bias_initializer: &uniform_bias/3]
          ])

        {seq, finals ++ [carry]}
      end)

    Axon.container({sequence, List.to_tuple(finals)})
  end

  defp chain_state(:gru, l), do: {Axon.input("h#{l}", shape: {nil, @units})}

  defp chain_state(:lstm, l),
    do: {Axon.input("c#{l}", shape: {nil, @units}), Axon.input("h#{l}", shape: {nil, @units})}

  # The stack's initial states as inputs {layers, batch, units}.
  defp stack_state(:gru), do: Axon.input("h", shape: {nil, nil, @units})

  defp stack_state(:lstm),
    do: {Axon.input("c", shape: {nil, nil, @units}), Axon.input("h", shape: {nil, nil, @units})}

  defp stacks_agree_with_axon_chain(cell, layers) do
    names = if cell == :gru, do: ~w(h), else: ~w(c h)

    per_layer =
      for n <- names,
          l <- 0..(layers - 1),
          into: %{},
          do: {"#{n}#{l}", random({@batch, @units}, 40 + l * 3 + String.length(n))}

    stacked =
      Map.new(names, fn n ->
        {n, Nx.stack(for l <- 0..(layers - 1), do: per_layer["#{n}#{l}"])}
      end)

    chain_templates = Map.new(per_layer, fn {k, v} -> {k, Nx.template(Nx.shape(v), :f32)} end)
    stack_templates = Map.new(stacked, fn {k, v} -> {k, Nx.template(Nx.shape(v), :f32)} end)

    {theirs_state, predict_theirs} = init(axon_chain(cell, layers), chain_templates)

    ours =
      apply(Layer, :"#{cell}_stack", [
        input(),
        @units,
        [layers: layers, name: "stack", initial_state: stack_state(cell), return_state: true]
      ])

    {ours_state, predict_ours} = init(ours, stack_templates)

    # The documented names and shapes; then Axon's values under them.
    params =
      for l <- 0..(layers - 1),
          {kind, suffix} <- [{"input_kernel", ""}, {"hidden_kernel", ""}, {"bias", ""}],
          into: %{} do
        {"#{kind}_#{l}#{suffix}", theirs_state.data["rnn_#{l}"][kind]}
      end

    assert deep_shapes(ours_state.data["stack"]) == deep_shapes(params)
    ours_state = put_in(ours_state.data["stack"], params)

    inputs_theirs = Map.put(per_layer, "x", x())
    inputs_ours = Map.put(stacked, "x", x())
    assert block_targets(predict_ours, ours_state, inputs_ours) == ["exphil_#{cell}_stack_fwd"]

    {sequence, finals} = predict_theirs.(theirs_state, inputs_theirs)
    {got_sequence, got_final} = predict_ours.(ours_state, inputs_ours)
    assert_close(got_sequence, sequence, 5.0e-6)

    # The final states, stacked over the layers ({c, h} for the LSTM).
    finals = Tuple.to_list(finals)

    case cell do
      :gru ->
        assert_close(got_final, Nx.stack(Enum.map(finals, &elem(&1, 0))), 5.0e-6)

      :lstm ->
        {c, h} = got_final
        assert_close(c, Nx.stack(Enum.map(finals, &elem(&1, 0))), 5.0e-6)
        assert_close(h, Nx.stack(Enum.map(finals, &elem(&1, 1))), 5.0e-6)
    end

    # Gradients in every parameter, through the stack's custom_grad and
    # through Axon's cells.
    weights = random(Nx.shape(sequence), 50)

    loss_theirs = fn params ->
      state =
        Enum.reduce(0..(layers - 1), theirs_state, fn l, st ->
          put_in(
            st.data["rnn_#{l}"],
            Map.new(["input_kernel", "hidden_kernel", "bias"], &{&1, params["#{&1}_#{l}"]})
          )
        end)

      {seq, _} = predict_theirs.(state, inputs_theirs)
      Nx.sum(Nx.multiply(seq, weights))
    end

    loss_ours = fn params ->
      {seq, _} = predict_ours.(put_in(ours_state.data["stack"], params), inputs_ours)
      Nx.sum(Nx.multiply(seq, weights))
    end

    expected = Nx.Defn.grad(params, loss_theirs)
    got = Nx.Defn.grad(params, loss_ours)

    for {group, by_name} <- expected, {name, grad} <- by_name do
      assert_close(got[group][name], grad, 2.0e-5)
    end
  end

  describe "gru_stack/3 and lstm_stack/3: stacked layers in one node" do
    for cell <- [:gru, :lstm], layers <- [2, 3] do
      test "#{cell} #{layers} layers: Axon's layers' parameters, renamed, give the chain's output and gradients",
        do: stacks_agree_with_axon_chain(unquote(cell), unquote(layers))
    end

    test "trains, and its sequence alone without return_state" do
      model = Layer.gru_stack(input(), @units, layers: 2)
      {model_state, predict_fn} = init(model)
      assert Map.keys(model_state.data) == ["gru_stack_0"]
      assert Nx.shape(predict_fn.(model_state, %{"x" => x()})) == {@batch, @steps, @units}
      {before, later} = train(model, @units)
      assert later < 0.9 * before, "loss #{before} -> #{later}"
    end

    test "bad options raise ArgumentError naming them" do
      for {call, message} <- [
            {fn -> Layer.gru_stack(input(), @units, layers: 5) end,
             "ExPhil.Native.Axon.gru_stack/3: option :layers expected 2, 3 or 4, got: 5"},
            {fn -> Layer.lstm_stack(input(), @units, initial_state: Axon.input("h")) end,
             "ExPhil.Native.Axon.lstm_stack/3: option :initial_state expected {c, h}, two Axon nodes"},
            {fn -> Layer.gru_stack(input(), 0) end,
             "argument 'units' expected a positive integer"},
            {fn -> Layer.gru_stack(input(), @units, kernel_initializer: :nope) end,
             "option :kernel_initializer expected one of"},
            {fn -> Layer.gru_stack(input(), @units, unroll: :static) end,
             "unknown options [:unroll]"}
          ] do
        error = assert_raise ArgumentError, call
        assert error.message =~ message
      end
    end
  end

  describe "bad options raise ArgumentError naming the option" do
    test "common and recurrent options" do
      for builder <- [&Layer.min_gru/3, &Layer.min_lstm/3, &Layer.liquid/3] do
        assert_raise ArgumentError, ~r/argument 'input' expected an Axon node, got: 3/, fn ->
          builder.(3, @units, [])
        end

        assert_raise ArgumentError,
                     ~r/argument 'units' expected a positive integer, got: 0/,
                     fn ->
                       builder.(input(), 0, [])
                     end

        assert_raise ArgumentError, ~r/unknown options \[:unit\], expected one of/, fn ->
          builder.(input(), @units, unit: 3)
        end

        assert_raise ArgumentError,
                     ~r/option :return_state expected a boolean, got: :yes/,
                     fn -> builder.(input(), @units, return_state: :yes) end

        assert_raise ArgumentError,
                     ~r/option :initial_state expected nil or an Axon node, got: #Nx.Tensor/,
                     fn -> builder.(input(), @units, initial_state: Nx.tensor(0.0)) end

        assert_raise ArgumentError,
                     ~r/option :kernel_initializer expected one of \[:zeros.* got: :bogus/,
                     fn -> builder.(input(), @units, kernel_initializer: :bogus) end

        assert_raise ArgumentError,
                     ~r/option :bias_initializer expected .* got: #Function/,
                     fn -> builder.(input(), @units, bias_initializer: fn -> 0 end) end

        assert_raise ArgumentError, ~r/option :name expected nil, a string .* got: 3/, fn ->
          builder.(input(), @units, name: 3)
        end
      end

      assert_raise ArgumentError,
                   ~r/liquid\/3: option :min_tau expected a positive number, got: 0/,
                   fn -> Layer.liquid(input(), @units, min_tau: 0) end

      assert_raise ArgumentError, ~r/min_gru\/3: unknown options \[:min_tau\]/, fn ->
        Layer.min_gru(input(), @units, min_tau: 1.0)
      end
    end

    test "mamba options" do
      for {option, value, expected} <- [
            {:state_size, 0, "a positive integer"},
            {:expand, 1.5, "a positive integer"},
            {:conv_size, nil, "a positive integer"},
            {:dt_rank, 0, "nil or a positive integer"},
            {:return_state, 1, "a boolean"}
          ] do
        message = "ExPhil.Native.Axon.mamba/2: option :#{option} expected #{expected}, got: "

        assert_raise ArgumentError, message <> inspect(value), fn ->
          Layer.mamba(input(), [{option, value}])
        end
      end
    end

    test "attention options" do
      cases = [
        {[head_size: 4], ~r/option :num_heads expected a positive integer, got: nil/},
        {[num_heads: 2], ~r/option :head_size expected a positive integer, got: nil/},
        {[num_heads: 2, head_size: 4, num_kv_heads: 3],
         ~r/option :num_kv_heads expected a positive integer dividing num_heads \(2\), got: 3/},
        {[num_heads: 2, head_size: 4, window: 2],
         ~r/option :window expected causal: true .* got: window: 2 with causal: false/},
        {[num_heads: 2, head_size: 4, causal: true, window: 0],
         ~r/option :window expected nil or a positive integer, got: 0/},
        {[num_heads: 2, head_size: 4, causal: 1], ~r/option :causal expected a boolean, got: 1/},
        {[num_heads: 2, head_size: 4, return_state: true], ~r/unknown options \[:return_state\]/}
      ]

      for {opts, message} <- cases do
        assert_raise ArgumentError, message, fn -> Layer.attention(input(), opts) end
      end
    end
  end
end
