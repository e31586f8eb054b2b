defmodule ExPhil.Native.Pure.GatedRnnTest do
  # The pure-Nx GRU and LSTM sequences (BinaryBackend): the forward against
  # Axon's own gru_cell and lstm_cell stepped over the sequence, with Axon's
  # parameters mapped onto wx, r and bias as the module doc says; the
  # backward against Nx's autodiff of the forward; the types of the outputs.
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

    test "#{cell}: backward/6 equals Nx.Defn.grad of forward/4 (f64)",
      do: backward_matches_autodiff(unquote(cell))

    test "#{cell}: a 16-bit sequence keeps its type; states and weights' gradients are f32",
      do: types_kept(unquote(cell))
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

      inputs =
        if optional,
          do: %{
            bias: random(k4, {g * h}, :f64, 0.5),
            h0: random(k5, {b, h}, :f64),
            c0: random(k6, {b, h}, :f64)
          },
          else: %{}

      finals =
        if optional,
          do: %{grad_h_final: random(k7, {b, h}, :f64), grad_c_final: random(k8, {b, h}, :f64)},
          else: %{}

      inputs = if cell == :gru, do: Map.delete(inputs, :c0), else: inputs
      finals = if cell == :gru, do: Map.delete(finals, :grad_c_final), else: finals

      out = GatedRnn.forward(cell, wx, r, Map.to_list(inputs))

      grads =
        GatedRnn.backward(cell, wx, r, out.y, grad_y, Map.to_list(Map.merge(inputs, finals)))

      # <y, grad_y> + <h_final, grad_h_final> (+ <c_final, grad_c_final>).
      loss = fn {wx, r, inputs} ->
        o = GatedRnn.forward(cell, wx, r, Map.to_list(inputs))

        [{:y, :grad_y}, {:h_final, :grad_h_final}, {:c_final, :grad_c_final}]
        |> Enum.filter(fn {_out, grad} -> grad == :grad_y or Map.has_key?(finals, grad) end)
        |> Enum.map(fn {name, grad} ->
          Nx.sum(Nx.multiply(o[name], if(grad == :grad_y, do: grad_y, else: finals[grad])))
        end)
        |> Enum.reduce(&Nx.add/2)
      end

      {d_wx, d_r, d_inputs} = Nx.Defn.grad({wx, r, inputs}, loss)
      label = "#{cell} B#{b} T#{t} H#{h} optional=#{optional}"
      assert_close(grads.grad_wx, d_wx, @f64, "#{label} grad_wx")
      assert_close(grads.grad_r, d_r, @f64, "#{label} grad_r")

      for {name, grad} <- [bias: :grad_bias, h0: :grad_h0, c0: :grad_c0],
          Map.has_key?(d_inputs, name),
          do: assert_close(grads[grad], d_inputs[name], @f64, "#{label} #{grad}")

      # grad_rh: grad_wx but for the GRU's n gate, which the reset scales.
      expected_rh =
        case cell do
          :lstm ->
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

  defp types_kept(cell) do
    g = GatedRnn.gates(cell)
    [k1, k2, k3] = keys(5, 3)
    wx = random(k1, {2, 3, g * 4}, :bf16)
    r = random(k2, {4, g * 4}, :f32, 0.5)
    out = GatedRnn.forward(cell, wx, r)
    assert Nx.type(out.y) == {:bf, 16}
    assert Nx.type(out.h_final) == {:f, 32}
    grads = GatedRnn.backward(cell, wx, r, out.y, random(k3, {2, 3, 4}, :bf16))
    assert {Nx.type(grads.grad_wx), Nx.type(grads.grad_rh)} == {{:bf, 16}, {:bf, 16}}

    assert {Nx.type(grads.grad_r), Nx.type(grads.grad_bias), Nx.type(grads.grad_h0)} ==
             {{:f, 32}, {:f, 32}, {:f, 32}}
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
