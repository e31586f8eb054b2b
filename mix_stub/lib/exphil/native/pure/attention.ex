defmodule ExPhil.Native.Pure.Attention do
  @moduledoc """
  Scaled dot-product attention with grouped-query heads, forward and
  backward, in plain Nx: the pure default of the native attention op
  (`ExPhil.Native.attention_forward/4` and `attention_backward/7`), that
  is, the default function of its `Nx.block`, which runs wherever the CUDA
  kernels do not. Same options as those, same results up to rounding.

  Both functions are built from Nx calls alone, with no branch on tensor
  values (only on static shapes, types and options), so they run on
  concrete tensors of any backend and, traced, inside `defn`.

  ## Algorithm

  For each batch row `b`, query head `h` and query `i`, with
  `g = div(h, div(Hq, Hkv))` the key/value head that `h` reads:

      s[j]         = scale * dot(q[b, h, i], k[b, g, j])   (keys j the mask lets i see)
      o[b, h, i]   = sum over j of exp(s[j] - lse[b, h, i]) * v[b, g, j]
      lse[b, h, i] = log(sum over j of exp(s[j]))

  `scale` is `1 / sqrt(d)` unless given. The whole `[T, S]` score matrix is
  formed at once (this is the reference path, not a memory-efficient one),
  with the row maximum subtracted before the exponential.

  The backward takes the forward's `o` and `lse` rather than recomputing
  them, as the kernels do:

      P   = exp(s - lse)            (0 where the mask hides a key)
      dP  = grad_o V^T
      D   = rowsum(grad_o * o)
      dS  = P * (dP - D)
      grad_q = scale dS K,   grad_k = scale dS^T Q,   grad_v = P^T grad_o

  Query heads are grouped as `[B, Hkv, Hq / Hkv, T, d]` against keys and
  values `[B, Hkv, S, d]`, never repeated per query head, so the products
  that give `grad_k` and `grad_v` sum over the heads of a group as they
  contract.

  ## Layouts

    * `:bhtd` (default): `q` `[B, Hq, T, d]`; `k`, `v` `[B, Hkv, S, d]`
    * `:bthd`: `q` `[B, T, Hq, d]`; `k`, `v` `[B, S, Hkv, d]`

  `o`, `grad_o` and `grad_q` have the shape of `q`; `grad_k` and `grad_v`
  that of `k`; `lse` is `[B, Hq, T]` in either layout.

  ## Masks

  Aligned to the bottom right: with `T != S`, query `i` stands at position
  `i + S - T`.

    * `:none` - every key.
    * `:causal` - keys `j <= i + S - T`.
    * `:window` - the last `window` of those:
      `i + S - T - window < j <= i + S - T`.

  A query that sees no key (causal with `T > S`, say) gets `o = 0`,
  `lse = -inf` and contributes no gradient: its `grad_q` row is zero, and
  nothing it computes is NaN.

  ## Types

  `q`, `k`, `v` (and `o`, `grad_o`) share one type: `{:f, 32}`, `{:bf, 16}`
  or `{:f, 16}` as on the kernels, or `{:f, 64}`, which only this
  implementation takes. Everything is computed in f32, as the kernels do
  (f64 for f64 inputs), and the results are cast back to the input type;
  `lse` is `{:f, 32}` (`{:f, 64}` for f64 inputs).
  """

  @types [{:f, 64}, {:f, 32}, {:bf, 16}, {:f, 16}]

  @doc """
  Returns `{o, lse}`: `o` of the shape and type of `q`, `lse` `{:f, 32}`
  (`{:f, 64}` for f64 inputs) `[B, Hq, T]`.

  Options: `:mask` (`:none`, `:causal` or `:window`; default `:none`),
  `:window` (a positive integer, with `mask: :window` only, where it is
  required), `:scale` (a nonzero number, or `nil` for `1 / sqrt(d)`) and
  `:layout` (`:bhtd` or `:bthd`; default `:bhtd`).
  """
  def forward(q, k, v, opts) do
    c = config!(q, k, v, opts)
    {q, k, v} = {grouped(q, c), heads_first(k, c), heads_first(v, c)}
    scores = scores(q, k, c)
    visible = Nx.broadcast(visible(c), Nx.shape(scores))
    sees_a_key = Nx.any(visible, axes: [-1], keep_axes: true)
    neg_inf = Nx.Constants.neg_infinity(c.state)

    masked = Nx.select(visible, scores, neg_inf)
    max = Nx.reduce_max(masked, axes: [-1], keep_axes: true)
    # A row that sees no key has max -inf, and -inf - -inf is NaN: shift it
    # by 0 instead, which leaves all its exponentials exp(-inf) = 0.
    shift = Nx.select(sees_a_key, max, 0.0)
    exps = Nx.exp(Nx.subtract(masked, shift))
    # Such a row sums to 0: divide it by 1 (o = 0, not 0/0) and take the
    # log of 1, so that no NaN reaches o, lse or a gradient through them.
    sum = Nx.select(sees_a_key, Nx.sum(exps, axes: [-1], keep_axes: true), 1.0)

    o = Nx.dot(Nx.divide(exps, sum), [4], [0, 1], v, [2], [0, 1])
    lse = Nx.select(sees_a_key, Nx.add(shift, Nx.log(sum)), neg_inf)
    {query_output(o, c), Nx.reshape(lse, {c.b, c.hq, c.t})}
  end

  @doc """
  Returns `{grad_q, grad_k, grad_v}` of the shapes of `q`, `k` and `v`, in
  their type, given the forward's inputs, its outputs `o` and `lse`, and
  `grad_o` (shape and type of `q`). The options must be the forward's.
  `grad_k` and `grad_v` sum over the query heads that share each key/value
  head.
  """
  def backward(q, k, v, o, lse, grad_o, opts) do
    c = config!(q, k, v, opts)
    check_like_q!(o, "o", q, c)
    check_like_q!(grad_o, "grad_o", q, c)
    check!(lse, "lse", {c.b, c.hq, c.t}, c.state)

    {q, o, grad_o} = {grouped(q, c), grouped(o, c), grouped(grad_o, c)}
    {k, v} = {heads_first(k, c), heads_first(v, c)}
    lse = Nx.reshape(lse, {c.b, c.hkv, c.g, c.t, 1})
    scores = scores(q, k, c)
    visible = Nx.broadcast(visible(c), Nx.shape(scores))

    # Hidden keys get P = 0, and so do all the keys of a row that sees none
    # (its lse is -inf, which makes exp(s - lse) infinite): such a row and
    # such a key add nothing anywhere, and its own gradients are exactly 0.
    p = Nx.select(visible, Nx.exp(Nx.subtract(scores, lse)), 0.0)
    dp = Nx.dot(grad_o, [4], [0, 1], v, [3], [0, 1])
    d = Nx.sum(Nx.multiply(grad_o, o), axes: [-1], keep_axes: true)
    ds = Nx.multiply(p, Nx.subtract(dp, d))

    grad_q = Nx.multiply(Nx.dot(ds, [4], [0, 1], k, [2], [0, 1]), c.scale)
    # Contracting over the group's heads and queries at once sums grad_k and
    # grad_v over the query heads that share a key head.
    grad_k = Nx.multiply(Nx.dot(ds, [2, 3], [0, 1], q, [2, 3], [0, 1]), c.scale)
    grad_v = Nx.dot(p, [2, 3], [0, 1], grad_o, [2, 3], [0, 1])

    {query_output(grad_q, c), key_output(grad_k, c), key_output(grad_v, c)}
  end

  # [B, Hkv, G, T, S] scaled scores.
  defp scores(q, k, c), do: Nx.multiply(Nx.dot(q, [4], [0, 1], k, [3], [0, 1]), c.scale)

  # [T, S], true where query i sees key j. T and S are static, so the mask
  # is a constant of the computation.
  defp visible(%{mask: :none, t: t, s: s}), do: Nx.broadcast(Nx.u8(1), {t, s})

  defp visible(%{t: t, s: s} = c) do
    j = Nx.iota({t, s}, axis: 1)
    last = Nx.add(Nx.iota({t, s}, axis: 0), s - t)
    causal = Nx.less_equal(j, last)

    case c.mask do
      :causal -> causal
      :window -> Nx.logical_and(causal, Nx.greater(j, Nx.subtract(last, c.window)))
    end
  end

  # q-shaped input -> f32 [B, Hkv, G, T, d].
  defp grouped(x, c) do
    x |> to_bhtd(c) |> Nx.as_type(c.state) |> Nx.reshape({c.b, c.hkv, c.g, c.t, c.d})
  end

  # k-shaped input -> f32 [B, Hkv, S, d].
  defp heads_first(x, c), do: x |> to_bhtd(c) |> Nx.as_type(c.state)

  # f32 [B, Hkv, G, T, d] -> q's shape and type.
  defp query_output(x, c), do: x |> Nx.reshape({c.b, c.hq, c.t, c.d}) |> key_output(c)

  # f32 [B, H, L, d] -> the layout's shape, the input type.
  defp key_output(x, c), do: x |> to_bhtd(c) |> Nx.as_type(c.type)

  # Swapping axes 1 and 2 is its own inverse, so it maps either way.
  defp to_bhtd(x, %{layout: :bhtd}), do: x
  defp to_bhtd(x, %{layout: :bthd}), do: Nx.transpose(x, axes: [0, 2, 1, 3])

  # Static checks of shapes, types and options, and the sizes they give.
  defp config!(q, k, v, opts) do
    opts = Keyword.validate!(opts, mask: :none, window: nil, scale: nil, layout: :bhtd)
    layout = opts[:layout]

    unless layout in [:bhtd, :bthd] do
      raise ArgumentError, "layout: expected :bhtd or :bthd, got #{inspect(layout)}"
    end

    type = Nx.type(q)

    unless type in @types do
      raise ArgumentError,
            "q: expected type f64, f32, bf16 or f16, got #{Nx.Type.to_string(type)}"
    end

    {b, hq, t, d} = dims!(q, "q", layout)
    {_, hkv, s, _} = dims = dims!(k, "k", layout)

    unless Nx.type(k) == type and Nx.type(v) == type do
      raise ArgumentError, "k and v: expected the type of q, #{Nx.Type.to_string(type)}"
    end

    unless Nx.shape(v) == Nx.shape(k) do
      raise ArgumentError,
            "v: expected the shape of k, #{inspect(Nx.shape(k))}, got #{inspect(Nx.shape(v))}"
    end

    unless dims == {b, hkv, s, d} and rem(hq, hkv) == 0 do
      raise ArgumentError,
            "k: expected q's batch and head width, and a number of heads dividing q's (#{hq}), " <>
              "got #{inspect(Nx.shape(k))} against q #{inspect(Nx.shape(q))}"
    end

    %{
      b: b,
      hq: hq,
      hkv: hkv,
      g: div(hq, hkv),
      t: t,
      s: s,
      d: d,
      type: type,
      # The kernels' arithmetic: f32; f64 for f64 inputs, which only this
      # implementation takes.
      state: if(type == {:f, 64}, do: {:f, 64}, else: {:f, 32}),
      layout: layout,
      mask: opts[:mask],
      window: window!(opts[:mask], opts[:window]),
      scale: scale!(opts[:scale], d)
    }
  end

  # {B, heads, length, d} of a rank-4 tensor in the layout.
  defp dims!(x, name, layout) do
    case {Nx.shape(x), layout} do
      {{b, h, l, d}, :bhtd} ->
        {b, h, l, d}

      {{b, l, h, d}, :bthd} ->
        {b, h, l, d}

      {shape, _} ->
        raise ArgumentError,
              "#{name}: expected rank 4 (layout #{inspect(layout)}), got #{inspect(shape)}"
    end
  end

  # A window with any other mask would be ignored, which would hide a
  # forgotten mask: :window (the native op refuses it too).
  defp window!(:window, w) when is_integer(w) and w >= 1, do: w

  defp window!(:window, w) do
    raise ArgumentError,
          "window: expected a positive integer with mask: :window, got #{inspect(w)}"
  end

  defp window!(mask, nil) when mask in [:none, :causal], do: nil

  defp window!(mask, w) when mask in [:none, :causal] do
    raise ArgumentError, "window: expected nil unless mask: :window, got #{inspect(w)}"
  end

  defp window!(mask, _w) do
    raise ArgumentError, "mask: expected :none, :causal or :window, got #{inspect(mask)}"
  end

  defp scale!(nil, d), do: 1.0 / :math.sqrt(d)
  defp scale!(scale, _d) when is_number(scale) and scale != 0, do: scale

  defp scale!(scale, _d),
    do: raise(ArgumentError, "scale: expected nil or a nonzero number, got #{inspect(scale)}")

  defp check_like_q!(x, name, q, c), do: check!(x, name, Nx.shape(q), c.type)

  defp check!(x, name, shape, type) do
    unless Nx.shape(x) == shape and Nx.type(x) == type do
      raise ArgumentError,
            "#{name}: expected #{Nx.Type.to_string(type)} #{inspect(shape)}, " <>
              "got #{Nx.Type.to_string(Nx.type(x))} #{inspect(Nx.shape(x))}"
    end
  end
end
