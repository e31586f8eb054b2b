defmodule ExPhil.Native.GatedRnnGpuTest do
  # gru_*, lstm_* and slstm_forward / _backward on the GPU against the
  # pure-Nx GRU, LSTM and sLSTM (ExPhil.Native.Pure.GatedRnn, itself held to
  # Axon's cells, Edifice's sLSTM and Nx's autodiff) run in f64 on the same
  # values: f32, bf16 and f16; with and without the optional inputs;
  # NIF-owned outputs, destination passing into pointer maps with a chosen
  # set of gradients, sync: false with await/1, a stream of its own; weights
  # and states in the sequence dtype; an H the device cannot hold.
  #
  # The tolerances are those of the C++ suite (test/gpu/test_gated_rnn.cpp):
  # |got - ref| <= atol * scale + rtol * |ref|, the scale the largest
  # reference state (y, h_final, c_final; the sLSTM's c, n and m each their
  # own, as there) or gradient of the call, and for grad_r and grad_bias,
  # sums over batch and time, also the largest sum of their terms'
  # magnitudes. As there, the sLSTM takes n0 >= 1, and gradients of its
  # c_final, n_final and m_final in f32 only: elsewhere they jump at max()'s
  # ties, and the backward's recompute from rounded y can land on the other
  # side of one near the reference's point.
  use ExUnit.Case, async: false
  @moduletag :gpu

  alias ExPhil.Native
  alias ExPhil.Native.Pure.GatedRnn

  @dims {3, 17, 37}

  defp tolerance({:f, 32}), do: {5.0e-5, 5.0e-5}
  defp tolerance({:f, 16}), do: {5.0e-3, 5.0e-3}
  defp tolerance({:bf, 16}), do: {4.0e-2, 3.0e-2}
  # f32 at precision: :tf32 (the C++ suite's f32-on-tensor-cores line).
  defp tolerance(:tf32), do: {1.0e-3, 1.0e-3}

  defp random(shape, type, seed, scale) do
    {t, _} = Nx.Random.uniform(Nx.Random.key(seed), -scale, scale, shape: shape, type: :f32)
    Nx.as_type(t, type)
  end

  defp upload!(%Nx.Tensor{} = t) do
    {:ok, buffer} = Native.upload(Nx.to_binary(t), Nx.type(t), Nx.shape(t))
    buffer
  end

  defp download!(%Native.Buffer{type: type, shape: shape} = buffer),
    do: download!(buffer, type, shape)

  defp download!({_pointer, type, shape} = view), do: download!(view, type, shape)

  defp download!(tensor, type, shape) do
    {:ok, binary} = Native.download(tensor)
    binary |> Nx.from_binary(type) |> Nx.reshape(shape)
  end

  defp f64(t), do: Nx.as_type(t, :f64)

  defp max_abs(t), do: t |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()

  # `line`: a type, or :tf32.
  defp assert_close(name, got, want, scale, line) do
    {atol, rtol} = tolerance(line)
    got = f64(got)
    bound = Nx.add(atol * max(scale, 1.0e-30), Nx.multiply(rtol, Nx.abs(want)))
    excess = Nx.subtract(Nx.abs(Nx.subtract(got, want)), bound)
    assert Nx.to_number(Nx.all(Nx.logical_not(Nx.is_nan(got)))) == 1, "#{name}: NaN"
    worst = Nx.to_number(Nx.reduce_max(excess))
    assert worst <= 0, "#{name}: beyond the tolerance by #{worst} (scale #{scale})"
  end

  # A problem of `cell` in sequence type `type`: the host tensors (rounded to
  # their types), and which optional inputs and final-state gradients it has
  # (all of the cell's, but for a 16-bit sLSTM those of c, n and m).
  defp problem(cell, type, optional?, opts \\ []) do
    {b, t, h} = Keyword.get(opts, :dims, @dims)
    g = GatedRnn.gates(cell)
    weight = Keyword.get(opts, :weight_type, {:f, 32})
    state = Keyword.get(opts, :state_type, {:f, 32})
    scale = 1.0 / :math.sqrt(h)

    inputs = %{
      wx: random({b, t, g * h}, type, 1, 2.0),
      r: random({h, g * h}, weight, 2, 2.0 * scale),
      grad_y: random({b, t, h}, type, 3, 1.0)
    }

    states = GatedRnn.states(cell)

    finals =
      if cell == :slstm and type != {:f, 32},
        do: [:grad_h_final],
        else: for(s <- states, do: :"grad_#{s}_final")

    optional =
      if optional? do
        %{
          bias: random({g * h}, weight, 4, 0.5),
          h0: random({b, h}, state, 5, 1.0),
          c0: random({b, h}, state, 6, 1.0),
          grad_h_final: random({b, h}, state, 7, 1.0),
          grad_c_final: random({b, h}, state, 8, 1.0),
          # n0 in [1, 2]: at least 1, as the default and every n_final
          n0: Nx.add(random({b, h}, state, 9, 0.5), 1.5),
          m0: random({b, h}, state, 10, 1.0),
          grad_n_final: random({b, h}, state, 11, 1.0),
          grad_m_final: random({b, h}, state, 12, 1.0)
        }
        |> Map.take([:bias | finals] ++ for(s <- states, do: :"#{s}0"))
      else
        %{}
      end

    %{cell: cell, type: type, dims: {b, t, h}, tensors: Map.merge(inputs, optional)}
  end

  @forward_options [:bias, :h0, :c0, :n0, :m0]
  @backward_options @forward_options ++
                      [:grad_h_final, :grad_c_final, :grad_n_final, :grad_m_final]

  defp options(p, keys, buffers),
    do: for(key <- keys, Map.has_key?(p.tensors, key), do: {key, buffers[key]})

  # The f64 references: the forward from the inputs, the backward from the
  # y the kernels wrote (what the backward kernels get).
  defp reference_forward(p) do
    t = Map.new(p.tensors, fn {k, v} -> {k, f64(v)} end)
    GatedRnn.forward(p.cell, t.wx, t.r, Enum.map(@forward_options, &{&1, t[&1]}))
  end

  defp reference_backward(p, y) do
    t = Map.new(p.tensors, fn {k, v} -> {k, f64(v)} end)
    opts = Enum.map(@backward_options, &{&1, t[&1]})
    grads = GatedRnn.backward(p.cell, t.wx, t.r, f64(y), t.grad_y, opts)

    # |h_{t-1}| . |grad_rh|: the magnitudes grad_r and grad_bias sum.
    {b, _t, h} = p.dims
    h0 = t[:h0] || Nx.broadcast(Nx.tensor(0.0, type: :f64), {b, h})
    steps = elem(p.dims, 1)

    h_prev =
      Nx.concatenate([Nx.new_axis(h0, 1), Nx.slice_along_axis(f64(y), 0, steps - 1, axis: 1)],
        axis: 1
      )

    terms = Nx.dot(Nx.abs(h_prev), [0, 1], Nx.abs(grads.grad_rh), [0, 1])

    Map.put(
      grads,
      :terms,
      max(max_abs(terms), max_abs(Nx.sum(Nx.abs(grads.grad_rh), axes: [0, 1])))
    )
  end

  defp finals(cell), do: for(s <- GatedRnn.states(cell), do: :"#{s}_final")

  # The largest magnitude of the initial state `name` given (0 without it).
  defp initial_scale(p, name),
    do: if(t = p.tensors[name], do: max_abs(f64(t)), else: 0.0)

  # The scale of each forward output. The GRU's and LSTM's outputs share
  # one: |y|, |h_final|, |h0|, |c0| (and |c_final|). The sLSTM's h, c, n and
  # m each have their own (the C++ suite's): n's at least 1, where it starts
  # without n0.
  defp forward_scales(%{cell: :slstm} = p, ref) do
    h = Enum.max([max_abs(ref.y), max_abs(ref.h_final), initial_scale(p, :h0)])

    %{
      y: h,
      h_final: h,
      c_final: max(max_abs(ref.c_final), initial_scale(p, :c0)),
      n_final: Enum.max([max_abs(ref.n_final), initial_scale(p, :n0), 1.0]),
      m_final: max(max_abs(ref.m_final), initial_scale(p, :m0))
    }
  end

  defp forward_scales(p, ref) do
    states =
      [ref.y, ref.h_final] ++
        Enum.map(Enum.filter(Map.keys(p.tensors), &(&1 in [:h0, :c0])), &f64(p.tensors[&1]))

    scale = states |> Enum.map(&max_abs/1) |> Enum.max()
    scale = if p.cell == :lstm, do: max(scale, max_abs(ref.c_final)), else: scale
    Map.new([:y | finals(p.cell)], &{&1, scale})
  end

  # The tolerance line of a problem: its type's, or :tf32 where it asks.
  defp line(p), do: if(p[:precision] == :tf32, do: :tf32, else: p.type)

  defp check_forward(p, outputs, ref) do
    scales = forward_scales(p, ref)

    for {name, tensor} <- outputs, name in [:y | finals(p.cell)] do
      assert_close("#{p.cell} #{name}", tensor, Map.fetch!(ref, name), scales[name], line(p))
    end
  end

  defp check_backward(p, grads, ref) do
    families = [:grad_wx, :grad_rh, :grad_h0, :grad_c0, :grad_n0, :grad_m0]
    scale = for(name <- families, Map.has_key?(ref, name), do: max_abs(ref[name])) |> Enum.max()

    for {name, tensor} <- grads do
      want = Map.fetch!(ref, name)
      s = if name in [:grad_r, :grad_bias], do: max(scale, ref.terms), else: scale
      assert_close("#{p.cell} #{name}", tensor, want, s, line(p))
    end
  end

  defp run_forward(p, buffers, opts) do
    apply(Native, :"#{p.cell}_forward", [
      buffers.wx,
      buffers.r,
      options(p, @forward_options, buffers) ++ opts
    ])
  end

  defp run_backward(p, buffers, y, opts) do
    apply(Native, :"#{p.cell}_backward", [
      buffers.wx,
      buffers.r,
      y,
      buffers.grad_y,
      options(p, @backward_options, buffers) ++ opts
    ])
  end

  for cell <- [:gru, :lstm, :slstm],
      type <- [{:f, 32}, {:bf, 16}, {:f, 16}],
      optional? <- [false, true] do
    test "#{cell} #{inspect(type)} optional inputs: #{optional?}: NIF-owned outputs match the pure reference" do
      p = problem(unquote(cell), unquote(type), unquote(optional?))
      buffers = Map.new(p.tensors, fn {k, t} -> {k, upload!(t)} end)
      {b, t, h} = p.dims
      g = GatedRnn.gates(p.cell)

      assert {:ok, %{y: y} = fwd} = run_forward(p, buffers, [])
      finals = finals(p.cell)
      assert Enum.sort(Map.keys(fwd)) == Enum.sort([:y | finals])
      assert {y.type, y.shape} == {p.type, {b, t, h}}
      assert Enum.all?(finals, &(fwd[&1].type == {:f, 32} and fwd[&1].shape == {b, h}))
      ref = reference_forward(p)
      check_forward(p, Map.new(fwd, fn {k, v} -> {k, download!(v)} end), ref)

      assert {:ok, bwd} = run_backward(p, buffers, y, [])

      initial_grads = for s <- GatedRnn.states(p.cell), do: :"grad_#{s}0"
      grads = [:grad_wx, :grad_r, :grad_bias, :grad_rh | initial_grads]

      assert Enum.sort(Map.keys(bwd)) == Enum.sort(grads)
      assert {bwd.grad_wx.type, bwd.grad_wx.shape} == {p.type, {b, t, g * h}}
      assert {bwd.grad_rh.type, bwd.grad_rh.shape} == {p.type, {b, t, g * h}}
      assert {bwd.grad_r.type, bwd.grad_r.shape} == {{:f, 32}, {h, g * h}}
      assert {bwd.grad_bias.type, bwd.grad_bias.shape} == {{:f, 32}, {g * h}}
      assert Enum.all?(initial_grads, &({bwd[&1].type, bwd[&1].shape} == {{:f, 32}, {b, h}}))

      ref = reference_backward(p, download!(y))
      check_backward(p, Map.new(bwd, fn {k, v} -> {k, download!(v)} end), ref)
    end
  end

  # precision: :tf32 at a shape that takes the tensor cores (B 24 in tiles
  # of 8, H a multiple of 16): the forward's product, the walk's and the
  # backward's two, each within the tf32 line; the same call at :exact
  # within f32's.
  for cell <- [:gru, :lstm] do
    test "#{cell} f32 precision: :tf32: the outputs match the pure reference within its line" do
      p = problem(unquote(cell), {:f, 32}, true, dims: {24, 9, 48})
      buffers = Map.new(p.tensors, fn {k, t} -> {k, upload!(t)} end)

      for precision <- [:tf32, :exact] do
        p = Map.put(p, :precision, precision)
        assert {:ok, %{y: y} = fwd} = run_forward(p, buffers, precision: precision)
        check_forward(p, Map.new(fwd, fn {k, v} -> {k, download!(v)} end), reference_forward(p))
        assert {:ok, bwd} = run_backward(p, buffers, y, precision: precision)
        ref = reference_backward(p, download!(y))
        check_backward(p, Map.new(bwd, fn {k, v} -> {k, download!(v)} end), ref)
      end
    end
  end

  test "destination passing into pointer maps, a chosen set of gradients, sync: false and a stream" do
    for cell <- [:gru, :lstm, :slstm] do
      p = problem(cell, {:f, 32}, true)
      buffers = Map.new(p.tensors, fn {k, t} -> {k, upload!(t)} end)
      {b, t, h} = p.dims
      g = GatedRnn.gates(cell)
      # Pointer maps borrow memory: the buffers behind them stay referenced
      # (in `owners`) until the last use.
      owned = fn shape -> elem(Native.allocate({:f, 32}, shape), 1) end
      view = fn buffer -> {Native.pointer(buffer), buffer.type, buffer.shape} end
      inputs = Map.new(buffers, fn {k, v} -> {k, view.(v)} end)

      outs =
        Map.new([:y | finals(cell)], &{&1, owned.(if(&1 == :y, do: {b, t, h}, else: {b, h}))})

      out_views = Map.new(outs, fn {k, v} -> {k, view.(v)} end)
      {:ok, stream} = Native.new_stream(device: 0)

      assert {:ok, %Native.Event{} = event} =
               run_forward(p, inputs, outputs: out_views, sync: false, stream: stream)

      assert {:ok, ^out_views} = Native.await(event)
      ref = reference_forward(p)
      check_forward(p, Map.new(outs, fn {k, v} -> {k, download!(v)} end), ref)

      # grad_wx and grad_r only: a caller that trains neither the bias nor h0.
      grads = %{grad_wx: owned.({b, t, g * h}), grad_r: owned.({h, g * h})}
      grad_views = Map.new(grads, fn {k, v} -> {k, view.(v)} end)

      assert {:ok, ^grad_views} =
               run_backward(p, inputs, out_views.y, outputs: grad_views, stream: :legacy_default)

      ref = reference_backward(p, download!(outs.y))
      check_backward(p, Map.new(grads, fn {k, v} -> {k, download!(v)} end), ref)

      Enum.each(
        Map.values(buffers) ++ Map.values(outs) ++ Map.values(grads),
        &(:ok = Native.free(&1))
      )
    end
  end

  test "weights and states in the sequence dtype: the outputs the NIF makes take their kind's dtype" do
    for cell <- [:gru, :lstm, :slstm] do
      p = problem(cell, {:bf, 16}, true, weight_type: {:bf, 16}, state_type: {:bf, 16})
      buffers = Map.new(p.tensors, fn {k, t} -> {k, upload!(t)} end)
      assert {:ok, %{y: y} = fwd} = run_forward(p, buffers, [])
      assert Enum.all?(finals(cell), &(fwd[&1].type == {:bf, 16}))
      check_forward(p, Map.new(fwd, fn {k, v} -> {k, download!(v)} end), reference_forward(p))

      assert {:ok, bwd} = run_backward(p, buffers, y, [])

      weights_and_states = [
        :grad_r,
        :grad_bias | for(s <- GatedRnn.states(cell), do: :"grad_#{s}0")
      ]

      assert Enum.all?(weights_and_states, &(bwd[&1].type == {:bf, 16}))

      check_backward(
        p,
        Map.new(bwd, fn {k, v} -> {k, download!(v)} end),
        reference_backward(p, download!(y))
      )
    end
  end
end
