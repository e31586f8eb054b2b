defmodule ExPhil.Native.Pure.GatedRnnStack do
  @moduledoc """
  Stacked GRU and LSTM layers in plain Nx (the default functions of the
  `gru_stack` and `lstm_stack` blocks, and the reference the kernels are
  tested against): each layer `ExPhil.Native.Pure.GatedRnn`'s sequence,
  layer `l > 0` on the layer below's `y` projected by `w[l - 1]` and
  `w_bias[l - 1]`, rounded to the type of `wx` as two calls would pass it.

  Shapes, with L layers and K = L - 1: `wx` `[B, T, G*H]`, `r` `[L, H, G*H]`,
  `w` `[K, H, G*H]`; options `:bias` `[L, G*H]`, `:w_bias` `[K, G*H]`,
  `:h0` and `:c0` `[L, B, H]`.
  """

  alias ExPhil.Native.Pure.GatedRnn

  @cells [:gru, :lstm]

  @doc """
  Returns `%{y:, y_lower:, h_final:}` (and `:c_final` for the LSTM): `y`
  the last layer's output, `y_lower` `[K, B, T, H]` the others', the final
  states `[L, B, H]`.
  """
  def forward(cell, wx, r, w, opts \\ []) when cell in @cells do
    layers = elem(Nx.shape(r), 0)
    type = Nx.type(wx)

    {outs, _} =
      Enum.map_reduce(0..(layers - 1), wx, fn l, input ->
        out = GatedRnn.forward(cell, input, r[l], layer_options(cell, opts, l))
        next = if l + 1 < layers, do: project(out.y, w[l], at(opts[:w_bias], l), type)
        {out, next}
      end)

    {lower, [top]} = Enum.split(outs, layers - 1)

    finals =
      for state <- GatedRnn.states(cell), into: %{} do
        key = :"#{state}_final"
        {key, outs |> Enum.map(&Map.fetch!(&1, key)) |> Nx.stack()}
      end

    Map.merge(finals, %{y: top.y, y_lower: lower |> Enum.map(& &1.y) |> Nx.stack()})
  end

  @doc """
  The gradients of `forward/5` given its inputs, its `y` and `y_lower`, and
  `grad_y` `[B, T, H]`; options as the forward's and `:grad_y_lower` `[K, B,
  T, H]`, `:grad_h_final` (and `:grad_c_final`) `[L, B, H]`. Each layer's
  `ExPhil.Native.Pure.GatedRnn.backward/6` from the top down.

  Returns `%{grad_wx:, grad_r:, grad_w:, grad_bias:, grad_w_bias:, grad_h0:}`
  (and `:grad_c0` for the LSTM), shaped as their inputs, the biases' and
  the initial states' also where those are absent (at their defaults).
  """
  def backward(cell, wx, r, w, y, y_lower, grad_y, opts \\ []) when cell in @cells do
    layers = elem(Nx.shape(r), 0)
    type = Nx.type(wx)
    state = Nx.type(r)

    {grads, _} =
      Enum.map_reduce((layers - 1)..0//-1, grad_y, fn l, grad ->
        input =
          if l == 0,
            do: wx,
            else: project(y_lower[l - 1], w[l - 1], at(opts[:w_bias], l - 1), type)

        output = if l + 1 == layers, do: y, else: y_lower[l]

        layer =
          layer_options(cell, opts, l) ++
            for(
              s <- GatedRnn.states(cell),
              do: {:"grad_#{s}_final", at(opts[:"grad_#{s}_final"], l)}
            )

        g = GatedRnn.backward(cell, input, r[l], output, grad, layer)

        if l == 0 do
          {Map.put(g, :grad_w, nil), nil}
        else
          below = Nx.as_type(y_lower[l - 1], state)
          grad_wx = Nx.as_type(g.grad_wx, state)
          grad_w = Nx.dot(below, [0, 1], grad_wx, [0, 1])
          grad_w_bias = Nx.sum(grad_wx, axes: [0, 1])
          grad_below = Nx.dot(grad_wx, [2], w[l - 1], [1])
          outside = at(opts[:grad_y_lower], l - 1)
          grad_below = if outside, do: Nx.add(grad_below, outside), else: grad_below

          {Map.merge(g, %{grad_w: grad_w, grad_w_bias: grad_w_bias}),
           Nx.as_type(grad_below, type)}
        end
      end)

    # Layer order (the walk went from the top).
    [first | _] = grads = Enum.reverse(grads)
    above = tl(grads)
    stack = fn key, list -> list |> Enum.map(&Map.fetch!(&1, key)) |> Nx.stack() end

    base = %{
      grad_wx: first.grad_wx,
      grad_r: stack.(:grad_r, grads),
      grad_w: stack.(:grad_w, above),
      grad_bias: stack.(:grad_bias, grads),
      grad_w_bias: stack.(:grad_w_bias, above),
      grad_h0: stack.(:grad_h0, grads)
    }

    if cell == :lstm, do: Map.put(base, :grad_c0, stack.(:grad_c0, grads)), else: base
  end

  # Layer l's options of the one-layer sequence.
  defp layer_options(cell, opts, l) do
    [bias: at(opts[:bias], l), h0: at(opts[:h0], l)] ++
      if(cell == :lstm, do: [c0: at(opts[:c0], l)], else: [])
  end

  defp at(nil, _l), do: nil
  defp at(tensor, l), do: tensor[l]

  # y W + b in the state type, rounded to the sequence's.
  defp project(y, w, bias, type) do
    wx = Nx.dot(Nx.as_type(y, Nx.type(w)), [2], w, [0])
    wx = if bias, do: Nx.add(wx, bias), else: wx
    Nx.as_type(wx, type)
  end
end
