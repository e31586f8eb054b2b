defmodule ExPhil.Native.Pure.GatedRnnTest do
  # The pure-Nx GRU, LSTM and sLSTM sequences (BinaryBackend): the forward
  # against Axon's own gru_cell and lstm_cell stepped over the sequence, with
  # Axon's parameters mapped onto wx, r and bias as the module doc says, and
  # the sLSTM's against Edifice's slstm_scan_fallback and a loop over plain
  # floats; the backward against Nx's autodiff of the forward (for the sLSTM
  # also at max()'s exact ties); the types of the outputs.
  use ExUnit.Case, async: true
  alias ExPhil.Native.Pure.GatedRnn
  alias ExPhil.Native.Reference

  # f64 throughout for the autodiff comparison: only rounding differs.
  @f64 {1.0e-12, 1.0e-12}
  # Axon's cells in f32 against ours in f32: the same operations grouped
  # differently (one product over the three gates, the biases in wx).
  @f32 {2.0e-6, 2.0e-6}

  defp random(key, shape, type, scale \\ 1.0) do
    {t, _key} = Nx.Random.uniform(key, -scale, scale, shape: shape, type: type)
    t
  end

  defp keys(seed, n),
    do:
      seed
      |> Nx.Random.key()
      |> Nx.Random.split(parts: n)
      |> then(&for(i <- 0..(n - 1), do: &1[i]))

  # Axon's parameters of a cell with input size i and hidden size h.
  defp axon_params(:gru, i, h, type, seed) do
    [k1, k2, k3, k4, k5, k6, k7, k8, k9, k10] = keys(seed, 10)
    s = 1.0 / :math.sqrt(h)

    {%{
       "wir" => random(k1, {i, h}, type, s),
       "wiz" => random(k2, {i, h}, type, s),
       "win" => random(k3, {i, h}, type, s)
     },
     %{
       "whr" => random(k4, {h, h}, type, s),
       "whz" => random(k5, {h, h}, type, s),
       "whn" => random(k6, {h, h}, type, s)
     },
     %{
       "br" => random(k7, {h}, type, 0.5),
       "bz" => random(k8, {h}, type, 0.5),
       "bin" => random(k9, {h}, type, 0.5),
       "bhn" => random(k10, {h}, type, 0.5)
     }}
  end

  defp axon_params(:lstm, i, h, type, seed) do
    ks = keys(seed, 12)
    s = 1.0 / :math.sqrt(h)
    [wi, wf, wg, wo, hi, hf, hg, ho, bi, bf, bg, bo] = ks

    {%{
       "wii" => random(wi, {i, h}, type, s),
       "wif" => random(wf, {i, h}, type, s),
       "wig" => random(wg, {i, h}, type, s),
       "wio" => random(wo, {i, h}, type, s)
     },
     %{
       "whi" => random(hi, {h, h}, type, s),
       "whf" => random(hf, {h, h}, type, s),
       "whg" => random(hg, {h, h}, type, s),
       "who" => random(ho, {h, h}, type, s)
     },
     %{
       "bi" => random(bi, {h}, type, 0.5),
       "bf" => random(bf, {h}, type, 0.5),
       "bg" => random(bg, {h}, type, 0.5),
       "bo" => random(bo, {h}, type, 0.5)
     }}
  end

  # Our wx, r and bias from Axon's parameters (the module doc's mapping).
  defp ours(:gru, x, {ih, hh, b}) do
    w = Nx.concatenate([ih["wir"], ih["wiz"], ih["win"]], axis: 1)
    b_in = Nx.concatenate([b["br"], b["bz"], b["bin"]])
    zeros = Nx.broadcast(Nx.tensor(0, type: Nx.type(b["bhn"])), Nx.shape(b["bhn"]))

    {x |> Nx.dot([2], w, [0]) |> Nx.add(b_in),
     Nx.concatenate([hh["whr"], hh["whz"], hh["whn"]], axis: 1),
     Nx.concatenate([zeros, zeros, b["bhn"]])}
  end

  defp ours(:lstm, x, {ih, hh, b}) do
    w = Nx.concatenate([ih["wii"], ih["wif"], ih["wig"], ih["wio"]], axis: 1)
    b_in = Nx.concatenate([b["bi"], b["bf"], b["bg"], b["bo"]])

    {x |> Nx.dot([2], w, [0]) |> Nx.add(b_in),
     Nx.concatenate([hh["whi"], hh["whf"], hh["whg"], hh["who"]], axis: 1), nil}
  end

  # Axon's cell stepped over x [B, T, I], from h0 (and c0): every h and the
  # final carry.
  defp axon_run(cell, x, {ih, hh, b}, h0, c0) do
    {_, steps, _} = Nx.shape(x)
    mask = Nx.tensor(0)

    {hs, carry} =
      Enum.map_reduce(0..(steps - 1), if(cell == :gru, do: {h0}, else: {c0, h0}), fn t, carry ->
        input = x |> Nx.slice_along_axis(t, 1, axis: 1) |> Nx.squeeze(axes: [1])

        {h, carry} =
          case cell do
            :gru -> Axon.Layers.gru_cell(input, carry, mask, ih, hh, b)
            :lstm -> Axon.Layers.lstm_cell(input, carry, mask, ih, hh, b)
          end

        {h, carry}
      end)

    {Nx.stack(hs, axis: 1), carry}
  end

  defp assert_close(got, want, {atol, rtol}, label) do
    got = Nx.to_flat_list(got)
    want = Nx.to_flat_list(want)
    assert length(got) == length(want), label
    # An all-zero reference (grad_r of one step from a zero h0) asks for zeros.
    scale = max(Reference.scale([want]), 1.0e-300)
    ratio = Reference.error_ratio(got, want, scale, atol, rtol)
    assert ratio <= 1.0, "#{label}: worst error #{Float.round(ratio, 3)} times the tolerance"
  end

  for cell <- [:gru, :lstm] do
    test "#{cell}: the forward is Axon's cell over the sequence",
      do: forward_matches_axon(unquote(cell))
  end

  for cell <- [:gru, :lstm, :slstm] do
    test "#{cell}: backward/6 equals Nx.Defn.grad of forward/4 (f64)",
      do: backward_matches_autodiff(unquote(cell))

    test "#{cell}: a 16-bit sequence keeps its type; states and weights' gradients are f32",
      do: types_kept(unquote(cell))
  end

  test "slstm: the forward is Edifice's slstm_scan_fallback (its states, no bias)" do
    for {b, t, h} <- [{1, 1, 3}, {2, 9, 5}] do
      [kx, kr] = keys(13, 2)
      wx = random(kx, {b, t, 4 * h}, :f32, 2.0)
      r = random(kr, {h, 4 * h}, :f32, 1.0 / :math.sqrt(h))
      want = Edifice.Recurrent.SLSTM.slstm_scan_fallback(wx, r)
      assert_close(GatedRnn.forward(:slstm, wx, r).y, want, @f32, "slstm B#{b} T#{t} H#{h} y")
    end
  end

  # The sLSTM on plain floats, one batch row at a time (slstm_cell.cuh's
  # math, written out): every h_t [B][T][H] and the final states by name.
  defp slstm_by_hand(wx, r, bias, initial) do
    [wx, r, bias] = Enum.map([wx, r, bias], &Nx.to_list/1)
    initial = Map.new(initial, fn {k, v} -> {k, Nx.to_list(v)} end)
    h = length(r)
    unit = fn list, gate, u -> Enum.at(list, gate * h + u) end

    rows =
      for {wx_b, b} <- Enum.with_index(wx) do
        start = Map.new(initial, fn {k, v} -> {k, Enum.at(v, b)} end)

        {ys, final} =
          Enum.map_reduce(wx_b, start, fn wx_t, s ->
            pre =
              for k <- 0..(4 * h - 1) do
                rh =
                  Enum.sum(for j <- 0..(h - 1), do: Enum.at(s.h, j) * Enum.at(Enum.at(r, j), k))

                Enum.at(wx_t, k) + rh + Enum.at(bias, k)
              end

            units =
              for u <- 0..(h - 1) do
                {li, lf} = {unit.(pre, 0, u), unit.(pre, 1, u)}
                z = :math.tanh(unit.(pre, 2, u))
                o = 1.0 / (1.0 + :math.exp(-unit.(pre, 3, u)))
                a = lf + Enum.at(s.m, u)
                m = max(a, li)
                {i, f} = {:math.exp(li - m), :math.exp(a - m)}
                c = f * Enum.at(s.c, u) + i * z
                n = f * Enum.at(s.n, u) + i
                %{h: o * c / max(abs(n), 1.0), c: c, n: n, m: m}
              end

            s = Map.new([:h, :c, :n, :m], fn k -> {k, Enum.map(units, & &1[k])} end)
            {s.h, s}
          end)

        {ys, final}
      end

    tensor = &Nx.tensor(&1, type: :f64)

    Map.new([:h, :c, :n, :m], fn k ->
      {:"#{k}_final", tensor.(for {_, final} <- rows, do: final[k])}
    end)
    |> Map.put(:y, tensor.(for {ys, _} <- rows, do: ys))
  end

  test "slstm: the forward with bias and every initial state is the step written out on floats (f64)" do
    {b, t, h} = {2, 6, 3}
    [kx, kr, kb, kh, kc, kn, km] = keys(17, 7)

    initial = %{
      h: random(kh, {b, h}, :f64),
      c: random(kc, {b, h}, :f64),
      n: random(kn, {b, h}, :f64, 2.0),
      m: random(km, {b, h}, :f64)
    }

    wx = random(kx, {b, t, 4 * h}, :f64, 2.0)
    r = random(kr, {h, 4 * h}, :f64, 0.6)
    bias = random(kb, {4 * h}, :f64, 0.5)
    opts = [bias: bias] ++ for({k, v} <- initial, do: {:"#{k}0", v})
    got = GatedRnn.forward(:slstm, wx, r, opts)
    want = slstm_by_hand(wx, r, bias, initial)
    assert Enum.sort(Map.keys(got)) == Enum.sort(Map.keys(want))

    for {name, tensor} <- want,
        do: assert_close(got[name], tensor, @f64, "slstm #{name}")

    # Without them: Edifice's h0 = c0 = m0 = 0, n0 = 1.
    zeros = Nx.broadcast(Nx.tensor(0.0, type: :f64), {b, h})
    defaults = %{h: zeros, c: zeros, n: Nx.add(zeros, 1.0), m: zeros}

    assert_close(
      GatedRnn.forward(:slstm, wx, r).y,
      slstm_by_hand(wx, r, Nx.multiply(bias, 0.0), defaults).y,
      @f64,
      "slstm defaults y"
    )
  end

  test "slstm: at max()'s exact ties the backward splits the gradient as Nx's autodiff (f64)" do
    # At t = 0 pre = wx exactly (no h0, bias or m0): unit 0 has pre_f = pre_i
    # (m's tie) and, with n0 = 0, n_1 = 1 (max(|n|, 1)'s); unit 1 pre_i >
    # pre_f, so n_1 = 1 alone; unit 2 neither.
    {b, t, h} = {2, 3, 3}
    [kx, kr, ky, k1, k2, k3, k4] = keys(19, 7)
    # pre_i and pre_f of units 0 and 1 at t = 0
    at_first_step = fn values -> Nx.broadcast(Nx.tensor(values, type: :f64), {b, 1, 2}) end

    wx =
      random(kx, {b, t, 4 * h}, :f64, 1.5)
      |> Nx.put_slice([0, 0, 0], at_first_step.([0.3, 0.7]))
      |> Nx.put_slice([0, 0, h], at_first_step.([0.3, -0.2]))

    r = random(kr, {h, 4 * h}, :f64, 0.6)
    n0 = Nx.broadcast(Nx.tensor(0.0, type: :f64), {b, h})
    one_step = GatedRnn.forward(:slstm, wx[[.., 0..0, ..]], r, n0: n0)
    assert Nx.to_list(one_step.n_final[[.., 0..1]]) == List.duplicate([1.0, 1.0], b)

    grad_y = random(ky, {b, t, h}, :f64)

    finals =
      Map.new(
        Enum.zip([:grad_h_final, :grad_c_final, :grad_n_final, :grad_m_final], [k1, k2, k3, k4]),
        fn {name, k} -> {name, random(k, {b, h}, :f64)} end
      )

    out = GatedRnn.forward(:slstm, wx, r, n0: n0)
    grads = GatedRnn.backward(:slstm, wx, r, out.y, grad_y, [n0: n0] ++ Map.to_list(finals))
    assert_matches_autodiff(:slstm, {wx, r, %{n0: n0}}, grad_y, finals, grads, "slstm ties")
  end

  # Functions of the cell, not test bodies with it unquoted: the compiler
  # would see a literal cell compared with the other.
  defp forward_matches_axon(cell) do
    for {b, t, i, h} <- [{1, 1, 3, 4}, {2, 9, 5, 7}] do
      params = axon_params(cell, i, h, :f32, 7)
      [kx, kh, kc] = keys(11, 3)
      x = random(kx, {b, t, i}, :f32)
      h0 = random(kh, {b, h}, :f32)
      c0 = random(kc, {b, h}, :f32)
      {wx, r, bias} = ours(cell, x, params)

      out = GatedRnn.forward(cell, wx, r, bias: bias, h0: h0, c0: c0)
      {ys, carry} = axon_run(cell, x, params, h0, c0)
      label = "#{cell} B#{b} T#{t} H#{h}"
      assert_close(out.y, ys, @f32, "#{label} y")

      case carry do
        {h_final} ->
          assert_close(out.h_final, h_final, @f32, "#{label} h_final")

        {c_final, h_final} ->
          assert_close(out.h_final, h_final, @f32, "#{label} h_final")
          assert_close(out.c_final, c_final, @f32, "#{label} c_final")
      end
    end
  end

  defp backward_matches_autodiff(cell) do
    g = GatedRnn.gates(cell)

    for {b, t, h} <- [{1, 1, 3}, {2, 7, 5}], optional <- [false, true] do
      [k1, k2, k3, k4, k5, k6, k7, k8] = keys(3, 8)
      wx = random(k1, {b, t, g * h}, :f64, 1.5)
      r = random(k2, {h, g * h}, :f64, 0.6)
      grad_y = random(k3, {b, t, h}, :f64)

      [k9, k10, k11, k12] = keys(4, 4)
      states = GatedRnn.states(cell)

      # The sLSTM's n0 on both sides of max(|n|, 1)'s kink, and negative.
      inputs =
        if optional,
          do:
            Map.take(
              %{
                h0: random(k5, {b, h}, :f64),
                c0: random(k6, {b, h}, :f64),
                n0: random(k9, {b, h}, :f64, 2.0),
                m0: random(k10, {b, h}, :f64)
              },
              Enum.map(states, &:"#{&1}0")
            )
            |> Map.put(:bias, random(k4, {g * h}, :f64, 0.5)),
          else: %{}

      finals =
        if optional,
          do:
            Map.take(
              %{
                grad_h_final: random(k7, {b, h}, :f64),
                grad_c_final: random(k8, {b, h}, :f64),
                grad_n_final: random(k11, {b, h}, :f64),
                grad_m_final: random(k12, {b, h}, :f64)
              },
              Enum.map(states, &:"grad_#{&1}_final")
            ),
          else: %{}

      out = GatedRnn.forward(cell, wx, r, Map.to_list(inputs))

      grads =
        GatedRnn.backward(cell, wx, r, out.y, grad_y, Map.to_list(Map.merge(inputs, finals)))

      label = "#{cell} B#{b} T#{t} H#{h} optional=#{optional}"
      assert_matches_autodiff(cell, {wx, r, inputs}, grad_y, finals, grads, label)

      # grad_rh: grad_wx but for the GRU's n gate, which the reset scales.
      expected_rh =
        case cell do
          cell when cell in [:lstm, :slstm] ->
            grads.grad_wx

          :gru ->
            h0 = inputs[:h0] || Nx.broadcast(Nx.tensor(0.0, type: :f64), {b, h})
            earlier = for s <- 0..(t - 2)//1, do: Nx.slice_along_axis(out.y, s, 1, axis: 1)
            h_prev = Nx.concatenate([Nx.new_axis(h0, 1) | earlier], axis: 1)

            pre =
              h_prev
              |> Nx.dot([2], r, [0])
              |> then(&if(inputs[:bias], do: Nx.add(&1, inputs.bias), else: &1))

            reset =
              Nx.sigmoid(
                Nx.add(
                  Nx.slice_along_axis(wx, 0, h, axis: 2),
                  Nx.slice_along_axis(pre, 0, h, axis: 2)
                )
              )

            n_part = Nx.multiply(Nx.slice_along_axis(grads.grad_wx, 2 * h, h, axis: 2), reset)

            Nx.concatenate([Nx.slice_along_axis(grads.grad_wx, 0, 2 * h, axis: 2), n_part],
              axis: 2
            )
        end

      assert_close(grads.grad_rh, expected_rh, @f64, "#{label} grad_rh")
    end
  end

  # `grads`, backward/6's for forward/4 at `{wx, r, inputs}` with `grad_y`
  # and the final states' gradients `finals`, against Nx.Defn.grad of
  # <y, grad_y> + <h_final, grad_h_final> + ... over the finals given.
  defp assert_matches_autodiff(cell, {wx, r, inputs}, grad_y, finals, grads, label) do
    loss = fn {wx, r, inputs} ->
      o = GatedRnn.forward(cell, wx, r, Map.to_list(inputs))

      for {grad, w} <- finals,
          "grad_" <> name = Atom.to_string(grad),
          reduce: Nx.sum(Nx.multiply(o.y, grad_y)),
          do: (acc -> Nx.add(acc, Nx.sum(Nx.multiply(o[String.to_atom(name)], w))))
    end

    {d_wx, d_r, d_inputs} = Nx.Defn.grad({wx, r, inputs}, loss)
    assert_close(grads.grad_wx, d_wx, @f64, "#{label} grad_wx")
    assert_close(grads.grad_r, d_r, @f64, "#{label} grad_r")

    for {name, d} <- d_inputs,
        do: assert_close(grads[:"grad_#{name}"], d, @f64, "#{label} grad_#{name}")
  end

  defp types_kept(cell) do
    g = GatedRnn.gates(cell)
    [k1, k2, k3] = keys(5, 3)
    wx = random(k1, {2, 3, g * 4}, :bf16)
    r = random(k2, {4, g * 4}, :f32, 0.5)
    out = GatedRnn.forward(cell, wx, r)
    assert Nx.type(out.y) == {:bf, 16}
    # every final state
    assert Enum.sort(Map.keys(out) -- [:y]) ==
             Enum.sort(Enum.map(GatedRnn.states(cell), &:"#{&1}_final"))

    assert Enum.all?(Map.delete(out, :y), fn {_, t} -> Nx.type(t) == {:f, 32} end)
    grads = GatedRnn.backward(cell, wx, r, out.y, random(k3, {2, 3, 4}, :bf16))
    assert {Nx.type(grads.grad_wx), Nx.type(grads.grad_rh)} == {{:bf, 16}, {:bf, 16}}

    # grad_r, grad_bias and every initial state's gradient
    others = Map.drop(grads, [:grad_wx, :grad_rh])
    assert map_size(others) == 2 + length(GatedRnn.states(cell))
    assert Enum.all?(others, fn {_, t} -> Nx.type(t) == {:f, 32} end)
  end

  test "a recurrent weight of the wrong width is refused, naming it" do
    wx = Nx.broadcast(0.0, {1, 2, 12})

    assert_raise ArgumentError,
                 ~r/argument 'r': expected shape \{H, 4 \* H\}, got: \{4, 12\}/,
                 fn ->
                   GatedRnn.forward(:lstm, wx, Nx.broadcast(0.0, {4, 12}))
                 end
  end
end
