defmodule ExPhil.Native.SelectiveScanReferenceTest do
  # The Elixir reference of the selective scan that the GPU tests trust:
  # its forward against values worked out by hand, its backward against
  # central finite differences of its forward. No GPU needed.
  use ExUnit.Case, async: true
  alias ExPhil.Native.Reference, as: R

  defp dot(u, v), do: Enum.zip_with(u, v, &(&1 * &2)) |> Enum.sum()

  defp sigmoid(v), do: 1.0 / (1.0 + :math.exp(-v))

  # Every part of the problem off; the tests add what they need.
  defp problem(dims, tensors) do
    Map.merge(
      %{dims: dims, softplus: false, clamp: nil, dt_bias: nil, d: nil, z: nil, h0: nil},
      Map.new(tensors)
    )
  end

  test "forward: two steps of one channel, worked out by hand" do
    p =
      problem({1, 2, 1, 1},
        x: [1.0, 2.0],
        dt: [0.5, 0.25],
        a: [-1.0],
        b: [0.5, -1.0],
        c: [2.0, 1.0],
        d: [0.5]
      )

    {y, h_final} = R.selective_scan_forward(p)
    h1 = 0.5 * 0.5 * 1.0
    h2 = :math.exp(-0.25) * h1 + 0.25 * -1.0 * 2.0
    assert_in_delta Enum.at(y, 0), 2.0 * h1 + 0.5 * 1.0, 1.0e-15
    assert_in_delta Enum.at(y, 1), 1.0 * h2 + 0.5 * 2.0, 1.0e-15
    assert_in_delta hd(h_final), h2, 1.0e-15
  end

  test "forward: bias, softplus, clamp (applied last), initial state and gate" do
    base = [
      x: [1.0],
      dt: [0.0],
      a: [-1.0],
      b: [1.0],
      c: [1.0],
      dt_bias: [0.25],
      h0: [1.0],
      z: [1.0]
    ]

    silu = 1.0 * sigmoid(1.0)

    for {extra, delta} <- [
          {[], 0.25},
          {[softplus: true], :math.log(1.0 + :math.exp(0.25))},
          # softplus(0.25) = 0.826 is above the clamp; the clamp wins
          {[softplus: true, clamp: {0.1, 0.5}], 0.5},
          {[clamp: {0.5, 0.9}], 0.5}
        ] do
      {[y], [h]} = R.selective_scan_forward(problem({1, 1, 1, 1}, base ++ extra))
      assert_in_delta h, :math.exp(-delta) * 1.0 + delta, 1.0e-15, inspect(extra)
      assert_in_delta y, h * silu, 1.0e-15, inspect(extra)
    end
  end

  # Each case: the problem's parts, and whether the loss sees h_final.
  for {label, config, final?} <- [
        {"no options", [], false},
        {"bias and softplus, skip and gate", [:dt_bias, :softplus, :d, :z], false},
        {"clamp without softplus, h0 and grad_h_final", [:clamp, :h0], true},
        {"every option", [:dt_bias, :softplus, :clamp, :d, :z, :h0], true}
      ] do
    test "backward matches finite differences: #{label}" do
      dims = {batch, steps, channels, states} = {2, 4, 3, 2}
      p = R.random_selective_scan(dims, unquote(config), & &1)
      w_y = R.random(batch * steps * channels, -1.0, 1.0)
      w_f = if unquote(final?), do: R.random(batch * channels * states, -1.0, 1.0)

      loss = fn p ->
        {y, h_final} = R.selective_scan_forward(p)
        dot(y, w_y) + if(w_f, do: dot(h_final, w_f), else: 0.0)
      end

      grads = R.selective_scan_backward(p, w_y, w_f)
      given = Enum.filter(R.selective_scan_tensors(), &p[&1])
      assert Enum.sort(Map.keys(grads)) == Enum.sort(Enum.map(given, &:"grad_#{&1}"))

      ExPhil.Native.FiniteDifferences.assert_matches(loss, p, grads, given)
    end
  end
end

defmodule ExPhil.Native.SelectiveScanTest do
  # The selective scan on the GPU against the Elixir reference: forward and
  # backward, f32 and bf16, options off and on, into NIF-owned buffers;
  # destination passing into Nx-style pointer maps with a chosen set of
  # gradients; sync: false with await/1, and a stream of its own.
  use ExUnit.Case, async: false
  @moduletag :gpu
  import ExPhil.Native.GPUCase, only: [upload!: 3, download!: 2]
  alias ExPhil.Native
  alias ExPhil.Native.Reference, as: R

  # The problem's parts (R.random_selective_scan/3), and :grad_h_final.
  @configs [
    {"no options", []},
    {"as Mamba calls it (bias, softplus, skip, gate)", [:dt_bias, :softplus, :d, :z]},
    {"clamp without softplus, h0 and grad_h_final", [:clamp, :h0, :grad_h_final]},
    {"every option", [:dt_bias, :softplus, :clamp, :d, :z, :h0, :grad_h_final]}
  ]

  # Tolerances of the C++ suite (test/support/tolerance.hpp), by the type of
  # the result: the f32 results of a bf16 call are computed from the same
  # bf16 values as the reference, in f32.
  defp tolerance({:f, 32}), do: {2.0e-5, 2.0e-5}
  defp tolerance({:bf, 16}), do: {3.0e-2, 2.0e-2}

  defp bf16(values), do: elem(R.to_bf16(values), 0)

  # {shape, type} of every tensor of the op, inputs and outputs, by name.
  defp layout({batch, steps, channels, states}, type) do
    sequence = {{batch, steps, channels}, type}
    projection = {{batch, steps, states}, type}
    state = {{batch, channels, states}, {:f, 32}}
    per_channel = {{channels}, {:f, 32}}

    %{
      x: sequence,
      dt: sequence,
      z: sequence,
      a: {{channels, states}, {:f, 32}},
      b: projection,
      c: projection,
      dt_bias: per_channel,
      d: per_channel,
      h0: state,
      y: sequence,
      h_final: state,
      grad_y: sequence,
      grad_h_final: state
    }
    |> then(fn l ->
      Enum.reduce(R.selective_scan_tensors(), l, &Map.put(&2, :"grad_#{&1}", l[&1]))
    end)
  end

  # A problem at `dims` rounded to what a `type` call sees, its uploads, and
  # the reference forward and backward.
  defp problem(dims, config, type) do
    {batch, steps, channels, states} = dims
    round = if type == {:bf, 16}, do: &bf16/1, else: &R.to_f32/1
    p = R.random_selective_scan(dims, config, round)
    grad_y = round.(R.random(batch * steps * channels, -1.0, 1.0))

    grad_h_final =
      if :grad_h_final in config, do: R.to_f32(R.random(batch * channels * states, -1.0, 1.0))

    l = layout(dims, type)

    uploads =
      for {name, values} <-
            [grad_y: grad_y, grad_h_final: grad_h_final] ++
              Map.to_list(Map.take(p, R.selective_scan_tensors())),
          values != nil,
          into: %{} do
        {shape, t} = l[name]
        {name, upload!(values, shape, t)}
      end

    {ref_y, ref_h_final} = R.selective_scan_forward(p)
    ref_grads = R.selective_scan_backward(p, grad_y, grad_h_final)

    %{
      layout: l,
      uploads: uploads,
      p: p,
      ref_forward: %{y: ref_y, h_final: ref_h_final},
      ref_backward: ref_grads
    }
  end

  # The options of both directions for the problem's uploads; nil for the
  # absent tensors, as a caller building them may pass.
  defp options(s, extra) do
    u = s.uploads

    [
      dt_bias: u[:dt_bias],
      d: u[:d],
      z: u[:z],
      h0: u[:h0],
      softplus: s.p.softplus,
      clamp: s.p.clamp
    ] ++ extra
  end

  defp inputs(s), do: Enum.map([:x, :dt, :a, :b, :c], &s.uploads[&1])

  defp forward(s, opts),
    do: apply(Native, :selective_scan_forward, inputs(s) ++ [options(s, opts)])

  defp backward(s, opts) do
    opts = options(s, [grad_h_final: s.uploads[:grad_h_final]] ++ opts)
    apply(Native, :selective_scan_backward, inputs(s) ++ [s.uploads.grad_y, opts])
  end

  # Every output against its reference; NIF-owned buffers also by type and
  # shape. As in the C++ harness, atol is relative to the output's own max
  # |ref|: the outputs differ by orders of magnitude (grad_a sums over B * T,
  # grad_x does not), and a shared scale would leave the small ones
  # unchecked. The floor keeps an all-zero reference (every step clamped)
  # from dividing by zero: it then asks for zeros.
  defp check(s, outputs, refs) do
    for {name, tensor} <- outputs do
      {shape, type} = s.layout[name]

      with %Native.Buffer{} <- tensor do
        assert {tensor.shape, tensor.type} == {shape, type}, "#{name}"
      end

      got = download!(tensor, type)
      # decode_f32 stops at the first NaN or infinity (decode_bf16 raises):
      # a short list means the output holds one (poison left unwritten, say).
      assert length(got) == Tuple.product(shape), "#{name}: non-finite values"
      ref = Map.fetch!(refs, name)
      {atol, rtol} = tolerance(type)
      ratio = R.error_ratio(got, ref, max(R.scale([ref]), 1.0e-30), atol, rtol)
      assert ratio <= 1.0, "#{name}: worst error #{Float.round(ratio, 3)} times the tolerance"
    end
  end

  for type <- [{:f, 32}, {:bf, 16}],
      dims <- [{2, 5, 3, 4}, {1, 33, 7, 16}],
      {label, config} <- @configs do
    test "#{inspect(type)} #{inspect(dims)}, #{label}: forward and backward match the reference" do
      s = problem(unquote(Macro.escape(dims)), unquote(config), unquote(Macro.escape(type)))
      assert {:ok, fwd} = forward(s, [])
      assert Enum.sort(Map.keys(fwd)) == [:h_final, :y]
      check(s, fwd, s.ref_forward)

      assert {:ok, bwd} = backward(s, [])
      assert Enum.sort(Map.keys(bwd)) == Enum.sort(Map.keys(s.ref_backward))
      check(s, bwd, s.ref_backward)
    end
  end

  # A pointer map over a new buffer of NaNs, as Nx.to_pointer gives one, and
  # the buffer that owns the memory (to keep alive until the last use).
  defp nan_view(s, name) do
    {shape, type} = s.layout[name]
    nan = if type == {:f, 32}, do: <<0xFF, 0xFF, 0xFF, 0x7F>>, else: <<0xFF, 0x7F>>
    {:ok, buffer} = Native.upload(:binary.copy(nan, Tuple.product(shape)), type, shape)
    {{Native.pointer(buffer), type, shape}, buffer}
  end

  for type <- [{:f, 32}, {:bf, 16}] do
    test "#{inspect(type)}: destination passing into pointer maps writes the outputs asked for, and only those" do
      s =
        problem(
          {2, 5, 3, 4},
          [:dt_bias, :softplus, :clamp, :d, :z, :h0, :grad_h_final],
          unquote(Macro.escape(type))
        )

      # Forward without :h_final, then with it.
      {y, y_owner} = nan_view(s, :y)
      assert {:ok, %{y: ^y} = fwd} = forward(s, outputs: [y: y])
      assert map_size(fwd) == 1
      check(s, fwd, s.ref_forward)
      {h_final, h_owner} = nan_view(s, :h_final)

      assert {:ok, %{y: ^y, h_final: ^h_final} = fwd} =
               forward(s, outputs: %{y: y, h_final: h_final})

      check(s, fwd, s.ref_forward)

      # A subset of the gradients: a sequence one, the reductions over time
      # and batch, and the initial state's.
      views = Map.new([:grad_x, :grad_a, :grad_dt_bias, :grad_h0], &{&1, nan_view(s, &1)})
      wanted = Map.new(views, fn {name, {view, _owner}} -> {name, view} end)
      assert {:ok, ^wanted} = backward(s, outputs: wanted)
      check(s, wanted, s.ref_backward)

      owners =
        [y_owner, h_owner | Enum.map(Map.values(views), &elem(&1, 1))] ++ Map.values(s.uploads)

      Enum.each(owners, &(:ok = Native.free(&1)))
    end
  end

  test "sync: false returns events for await/1, on a stream of the caller's" do
    s = problem({1, 33, 7, 16}, [:dt_bias, :softplus, :d, :z, :h0, :grad_h_final], {:f, 32})
    assert {:ok, %Native.Stream{} = stream} = Native.new_stream(device: 0)

    assert {:ok, %Native.Event{} = event} = forward(s, sync: false, stream: stream)
    assert {:ok, fwd} = Native.await(event)
    check(s, fwd, s.ref_forward)

    assert {:ok, %Native.Event{} = event} = backward(s, sync: false, stream: stream)
    assert {:ok, bwd} = Native.await(event)
    assert {:ok, ^bwd} = Native.await(event)
    check(s, bwd, s.ref_backward)
  end
end
