defmodule ExPhil.Native.GatedRnnStackTest do
  # The stacked ops: ExPhil.Native.Ops.gru_stack/4 and lstm_stack/4 (their
  # pure-Nx default functions here, on the binary backend) against the
  # stack composed by hand from the one-layer ops and Nx.dot, values and
  # gradients (inside defn, through the ops' custom_grad), and the
  # argument checks; on a GPU (tag :gpu) the NIF's gru_stack_forward /
  # _backward and lstm_stack_forward / _backward against
  # ExPhil.Native.Pure.GatedRnnStack in f64 on the same values.
  use ExUnit.Case, async: true

  alias ExPhil.Native
  alias ExPhil.Native.Ops
  alias ExPhil.Native.Pure.GatedRnnStack

  defp random(shape, seed, scale, type \\ :f32) do
    {t, _} = Nx.Random.uniform(Nx.Random.key(seed), -scale, scale, shape: shape, type: :f32)
    Nx.as_type(t, type)
  end

  # L layers of `cell` at {B, T, H}: the stacked tensors.
  defp problem(cell, {l, b, t, h}, type \\ :f32) do
    g = if cell == :gru, do: 3, else: 4
    s = 1.0 / :math.sqrt(h)

    %{
      wx: random({b, t, g * h}, 1, 1.5, type),
      r: random({l, h, g * h}, 2, 1.5 * s),
      w: random({l - 1, h, g * h}, 3, 1.5 * s),
      bias: random({l, g * h}, 4, 0.5),
      w_bias: random({l - 1, g * h}, 5, 0.5),
      h0: random({l, b, h}, 6, 1.0),
      c0: random({l, b, h}, 7, 1.0)
    }
  end

  defp options(cell, p), do: [bias: p.bias, w_bias: p.w_bias, h0: p.h0] ++ cell_state(cell, p.c0)

  # The LSTM's cell state as an option (`[c0: value]`), none for a GRU.
  defp cell_state(:gru, _value), do: []
  defp cell_state(:lstm, value), do: [c0: value]

  # The C++ suite's (test/support/tolerance.hpp, gated_rnn_tolerance).
  defp tolerance({:f, 32}), do: {5.0e-5, 5.0e-5}
  defp tolerance({:bf, 16}), do: {4.0e-2, 3.0e-2}

  defp stack_op(:gru), do: &Ops.gru_stack/4
  defp stack_op(:lstm), do: &Ops.lstm_stack/4

  defp nif_functions(:gru), do: {&Native.gru_stack_forward/4, &Native.gru_stack_backward/7}
  defp nif_functions(:lstm), do: {&Native.lstm_stack_forward/4, &Native.lstm_stack_backward/7}

  # The stack by hand: each layer the one-layer op, the projection Nx.dot.
  defp composed(cell, wx, r, w, bias, w_bias, h0, c0) do
    layers = elem(Nx.shape(r), 0)

    Enum.reduce(0..(layers - 1), {wx, []}, fn l, {input, finals} ->
      opts = [bias: bias[l], h0: h0[l], final_state: true] ++ cell_state(cell, c0 && c0[l])

      {y, states} =
        case cell do
          :gru ->
            {y, h} = Ops.gru(input, r[l], opts)
            {y, [h]}

          :lstm ->
            {y, h, c} = Ops.lstm(input, r[l], opts)
            {y, [h, c]}
        end

      next = if l + 1 < layers, do: Nx.add(Nx.dot(y, [2], w[l], [0]), w_bias[l]), else: y
      {next, finals ++ [states]}
    end)
  end

  for cell <- [:gru, :lstm] do
    test "#{cell}_stack: values and gradients are those of the layers composed by hand" do
      cell = unquote(cell)
      p = problem(cell, {3, 2, 4, 5})
      stack = stack_op(cell)

      {y, _} = composed(cell, p.wx, p.r, p.w, p.bias, p.w_bias, p.h0, p.c0)
      got = stack.(p.wx, p.r, p.w, options(cell, p))
      assert Nx.all_close(got, y, atol: 1.0e-5) |> Nx.to_number() == 1

      # With the final states, [L, B, H] each.
      [_y | states] =
        Tuple.to_list(stack.(p.wx, p.r, p.w, options(cell, p) ++ [final_state: true]))

      {_, finals} = composed(cell, p.wx, p.r, p.w, p.bias, p.w_bias, p.h0, p.c0)

      for {state, i} <- Enum.with_index(states) do
        want = finals |> Enum.map(&Enum.at(&1, i)) |> Nx.stack()
        assert Nx.all_close(state, want, atol: 1.0e-5) |> Nx.to_number() == 1
      end

      # Gradients of every input, through both.
      loss_stack = fn wx, r, w, bias, w_bias, h0, c0 ->
        opts = [bias: bias, w_bias: w_bias, h0: h0, final_state: true] ++ cell_state(cell, c0)
        [y | states] = Tuple.to_list(stack.(wx, r, w, opts))
        Enum.reduce(states, Nx.sum(Nx.multiply(y, y)), &Nx.add(Nx.sum(Nx.sin(&1)), &2))
      end

      loss_composed = fn wx, r, w, bias, w_bias, h0, c0 ->
        {y, finals} = composed(cell, wx, r, w, bias, w_bias, h0, c0)
        states = finals |> Enum.zip() |> Enum.map(&(&1 |> Tuple.to_list() |> Nx.stack()))
        Enum.reduce(states, Nx.sum(Nx.multiply(y, y)), &Nx.add(Nx.sum(Nx.sin(&1)), &2))
      end

      inputs = {p.wx, p.r, p.w, p.bias, p.w_bias, p.h0, p.c0}

      grads = fn loss ->
        Nx.Defn.jit(fn inputs ->
          Nx.Defn.grad(inputs, fn {wx, r, w, bias, w_bias, h0, c0} ->
            loss.(wx, r, w, bias, w_bias, h0, c0)
          end)
        end).(inputs)
      end

      got = grads.(loss_stack) |> Tuple.to_list()
      want = grads.(loss_composed) |> Tuple.to_list()
      # (A GRU has no c0: its gradient, last, is left out by the zip.)
      names = [:wx, :r, :w, :bias, :w_bias, :h0 | Keyword.keys(cell_state(cell, nil))]

      for {name, g, e} <- Enum.zip([names, got, want]) do
        assert Nx.all_close(g, e, atol: 1.0e-4, rtol: 1.0e-4) |> Nx.to_number() == 1,
               "grad #{name}: #{inspect(Nx.reduce_max(Nx.abs(Nx.subtract(g, e))))}"
      end
    end
  end

  test "the stacks' argument checks name the argument, the expected and the received" do
    p = problem(:gru, {2, 2, 3, 4})

    for {call, message} <- [
          {fn -> Ops.gru_stack(p.wx, p.r[0], p.w) end,
           "ExPhil.Native.Ops.gru_stack/4: argument 'r' expected rank 3"},
          {fn -> Ops.gru_stack(p.wx, Nx.concatenate(List.duplicate(p.r, 3)), p.w) end,
           "argument 'r' expected 2 to 4 layers"},
          {fn -> Ops.gru_stack(p.wx, p.r, p.r) end, "argument 'w' expected shape"},
          {fn -> Ops.gru_stack(p.wx, p.r, p.w, h0: p.h0[0]) end, "argument 'h0' expected shape"},
          {fn -> Ops.gru_stack(p.wx, p.r, p.w, c0: p.h0) end, "unknown options [:c0]"},
          {fn -> Ops.gru_stack(p.wx, p.r, p.w, final_state: 1) end,
           "option :final_state expected a boolean, got: 1"}
        ] do
      error = assert_raise ArgumentError, call
      assert error.message =~ message
    end
  end

  describe "on the GPU" do
    @describetag :gpu

    defp upload!(%Nx.Tensor{} = t) do
      {:ok, buffer} = Native.upload(Nx.to_binary(t), Nx.type(t), Nx.shape(t))
      buffer
    end

    defp download!(%Native.Buffer{type: type, shape: shape} = buffer) do
      {:ok, binary} = Native.download(buffer)
      binary |> Nx.from_binary(type) |> Nx.reshape(shape)
    end

    defp f64(t), do: Nx.as_type(t, :f64)

    # |got - want| <= atol * scale + rtol * |want|, scale the largest |want|
    # of the group (test/gpu/test_gated_rnn_stack.cpp's rule).
    defp assert_close(name, got, want, scale, {atol, rtol}) do
      bound = Nx.add(atol * max(scale, 1.0e-30), Nx.multiply(rtol, Nx.abs(want)))

      excess =
        Nx.subtract(Nx.abs(Nx.subtract(f64(got), want)), bound)
        |> Nx.reduce_max()
        |> Nx.to_number()

      assert excess <= 0, "#{name}: beyond the tolerance by #{excess}"
    end

    defp max_abs(t), do: t |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()

    for cell <- [:gru, :lstm],
        type <- [{:f, 32}, {:bf, 16}],
        dims <- [{2, 1, 32, 64}, {3, 3, 7, 37}] do
      test "#{cell}_stack #{inspect(type)} #{inspect(dims)}: the NIF's forward and backward against the pure stack" do
        cell = unquote(cell)
        type = unquote(type)
        tol = tolerance(type)
        p = problem(cell, unquote(Macro.escape(dims)), type)
        {forward, backward} = nif_functions(cell)

        buffers = Map.new(p, fn {k, v} -> {k, upload!(v)} end)
        opts = for {k, _} <- options(cell, p), do: {k, buffers[k]}
        {:ok, out} = forward.(buffers.wx, buffers.r, buffers.w, opts)

        ref = Map.new(p, fn {k, v} -> {k, f64(v)} end)
        want = GatedRnnStack.forward(cell, ref.wx, ref.r, ref.w, options(cell, ref))
        scale = Enum.max([max_abs(want.y), max_abs(want.y_lower), max_abs(want.h_final)])
        assert_close("y", download!(out.y), want.y, scale, tol)
        assert_close("y_lower", download!(out.y_lower), want.y_lower, scale, tol)
        assert_close("h_final", download!(out.h_final), want.h_final, scale, tol)

        # The backward from the kernels' y and y_lower.
        grad_y = random(Nx.shape(p.wx) |> put_elem(2, elem(Nx.shape(p.h0), 2)), 8, 1.0, type)
        y = download!(out.y)
        y_lower = download!(out.y_lower)

        {:ok, g} =
          backward.(
            buffers.wx,
            buffers.r,
            buffers.w,
            out.y,
            out.y_lower,
            upload!(grad_y),
            opts ++ [grad_h_final: upload!(random(Nx.shape(p.h0), 9, 1.0))]
          )

        want =
          GatedRnnStack.backward(
            cell,
            ref.wx,
            ref.r,
            ref.w,
            f64(y),
            f64(y_lower),
            f64(grad_y),
            options(cell, ref) ++ [grad_h_final: f64(random(Nx.shape(p.h0), 9, 1.0))]
          )

        gscale = Enum.max([max_abs(want.grad_wx), max_abs(want.grad_h0)])
        # Sums over batch and time: at their largest value too.
        for key <- [:grad_wx, :grad_h0 | for({s, _} <- cell_state(cell, nil), do: :"grad_#{s}")],
            do: assert_close("#{key}", download!(g[key]), want[key], gscale, tol)

        for key <- [:grad_r, :grad_w, :grad_bias, :grad_w_bias],
            do:
              assert_close(
                "#{key}",
                download!(g[key]),
                want[key],
                max(gscale, max_abs(want[key])),
                tol
              )
      end
    end
  end
end
