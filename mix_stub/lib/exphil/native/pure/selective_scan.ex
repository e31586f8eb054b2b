defmodule ExPhil.Native.Pure.SelectiveScan do
  @moduledoc """
  Mamba's selective scan (S6) in plain Nx, forward and backward: the default
  implementation of the native `selective_scan` op, run where the CUDA
  kernels are not (another backend, or inside `defn` when the op's
  `Nx.block` is not taken over by a compiler).

  ## Definition

      delta_t   = clamp(softplus?(dt_t + dt_bias))
      h_t[d, n] = exp(delta_t[d] A[d, n]) h_{t-1}[d, n] + delta_t[d] B_t[n] x_t[d]
      y_t[d]    = (sum_n C_t[n] h_t[d, n] + D[d] x_t[d]) * silu(z_t[d])

  with `h_{-1} = h0` (zero without it). Softplus, when asked, comes after
  the bias; the clamp to `[dt_min, dt_max]` comes last. As `torch.clamp`,
  the clamp passes the gradient where `dt_min <= u <= dt_max` (bounds
  included) and blocks it where it replaces `u`; softplus' derivative is
  `sigmoid(dt + dt_bias)`.

  ## Shapes and types

    * `x`, `dt`, `z`, `y` and their gradients: `[B, T, D]`; `b`, `c` and
      their gradients: `[B, T, N]`. These share `x`'s float type (f32, bf16
      or f16).
    * `a` `[D, N]`; `dt_bias`, `d` `[D]`; `h0`, `h_final`, `grad_h_final`
      `[B, D, N]`: f32, as are their gradients.

  Everything is computed in f32 (the inputs are upcast, the sequence
  outputs rounded to `x`'s type at the end), and in f64 for f64 inputs,
  which only this implementation takes (the states are then f64 too).

  ## Algorithm

  For each `(b, d, n)` the state recurrence is linear,
  `h_t = alpha_t h_{t-1} + beta_t` with `alpha = exp(delta A)` and
  `beta = delta B x`, so the states come from a log-step (Hillis-Steele)
  associative scan over T on `[B, T, D, N]` tensors: `ceil(log2 T)` steps
  (T is static at trace time), `h0` folded into the first step. The
  backward recomputes the states that way, then `dL/dh_t` with the same
  scan run backwards in time,

      dh_t = C_t gy'_t + alpha_{t+1} dh_{t+1},   dh_{T-1} = C_{T-1} gy'_{T-1} + grad_h_final

  (`gy' = grad_y * silu(z)`, or `grad_y` without `z`), and every gradient
  from it by elementwise products and sums (over `n`; over batch and time
  for `a`, `dt_bias` and `d`; over channels for `b` and `c`).

  Only Nx functions are applied to tensors and only static shapes, types and
  options steer the code, so both functions run inside `defn` on traced
  expressions as well as on concrete tensors of any backend.
  """

  @forward_options [dt_bias: nil, d: nil, z: nil, h0: nil, softplus: false, clamp: nil]
  @backward_options @forward_options ++ [grad_h_final: nil]

  @doc """
  `{y, h_final}`: y `[B, T, D]` in `x`'s type and the final state
  `[B, D, N]` in f32.

  ## Options

    * `:dt_bias` - f32 `[D]`, added to `dt` (default `nil`: none)
    * `:d` - f32 `[D]`, the skip connection `D x` (default `nil`: none)
    * `:z` - `[B, T, D]` in `x`'s type, the gate `silu(z)` (default `nil`: none)
    * `:h0` - f32 `[B, D, N]`, the initial state (default `nil`: zeros)
    * `:softplus` - apply softplus to `dt + dt_bias` (default `false`)
    * `:clamp` - `{dt_min, dt_max}` floats, clamping delta last (default `nil`)
  """
  def forward(x, dt, a, b, c, opts) do
    opts = Keyword.validate!(opts, @forward_options)
    s = discretize(x, dt, a, b, opts)
    h = linear_scan(s.alpha, s.beta, s.h0)
    y = ungated_output(h, c_n(c), s.x, opts[:d])
    y = if z = opts[:z], do: Nx.multiply(y, silu(up(z))), else: y
    {Nx.as_type(y, Nx.type(x)), last_step(h)}
  end

  @doc """
  The gradients of the forward's inputs given `grad_y` (`[B, T, D]`, `x`'s
  type) and, as the option `:grad_h_final`, the f32 gradient of `h_final`
  (default `nil`: zeros). Other options as in `forward/6`.

  Returns `%{grad_x:, grad_dt:, grad_a:, grad_b:, grad_c:, grad_dt_bias:,
  grad_d:, grad_z:, grad_h0:}`, each of its input's shape: those of x, dt,
  b, c and z in `x`'s type, the others f32; the gradient of an optional
  input that is absent is `nil`.
  """
  def backward(x, dt, a, b, c, grad_y, opts) do
    opts = Keyword.validate!(opts, @backward_options)
    s = discretize(x, dt, a, b, opts)
    h = linear_scan(s.alpha, s.beta, s.h0)
    c_n = c_n(c)
    grad_y = up(grad_y)

    # grad_ungated = dL/d(the output before the gate)
    {grad_ungated, grad_z} =
      case opts[:z] do
        nil ->
          {grad_y, nil}

        z ->
          z = up(z)
          sigmoid_z = Nx.sigmoid(z)
          # silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)
          silu_slope =
            Nx.multiply(sigmoid_z, Nx.add(1, Nx.multiply(z, Nx.subtract(1, sigmoid_z))))

          ungated = ungated_output(h, c_n, s.x, opts[:d])

          {Nx.multiply(grad_y, Nx.multiply(z, sigmoid_z)),
           grad_y |> Nx.multiply(ungated) |> Nx.multiply(silu_slope)}
      end

    grad_ungated_n = Nx.new_axis(grad_ungated, -1)

    # dh_t receives alpha_{t+1} dh_{t+1}; at t = T - 1 the carry is
    # grad_h_final itself, hence alpha_T = 1.
    alpha_next = Nx.pad(s.alpha, 1.0, [{0, 0, 0}, {-1, 1, 0}, {0, 0, 0}, {0, 0, 0}])
    grad_h_final = if g = opts[:grad_h_final], do: up(g)
    dh = linear_scan(alpha_next, Nx.multiply(c_n, grad_ungated_n), grad_h_final, reverse: true)

    # h_t = alpha_t h_{t-1} + delta_t B_t x_t, alpha_t = exp(delta_t A): the
    # decay's part, dh alpha h_{t-1}, feeds the gradients of both delta and A.
    dh_decayed = dh |> Nx.multiply(s.alpha) |> Nx.multiply(previous_states(h, s.h0))
    dh_delta = Nx.multiply(dh, s.delta_n)

    grad_delta =
      Nx.add(
        Nx.sum(Nx.multiply(dh_decayed, s.a), axes: [3]),
        Nx.sum(dh |> Nx.multiply(s.b_n) |> Nx.multiply(s.x_n), axes: [3])
      )

    grad_dt = Nx.multiply(grad_delta, s.slope)
    grad_x = Nx.sum(Nx.multiply(dh_delta, s.b_n), axes: [3])
    grad_x = if d = opts[:d], do: Nx.add(grad_x, Nx.multiply(grad_ungated, up(d))), else: grad_x
    type = Nx.type(x)

    %{
      grad_x: Nx.as_type(grad_x, type),
      grad_dt: Nx.as_type(grad_dt, type),
      grad_a: Nx.sum(Nx.multiply(dh_decayed, s.delta_n), axes: [0, 1]),
      grad_b: Nx.as_type(Nx.sum(Nx.multiply(dh_delta, s.x_n), axes: [2]), type),
      grad_c: Nx.as_type(Nx.sum(Nx.multiply(grad_ungated_n, h), axes: [2]), type),
      grad_dt_bias: if(opts[:dt_bias], do: Nx.sum(grad_dt, axes: [0, 1])),
      grad_d: if(opts[:d], do: Nx.sum(Nx.multiply(grad_ungated, s.x), axes: [0, 1])),
      grad_z: if(grad_z, do: Nx.as_type(grad_z, type)),
      grad_h0:
        if(s.h0, do: Nx.multiply(first_step(s.alpha), first_step(dh)) |> Nx.squeeze(axes: [1]))
    }
  end

  # The f32 operands of the recurrence, with the [B, T, D] ones also as
  # [B, T, D, 1] and the [B, T, N] ones as [B, T, 1, N], so that they
  # broadcast against the [B, T, D, N] states (and a [D, N] against them).
  defp discretize(x, dt, a, b, opts) do
    x = up(x)
    a = up(a)
    {delta, slope} = delta(up(dt), opts)
    x_n = Nx.new_axis(x, -1)
    b_n = Nx.new_axis(up(b), 2)
    delta_n = Nx.new_axis(delta, -1)

    %{
      x: x,
      x_n: x_n,
      a: a,
      b_n: b_n,
      delta_n: delta_n,
      slope: slope,
      alpha: Nx.exp(Nx.multiply(delta_n, a)),
      beta: delta_n |> Nx.multiply(b_n) |> Nx.multiply(x_n),
      h0: if(h0 = opts[:h0], do: up(h0))
    }
  end

  # delta and d delta / d dt (which is also d delta / d dt_bias).
  defp delta(dt, opts) do
    u = if bias = opts[:dt_bias], do: Nx.add(dt, up(bias)), else: dt
    {u, slope} = if opts[:softplus], do: {softplus(u), Nx.sigmoid(u)}, else: {u, 1.0}

    case opts[:clamp] do
      nil ->
        {u, slope}

      {lo, hi} ->
        inside = Nx.logical_and(Nx.greater_equal(u, lo), Nx.less_equal(u, hi))
        {Nx.clip(u, lo, hi), Nx.select(inside, slope, 0.0)}
    end
  end

  # log(1 + exp(u)) without overflow for large u, and precise for very
  # negative u; the references' formula.
  defp softplus(u), do: Nx.add(Nx.max(u, 0), Nx.log1p(Nx.exp(Nx.negate(Nx.abs(u)))))

  defp silu(z), do: Nx.multiply(z, Nx.sigmoid(z))

  # sum_n C_t[n] h_t[d, n] + D[d] x_t[d]: [B, T, D]
  defp ungated_output(h, c_n, x, d) do
    y = Nx.sum(Nx.multiply(c_n, h), axes: [3])
    if d, do: Nx.add(y, Nx.multiply(up(d), x)), else: y
  end

  # h_t = alpha_t h_{t-1} + beta_t along axis 1 of [B, T, D, N] tensors, from
  # h_{-1} = init (nil: zeros); with reverse: true, from h_T = init down to
  # h_0 = alpha_0 h_1 + beta_0. Composing two steps gives a step again
  # (alpha alpha', alpha beta' + beta), so after the pass at offset k every
  # position holds the composition of its last 2k steps (fewer near the
  # start, where the padding with the identity step (1, 0) stands in).
  defp linear_scan(alpha, beta, init, opts \\ []) do
    if opts[:reverse] do
      alpha
      |> Nx.reverse(axes: [1])
      |> linear_scan(Nx.reverse(beta, axes: [1]), init)
      |> Nx.reverse(axes: [1])
    else
      beta =
        if init, do: Nx.put_slice(beta, [0, 0, 0, 0], fold_initial(alpha, beta, init)), else: beta

      steps = Nx.axis_size(alpha, 1)

      {_alpha, h} =
        1
        |> Stream.iterate(&(&1 * 2))
        |> Enum.take_while(&(&1 < steps))
        |> Enum.reduce({alpha, beta}, fn k, {alpha, h} ->
          {Nx.multiply(alpha, shift(alpha, k, 1.0)),
           Nx.add(Nx.multiply(alpha, shift(h, k, 0.0)), h)}
        end)

      h
    end
  end

  # The first step applied to the initial state: alpha_0 init + beta_0.
  defp fold_initial(alpha, beta, init) do
    Nx.add(Nx.multiply(first_step(alpha), Nx.new_axis(init, 1)), first_step(beta))
  end

  # h_{t-1} for every t, h0 (or zeros) at t = 0.
  defp previous_states(h, nil), do: shift(h, 1, 0.0)

  defp previous_states(h, h0),
    do: Nx.put_slice(shift(h, 1, 0.0), [0, 0, 0, 0], Nx.new_axis(h0, 1))

  # Moves a [B, T, D, N] tensor k steps later in time, filling the first k.
  defp shift(t, k, fill), do: Nx.pad(t, fill, [{0, 0, 0}, {k, -k, 0}, {0, 0, 0}, {0, 0, 0}])

  defp first_step(t), do: Nx.slice_along_axis(t, 0, 1, axis: 1)

  defp last_step(t),
    do: t |> Nx.slice_along_axis(Nx.axis_size(t, 1) - 1, 1, axis: 1) |> Nx.squeeze(axes: [1])

  # C [B, T, N] as f32 [B, T, 1, N], to broadcast against the states.
  defp c_n(c), do: Nx.new_axis(up(c), 2)

  # The kernels' arithmetic: f32, and f64 for f64 inputs (which only this
  # implementation takes).
  defp up(t), do: Nx.as_type(t, Nx.Type.merge(Nx.type(t), {:f, 32}))
end
