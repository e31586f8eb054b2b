defmodule ExPhil.Native.AttentionReference do
  @moduledoc """
  CPU reference of attention (exphil.h, "attention") in Elixir floats
  (double precision), written from the definition, for the GPU tests of
  `ExPhil.Native.attention_forward/4` and `attention_backward/7`.

  A problem is a map: `dims` `{B, Hq, Hkv, T, S, d}`; `layout` `:bhtd` or
  `:bthd`; `mask` `:none`, `:causal` or `:window` with `window`; `scale`
  (`nil`: `1 / sqrt(d)`); and `q`, `k`, `v` as flat row-major lists in the
  layout's order. Results are flat lists in the same order; `lse` is
  `[B, Hq, T]` whatever the layout, with `:neg_infinity` for a query that
  sees no key.
  """

  alias ExPhil.Native.Reference, as: R

  @doc "Shapes of q (and o, grad_o, grad_q), k (and v, grad_k, grad_v) and lse."
  def shapes(%{dims: {b, hq, hkv, t, s, d}, layout: :bhtd}),
    do: %{q: {b, hq, t, d}, k: {b, hkv, s, d}, lse: {b, hq, t}}

  def shapes(%{dims: {b, hq, hkv, t, s, d}, layout: :bthd}),
    do: %{q: {b, t, hq, d}, k: {b, s, hkv, d}, lse: {b, hq, t}}

  @doc """
  A random problem: q in [-2, 2] (so that softmax rows are peaked, not
  uniform), k and v in [-1, 1]. `round` maps the tensors to the values the
  GPU sees (`R.to_f32/1`, or bf16); a given scale is rounded to f32.
  """
  def random(dims, options \\ [], round \\ &R.to_f32/1) do
    {b, hq, hkv, t, s, d} = dims

    %{
      dims: dims,
      layout: Keyword.get(options, :layout, :bhtd),
      mask: Keyword.get(options, :mask, :none),
      window: Keyword.get(options, :window),
      scale: with(x when is_number(x) <- Keyword.get(options, :scale), do: hd(R.to_f32([x]))),
      q: round.(R.random(b * hq * t * d, -2.0, 2.0)),
      k: round.(R.random(b * hkv * s * d, -1.0, 1.0)),
      v: round.(R.random(b * hkv * s * d, -1.0, 1.0))
    }
  end

  @doc "The keys query `i` sees (bottom-right aligned masks)."
  def keys(%{dims: {_b, _hq, _hkv, t, s, _d}} = p, i) do
    last = i + s - t

    case p.mask do
      :none -> Enum.to_list(0..(s - 1))
      :causal -> if last < 0, do: [], else: Enum.to_list(0..min(last, s - 1))
      :window -> for j <- max(last - p.window + 1, 0)..last//1, j < s, do: j
    end
  end

  def scale(%{scale: nil, dims: {_, _, _, _, _, d}}), do: 1.0 / :math.sqrt(d)
  def scale(%{scale: scale}), do: scale

  @doc "Forward: `%{o: flat list in the layout, lse: [B, Hq, T] with :neg_infinity where no key is seen}`."
  def forward(p) do
    {b, hq, hkv, t, _s, d} = p.dims
    {q, k, v} = {rows(p, p.q, :q), rows(p, p.k, :k), rows(p, p.v, :k)}

    per_row =
      for bi <- 0..(b - 1), h <- 0..(hq - 1), i <- 0..(t - 1), into: %{} do
        g = div(h, div(hq, hkv))

        case softmax(p, q[{bi, h, i}], k, bi, g, i) do
          nil ->
            {{bi, h, i}, {List.duplicate(0.0, d), :neg_infinity}}

          {probs, lse} ->
            o =
              Enum.reduce(probs, List.duplicate(0.0, d), fn {j, pj}, acc ->
                axpy(pj, v[{bi, g, j}], acc)
              end)

            {{bi, h, i}, {o, lse}}
        end
      end

    %{
      o: flatten(p, Map.new(per_row, fn {key, {o, _}} -> {key, o} end), :q),
      lse:
        for(bi <- 0..(b - 1), h <- 0..(hq - 1), i <- 0..(t - 1), do: elem(per_row[{bi, h, i}], 1))
    }
  end

  @doc """
  Backward given grad_o (flat, q's layout): `%{grad_q: ..., grad_k: ...,
  grad_v: ...}` as flat lists in the layout. grad_k and grad_v sum over the
  query heads sharing each key/value head; a query that sees no key adds
  nothing and gets a zero grad_q.
  """
  def backward(p, grad_o) do
    {b, hq, hkv, t, _s, d} = p.dims
    sc = scale(p)
    {q, k, v, go} = {rows(p, p.q, :q), rows(p, p.k, :k), rows(p, p.v, :k), rows(p, grad_o, :q)}
    zero = List.duplicate(0.0, d)

    {grad_q, grad_k, grad_v} =
      for bi <- 0..(b - 1), h <- 0..(hq - 1), i <- 0..(t - 1), reduce: {%{}, %{}, %{}} do
        {gq, gk, gv} ->
          g = div(h, div(hq, hkv))
          qi = q[{bi, h, i}]
          doi = go[{bi, h, i}]

          case softmax(p, qi, k, bi, g, i) do
            nil ->
              {Map.put(gq, {bi, h, i}, zero), gk, gv}

            {probs, _lse} ->
              dp = Enum.map(probs, fn {j, pj} -> {j, pj, dot(doi, v[{bi, g, j}])} end)
              dd = dp |> Enum.map(fn {_j, pj, dpj} -> pj * dpj end) |> Enum.sum()

              Enum.reduce(dp, {Map.put(gq, {bi, h, i}, zero), gk, gv}, fn {j, pj, dpj},
                                                                          {gq, gk, gv} ->
                ds = pj * (dpj - dd)
                key = {bi, g, j}

                {Map.update!(gq, {bi, h, i}, &axpy(sc * ds, k[key], &1)),
                 Map.update(gk, key, scaled(sc * ds, qi), &axpy(sc * ds, qi, &1)),
                 Map.update(gv, key, scaled(pj, doi), &axpy(pj, doi, &1))}
              end)
          end
      end

    %{
      grad_q: flatten(p, grad_q, :q),
      grad_k: flatten(p, grad_k, :k),
      grad_v: flatten(p, grad_v, :k)
    }
  end

  # {[{j, probability}], lse} over the keys query i sees, or nil if none.
  defp softmax(p, qi, k, bi, g, i) do
    case keys(p, i) do
      [] ->
        nil

      js ->
        sc = scale(p)
        scores = Enum.map(js, &{&1, sc * dot(qi, k[{bi, g, &1}])})
        m = scores |> Enum.map(&elem(&1, 1)) |> Enum.max()
        e = Enum.map(scores, fn {j, x} -> {j, :math.exp(x - m)} end)
        l = e |> Enum.map(&elem(&1, 1)) |> Enum.sum()
        {Enum.map(e, fn {j, x} -> {j, x / l} end), m + :math.log(l)}
    end
  end

  defp dot(u, w), do: Enum.zip_with(u, w, &(&1 * &2)) |> Enum.sum()
  defp axpy(a, x, y), do: Enum.zip_with(x, y, &(a * &1 + &2))
  defp scaled(a, x), do: Enum.map(x, &(a * &1))

  # heads and rows per head of the query-shaped or key-shaped tensors.
  defp extent(%{dims: {_b, hq, _hkv, t, _s, _d}}, :q), do: {hq, t}
  defp extent(%{dims: {_b, _hq, hkv, _t, s, _d}}, :k), do: {hkv, s}

  # The (b, h, row) keys in the layout's memory order.
  defp row_order(%{dims: {b, _, _, _, _, _}, layout: :bhtd} = p, which) do
    {heads, len} = extent(p, which)
    for bi <- 0..(b - 1), h <- 0..(heads - 1), l <- 0..(len - 1), do: {bi, h, l}
  end

  defp row_order(%{dims: {b, _, _, _, _, _}, layout: :bthd} = p, which) do
    {heads, len} = extent(p, which)
    for bi <- 0..(b - 1), l <- 0..(len - 1), h <- 0..(heads - 1), do: {bi, h, l}
  end

  # A flat tensor as %{{b, h, row} => [d values]}.
  defp rows(%{dims: {_, _, _, _, _, d}} = p, values, which) do
    Enum.zip(row_order(p, which), Enum.chunk_every(values, d)) |> Map.new()
  end

  # The inverse of rows/3; rows absent from the map are zeros.
  defp flatten(%{dims: {_, _, _, _, _, d}} = p, by_row, which) do
    zero = List.duplicate(0.0, d)
    for key <- row_order(p, which), x <- Map.get(by_row, key, zero), do: x
  end

  @doc """
  f32 values of a binary, with `:infinity`, `:neg_infinity` and `:nan` for
  the values Elixir floats cannot hold (`R.decode_f32/1` stops at the first).
  """
  def decode_f32_specials(binary) do
    for <<bits::32-native <- binary>> do
      case <<bits::32>> do
        <<0::1, 0xFF::8, 0::23>> -> :infinity
        <<1::1, 0xFF::8, 0::23>> -> :neg_infinity
        <<_::1, 0xFF::8, _::23>> -> :nan
        <<x::float-32>> -> x
      end
    end
  end
end
