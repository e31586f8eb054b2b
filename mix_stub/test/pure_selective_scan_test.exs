defmodule ExPhil.Native.Pure.SelectiveScanTest do
  # The pure-Nx selective scan (Nx.BinaryBackend, no GPU) against the Elixir
  # double-precision reference, both given the same values: forward and
  # every gradient, f32, bf16 and f16, every option, awkward sizes; then the
  # backward against Nx.Defn.grad of the forward, and both inside jit.
  use ExUnit.Case, async: true
  alias ExPhil.Native.Pure.SelectiveScan
  alias ExPhil.Native.Reference, as: R

  setup do
    Nx.default_backend(Nx.BinaryBackend)
    :ok
  end

  # An element passes when |got - ref| <= atol * scale + rtol * |ref|, by the
  # type of the result, scale being the result's own max |ref| (but see
  # term_scales/3). Everything is computed in f32 from the values the
  # reference gets, so an f32 result (h_final, grad_a, grad_dt_bias, grad_d,
  # grad_h0 of any call) owes f32 accuracy: the C++ suite's tolerance, about
  # 20 times the worst error seen over thousands of random problems. A bf16
  # or f16 result is that f32 value rounded to 8 or 11 significant bits:
  # rtol covers the rounding, 2^-7 = 7.8e-3 for bf16 (Nx.BinaryBackend
  # truncates toward zero; 2^-8 on backends that round to nearest), 2^-11 =
  # 4.9e-4 for f16 (rounded to nearest), with margin; atol the f32 error
  # before the rounding.
  defp tolerance({:f, 32}), do: {2.0e-5, 2.0e-5}
  defp tolerance({:bf, 16}), do: {1.0e-4, 1.0e-2}
  defp tolerance({:f, 16}), do: {1.0e-4, 1.0e-3}

  @options [:dt_bias, :d, :z, :h0, :softplus, :clamp]
  @grads [:grad_x, :grad_dt, :grad_a, :grad_b, :grad_c, :grad_dt_bias, :grad_d, :grad_z, :grad_h0]

  # {shape, type} of every tensor of the op, inputs and outputs, by name.
  defp layout({batch, steps, channels, states}, type) do
    sequence = {{batch, steps, channels}, type}
    projection = {{batch, steps, states}, type}
    state = {{batch, channels, states}, {:f, 32}}
    per_channel = {{channels}, {:f, 32}}

    inputs = %{
      x: sequence,
      dt: sequence,
      z: sequence,
      a: {{channels, states}, {:f, 32}},
      b: projection,
      c: projection,
      dt_bias: per_channel,
      d: per_channel,
      h0: state
    }

    grads = Map.new(inputs, fn {name, layout} -> {:"grad_#{name}", layout} end)

    Map.merge(inputs, grads)
    |> Map.merge(%{y: sequence, h_final: state, grad_y: sequence, grad_h_final: state})
  end

  # A random problem (R.random_selective_scan/3) with the parts `config`
  # names, its sequence tensors rounded to `type` by Nx itself, so that the
  # reference computes on exactly the values the tensors hold; grad_y, and
  # grad_h_final with :grad_h_final in `config`; the tensors; the reference
  # forward and backward.
  defp problem(dims, config, type) do
    {batch, steps, channels, states} = dims
    round = fn values -> values |> Nx.tensor(type: type) |> Nx.to_flat_list() end
    p = dims |> R.random_selective_scan(config, round) |> beyond_clamp(round)
    grad_y = round.(R.random(batch * steps * channels, -1.0, 1.0))

    grad_h_final =
      if :grad_h_final in config, do: R.to_f32(R.random(batch * channels * states, -1.0, 1.0))

    layout = layout(dims, type)

    lists =
      Map.merge(Map.take(p, R.selective_scan_tensors()), %{
        grad_y: grad_y,
        grad_h_final: grad_h_final
      })

    tensors =
      for {name, values} <- lists, values != nil, into: %{} do
        {shape, type} = layout[name]
        {name, values |> Nx.tensor(type: type) |> Nx.reshape(shape)}
      end

    {y, h_final} = R.selective_scan_forward(p)

    %{
      p: p,
      layout: layout,
      tensors: tensors,
      ref_forward: %{y: y, h_final: h_final},
      ref_backward: R.selective_scan_backward(p, grad_y, grad_h_final),
      scales: term_scales(p, grad_y, grad_h_final)
    }
  end

  # Every fourth dt moved to give a delta of half dt_min, and the one after
  # it dt_max + 0.25, so that the clamp replaces deltas on both sides (the
  # generator's range alone seldom goes below dt_min); both far from the
  # bounds, where rounding dt to bf16 cannot carry them across.
  defp beyond_clamp(%{clamp: nil} = p, _round), do: p

  defp beyond_clamp(p, round) do
    {lo, hi} = p.clamp
    {_batch, _steps, channels, _states} = p.dims

    dt =
      p.dt
      |> Enum.with_index()
      |> Enum.map(fn {dt, k} ->
        case rem(k, 4) do
          0 -> hd(round.([dt_giving(p, lo / 2, rem(k, channels))]))
          1 -> hd(round.([dt_giving(p, hi + 0.25, rem(k, channels))]))
          _ -> dt
        end
      end)

    %{p | dt: dt}
  end

  # The dt of channel i whose delta before the clamp is `delta`.
  defp dt_giving(p, delta, i) do
    u = if p.softplus, do: :math.log(:math.exp(delta) - 1.0), else: delta
    if p.dt_bias, do: u - Enum.at(p.dt_bias, i), else: u
  end

  # The scales of the gradients that are sums whose terms can cancel, as in
  # the C++ harness (test/support/selective_scan_harness.cpp): the largest
  # sum of |term| of one element. Rounding a sum costs about eps * sum |term|,
  # which exceeds the tolerance at the output's own max |ref| when every
  # element cancels: at the output's max |ref|, grad_dt (a sum over N) and
  # grad_dt_bias (over B * T, fewer terms where deltas are clamped) failed
  # about one run in a hundred of this file. The Elixir reference does not
  # report the terms, so they are taken here, in doubles, as the C++
  # reference takes dt_terms, A_terms and D_terms. For dt_bias its terms are
  # those of the grad_dt it sums (the C++ reference sums |grad_dt|, which
  # misses grad_dt's own cancellation: that left f32 runs at 0.8 times the
  # tolerance).
  defp term_scales(p, grad_y, grad_h_final) do
    {batch, steps, channels, states} = p.dims
    q = Map.new(R.selective_scan_tensors(), &{&1, p[&1] && List.to_tuple(p[&1])})
    grad_y = List.to_tuple(grad_y)
    row = fn values, offset -> for n <- 0..(states - 1), do: elem(values, offset + n) end
    zeros = List.duplicate(0.0, states)

    # {channel, dt term, A terms (by n), D term} of every step
    terms =
      for bi <- 0..(batch - 1), i <- 0..(channels - 1), reduce: [] do
        acc ->
          a = row.(q.a, i * states)
          state = (bi * channels + i) * states
          h0 = if q.h0, do: row.(q.h0, state), else: zeros

          {walk, _h_final} =
            Enum.map_reduce(0..(steps - 1), h0, fn t, h_prev ->
              j = (bi * steps + t) * channels + i
              {delta, slope} = delta_and_slope(p, elem(q.dt, j), i)
              {x, b} = {elem(q.x, j), row.(q.b, (bi * steps + t) * states)}
              decay = Enum.map(a, &:math.exp(delta * &1))
              h = Enum.zip_with([decay, h_prev, b], fn [e, hp, bn] -> e * hp + delta * bn * x end)

              step = %{
                j: j,
                x: x,
                delta: delta,
                slope: slope,
                b: b,
                c: row.(q.c, (bi * steps + t) * states)
              }

              {Map.merge(step, %{decay: decay, h_prev: h_prev}), h}
            end)

          g_final = if grad_h_final, do: Enum.slice(grad_h_final, state, states), else: zeros

          {acc, _g_h0} =
            Enum.reduce(Enum.reverse(walk), {acc, g_final}, fn s, {acc, g} ->
              g_ungated = elem(grad_y, s.j) * if(q.z, do: silu(elem(q.z, s.j)), else: 1.0)
              g = Enum.zip_with(g, s.c, &(&1 + g_ungated * &2))

              dt_term =
                Enum.zip_with([g, a, s.decay, s.h_prev, s.b], fn [g, a, e, hp, b] ->
                  abs(g * a * e * hp) + abs(g * b * s.x)
                end)
                |> Enum.sum()
                |> Kernel.*(s.slope)

              a_terms =
                Enum.zip_with([g, s.decay, s.h_prev], fn [g, e, hp] ->
                  abs(g * s.delta * e * hp)
                end)

              {[{i, dt_term, a_terms, abs(g_ungated * s.x)} | acc],
               Enum.zip_with(g, s.decay, &(&1 * &2))}
            end)

          acc
      end

    by_channel = Enum.group_by(terms, &elem(&1, 0))

    channel_max = fn term ->
      by_channel |> Map.values() |> Enum.map(&Enum.sum(Enum.map(&1, term))) |> Enum.max()
    end

    %{
      grad_dt: terms |> Enum.map(&elem(&1, 1)) |> Enum.max(),
      grad_a:
        by_channel
        |> Map.values()
        |> Enum.flat_map(fn rows ->
          rows |> Enum.map(&elem(&1, 2)) |> Enum.zip_with(&Enum.sum/1)
        end)
        |> Enum.max(),
      grad_dt_bias: channel_max.(&elem(&1, 1)),
      grad_d: channel_max.(&elem(&1, 3))
    }
  end

  # delta and d delta / d dt, as the references define them (the clamp's
  # slope is 1 on [dt_min, dt_max], bounds included, and 0 beyond).
  defp delta_and_slope(p, dt, i) do
    u = if p.dt_bias, do: dt + Enum.at(p.dt_bias, i), else: dt

    {u, slope} =
      if p.softplus,
        do: {max(u, 0.0) + :math.log(1.0 + :math.exp(-abs(u))), sigmoid(u)},
        else: {u, 1.0}

    case p.clamp do
      {lo, hi} when u < lo or u > hi -> {min(max(u, lo), hi), 0.0}
      _ -> {u, slope}
    end
  end

  defp sigmoid(v), do: 1.0 / (1.0 + :math.exp(-v))
  defp silu(v), do: v * sigmoid(v)

  defp options(s, extra \\ []) do
    t = s.tensors

    [
      dt_bias: t[:dt_bias],
      d: t[:d],
      z: t[:z],
      h0: t[:h0],
      softplus: s.p.softplus,
      clamp: s.p.clamp
    ] ++ extra
  end

  defp inputs(s), do: Enum.map([:x, :dt, :a, :b, :c], &s.tensors[&1])

  defp forward(s), do: apply(SelectiveScan, :forward, inputs(s) ++ [options(s)])

  defp backward(s) do
    opts = options(s, grad_h_final: s.tensors[:grad_h_final])
    apply(SelectiveScan, :backward, inputs(s) ++ [s.tensors.grad_y, opts])
  end

  # Each result of `refs` by type and shape exactly, then value by value.
  defp check(s, results, refs, label) do
    for {name, ref} <- refs do
      got = Map.fetch!(results, name)
      {shape, type} = s.layout[name]
      assert {Nx.shape(got), Nx.type(got)} == {shape, type}, "#{label}: #{name}"
      assert_close(got, ref, Map.get(s.scales, name), "#{label}: #{name}")
    end
  end

  # `got` (a tensor) against `ref` (a list) at the tolerance of got's type,
  # atol relative to `scale` (nil: max |ref|).
  defp assert_close(got, ref, scale, label) do
    type = Nx.type(got)
    {atol, rtol} = tolerance(type)
    got = Nx.to_flat_list(got)
    assert Enum.all?(got, &is_float/1), "#{label}: non-finite values"
    # The floor keeps an all-zero reference (every delta clamped) from
    # dividing by zero; for f16 it is the subnormal spacing 2^-24, which no
    # rounding to f16 can beat.
    floor = if type == {:f, 16}, do: :math.pow(2, -24) / atol, else: 1.0e-30
    ratio = R.error_ratio(got, ref, max(scale || R.scale([ref]), floor), atol, rtol)
    assert ratio <= 1.0, "#{label}: worst error #{Float.round(ratio, 3)} times the tolerance"
  end

  defp check_problem(dims, config, type) do
    s = problem(dims, config, type)
    label = "#{inspect(type)} #{inspect(dims)} #{inspect(config)}"

    {y, h_final} = forward(s)
    check(s, %{y: y, h_final: h_final}, s.ref_forward, label)

    grads = backward(s)
    assert Enum.sort(Map.keys(grads)) == Enum.sort(@grads), label
    present = for {name, grad} <- grads, grad != nil, do: name
    assert Enum.sort(present) == Enum.sort(Map.keys(s.ref_backward)), label
    check(s, grads, s.ref_backward, label)
  end

  # All 2^7 combinations of the options and grad_h_final, in eight tests,
  # one per way of forming delta.
  for delta_options <- [
        [],
        [:dt_bias],
        [:softplus],
        [:clamp],
        [:dt_bias, :softplus],
        [:dt_bias, :clamp],
        [:softplus, :clamp],
        [:dt_bias, :softplus, :clamp]
      ] do
    test "f32 [2, 5, 3, 4], delta from #{inspect(delta_options)}: every combination of d, z, h0 and grad_h_final" do
      for d <- [[], [:d]], z <- [[], [:z]], h0 <- [[], [:h0]], final <- [[], [:grad_h_final]] do
        check_problem({2, 5, 3, 4}, unquote(delta_options) ++ d ++ z ++ h0 ++ final, {:f, 32})
      end
    end
  end

  @every_option @options ++ [:grad_h_final]
  @mamba [:dt_bias, :softplus, :d, :z]

  # T = 1 (no scan step), odd T and D, T a power of two, N = 16.
  for {type, dims, configs} <- [
        {{:f, 32}, {2, 1, 5, 3}, [[], @every_option]},
        {{:f, 32}, {1, 33, 5, 16}, [@mamba, @every_option]},
        {{:f, 32}, {2, 8, 3, 2}, [@every_option]},
        {{:bf, 16}, {2, 5, 3, 4}, [[], @mamba, [:clamp, :h0, :grad_h_final], @every_option]},
        {{:bf, 16}, {2, 1, 5, 3}, [@every_option]},
        {{:bf, 16}, {2, 33, 5, 4}, [@every_option]},
        {{:f, 16}, {2, 9, 3, 4}, [[], @every_option]}
      ],
      config <- configs do
    test "#{inspect(type)} #{inspect(dims)} #{inspect(config)}: forward and backward match the reference" do
      check_problem(unquote(Macro.escape(dims)), unquote(config), unquote(Macro.escape(type)))
    end
  end

  for {label, config} <- [
        {"every option", @every_option},
        {"clamp without softplus", [:clamp, :h0, :grad_h_final]}
      ] do
    test "f32, #{label}: backward equals Nx.Defn.grad of a loss through forward" do
      s = problem({2, 7, 3, 4}, unquote(config), {:f, 32})
      names = Enum.filter([:x, :dt, :a, :b, :c | @options], &Map.has_key?(s.tensors, &1))
      w_y = s.tensors.grad_y
      w_f = s.tensors[:grad_h_final]

      autodiff =
        Nx.Defn.grad(Map.take(s.tensors, names), fn t ->
          {y, h_final} = forward(%{s | tensors: Map.merge(s.tensors, t)})
          loss = Nx.sum(Nx.multiply(y, w_y))
          if w_f, do: Nx.add(loss, Nx.sum(Nx.multiply(h_final, w_f))), else: loss
        end)

      grads = backward(s)

      # Both are f32 sums: the reference's term scales apply to either.
      for name <- names do
        grad_name = :"grad_#{name}"
        expected = Nx.to_flat_list(autodiff[name])
        assert_close(grads[grad_name], expected, Map.get(s.scales, grad_name), "#{grad_name}")
      end
    end
  end

  test "forward and backward run inside Nx.Defn.jit, with the values they give outside" do
    s = problem({2, 6, 3, 4}, @every_option, {:bf, 16})
    run_forward = fn t -> forward(%{s | tensors: t}) end

    # Every input is present (no gradient is nil, which jit cannot return).
    run_backward = fn t -> backward(%{s | tensors: t}) end

    {y, h_final} = Nx.Defn.jit(run_forward).(s.tensors)
    {ref_y, ref_h_final} = forward(s)
    assert {Nx.type(y), Nx.type(h_final)} == {{:bf, 16}, {:f, 32}}
    assert Nx.to_flat_list(y) == Nx.to_flat_list(ref_y)
    assert Nx.to_flat_list(h_final) == Nx.to_flat_list(ref_h_final)

    jitted = Nx.Defn.jit(run_backward).(s.tensors)
    expected = run_backward.(s.tensors)
    assert Enum.sort(Map.keys(jitted)) == Enum.sort(@grads)

    for {name, grad} <- jitted,
        do: assert(Nx.to_flat_list(grad) == Nx.to_flat_list(expected[name]), "#{name}")
  end
end
