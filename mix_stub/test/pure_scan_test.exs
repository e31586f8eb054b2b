defmodule ExPhil.Native.Pure.ScanTest do
  # The pure-Nx scans (BinaryBackend) against the double-precision Elixir
  # reference on the same rounded values, against Nx's own autodiff of the
  # pure forward, and traced inside Nx.Defn.jit.
  use ExUnit.Case, async: true
  alias ExPhil.Native.Pure.Scan
  alias ExPhil.Native.Reference

  @ops [:linear_scan, :min_gru, :min_lstm, :liquid]

  # {B, T, H}: a single step, two steps (one scan pass), and an odd T that
  # leaves a ragged last pass (37 = 32 + 5, six passes); odd H, B of 1 and 2.
  @dims [{1, 1, 3}, {2, 2, 5}, {2, 37, 3}]

  # Each element passes when |got - ref| <= atol * scale + rtol * |ref|,
  # scale being the largest magnitude of its family (states y and h_final,
  # or all gradients), as Reference.error_ratio/5 measures it.
  #
  # f32 values: f32 arithmetic against double. The scan rounds each state
  # about log2(T) times, and the sigmoids, exp and divisions a few ulps
  # (2^-24 each): the worst error seen is about 1% of 1e-5, which still
  # catches any wrong term, shift or missing state.
  @f32 {1.0e-5, 1.0e-5}
  # Sequence outputs (y and the input gradients) of a 16-bit run are also
  # rounded to the inputs' type, and the backward reads h_{t-1} from that
  # rounded y, whose error (one rounding of |h|) reaches every gradient
  # through dh_t * h_{t-1}, bounded by the gradients' scale. bf16 keeps 8
  # significant bits and the BinaryBackend's as_type to bf16 truncates
  # (Nx.Shared writes the top half of the f32): up to one ulp, 2^-7 of |x|.
  # f16 keeps 11 bits, rounded to nearest: half an ulp, 2^-11 of |x|.
  @sequence %{f32: @f32, bf16: {2.0 ** -7, 2.0 ** -7}, f16: {2.0 ** -11, 2.0 ** -11}}

  test "input_count/1 gives each op's number of inputs" do
    assert Enum.map(@ops, &Scan.input_count/1) == [2, 2, 3, 2]
    assert Enum.map(@ops, &length(Reference.input_names(&1))) == [2, 2, 3, 2]
  end

  test "a wrong number of inputs is refused" do
    x = Nx.broadcast(Nx.tensor(0.5, type: :f32), {1, 2, 3})

    assert_raise ArgumentError, ~r/min_lstm takes 3 inputs, got 2/, fn ->
      Scan.forward(:min_lstm, [x, x], nil)
    end
  end

  for op <- @ops, type <- [:f32, :bf16, :f16] do
    test "#{op} #{type}: forward and backward match the reference" do
      for dims <- @dims, with_h0 <- [false, true], with_grad_final <- [false, true] do
        check_against_reference(unquote(op), unquote(type), dims, with_h0, with_grad_final)
      end
    end
  end

  for op <- @ops do
    test "#{op}: backward/6 equals Nx.Defn.grad of forward/3 (f32)" do
      op = unquote(op)

      for dims <- [{1, 1, 3}, {2, 37, 5}], with_grad_final <- [false, true] do
        p = problem(op, :f32, dims, true, with_grad_final)
        {y, _h_final} = Scan.forward(op, p.inputs, p.h0)
        expected = Tuple.to_list(Scan.backward(op, p.inputs, p.h0, y, p.grad_y, p.grad_h_final))

        # The loss whose gradient is backward's: <y, grad_y> + <h_final, grad_h_final>.
        loss = fn {inputs, h0} ->
          {y, h_final} = Scan.forward(op, Tuple.to_list(inputs), h0)
          y_term = Nx.sum(Nx.multiply(y, p.grad_y))

          if p.grad_h_final,
            do: Nx.add(y_term, Nx.sum(Nx.multiply(h_final, p.grad_h_final))),
            else: y_term
        end

        {grad_inputs, grad_h0} = Nx.Defn.grad({List.to_tuple(p.inputs), p.h0}, loss)
        autodiff = Tuple.to_list(grad_inputs) ++ [grad_h0]

        scale = Reference.scale(Enum.map(autodiff, &Nx.to_flat_list/1))

        for {got, want, name} <-
              Enum.zip([expected, autodiff, Reference.grad_names(op) ++ [:grad_h0]]) do
          assert_close(got, Nx.to_flat_list(want), scale, @f32, "#{op} #{inspect(dims)} #{name}")
        end
      end
    end
  end

  for op <- @ops, type <- [:f32, :bf16] do
    test "#{op} #{type}: runs traced inside Nx.Defn.jit, with the values it gives outside" do
      op = unquote(op)
      type = unquote(type)

      for with_states <- [false, true] do
        p = problem(op, type, {2, 37, 3}, with_states, with_states)
        {y, _h_final} = Scan.forward(op, p.inputs, p.h0)

        # An absent state is no key at all, as nil is not a tensor argument.
        args =
          %{
            inputs: List.to_tuple(p.inputs),
            y: y,
            grad_y: p.grad_y,
            h0: p.h0,
            grad_h_final: p.grad_h_final
          }
          |> Map.reject(fn {_key, value} -> is_nil(value) end)

        run = fn args ->
          inputs = Tuple.to_list(args.inputs)
          {y, h_final} = Scan.forward(op, inputs, args[:h0])
          grads = Scan.backward(op, inputs, args[:h0], args.y, args.grad_y, args[:grad_h_final])
          List.to_tuple([y, h_final | Tuple.to_list(grads)])
        end

        traced = Tuple.to_list(Nx.Defn.jit(run).(args))
        expressions = Tuple.to_list(Nx.Defn.debug_expr(run).(args))
        assert Enum.all?(expressions, &match?(%Nx.Tensor{data: %Nx.Defn.Expr{}}, &1))

        # Not bit for bit: the expression builder rewrites x * (1 / s) as
        # x / s (min_lstm, liquid), which rounds differently in f32, and
        # a bf16 output truncated from it can then move by one ulp.
        for {got, want} <- Enum.zip(traced, Tuple.to_list(run.(args))) do
          assert {Nx.type(got), Nx.shape(got)} == {Nx.type(want), Nx.shape(want)}
          tolerance = if Nx.type(want) == {:f, 32}, do: @f32, else: @sequence[type]
          want = Nx.to_flat_list(want)
          assert_close(got, want, Reference.scale([want]), tolerance, "#{op} #{type} traced")
        end
      end
    end
  end

  defp check_against_reference(op, type, {b, t, h} = dims, with_h0, with_grad_final) do
    p = problem(op, type, dims, with_h0, with_grad_final)
    label = "#{op} #{type} #{inspect(dims)} h0: #{with_h0}, grad_h_final: #{with_grad_final}"
    sequence_type = Nx.Type.normalize!(type)

    {y, h_final} = Scan.forward(op, p.inputs, p.h0)
    assert {Nx.type(y), Nx.shape(y)} == {sequence_type, {b, t, h}}, label
    assert {Nx.type(h_final), Nx.shape(h_final)} == {{:f, 32}, {b, h}}, label

    {ref_y, ref_h_final} = Reference.forward(op, p.values, dims, p.h0_values)
    state_scale = Reference.scale([ref_y, ref_h_final])
    assert_close(y, ref_y, state_scale, @sequence[type], "#{label} y")
    assert_close(h_final, ref_h_final, state_scale, @f32, "#{label} h_final")

    grads = Tuple.to_list(Scan.backward(op, p.inputs, p.h0, y, p.grad_y, p.grad_h_final))
    assert length(grads) == Scan.input_count(op) + 1, label
    {grad_inputs, [grad_h0]} = Enum.split(grads, -1)

    {ref_grads, ref_grad_h0} =
      Reference.backward(op, p.values, dims, p.h0_values, p.grad_y_values, p.grad_h_final_values)

    grad_scale = Reference.scale([ref_grad_h0 | ref_grads])

    for {got, ref, name} <- Enum.zip([grad_inputs, ref_grads, Reference.grad_names(op)]) do
      assert {Nx.type(got), Nx.shape(got)} == {sequence_type, {b, t, h}}, "#{label} #{name}"
      assert_close(got, ref, grad_scale, @sequence[type], "#{label} #{name}")
    end

    # grad_h0 = a_1 dh_1 depends on no rounded y: f32's tolerance.
    assert {Nx.type(grad_h0), Nx.shape(grad_h0)} == {{:f, 32}, {b, h}}, label
    assert_close(grad_h0, ref_grad_h0, grad_scale, @f32, "#{label} grad_h0")
  end

  # Random inputs, h0, grad_y and grad_h_final of `op` at `dims` as tensors
  # (the sequences in `type`, the states f32; absent ones nil), with the
  # values they hold as flat lists for the reference.
  defp problem(op, type, {b, t, h}, with_h0, with_grad_final) do
    count = b * t * h
    sequences = Enum.map(Reference.random_inputs(op, count), &rounded(&1, type, {b, t, h}))
    grad_y = rounded(Reference.random(count, -1.0, 1.0), type, {b, t, h})

    h0 =
      if with_h0, do: rounded(Reference.random(b * h, -1.0, 1.0), :f32, {b, h}), else: {nil, nil}

    grad_final =
      if with_grad_final,
        do: rounded(Reference.random(b * h, -1.0, 1.0), :f32, {b, h}),
        else: {nil, nil}

    %{
      inputs: Enum.map(sequences, &elem(&1, 0)),
      values: Enum.map(sequences, &elem(&1, 1)),
      h0: elem(h0, 0),
      h0_values: elem(h0, 1),
      grad_y: elem(grad_y, 0),
      grad_y_values: elem(grad_y, 1),
      grad_h_final: elem(grad_final, 0),
      grad_h_final_values: elem(grad_final, 1)
    }
  end

  # {tensor of `type` holding `values` rounded, the values it holds}.
  defp rounded(values, :f32, shape) do
    {values |> Reference.encode_f32() |> Nx.from_binary(:f32) |> Nx.reshape(shape),
     Reference.to_f32(values)}
  end

  defp rounded(values, :bf16, shape) do
    {held, binary} = Reference.to_bf16(values)
    {binary |> Nx.from_binary(:bf16) |> Nx.reshape(shape), held}
  end

  defp rounded(values, :f16, shape) do
    tensor = values |> Nx.tensor(type: :f16) |> Nx.reshape(shape)
    {tensor, Nx.to_flat_list(tensor)}
  end

  defp assert_close(got, ref, scale, {atol, rtol}, label) do
    got = Nx.to_flat_list(got)
    assert length(got) == length(ref), label
    ratio = Reference.error_ratio(got, ref, scale, atol, rtol)
    assert ratio <= 1.0, "#{label}: worst error #{Float.round(ratio, 3)} times the tolerance"
  end
end
