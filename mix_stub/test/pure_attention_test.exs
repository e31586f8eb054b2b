defmodule ExPhil.Native.Pure.AttentionTest do
  # The pure-Nx attention (the native op's default) on Nx.BinaryBackend
  # against the double-precision Elixir reference, on the same rounded
  # inputs: forward and backward, f32, bf16 and f16, both layouts, grouped
  # heads, T = 1 and T != S, every mask, a given scale; rows that see no
  # key; Nx.Defn.grad of its forward against its backward; and both under
  # Nx.Defn.jit. No GPU needed.
  use ExUnit.Case, async: true
  alias ExPhil.Native.AttentionReference, as: A
  alias ExPhil.Native.Pure.Attention
  alias ExPhil.Native.Reference, as: R

  # {atol, rtol}: an element passes if |got - ref| <= atol + rtol * |ref|.
  # Both sides take the same rounded inputs, so the error is the pure path's
  # f32 arithmetic and its rounding of the outputs to the input type.
  #
  # rtol: that final rounding, one ulp of the type relative to the value
  # (Nx.BinaryBackend truncates to bf16, so a full ulp, 2^-7; f16 rounds to
  # nearest, within 2^-11, given 2^-10). f32 outputs are not rounded again,
  # only the sums' own rounding is left: about 8 ulps, 1.0e-6.
  #
  # atol: gradients are sums whose order-1 terms (q in [-2, 2], k, v and
  # grad_o in [-1, 1], d <= 8) cancel, so their error is set by the terms,
  # not by the result: a reference gradient can be 0 (one visible key) where
  # f32 leaves ~1e-7. Below f32 the backward also takes the rounded o into
  # rowsum(grad_o * o), which moves grad_k and grad_q by up to about one
  # ulp of 1 (seen: 3.9e-3 in bf16, 1.5e-4 in f16): two ulps of 1.
  # lse is f32 from the same rounded values whatever the input type: f32's.
  defp tolerance({:f, 32}), do: {1.0e-6, 1.0e-6}
  defp tolerance({:bf, 16}), do: {2 * 2.0 ** -7, 2.0 ** -7}
  defp tolerance({:f, 16}), do: {2 * 2.0 ** -10, 2.0 ** -10}

  # {{B, Hq, Hkv, T, S, d}, options, type}
  @cases [
    {{2, 2, 2, 5, 5, 8}, [], {:f, 32}},
    {{1, 4, 2, 7, 11, 4}, [mask: :causal, layout: :bthd], {:f, 32}},
    {{2, 4, 1, 13, 6, 8}, [mask: :causal], {:f, 32}},
    {{1, 2, 1, 17, 9, 4}, [mask: :window, window: 1, layout: :bthd], {:f, 32}},
    {{1, 4, 2, 9, 16, 8}, [mask: :window, window: 1], {:f, 32}},
    {{2, 2, 2, 1, 17, 8}, [mask: :causal], {:f, 32}},
    {{1, 4, 2, 1, 9, 4}, [mask: :window, window: 20, layout: :bthd], {:f, 32}},
    {{1, 4, 4, 12, 5, 4}, [mask: :window, window: 20], {:f, 32}},
    {{1, 2, 2, 9, 9, 8}, [mask: :window, window: 3, scale: 0.3], {:f, 32}},
    {{2, 4, 1, 6, 14, 4}, [scale: -0.7, layout: :bthd], {:f, 32}},
    {{1, 1, 1, 1, 1, 4}, [], {:f, 32}},
    {{2, 2, 2, 5, 5, 8}, [], {:bf, 16}},
    {{1, 4, 2, 7, 11, 8}, [mask: :causal, layout: :bthd], {:bf, 16}},
    {{2, 4, 1, 13, 6, 8}, [mask: :causal], {:bf, 16}},
    {{1, 4, 2, 17, 9, 4}, [mask: :window, window: 2, layout: :bthd], {:bf, 16}},
    {{2, 2, 1, 1, 17, 8}, [mask: :window, window: 1], {:bf, 16}},
    {{1, 4, 1, 6, 14, 8}, [mask: :window, window: 30, scale: 0.5], {:bf, 16}},
    {{2, 4, 2, 11, 7, 8}, [mask: :causal, layout: :bthd], {:f, 16}}
  ]

  # The values `type` holds nearest to each of `values`.
  defp rounder(type) do
    fn values ->
      values |> tensor({length(values)}, {:f, 32}) |> Nx.as_type(type) |> Nx.to_flat_list()
    end
  end

  defp tensor(values, shape, type) do
    values
    |> R.encode_f32()
    |> Nx.from_binary({:f, 32}, backend: Nx.BinaryBackend)
    |> Nx.as_type(type)
    |> Nx.reshape(shape)
  end

  defp options(p), do: [mask: p.mask, window: p.window, scale: p.scale, layout: p.layout]

  # A problem, its tensors (q, k, v, grad_o) and the reference's results.
  defp problem(dims, opts, type) do
    round = rounder(type)
    p = A.random(dims, opts, round)
    grad_o = round.(R.random(length(p.q), -1.0, 1.0))
    shapes = A.shapes(p)

    tensors = %{
      q: tensor(p.q, shapes.q, type),
      k: tensor(p.k, shapes.k, type),
      v: tensor(p.v, shapes.k, type),
      grad_o: tensor(grad_o, shapes.q, type)
    }

    %{
      p: p,
      shapes: shapes,
      type: type,
      tensors: tensors,
      ref: Map.merge(A.forward(p), A.backward(p, grad_o))
    }
  end

  defp run(%{p: p, tensors: x}) do
    {o, lse} = Attention.forward(x.q, x.k, x.v, options(p))
    {grad_q, grad_k, grad_v} = Attention.backward(x.q, x.k, x.v, o, lse, x.grad_o, options(p))
    %{o: o, lse: lse, grad_q: grad_q, grad_k: grad_k, grad_v: grad_v}
  end

  # Elements equal where either is not a finite float (lse's -inf), else
  # within the tolerance.
  defp assert_close(name, got, ref, {atol, rtol}) do
    assert length(got) == length(ref)

    worst =
      for {g, r, i} <- Enum.zip([got, ref, 0..(length(ref) - 1)]), reduce: 0.0 do
        worst when is_float(g) and is_float(r) ->
          max(worst, abs(g - r) / (atol + rtol * abs(r)))

        worst ->
          assert g == r, "#{name}[#{i}]: got #{inspect(g)}, reference #{inspect(r)}"
          worst
      end

    assert worst <= 1.0, "#{name}: worst error #{Float.round(worst, 3)} times the tolerance"
  end

  defp values(tensor), do: tensor |> Nx.as_type({:f, 32}) |> Nx.to_flat_list()

  for {{b, hq, hkv, t, s, d} = dims, opts, type} <- @cases do
    test "#{Nx.Type.to_string(type)} B#{b} Hq#{hq} Hkv#{hkv} T#{t} S#{s} d#{d} #{inspect(opts)}" do
      %{p: p, shapes: shapes, type: type} =
        c = problem(unquote(Macro.escape(dims)), unquote(opts), unquote(type))

      got = run(c)

      expected = %{
        o: {shapes.q, type},
        lse: {shapes.lse, {:f, 32}},
        grad_q: {shapes.q, type},
        grad_k: {shapes.k, type},
        grad_v: {shapes.k, type}
      }

      for {name, {shape, out_type}} <- expected do
        assert {Nx.shape(got[name]), Nx.type(got[name])} == {shape, out_type}, "#{name}"
        tol = if name == :lse, do: tolerance({:f, 32}), else: tolerance(type)
        assert_close(name, values(got[name]), c.ref[name], tol)
      end

      assert_no_key_rows(p, got)
    end
  end

  # Queries that see no key: o and grad_q rows exactly 0, lse -inf; keys no
  # query sees: grad_k and grad_v rows exactly 0. assert_close has already
  # found every other value finite (no NaN anywhere).
  defp assert_no_key_rows(%{dims: {_b, _hq, _hkv, t, s, _d}} = p, got) do
    seen = Enum.map(0..(t - 1), &A.keys(p, &1))
    blind = for {[], i} <- Enum.with_index(seen), do: i
    unseen = Enum.to_list(0..(s - 1)) -- Enum.concat(seen)
    # T (or S) is axis 2 in :bhtd, 1 in :bthd
    axis = if p.layout == :bhtd, do: 2, else: 1

    rows = fn tensor, indices, axis ->
      tensor |> Nx.take(Nx.tensor(indices), axis: axis) |> Nx.to_flat_list()
    end

    if blind != [] do
      assert Enum.all?(rows.(got.lse, blind, 2), &(&1 == :neg_infinity))

      for name <- [:o, :grad_q] do
        assert Enum.all?(rows.(got[name], blind, axis), &(&1 == 0)), "#{name}"
      end
    end

    if unseen != [] do
      for name <- [:grad_k, :grad_v] do
        assert Enum.all?(rows.(got[name], unseen, axis), &(&1 == 0)), "#{name}"
      end
    end
  end

  test "the cases reach rows that see no key and keys that no row sees" do
    for type <- [{:f, 32}, {:bf, 16}] do
      problems = for {dims, opts, ^type} <- @cases, do: A.random(dims, opts, & &1)

      assert Enum.any?(problems, fn %{dims: {_, _, _, t, _, _}} = p ->
               Enum.any?(0..(t - 1), &(A.keys(p, &1) == []))
             end)

      assert Enum.any?(problems, fn %{dims: {_, _, _, t, s, _}} = p ->
               Enum.concat(Enum.map(0..(t - 1), &A.keys(p, &1))) |> Enum.uniq() |> length() < s
             end)
    end
  end

  # Nx.Defn.grad differentiates the forward as written (through its max,
  # selects and division); the backward is the closed form. f32, where they
  # differ by rounding alone. The first three cases' rows all see a key; the
  # last's first four rows see none, where both must give exactly 0 (and
  # the grad no NaN).
  for {dims, opts} <- [
        {{2, 4, 2, 7, 11, 8}, [mask: :causal, layout: :bthd]},
        {{1, 4, 1, 9, 9, 4}, [mask: :window, window: 3, scale: 0.5]},
        {{2, 2, 2, 6, 4, 8}, []},
        {{1, 4, 2, 10, 6, 4}, [mask: :causal, layout: :bthd]}
      ] do
    test "Nx.Defn.grad of forward/4 equals backward/7: #{inspect(dims)} #{inspect(opts)}" do
      %{p: p, tensors: x} = problem(unquote(Macro.escape(dims)), unquote(opts), {:f, 32})
      opts = options(p)
      {o, lse} = Attention.forward(x.q, x.k, x.v, opts)
      backward = Attention.backward(x.q, x.k, x.v, o, lse, x.grad_o, opts)

      grad =
        Nx.Defn.grad({x.q, x.k, x.v}, fn {q, k, v} ->
          {o, _lse} = Attention.forward(q, k, v, opts)
          Nx.sum(Nx.multiply(o, x.grad_o))
        end)

      for {name, got, want} <-
            Enum.zip([[:grad_q, :grad_k, :grad_v], Tuple.to_list(grad), Tuple.to_list(backward)]) do
        assert_close(name, values(got), values(want), tolerance({:f, 32}))
      end
    end
  end

  test "forward and backward under Nx.Defn.jit give the eager values" do
    for {dims, opts, type} <- [
          {{1, 4, 2, 13, 6, 8}, [mask: :causal, layout: :bthd], {:f, 32}},
          {{2, 2, 1, 5, 9, 4}, [mask: :window, window: 2, scale: 0.4], {:bf, 16}},
          {{1, 2, 2, 3, 5, 8}, [], {:f, 16}}
        ] do
      %{p: p, tensors: x} = problem(dims, opts, type)
      opts = options(p)
      {o, lse} = Attention.forward(x.q, x.k, x.v, opts)
      grads = Attention.backward(x.q, x.k, x.v, o, lse, x.grad_o, opts)

      {jit_o, jit_lse} = Nx.Defn.jit(&Attention.forward(&1, &2, &3, opts)).(x.q, x.k, x.v)

      jit_grads =
        Nx.Defn.jit(&Attention.backward(&1, &2, &3, &4, &5, &6, opts)).(
          x.q,
          x.k,
          x.v,
          o,
          lse,
          x.grad_o
        )

      for {eager, jit} <-
            Enum.zip([o, lse | Tuple.to_list(grads)], [jit_o, jit_lse | Tuple.to_list(jit_grads)]) do
        assert {Nx.shape(jit), Nx.type(jit)} == {Nx.shape(eager), Nx.type(eager)}
        assert Nx.to_flat_list(jit) == Nx.to_flat_list(eager)
      end
    end
  end

  test "bad options and tensors raise ArgumentError" do
    q = Nx.iota({1, 2, 3, 4}, type: :f32)
    k = Nx.iota({1, 1, 5, 4}, type: :f32)

    for {opts, message} <- [
          {[mask: :window], ~r/window: expected a positive integer/},
          {[mask: :window, window: 0], ~r/window: expected a positive integer/},
          {[mask: :causal, window: 2], ~r/window: expected nil unless mask: :window/},
          {[mask: :diagonal], ~r/mask: expected :none, :causal or :window/},
          {[layout: :tbhd], ~r/layout: expected :bhtd or :bthd/},
          {[scale: 0], ~r/scale: expected nil or a nonzero number/}
        ] do
      assert_raise ArgumentError, message, fn -> Attention.forward(q, k, k, opts) end
    end

    assert_raise ArgumentError, ~r/k and v: expected the type of q/, fn ->
      Attention.forward(q, Nx.as_type(k, :bf16), k, [])
    end

    assert_raise ArgumentError, ~r/q: expected type f64, f32, bf16 or f16, got s32/, fn ->
      Attention.forward(Nx.as_type(q, :s32), k, k, [])
    end

    assert_raise ArgumentError, ~r/k: expected q's batch and head width/, fn ->
      Attention.forward(
        q,
        Nx.iota({1, 3, 5, 4}, type: :f32),
        Nx.iota({1, 3, 5, 4}, type: :f32),
        []
      )
    end

    {o, lse} = Attention.forward(q, k, k, [])

    assert_raise ArgumentError, ~r/lse: expected f32 \{1, 2, 3\}/, fn ->
      Attention.backward(q, k, k, o, Nx.as_type(lse, :bf16), o, [])
    end
  end
end
