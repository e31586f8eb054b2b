defmodule ExPhil.Native.Pure.GatedRnn do
  @moduledoc """
  The GRU, LSTM and sLSTM sequences (`:gru`, `:lstm` and `:slstm`,
  `include/exphil/gated_rnn.hpp`) forward and backward in plain Nx: the
  pure path of those ops, and the second reference the native kernels are
  held to.

  ## Math

  `wx [B, T, G*H]` is the input projection `x W + b` of every step (the
  caller's), `r [H, G*H]` the recurrent weights, `bias [G*H]` an optional
  recurrent bias; the gates sit side by side in the last dimension, and
  `rh_t = h_{t-1} r + bias`.

    * GRU (`G = 3`, gates r, z, n, as Axon's `gru_cell`):
      `r = sigmoid(wx_r + rh_r)`, `z = sigmoid(wx_z + rh_z)`,
      `n = tanh(wx_n + r * rh_n)`, `h_t = (1 - z) n + z h_{t-1}`.
      Axon's biases `br`, `bz`, `bin` belong in `wx`; its `bhn` is the
      n part of `bias`.
    * LSTM (`G = 4`, gates i, f, g, o, as Axon's `lstm_cell`):
      `c_t = f c_{t-1} + i g`, `h_t = o tanh(c_t)`, with `g = tanh(...)`
      and the others sigmoids.
    * sLSTM (`G = 4`, gates i, f, z, o, as Edifice's `slstm_scan`), with
      `pre = wx + rh`: `m_t = max(pre_f + m_{t-1}, pre_i)`,
      `i = exp(pre_i - m_t)`, `f = exp(pre_f + m_{t-1} - m_t)`,
      `c_t = f c_{t-1} + i tanh(pre_z)`, `n_t = f n_{t-1} + i`,
      `h_t = sigmoid(pre_o) c_t / max(|n_t|, 1)`. At max()'s ties the
      backward splits the gradient as Nx's autodiff does (half to each side),
      as the kernels do (`cuda/gated_rnn/slstm_cell.cuh`).

  `h0`, `c0` and the sLSTM's `m0` default to zeros, its `n0` to ones
  (Edifice's).

  ## Algorithm

  The forward steps through time (T is read from the shape, so the loop is
  unrolled at trace time). The backward reads every `h_{t-1}` from the given
  `y`, as the kernels do: it forms all the recurrent products in one matrix
  product, the LSTM's cells by one more pass forward, then walks back in
  time carrying `dh` (and `dc`), and sums `grad_r` and `grad_bias` over
  every batch row and step at the end. The sLSTM's backward is the LSTM's
  with its states `c`, `n` and `m` recomputed and carried back.

  ## Types

  `wx`, `y`, `grad_y` and the sequence gradients (`grad_wx`, `grad_rh`)
  share one float type; everything else is computed in f32 (f64 with f64
  inputs) and returned so. Arithmetic is in that state type throughout.
  """

  @cells [:gru, :lstm, :slstm]

  # The states each cell carries, in the targets' order, with the value of
  # each when its initial state is not given.
  @states %{gru: [h: 0], lstm: [h: 0, c: 0], slstm: [h: 0, c: 0, n: 1, m: 0]}

  @doc "The number of gates of `cell`: 3 (GRU) or 4 (LSTM, sLSTM)."
  def gates(:gru), do: 3
  def gates(cell) when cell in [:lstm, :slstm], do: 4

  @doc """
  The states `cell` carries, in the targets' order: `[:h]` (GRU), `[:h, :c]`
  (LSTM), `[:h, :c, :n, :m]` (sLSTM). Each has an initial state (`:h0`, ...),
  a final one (`:h_final`, ...) and their gradients.
  """
  def states(cell) when cell in @cells, do: Keyword.keys(@states[cell])

  @doc """
  Runs `cell` over `wx [B, T, G*H]` with recurrent weights `r [H, G*H]`.
  Options: `:bias` `[G*H]`, `:h0` `[B, H]`, for the LSTM and the sLSTM
  `:c0` `[B, H]`, and for the sLSTM `:n0` and `:m0` `[B, H]` (each nil or
  absent by default).

  Returns `%{y: y, h_final: h_final}`, with `:c_final` for the LSTM and
  `:c_final`, `:n_final`, `:m_final` for the sLSTM: `y` `[B, T, H]` in the
  type of `wx`, the final states `[B, H]` in the state type (before any
  rounding of `y`).
  """
  def forward(cell, wx, r, opts \\ []) when cell in @cells do
    {type, state} = types(wx)
    up = &(&1 && Nx.as_type(&1, state))
    {wx, r, bias} = {up.(wx), up.(r), up.(opts[:bias])}
    {batch, steps, hidden} = dims(cell, wx, r)

    {hs, final} =
      Enum.map_reduce(0..(steps - 1), initial(cell, opts, state, {batch, hidden}), fn t, s ->
        s = step(cell, step_of(wx, t), recurrent(s.h, r, bias), s)
        {s.h, s}
      end)

    for {name, value} <- final,
        into: %{y: hs |> Nx.stack(axis: 1) |> Nx.as_type(type)},
        do: {:"#{name}_final", value}
  end

  @doc """
  The gradients of `forward/4` given its `wx`, `r` and options, its `y`,
  and `grad_y [B, T, H]`. Options as the forward's, and the final states'
  gradients `[B, H]`: `:grad_h_final`, `:grad_c_final` (LSTM, sLSTM),
  `:grad_n_final` and `:grad_m_final` (sLSTM).

  Returns `%{grad_wx:, grad_rh:, grad_r:, grad_bias:, grad_h0:}`, with
  `:grad_c0` for the LSTM and `:grad_c0`, `:grad_n0`, `:grad_m0` for the
  sLSTM. `grad_rh` is the gradient of the recurrent pre-activations
  `h_{t-1} r + bias` (Edifice's; it equals `grad_wx` but for the GRU's n
  gate, where it is `r` times it); `grad_bias` and the initial states'
  gradients are given also without `bias` or those states (at their
  defaults).
  """
  def backward(cell, wx, r, y, grad_y, opts \\ []) when cell in @cells do
    {type, state} = types(wx)
    up = &(&1 && Nx.as_type(&1, state))
    {wx, r, bias, y, grad_y} = {up.(wx), up.(r), up.(opts[:bias]), up.(y), up.(grad_y)}
    {batch, steps, hidden} = dims(cell, wx, r)
    zeros = Nx.broadcast(Nx.tensor(0, type: state), {batch, hidden})
    initial = initial(cell, opts, state, {batch, hidden})

    # Every h_{t-1}, and every recurrent product at once.
    h_prev = previous_states(initial.h, y, steps)

    rh = h_prev |> Nx.dot([2], r, [0]) |> add_bias(bias)

    # What each step's derivative takes besides wx, rh and h_{t-1}: the
    # LSTM's and sLSTM's states, recomputed by one more pass forward.
    saved = cell |> recompute(wx, rh, initial, steps) |> List.to_tuple()

    finals =
      Map.new(@states[cell], fn {name, _} ->
        {name, up.(opts[:"grad_#{name}_final"]) || zeros}
      end)

    {per_step, initial_grads} =
      Enum.map_reduce((steps - 1)..0//-1, finals, fn t, d ->
        d = %{d | h: Nx.add(d.h, step_of(grad_y, t))}

        {dwx, drh, d} =
          step_backward(
            cell,
            step_of(wx, t),
            step_of(rh, t),
            step_of(h_prev, t),
            elem(saved, t),
            d,
            r
          )

        {{dwx, drh}, d}
      end)

    {dwx, drh} = per_step |> Enum.reverse() |> Enum.unzip()
    grad_wx = Nx.stack(dwx, axis: 1)
    grad_rh = Nx.stack(drh, axis: 1)

    for {name, grad} <- initial_grads,
        into: %{
          grad_wx: Nx.as_type(grad_wx, type),
          grad_rh: Nx.as_type(grad_rh, type),
          grad_r: Nx.dot(h_prev, [0, 1], grad_rh, [0, 1]),
          grad_bias: Nx.sum(grad_rh, axes: [0, 1])
        },
        do: {:"grad_#{name}0", grad}
  end

  # The initial states of `cell`, by name: the options `h0`, `c0`, ... given,
  # in the state type, or their defaults.
  defp initial(cell, opts, state, shape) do
    Map.new(@states[cell], fn {name, default} ->
      given = opts[:"#{name}0"]

      {name,
       if(given,
         do: Nx.as_type(given, state),
         else: Nx.broadcast(Nx.tensor(default, type: state), shape)
       )}
    end)
  end

  # The sequence type and the state type of a call.
  defp types(wx) do
    case Nx.type(wx) do
      {:f, 64} -> {{:f, 64}, {:f, 64}}
      {:f, _} = t -> {t, {:f, 32}}
      {:bf, 16} = t -> {t, {:f, 32}}
      t -> raise ArgumentError, "argument 'wx': expected a float type, got: #{inspect(t)}"
    end
  end

  defp dims(cell, wx, r) do
    {batch, steps, width} = Nx.shape(wx)
    {hidden, ^width} = Nx.shape(r)

    unless width == gates(cell) * hidden,
      do:
        raise(
          ArgumentError,
          "argument 'r': expected shape {H, #{gates(cell)} * H}, got: #{inspect(Nx.shape(r))}"
        )

    {batch, steps, hidden}
  end

  # h_{t-1} of every step [B, T, H]: h0, then y but its last step.
  defp previous_states(h0, _y, 1), do: Nx.new_axis(h0, 1)

  defp previous_states(h0, y, steps),
    do:
      Nx.concatenate([Nx.new_axis(h0, 1), Nx.slice_along_axis(y, 0, steps - 1, axis: 1)], axis: 1)

  defp step_of(x, t), do: x |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])

  defp recurrent(h, r, bias), do: h |> Nx.dot(r) |> add_bias(bias)

  defp add_bias(x, nil), do: x
  defp add_bias(x, bias), do: Nx.add(x, bias)

  # The gates of one step, split along the last axis.
  defp split(x, count) do
    width = div(Nx.axis_size(x, -1), count)
    for k <- 0..(count - 1), do: Nx.slice_along_axis(x, k * width, width, axis: -1)
  end

  # One step forward: the states after it, from those before (`s`).
  defp step(:gru, wx, rh, %{h: h}) do
    [wx_r, wx_z, wx_n] = split(wx, 3)
    [rh_r, rh_z, rh_n] = split(rh, 3)
    r = Nx.sigmoid(Nx.add(wx_r, rh_r))
    z = Nx.sigmoid(Nx.add(wx_z, rh_z))
    n = Nx.tanh(Nx.add(wx_n, Nx.multiply(r, rh_n)))
    %{h: Nx.add(Nx.multiply(Nx.subtract(1, z), n), Nx.multiply(z, h))}
  end

  defp step(:lstm, wx, rh, %{c: c}) do
    [i, f, g, o] = lstm_gates(Nx.add(wx, rh))
    c = Nx.add(Nx.multiply(f, c), Nx.multiply(i, g))
    %{h: Nx.multiply(o, Nx.tanh(c)), c: c}
  end

  defp step(:slstm, wx, rh, s), do: s |> slstm_step(Nx.add(wx, rh)) |> elem(0)

  defp lstm_gates(pre) do
    [i, f, g, o] = split(pre, 4)
    [Nx.sigmoid(i), Nx.sigmoid(f), Nx.tanh(g), Nx.sigmoid(o)]
  end

  # One sLSTM step from the pre-activations `pre` (slstm_cell.cuh's
  # slstm_step, Edifice's slstm_scan_fallback): the states after it, and its
  # gates (i' and f' stabilised) with the two sides of m's max.
  defp slstm_step(%{c: c, n: n, m: m}, pre) do
    [log_i, log_f, pre_z, pre_o] = split(pre, 4)
    a = Nx.add(log_f, m)
    m = Nx.max(a, log_i)
    i = Nx.exp(Nx.subtract(log_i, m))
    f = Nx.exp(Nx.subtract(a, m))
    z = Nx.tanh(pre_z)
    o = Nx.sigmoid(pre_o)
    c = Nx.add(Nx.multiply(f, c), Nx.multiply(i, z))
    n = Nx.add(Nx.multiply(f, n), i)
    h = Nx.multiply(o, Nx.divide(c, Nx.max(Nx.abs(n), 1.0)))
    {%{h: h, c: c, n: n, m: m}, %{i: i, f: f, z: z, o: o, a: a, log_i: log_i}}
  end

  # What step_backward/7 takes of each step besides wx, rh and h_{t-1}, in
  # time order, from every step's wx and rh [B, T, G*H]: nothing for the
  # GRU; the LSTM's c_t and c_{t-1}; the sLSTM's gates and its states before
  # and after the step. The recurrence runs on the given h_{t-1}.
  defp recompute(:gru, _wx, _rh, _initial, steps), do: List.duplicate(nil, steps)

  defp recompute(:lstm, wx, rh, initial, steps) do
    pre = Nx.add(wx, rh)

    {saved, _c} =
      Enum.map_reduce(0..(steps - 1), initial.c, fn t, c_prev ->
        [i, f, g, _o] = lstm_gates(step_of(pre, t))
        c = Nx.add(Nx.multiply(f, c_prev), Nx.multiply(i, g))
        {{c, c_prev}, c}
      end)

    saved
  end

  defp recompute(:slstm, wx, rh, initial, steps) do
    pre = Nx.add(wx, rh)

    {saved, _s} =
      Enum.map_reduce(0..(steps - 1), initial, fn t, prev ->
        {s, gates} = slstm_step(prev, step_of(pre, t))
        {{gates, s, prev}, s}
      end)

    saved
  end

  # One step back: the gradients of its wx and rh, and `d`, the gradients
  # carried into its states (dh already holds grad_y_t), carried into the
  # step before's.
  defp step_backward(:gru, wx, rh, h_prev, nil, %{h: dh}, r_weights) do
    [wx_r, wx_z, wx_n] = split(wx, 3)
    [rh_r, rh_z, rh_n] = split(rh, 3)
    r = Nx.sigmoid(Nx.add(wx_r, rh_r))
    z = Nx.sigmoid(Nx.add(wx_z, rh_z))
    n = Nx.tanh(Nx.add(wx_n, Nx.multiply(r, rh_n)))

    dn = Nx.multiply(dh, Nx.subtract(1, z))
    dz = Nx.multiply(dh, Nx.subtract(h_prev, n))
    da_n = Nx.multiply(dn, Nx.subtract(1, Nx.multiply(n, n)))
    da_r = da_n |> Nx.multiply(rh_n) |> Nx.multiply(Nx.multiply(r, Nx.subtract(1, r)))
    da_z = Nx.multiply(dz, Nx.multiply(z, Nx.subtract(1, z)))

    dwx = Nx.concatenate([da_r, da_z, da_n], axis: -1)
    drh = Nx.concatenate([da_r, da_z, Nx.multiply(da_n, r)], axis: -1)
    {dwx, drh, %{h: Nx.add(Nx.multiply(dh, z), Nx.dot(drh, [1], r_weights, [1]))}}
  end

  defp step_backward(:lstm, wx, rh, _h_prev, {c, c_prev}, %{h: dh, c: dc}, r_weights) do
    [i, f, g, o] = lstm_gates(Nx.add(wx, rh))
    tc = Nx.tanh(c)
    do_ = Nx.multiply(dh, tc)
    dc = Nx.add(dc, dh |> Nx.multiply(o) |> Nx.multiply(Nx.subtract(1, Nx.multiply(tc, tc))))

    da_i = dc |> Nx.multiply(g) |> Nx.multiply(Nx.multiply(i, Nx.subtract(1, i)))
    da_f = dc |> Nx.multiply(c_prev) |> Nx.multiply(Nx.multiply(f, Nx.subtract(1, f)))
    da_g = dc |> Nx.multiply(i) |> Nx.multiply(Nx.subtract(1, Nx.multiply(g, g)))
    da_o = Nx.multiply(do_, Nx.multiply(o, Nx.subtract(1, o)))

    d = Nx.concatenate([da_i, da_f, da_g, da_o], axis: -1)
    {d, d, %{h: Nx.dot(d, [1], r_weights, [1]), c: Nx.multiply(dc, f)}}
  end

  # slstm_cell.cuh's slstm_step_backward: m's max gives a tie's gradient
  # half to each side, max(|n|, 1) half of |n|'s slope at |n| = 1 (and abs
  # takes 0 as positive), as Nx's autodiff does.
  defp step_backward(:slstm, _wx, _rh, _h_prev, {g, s, prev}, d, r_weights) do
    abs_n = Nx.abs(s.n)
    inv = Nx.divide(1.0, Nx.max(abs_n, 1.0))
    q = Nx.multiply(s.c, inv)
    w_n = Nx.multiply(tie_share(abs_n, 1.0), Nx.select(Nx.less(s.n, 0), -1.0, 1.0))
    dh_o = Nx.multiply(d.h, g.o)
    dc = Nx.add(d.c, Nx.multiply(dh_o, inv))
    dn = Nx.subtract(d.n, dh_o |> Nx.multiply(q) |> Nx.multiply(inv) |> Nx.multiply(w_n))
    dli = dc |> Nx.multiply(g.z) |> Nx.add(dn) |> Nx.multiply(g.i)

    dlf =
      dc
      |> Nx.multiply(prev.c)
      |> Nx.add(Nx.multiply(dn, prev.n))
      |> Nx.multiply(g.f)

    dm = d.m |> Nx.subtract(dli) |> Nx.subtract(dlf)
    to_f = Nx.multiply(tie_share(g.a, g.log_i), dm)
    da_i = Nx.add(dli, Nx.subtract(dm, to_f))
    da_f = Nx.add(dlf, to_f)
    da_z = dc |> Nx.multiply(g.i) |> Nx.multiply(Nx.subtract(1, Nx.multiply(g.z, g.z)))
    da_o = d.h |> Nx.multiply(q) |> Nx.multiply(g.o) |> Nx.multiply(Nx.subtract(1, g.o))
    da = Nx.concatenate([da_i, da_f, da_z, da_o], axis: -1)

    {da, da,
     %{
       h: Nx.dot(da, [1], r_weights, [1]),
       c: Nx.multiply(dc, g.f),
       n: Nx.multiply(dn, g.f),
       m: da_f
     }}
  end

  # The share of max(x, y)'s gradient that x takes: 1, 0, or 1/2 at a tie.
  defp tie_share(x, y),
    do: Nx.select(Nx.greater(x, y), 1.0, Nx.select(Nx.less(x, y), 0.0, 0.5))
end
