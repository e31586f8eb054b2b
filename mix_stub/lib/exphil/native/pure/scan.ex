defmodule ExPhil.Native.Pure.Scan do
  @moduledoc """
  The four linear-recurrence ops (`:linear_scan`, `:min_gru`, `:min_lstm`,
  `:liquid`), forward and backward, in plain Nx: the pure default of the
  native ops, the function their `Nx.block` falls back to where no backend
  supplies the fused kernel.

  ## Recurrence

  Every op is `h_t = a_t * h_{t-1} + b_t` over `t = 1..T`, with `h_0 = h0`
  (zeros when `h0` is nil) and `(a_t, b_t)` derived from the op's inputs as
  in the README's "Ops" table and `cuda/scan/scan_ops.cuh`, whose formulas
  are mirrored here, including the ones that avoid cancellation in f32
  (`1 - sigmoid(x)` as `sigmoid(-x)`, `1 - exp(-1/tau)` as
  `-expm1(-1/tau)`).

  ## Algorithm

  A per-step loop would build a graph (or run a loop) of `T` steps, so the
  recurrence is solved as an associative scan of the affine maps
  `h -> a h + b` along the time axis (Hillis-Steele): `h0` is folded into
  the first step (`b_1 += a_1 h0`), then for `k = 1, 2, 4, ... < T`, every
  step `t > k` composes with the one `k` earlier,
  `(a_t, b_t) <- (a_t a_{t-k}, b_t + a_t b_{t-k})`. After `ceil(log2(T))`
  passes `b_t = h_t`. `T` is read from the shape, so the number of passes
  is fixed at trace time.

  The backward is the same scan run backwards in time,
  `dh_t = grad_y_t + a_{t+1} dh_{t+1}` with `grad_h_final` entering at
  `t = T`; then `grad_b_t = dh_t`, `grad_a_t = dh_t h_{t-1}`,
  `grad_h0 = a_1 dh_1`, and the chain rule through each op's `(a, b)`. As
  the GPU kernel does, `h_{t-1}` is read from the given `y` (upcast), not
  recomputed.

  ## Layout and types

  Sequence tensors (inputs, `y`, `grad_y`, input gradients) are `[B, T, H]`
  and share one float type (f32, bf16 or f16 as on the kernels; f64, which
  only this implementation takes); state tensors (`h0`, `h_final`,
  `grad_h_final`, `grad_h0`) are `[B, H]` and f32 (f64 with f64 inputs). All
  arithmetic is in the state type: inputs are upcast on entry and sequence
  outputs cast back to the inputs' type on exit.

  Only Nx functions are used, with no control flow on tensor values, so the
  functions run on concrete tensors of any backend and inside `defn` on
  traced ones alike.
  """

  @ops [:linear_scan, :min_gru, :min_lstm, :liquid]

  # The epsilon of min_lstm's normaliser s = f + i + eps, as in the kernel.
  @lstm_eps 1.0e-6

  @doc "The number of `[B, T, H]` inputs of `op`."
  def input_count(:linear_scan), do: 2
  def input_count(:min_gru), do: 2
  def input_count(:min_lstm), do: 3
  def input_count(:liquid), do: 2

  @doc """
  Runs `op` over `inputs` (a list of `input_count(op)` tensors `[B, T, H]`
  of one float type) from `h0` (nil for zeros, or f32 `[B, H]`).

  Returns `{y, h_final}`: every state `y [B, T, H]` in the inputs' type and
  the last one, `h_final [B, H]`, in f32 (before any rounding of `y`).
  """
  def forward(op, inputs, h0) when op in @ops do
    type = sequence_type!(op, inputs)
    up = &Nx.as_type(&1, state_type(type))
    {a, b} = coefficients(op, Enum.map(inputs, up))
    h = scan(a, b, h0 && up.(h0))
    steps = Nx.axis_size(h, 1)
    h_final = h |> Nx.slice_along_axis(steps - 1, 1, axis: 1) |> Nx.squeeze(axes: [1])
    {Nx.as_type(h, type), h_final}
  end

  @doc """
  Gradients of `op` given the forward's `inputs`, `h0` and `y` (as the
  forward returned it), `grad_y [B, T, H]` in the inputs' type and
  `grad_h_final` (nil, or f32 `[B, H]`).

  Returns `{grad_input_1, ..., grad_input_n, grad_h0}`: each input's gradient
  in the inputs' type, and `grad_h0` in f32, computed also when `h0` is nil
  (the gradient with respect to the zero initial state).
  """
  def backward(op, inputs, h0, y, grad_y, grad_h_final) when op in @ops do
    type = sequence_type!(op, inputs)
    up = &Nx.as_type(&1, state_type(type))
    xs = Enum.map(inputs, up)
    {a, _b} = coefficients(op, xs)

    # dh_t = grad_y_t + a_{t+1} dh_{t+1}: in reversed time, the forward scan
    # with a_{t+1} as coefficient; its "a_{T+1}" is 1 so that grad_h_final,
    # folded in as the initial state, enters dh_T unchanged.
    a_next = shift(a, -1, 1.0)
    reverse = &Nx.reverse(&1, axes: [1])

    dh =
      reverse.(scan(reverse.(a_next), reverse.(up.(grad_y)), grad_h_final && up.(grad_h_final)))

    h_prev = shift(up.(y), 1, 0.0)
    h_prev = if h0, do: Nx.add(h_prev, first_step(up.(h0), Nx.axis_size(a, 1))), else: h_prev

    first = &(&1 |> Nx.slice_along_axis(0, 1, axis: 1) |> Nx.squeeze(axes: [1]))
    grad_h0 = Nx.multiply(first.(a), first.(dh))

    op
    |> input_gradients(xs, h_prev, dh)
    |> Enum.map(&Nx.as_type(&1, type))
    |> Kernel.++([grad_h0])
    |> List.to_tuple()
  end

  defp sequence_type!(op, inputs) do
    count = input_count(op)

    unless length(inputs) == count do
      raise ArgumentError, "#{op} takes #{count} inputs, got #{length(inputs)}"
    end

    [first | rest] = inputs
    type = Nx.type(first)

    unless type in [{:f, 64}, {:f, 32}, {:bf, 16}, {:f, 16}] do
      raise ArgumentError, "#{op}: inputs must be f64, f32, bf16 or f16, got #{inspect(type)}"
    end

    if x = Enum.find(rest, &(Nx.type(&1) != type or Nx.shape(&1) != Nx.shape(first))) do
      raise ArgumentError,
            "#{op}: every input must be #{inspect(type)} #{inspect(Nx.shape(first))} as the first, " <>
              "got #{inspect(Nx.type(x))} #{inspect(Nx.shape(x))}"
    end

    type
  end

  # The kernels' arithmetic: f32, and f64 for f64 inputs (which only this
  # implementation takes).
  defp state_type({:f, 64}), do: {:f, 64}
  defp state_type(_type), do: {:f, 32}

  # h_t for every t: the inclusive scan of h -> a_t h + b_t from h0 (nil: 0).
  defp scan(a, b, h0) do
    steps = Nx.axis_size(a, 1)
    b = if h0, do: Nx.add(b, Nx.multiply(a, first_step(h0, steps))), else: b

    {_a, h} =
      1
      |> Stream.iterate(&(&1 * 2))
      |> Enum.take_while(&(&1 < steps))
      |> Enum.reduce({a, b}, fn k, {a, b} ->
        # Before this pass (a_t, b_t) composes steps max(1, t - k + 1)..t,
        # after it max(1, t - 2k + 1)..t. The identity map (a = 1, b = 0)
        # fills the first k steps, which have no step k earlier.
        {Nx.multiply(a, shift(a, k, 1.0)), Nx.add(b, Nx.multiply(a, shift(b, k, 0.0)))}
      end)

    h
  end

  # x moved k steps later in time (earlier for k < 0) along axis 1, the
  # vacated steps filled with `fill`. Negative padding drops the steps
  # moved out, with no slice of length zero when T = 1.
  defp shift(x, k, fill), do: Nx.pad(x, fill, [{0, 0, 0}, {k, -k, 0}, {0, 0, 0}])

  # A state [B, H] placed at t = 1 of a [B, T, H] sequence of zeros.
  defp first_step(state, steps) do
    state |> Nx.new_axis(1) |> Nx.pad(0.0, [{0, 0, 0}, {0, steps - 1, 0}, {0, 0, 0}])
  end

  # {sigmoid(x), 1 - sigmoid(x)}, the second without cancellation.
  defp sigmoid_pair(x), do: {Nx.sigmoid(x), Nx.sigmoid(Nx.negate(x))}

  defp coefficients(:linear_scan, [a, b]), do: {a, b}

  defp coefficients(:min_gru, [gate, candidate]) do
    {z, one_minus_z} = sigmoid_pair(gate)
    {one_minus_z, Nx.multiply(z, candidate)}
  end

  defp coefficients(:min_lstm, [forget, input, candidate]) do
    {f, i} = {Nx.sigmoid(forget), Nx.sigmoid(input)}
    inv_s = Nx.divide(1.0, f |> Nx.add(i) |> Nx.add(@lstm_eps))
    {Nx.multiply(f, inv_s), i |> Nx.multiply(inv_s) |> Nx.multiply(candidate)}
  end

  defp coefficients(:liquid, [tau, target]) do
    q = Nx.divide(-1.0, tau)
    {Nx.exp(q), Nx.multiply(target, Nx.negate(Nx.expm1(q)))}
  end

  # The chain rule from g = dL/dh_t (= dL/db_t; dL/da_t = g h_{t-1}) into
  # each input of the op.
  defp input_gradients(:linear_scan, [_a, _b], h_prev, g), do: [Nx.multiply(g, h_prev), g]

  defp input_gradients(:min_gru, [gate, candidate], h_prev, g) do
    {z, one_minus_z} = sigmoid_pair(gate)
    sigmoid_slope = Nx.multiply(z, one_minus_z)

    [
      g |> Nx.multiply(Nx.subtract(candidate, h_prev)) |> Nx.multiply(sigmoid_slope),
      Nx.multiply(g, z)
    ]
  end

  defp input_gradients(:min_lstm, [forget, input, candidate], h_prev, g) do
    {f, one_minus_f} = sigmoid_pair(forget)
    {i, one_minus_i} = sigmoid_pair(input)
    inv_s = Nx.divide(1.0, f |> Nx.add(i) |> Nx.add(@lstm_eps))
    g_s2 = g |> Nx.multiply(inv_s) |> Nx.multiply(inv_s)

    # dh/df = (h_prev (i + eps) - i c) / s^2, dh/di = (c (f + eps) - f h_prev) / s^2
    dh_df = Nx.subtract(Nx.multiply(h_prev, Nx.add(i, @lstm_eps)), Nx.multiply(i, candidate))
    dh_di = Nx.subtract(Nx.multiply(candidate, Nx.add(f, @lstm_eps)), Nx.multiply(f, h_prev))

    [
      g_s2 |> Nx.multiply(dh_df) |> Nx.multiply(f) |> Nx.multiply(one_minus_f),
      g_s2 |> Nx.multiply(dh_di) |> Nx.multiply(i) |> Nx.multiply(one_minus_i),
      g |> Nx.multiply(i) |> Nx.multiply(inv_s)
    ]
  end

  defp input_gradients(:liquid, [tau, target], h_prev, g) do
    inv_tau = Nx.divide(1.0, tau)
    e = Nx.exp(Nx.negate(inv_tau))

    # de/dtau = e / tau^2
    [
      g
      |> Nx.multiply(Nx.subtract(h_prev, target))
      |> Nx.multiply(e)
      |> Nx.multiply(Nx.multiply(inv_tau, inv_tau)),
      Nx.multiply(g, Nx.negate(Nx.expm1(Nx.negate(inv_tau))))
    ]
  end
end
