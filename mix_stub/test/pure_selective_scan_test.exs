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
  # type of the result, scale being the result's own max |ref|. Everything
  # is computed in f32 from the values the reference gets, so an f32 result
  # (h_final, grad_a, grad_dt_bias, grad_d, grad_h0 of any call) owes f32
  # accuracy: the C++ suite's tolerance, about 20 times the worst error seen
  # over thousands of random problems. A bf16 or f16 result is that f32
  # value rounded to 8 or 11 significant bits: rtol covers the rounding,
  # 2^-7 = 7.8e-3 for bf16 (Nx.BinaryBackend truncates toward zero; 2^-8 on
  # backends that round to nearest), 2^-11 = 4.9e-4 for f16 (rounded to
  # nearest), with margin; atol the f32 error before the rounding.
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
    Map.merge(inputs, grads) |> Map.merge(%{y: sequence, h_final: state, grad_y: sequence, grad_h_final: state})
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
    grad_h_final = if :grad_h_final in config, do: R.to_f32(R.random(batch * channels * states, -1.0, 1.0))
    layout = layout(dims, type)
    lists = Map.merge(Map.take(p, R.selective_scan_tensors()), %{grad_y: grad_y, grad_h_final: grad_h_final})

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
      ref_backward: R.selective_scan_backward(p, grad_y, grad_h_final)
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

  defp options(s, extra \\ []) do
    t = s.tensors
    [dt_bias: t[:dt_bias], d: t[:d], z: t[:z], h0: t[:h0], softplus: s.p.softplus, clamp: s.p.clamp] ++ extra
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
      got = Nx.to_flat_list(got)
      assert Enum.all?(got, &is_float/1), "#{label}: #{name} holds non-finite values"
      {atol, rtol} = tolerance(type)
      # The floor keeps an all-zero reference (every delta clamped) from
      # dividing by zero; for f16 it is the subnormal spacing 2^-24, which
      # no rounding to f16 can beat.
      floor = if type == {:f, 16}, do: :math.pow(2, -24) / atol, else: 1.0e-30
      ratio = R.error_ratio(got, ref, max(R.scale([ref]), floor), atol, rtol)
      assert ratio <= 1.0, "#{label}: #{name}: worst error #{Float.round(ratio, 3)} times the tolerance"
    end
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
  for delta_options <- [[], [:dt_bias], [:softplus], [:clamp], [:dt_bias, :softplus], [:dt_bias, :clamp], [:softplus, :clamp], [:dt_bias, :softplus, :clamp]] do
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

  for {label, config} <- [{"every option", @every_option}, {"clamp without softplus", [:clamp, :h0, :grad_h_final]}] do
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

      for name <- names do
        grad_name = :"grad_#{name}"
        expected = Nx.to_flat_list(autodiff[name])
        {atol, rtol} = tolerance({:f, 32})
        ratio = R.error_ratio(Nx.to_flat_list(grads[grad_name]), expected, max(R.scale([expected]), 1.0e-30), atol, rtol)
        assert ratio <= 1.0, "#{grad_name}: worst error #{Float.round(ratio, 3)} times the tolerance"
      end
    end
  end

  test "forward and backward run inside Nx.Defn.jit, with the values they give outside" do
    s = problem({2, 6, 3, 4}, @every_option, {:bf, 16})
    run_forward = fn t -> forward(%{s | tensors: t}) end
    run_backward = fn t -> t |> then(&backward(%{s | tensors: &1})) |> Map.reject(fn {_, g} -> g == nil end) end

    {y, h_final} = Nx.Defn.jit(run_forward).(s.tensors)
    {ref_y, ref_h_final} = forward(s)
    assert {Nx.type(y), Nx.type(h_final)} == {{:bf, 16}, {:f, 32}}
    assert Nx.to_flat_list(y) == Nx.to_flat_list(ref_y)
    assert Nx.to_flat_list(h_final) == Nx.to_flat_list(ref_h_final)

    jitted = Nx.Defn.jit(run_backward).(s.tensors)
    expected = run_backward.(s.tensors)
    assert Enum.sort(Map.keys(jitted)) == Enum.sort(@grads)
    for {name, grad} <- jitted, do: assert(Nx.to_flat_list(grad) == Nx.to_flat_list(expected[name]), "#{name}")
  end
end
