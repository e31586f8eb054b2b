defmodule ExPhil.Native.Pure.GatedRnn do
  @moduledoc """
  The GRU and LSTM sequences (`:gru` and `:lstm`, `include/exphil/gated_rnn.hpp`)
  forward and backward in plain Nx: the pure path of those ops, and the
  second reference the native kernels are held to.

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

  `h0` and the LSTM's `c0` default to zeros.

  ## Algorithm

  The forward steps through time (T is read from the shape, so the loop is
  unrolled at trace time). The backward reads every `h_{t-1}` from the given
  `y`, as the kernels do: it forms all the recurrent products in one matrix
  product, the LSTM's cells by one more pass forward, then walks back in
  time carrying `dh` (and `dc`), and sums `grad_r` and `grad_bias` over
  every batch row and step at the end.

  ## Types

  `wx`, `y`, `grad_y` and the sequence gradients (`grad_wx`, `grad_rh`)
  share one float type; everything else is computed in f32 (f64 with f64
  inputs) and returned so. Arithmetic is in that state type throughout.
  """

  @cells [:gru, :lstm]

  @doc "The number of gates of `cell`: 3 (GRU) or 4 (LSTM)."
  def gates(:gru), do: 3
  def gates(:lstm), do: 4

  @doc """
  Runs `cell` over `wx [B, T, G*H]` with recurrent weights `r [H, G*H]`.
  Options: `:bias` `[G*H]`, `:h0` `[B, H]`, and for the LSTM `:c0` `[B, H]`
  (each nil or absent by default).

  Returns `%{y: y, h_final: h_final}`, and `:c_final` for the LSTM: `y`
  `[B, T, H]` in the type of `wx`, the final states `[B, H]` in the state
  type (before any rounding of `y`).
  """
  def forward(cell, wx, r, opts \\ []) when cell in @cells do
    {type, state} = types(wx)
    up = &(&1 && Nx.as_type(&1, state))
    {wx, r, bias} = {up.(wx), up.(r), up.(opts[:bias])}
    {batch, steps, hidden} = dims(cell, wx, r)
    h0 = up.(opts[:h0]) || Nx.broadcast(Nx.tensor(0, type: state), {batch, hidden})
    c0 = up.(opts[:c0]) || Nx.broadcast(Nx.tensor(0, type: state), {batch, hidden})

    {hs, {h, c}} =
      Enum.map_reduce(0..(steps - 1), {h0, c0}, fn t, {h, c} ->
        rh = recurrent(h, r, bias)
        {h, c} = step(cell, step_of(wx, t), rh, h, c)
        {h, {h, c}}
      end)

    out = %{y: hs |> Nx.stack(axis: 1) |> Nx.as_type(type), h_final: h}
    if cell == :lstm, do: Map.put(out, :c_final, c), else: out
  end

  @doc """
  The gradients of `forward/4` given its `wx`, `r` and options, its `y`,
  and `grad_y [B, T, H]`. Options as the forward's, and `:grad_h_final`,
  `:grad_c_final` (LSTM) `[B, H]`.

  Returns `%{grad_wx:, grad_rh:, grad_r:, grad_bias:, grad_h0:}` and
  `:grad_c0` for the LSTM. `grad_rh` is the gradient of the recurrent
  pre-activations `h_{t-1} r + bias` (Edifice's; it equals `grad_wx` but
  for the GRU's n gate, where it is `r` times it); `grad_bias` and
  `grad_h0` are given also without `bias` or `h0` (at zero).
  """
  def backward(cell, wx, r, y, grad_y, opts \\ []) when cell in @cells do
    {type, state} = types(wx)
    up = &(&1 && Nx.as_type(&1, state))
    {wx, r, bias, y, grad_y} = {up.(wx), up.(r), up.(opts[:bias]), up.(y), up.(grad_y)}
    {batch, steps, hidden} = dims(cell, wx, r)
    zeros = Nx.broadcast(Nx.tensor(0, type: state), {batch, hidden})
    h0 = up.(opts[:h0]) || zeros
    c0 = up.(opts[:c0]) || zeros

    # Every h_{t-1}, and every recurrent product at once.
    h_prev = previous_states(h0, y, steps)

    rh = h_prev |> Nx.dot([2], r, [0]) |> add_bias(bias)

    cells = if cell == :lstm, do: cells(wx, rh, c0, steps, hidden), else: nil

    {per_step, {dh, dc}} =
      Enum.map_reduce(
        (steps - 1)..0//-1,
        {up.(opts[:grad_h_final]) || zeros, up.(opts[:grad_c_final]) || zeros},
        fn t, {dh, dc} ->
          dh = Nx.add(dh, step_of(grad_y, t))

          {dwx, drh, dh_prev, dc_prev} =
            step_backward(
              cell,
              step_of(wx, t),
              step_of(rh, t),
              step_of(h_prev, t),
              cells && {step_of(cells, t), prev_cell(cells, c0, t)},
              dh,
              dc,
              r
            )

          {{dwx, drh}, {dh_prev, dc_prev}}
        end
      )

    {dwx, drh} = per_step |> Enum.reverse() |> Enum.unzip()
    grad_wx = Nx.stack(dwx, axis: 1)
    grad_rh = Nx.stack(drh, axis: 1)

    out = %{
      grad_wx: Nx.as_type(grad_wx, type),
      grad_rh: Nx.as_type(grad_rh, type),
      grad_r: Nx.dot(h_prev, [0, 1], grad_rh, [0, 1]),
      grad_bias: Nx.sum(grad_rh, axes: [0, 1]),
      grad_h0: dh
    }

    if cell == :lstm, do: Map.put(out, :grad_c0, dc), else: out
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

  defp step(:gru, wx, rh, h, c) do
    [wx_r, wx_z, wx_n] = split(wx, 3)
    [rh_r, rh_z, rh_n] = split(rh, 3)
    r = Nx.sigmoid(Nx.add(wx_r, rh_r))
    z = Nx.sigmoid(Nx.add(wx_z, rh_z))
    n = Nx.tanh(Nx.add(wx_n, Nx.multiply(r, rh_n)))
    {Nx.add(Nx.multiply(Nx.subtract(1, z), n), Nx.multiply(z, h)), c}
  end

  defp step(:lstm, wx, rh, _h, c) do
    [i, f, g, o] = lstm_gates(Nx.add(wx, rh))
    c = Nx.add(Nx.multiply(f, c), Nx.multiply(i, g))
    {Nx.multiply(o, Nx.tanh(c)), c}
  end

  defp lstm_gates(pre) do
    [i, f, g, o] = split(pre, 4)
    [Nx.sigmoid(i), Nx.sigmoid(f), Nx.tanh(g), Nx.sigmoid(o)]
  end

  # Every c_t of the LSTM [B, T, H], from the gates (an elementwise pass).
  defp cells(wx, rh, c0, steps, _hidden) do
    pre = Nx.add(wx, rh)

    {cs, _c} =
      Enum.map_reduce(0..(steps - 1), c0, fn t, c ->
        [i, f, g, _o] = lstm_gates(step_of(pre, t))
        c = Nx.add(Nx.multiply(f, c), Nx.multiply(i, g))
        {c, c}
      end)

    Nx.stack(cs, axis: 1)
  end

  defp prev_cell(_cells, c0, 0), do: c0
  defp prev_cell(cells, _c0, t), do: step_of(cells, t - 1)

  # One step back: the gradients of its wx and rh, and dh, dc into the
  # step before. dh already holds grad_y_t.
  defp step_backward(:gru, wx, rh, h_prev, nil, dh, dc, r_weights) do
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
    dh_prev = Nx.add(Nx.multiply(dh, z), Nx.dot(drh, [1], r_weights, [1]))
    {dwx, drh, dh_prev, dc}
  end

  defp step_backward(:lstm, wx, rh, _h_prev, {c, c_prev}, dh, dc, r_weights) do
    [i, f, g, o] = lstm_gates(Nx.add(wx, rh))
    tc = Nx.tanh(c)
    do_ = Nx.multiply(dh, tc)
    dc = Nx.add(dc, dh |> Nx.multiply(o) |> Nx.multiply(Nx.subtract(1, Nx.multiply(tc, tc))))

    da_i = dc |> Nx.multiply(g) |> Nx.multiply(Nx.multiply(i, Nx.subtract(1, i)))
    da_f = dc |> Nx.multiply(c_prev) |> Nx.multiply(Nx.multiply(f, Nx.subtract(1, f)))
    da_g = dc |> Nx.multiply(i) |> Nx.multiply(Nx.subtract(1, Nx.multiply(g, g)))
    da_o = Nx.multiply(do_, Nx.multiply(o, Nx.subtract(1, o)))

    d = Nx.concatenate([da_i, da_f, da_g, da_o], axis: -1)
    {d, d, Nx.dot(d, [1], r_weights, [1]), Nx.multiply(dc, f)}
  end
end
