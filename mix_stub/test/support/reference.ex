defmodule ExPhil.Native.Reference do
  @moduledoc """
  CPU reference of the scans in Elixir floats (double precision), written
  from each op's definition, with the helpers the GPU tests share: random
  inputs, f32 encoding, and the comparison the C++ suite uses (absolute error
  relative to the largest magnitude of the family: states, or gradients).
  """

  import Bitwise

  @inputs %{
    linear_scan: [a: {-1.0, 1.0}, b: {-1.0, 1.0}],
    min_gru: [gate: {-4.0, 4.0}, candidate: {-2.0, 2.0}],
    min_lstm: [forget: {-4.0, 4.0}, input: {-4.0, 4.0}, candidate: {-2.0, 2.0}],
    liquid: [tau: {0.5, 8.0}, target: {-2.0, 2.0}]
  }

  @doc "The ops, with their input names and value ranges."
  def ops, do: Map.keys(@inputs)
  def input_names(op), do: Keyword.keys(@inputs[op])
  def grad_names(op), do: Enum.map(input_names(op), &:"grad_#{&1}")

  @doc "Random inputs of `op` for `count` elements each, exactly representable in f32."
  def random_inputs(op, count) do
    for {_name, {lo, hi}} <- @inputs[op], do: random(count, lo, hi)
  end

  def random(count, lo, hi), do: for(_ <- 1..count, do: lo + (hi - lo) * :rand.uniform())

  @doc "Rounds to f32 (the values the GPU sees)."
  def to_f32(values), do: values |> encode_f32() |> decode_f32()

  def encode_f32(values), do: for(x <- values, into: <<>>, do: <<x::float-32-native>>)
  def decode_f32(binary), do: for(<<x::float-32-native <- binary>>, do: x)

  @doc "Rounds toward zero to bf16 and returns {values, bf16 binary}."
  def to_bf16(values) do
    binary =
      for x <- values, into: <<>> do
        <<bits::32-native>> = <<x::float-32-native>>
        <<bits >>> 16::16-native>>
      end

    {decode_bf16(binary), binary}
  end

  def decode_bf16(binary) do
    for <<bits::16-native <- binary>> do
      <<x::float-32-native>> = <<bits <<< 16::32-native>>
      x
    end
  end

  defp sigmoid(x), do: 1.0 / (1.0 + :math.exp(-x))

  defp step(:linear_scan, [a, b], h), do: a * h + b
  defp step(:min_gru, [g, c], h) do
    z = sigmoid(g)
    (1 - z) * h + z * c
  end

  defp step(:min_lstm, [f, i, c], h) do
    {f, i} = {sigmoid(f), sigmoid(i)}
    s = f + i + 1.0e-6
    f / s * h + i / s * c
  end

  defp step(:liquid, [tau, target], h), do: target + (h - target) * :math.exp(-1 / tau)

  # {dh_t/dh_{t-1}, [dh_t/dx_i]}
  defp partials(:linear_scan, [a, _b], h_prev), do: {a, [h_prev, 1.0]}

  defp partials(:min_gru, [g, c], h_prev) do
    z = sigmoid(g)
    {1 - z, [(c - h_prev) * z * (1 - z), z]}
  end

  defp partials(:min_lstm, [f0, i0, c], h_prev) do
    {f, i} = {sigmoid(f0), sigmoid(i0)}
    s = f + i + 1.0e-6
    h = (f * h_prev + i * c) / s
    {f / s, [(h_prev - h) / s * f * (1 - f), (c - h) / s * i * (1 - i), i / s]}
  end

  defp partials(:liquid, [tau, target], h_prev) do
    e = :math.exp(-1 / tau)
    {e, [(h_prev - target) * e / (tau * tau), 1 - e]}
  end

  @doc """
  Forward of `op` over inputs (flat lists in [B, T, H] order) and an optional
  h0 (flat [B, H]); returns {y, h_final} as flat lists.
  """
  def forward(op, inputs, {b, t, h}, h0 \\ nil) do
    xs = Enum.map(inputs, &List.to_tuple/1)
    h0 = if h0, do: List.to_tuple(h0)

    channels =
      for bi <- 0..(b - 1), hi <- 0..(h - 1) do
        start = if h0, do: elem(h0, bi * h + hi), else: 0.0

        {states, _} =
          Enum.map_reduce(0..(t - 1), start, fn ti, state ->
            i = (bi * t + ti) * h + hi
            next = step(op, Enum.map(xs, &elem(&1, i)), state)
            {next, next}
          end)

        {{bi, hi}, List.to_tuple(states)}
      end

    by_channel = Map.new(channels)
    y = for bi <- 0..(b - 1), ti <- 0..(t - 1), hi <- 0..(h - 1), do: elem(by_channel[{bi, hi}], ti)
    h_final = for bi <- 0..(b - 1), hi <- 0..(h - 1), do: elem(by_channel[{bi, hi}], t - 1)
    {y, h_final}
  end

  @doc """
  Backward of `op`: gradients of every input (flat lists) and of h0, given
  grad_y and an optional grad_h_final.
  """
  def backward(op, inputs, {b, t, h} = dims, h0, grad_y, grad_h_final \\ nil) do
    {y, _} = forward(op, inputs, dims, h0)
    {xs, yt, gy} = {Enum.map(inputs, &List.to_tuple/1), List.to_tuple(y), List.to_tuple(grad_y)}
    h0t = if h0, do: List.to_tuple(h0)
    gf = if grad_h_final, do: List.to_tuple(grad_h_final)

    results =
      for bi <- 0..(b - 1), hi <- 0..(h - 1) do
        s = bi * h + hi
        start = if gf, do: elem(gf, s), else: 0.0

        {grads, g0} =
          Enum.map_reduce((t - 1)..0//-1, start, fn ti, g ->
            i = (bi * t + ti) * h + hi
            g = g + elem(gy, i)
            h_prev = if ti > 0, do: elem(yt, i - h), else: if(h0t, do: elem(h0t, s), else: 0.0)
            {dh, dx} = partials(op, Enum.map(xs, &elem(&1, i)), h_prev)
            {{i, Enum.map(dx, &(&1 * g))}, g * dh}
          end)

        {grads, {s, g0}}
      end

    by_index = results |> Enum.flat_map(&elem(&1, 0)) |> Map.new(fn {i, dx} -> {i, List.to_tuple(dx)} end)
    n = b * t * h
    grads = for k <- 0..(length(inputs) - 1), do: for(i <- 0..(n - 1), do: elem(by_index[i], k))
    grad_h0 = results |> Enum.map(&elem(&1, 1)) |> Enum.sort() |> Enum.map(&elem(&1, 1))
    {grads, grad_h0}
  end

  @doc """
  Worst |got - ref| / (atol * scale + rtol * |ref|) over the elements (<= 1
  passes), with f32's tolerances (atol 2e-5, rtol 2e-5) unless given.
  """
  def error_ratio(got, ref, scale, atol \\ 2.0e-5, rtol \\ 2.0e-5) do
    Enum.zip(got, ref)
    |> Enum.map(fn {g, r} -> abs(g - r) / (atol * scale + rtol * abs(r)) end)
    |> Enum.max()
  end

  def scale(lists), do: lists |> Enum.concat() |> Enum.map(&abs/1) |> Enum.max()
end
