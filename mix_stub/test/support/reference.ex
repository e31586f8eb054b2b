defmodule ExPhil.Native.Reference do
  @moduledoc """
  CPU reference of the scans in Elixir floats (double precision), written
  from each op's definition, with the helpers the GPU tests share: random
  inputs, f32 encoding, and the comparison the C++ suite uses (absolute error
  relative to the largest magnitude of the family: states, or gradients).
  The selective scan, whose inputs differ in shape, has its own functions
  (`selective_scan_forward/1` and the ones after it).
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

    y =
      for bi <- 0..(b - 1), ti <- 0..(t - 1), hi <- 0..(h - 1), do: elem(by_channel[{bi, hi}], ti)

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

    by_index =
      results |> Enum.flat_map(&elem(&1, 0)) |> Map.new(fn {i, dx} -> {i, List.to_tuple(dx)} end)

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

  ## Selective scan (exphil.h, "selective_scan")
  #
  # A problem is a map of flat row-major lists: x, dt (and z) [B, T, D];
  # a [D, N]; b, c [B, T, N]; dt_bias, d [D]; h0 [B, D, N]; the optional
  # ones nil when absent; with dims {B, T, D, N}, softplus (boolean) and
  # clamp (nil or {dt_min, dt_max}). Keys are the NIF's argument names.

  @selective_scan_tensors [:x, :dt, :a, :b, :c, :dt_bias, :d, :z, :h0]

  @doc "The tensors of a selective-scan problem, in the order of the NIF's arguments, then its options."
  def selective_scan_tensors, do: @selective_scan_tensors

  @doc """
  A random selective-scan problem at `{B, T, D, N}` with the parts `config`
  names (`:dt_bias`, `:d`, `:z`, `:h0`, `:softplus`, `:clamp`), in the ranges
  Mamba models use (those of the C++ suite's problems, but for dt_bias
  without softplus). `round` maps the sequence tensors (x, dt, b, c, z) to
  the values the GPU will see (to_f32/1, or bf16); the f32 tensors and the
  clamp bounds are rounded to f32. dt is kept clear of the clamp's edges.
  """
  def random_selective_scan(dims, config, round \\ &to_f32/1) do
    {batch, steps, channels, states} = dims
    sequence = batch * steps * channels
    softplus = :softplus in config
    optional = fn name, make -> if name in config, do: make.() end

    %{
      dims: dims,
      softplus: softplus,
      # Bounds inside the range of u, so that steps are clamped on both sides.
      clamp:
        optional.(:clamp, fn ->
          List.to_tuple(to_f32(if softplus, do: [0.1, 0.9], else: [0.05, 0.5]))
        end),
      x: round.(random(sequence, -1.0, 1.0)),
      dt: round.(if softplus, do: random(sequence, -3.0, 1.0), else: random(sequence, 0.01, 2.0)),
      a: to_f32(random(channels * states, -2.0, -0.01)),
      b: round.(random(batch * steps * states, -1.0, 1.0)),
      c: round.(random(batch * steps * states, -1.0, 1.0)),
      # Without softplus, delta is dt + dt_bias itself: kept positive, as a
      # negative step grows the state without bound.
      dt_bias:
        optional.(:dt_bias, fn ->
          to_f32(if softplus, do: random(channels, -1.0, 1.0), else: random(channels, 0.0, 0.5))
        end),
      d: optional.(:d, fn -> to_f32(random(channels, -1.0, 1.0)) end),
      z: optional.(:z, fn -> round.(random(sequence, -3.0, 3.0)) end),
      h0: optional.(:h0, fn -> to_f32(random(batch * channels * states, -1.0, 1.0)) end)
    }
    |> keep_clear_of_clamp_edges(round)
  end

  # The clamp's derivative jumps from 1 to 0 at each edge. Where u lies
  # within f32 rounding of an edge, the GPU (f32) and this reference
  # (double) can fall on opposite sides, and so can the two evaluations of
  # a finite difference: no tolerance absorbs that. As the C++ harness does,
  # such dt are stepped clear by 1/64, well beyond a margin of 1e-5 (about
  # one element in 10^5 moves).
  defp keep_clear_of_clamp_edges(%{clamp: nil} = p, _round), do: p

  defp keep_clear_of_clamp_edges(p, round) do
    {_batch, _steps, channels, _states} = p.dims
    q = as_tuples(p)

    dt =
      p.dt
      |> Enum.with_index()
      |> Enum.map(fn {dt, k} -> clear_of_edges(q, dt, rem(k, channels), round, 0) end)

    %{p | dt: dt}
  end

  defp clear_of_edges(q, dt, i, round, tries) do
    {u, _slope} = ss_u(q, dt, i)
    {lo, hi} = q.clamp

    cond do
      abs(u - lo) >= 1.0e-5 and abs(u - hi) >= 1.0e-5 -> dt
      tries == 16 -> raise "keep_clear_of_clamp_edges: dt = #{dt} does not move"
      true -> clear_of_edges(q, hd(round.([dt + 1 / 64])), i, round, tries + 1)
    end
  end

  @doc "Forward of the selective scan: {y [B, T, D], h_final [B, D, N]} as flat lists."
  def selective_scan_forward(p) do
    {batch, steps, channels, _states} = p.dims
    q = as_tuples(p)

    walks =
      for bi <- 0..(batch - 1),
          i <- 0..(channels - 1),
          into: %{},
          do: {{bi, i}, ss_walk(q, bi, i)}

    y =
      for bi <- 0..(batch - 1), t <- 0..(steps - 1), i <- 0..(channels - 1) do
        elem(walks[{bi, i}].steps, t).y
      end

    h_final = for bi <- 0..(batch - 1), i <- 0..(channels - 1), h <- walks[{bi, i}].h_final, do: h
    {y, h_final}
  end

  @doc """
  Backward of the selective scan given grad_y [B, T, D] and grad_h_final
  [B, D, N] (nil: none). Returns %{grad_x: ..., ...} with the NIF's output
  names: the gradients of x, dt, a, b, c always, and of each optional input
  the problem has.
  """
  def selective_scan_backward(p, grad_y, grad_h_final \\ nil) do
    {batch, steps, channels, states} = p.dims
    q = as_tuples(p)
    gy = List.to_tuple(grad_y)
    gf = if grad_h_final, do: List.to_tuple(grad_h_final)

    # Each channel's contributions as {output, index, value}; outputs summed
    # over batch, time or channels (a, b, c, dt_bias, d) get several.
    contributions =
      for bi <- 0..(batch - 1), i <- 0..(channels - 1), reduce: [] do
        acc -> ss_channel_backward(q, ss_walk(q, bi, i), bi, i, gy, gf, acc)
      end

    sums =
      Enum.reduce(contributions, %{}, fn {name, k, v}, acc ->
        Map.update(acc, {name, k}, v, &(&1 + v))
      end)

    sizes = %{
      x: batch * steps * channels,
      dt: batch * steps * channels,
      z: batch * steps * channels,
      a: channels * states,
      b: batch * steps * states,
      c: batch * steps * states,
      dt_bias: channels,
      d: channels,
      h0: batch * channels * states
    }

    for name <- @selective_scan_tensors,
        name in [:x, :dt, :a, :b, :c] or p[name] != nil,
        into: %{} do
      {:"grad_#{name}", for(k <- 0..(sizes[name] - 1), do: Map.get(sums, {name, k}, 0.0))}
    end
  end

  defp as_tuples(p) do
    Enum.reduce(@selective_scan_tensors, p, fn name, q ->
      if p[name], do: Map.put(q, name, List.to_tuple(p[name])), else: q
    end)
  end

  defp softplus(u), do: max(u, 0.0) + :math.log(1.0 + :math.exp(-abs(u)))
  defp silu(v), do: v * sigmoid(v)

  # u = dt + dt_bias, then softplus if asked: {u, du / d dt}.
  defp ss_u(q, dt, i) do
    u = if q.dt_bias, do: dt + elem(q.dt_bias, i), else: dt
    if q.softplus, do: {softplus(u), sigmoid(u)}, else: {u, 1.0}
  end

  # delta and d delta / d dt (also d delta / d dt_bias). As torch.clamp, the
  # gradient passes where dt_min <= u <= dt_max and is zero where clamped.
  defp ss_delta(q, dt, i) do
    {u, slope} = ss_u(q, dt, i)

    case q.clamp do
      nil -> {u, slope}
      {lo, _hi} when u < lo -> {lo, 0.0}
      {_lo, hi} when u > hi -> {hi, 0.0}
      _ -> {u, slope}
    end
  end

  defp row(tuple, offset, count), do: for(k <- 0..(count - 1), do: elem(tuple, offset + k))

  # The forward of channel i of batch row bi: every step's values that the
  # backward needs, and the final state.
  defp ss_walk(q, bi, i) do
    {_batch, steps, channels, states} = q.dims
    a = row(q.a, i * states, states)

    h0 =
      if q.h0,
        do: row(q.h0, (bi * channels + i) * states, states),
        else: List.duplicate(0.0, states)

    {walk, h_final} =
      Enum.map_reduce(0..(steps - 1), h0, fn t, h_prev ->
        j = (bi * steps + t) * channels + i
        x = elem(q.x, j)
        {delta, slope} = ss_delta(q, elem(q.dt, j), i)
        b = row(q.b, (bi * steps + t) * states, states)
        c = row(q.c, (bi * steps + t) * states, states)
        decay = Enum.map(a, &:math.exp(delta * &1))
        h = Enum.zip_with([decay, h_prev, b], fn [e, hp, bn] -> e * hp + delta * bn * x end)
        y0 = dot(c, h) + if(q.d, do: elem(q.d, i) * x, else: 0.0)
        y = if q.z, do: y0 * silu(elem(q.z, j)), else: y0

        step = %{
          j: j,
          x: x,
          delta: delta,
          slope: slope,
          a: a,
          b: b,
          c: c,
          decay: decay,
          h_prev: h_prev,
          h: h,
          y0: y0,
          y: y
        }

        {step, h}
      end)

    %{steps: List.to_tuple(walk), h_final: h_final}
  end

  defp dot(u, v), do: Enum.zip_with(u, v, &(&1 * &2)) |> Enum.sum()

  # Walks channel (bi, i) backwards, carrying dL/dh_t, and adds its
  # contributions to `acc`.
  defp ss_channel_backward(q, walk, bi, i, gy, gf, acc) do
    {_batch, steps, channels, states} = q.dims
    s0 = (bi * channels + i) * states
    g_final = if gf, do: row(gf, s0, states), else: List.duplicate(0.0, states)

    {acc, g_h0} =
      Enum.reduce((steps - 1)..0//-1, {acc, g_final}, fn t, {acc, g_next} ->
        s = elem(walk.steps, t)
        p0 = (bi * steps + t) * states
        g_out = elem(gy, s.j)

        # y = y0 * silu(z)
        {g_y0, acc} =
          if q.z do
            z = elem(q.z, s.j)
            sz = sigmoid(z)
            {g_out * silu(z), [{:z, s.j, g_out * s.y0 * sz * (1.0 + z * (1.0 - sz))} | acc]}
          else
            {g_out, acc}
          end

        # y0 = c . h + d * x; g_next already holds dL/dh_t through h_{t+1}
        g_h = Enum.zip_with(g_next, s.c, fn g, c -> g + g_y0 * c end)

        acc =
          Enum.reduce(Enum.with_index(s.h), acc, fn {h, n}, acc ->
            [{:c, p0 + n, g_y0 * h} | acc]
          end)

        {g_x, acc} =
          if q.d, do: {g_y0 * elem(q.d, i), [{:d, i, g_y0 * s.x} | acc]}, else: {0.0, acc}

        # h = decay * h_prev + delta * b * x, decay = exp(delta * a)
        terms = Enum.zip([g_h, s.a, s.decay, s.h_prev, s.b]) |> Enum.with_index()

        {g_delta, g_x, acc} =
          Enum.reduce(terms, {0.0, g_x, acc}, fn {{g, a, e, hp, b}, n}, {g_delta, g_x, acc} ->
            acc = [
              {:a, i * states + n, g * s.delta * e * hp},
              {:b, p0 + n, g * s.delta * s.x} | acc
            ]

            {g_delta + g * (a * e * hp + b * s.x), g_x + g * s.delta * b, acc}
          end)

        g_u = g_delta * s.slope
        acc = [{:x, s.j, g_x}, {:dt, s.j, g_u} | acc]
        acc = if q.dt_bias, do: [{:dt_bias, i, g_u} | acc], else: acc
        {acc, Enum.zip_with(g_h, s.decay, &(&1 * &2))}
      end)

    if q.h0 do
      Enum.reduce(Enum.with_index(g_h0), acc, fn {g, n}, acc -> [{:h0, s0 + n, g} | acc] end)
    else
      acc
    end
  end
end
