defmodule ExPhil.Native.ReferenceTest do
  # The Elixir reference that the GPU tests trust: its backward against
  # central finite differences of its forward, for every op.
  use ExUnit.Case, async: true
  alias ExPhil.Native.Reference

  defp loss(op, inputs, dims, h0, w_y, w_f) do
    {y, h_final} = Reference.forward(op, inputs, dims, h0)
    dot = fn a, b -> Enum.zip(a, b) |> Enum.map(fn {x, y} -> x * y end) |> Enum.sum() end
    dot.(y, w_y) + dot.(h_final, w_f)
  end

  defp bump(list, i, eps), do: List.update_at(list, i, &(&1 + eps))

  for op <- [:linear_scan, :min_gru, :min_lstm, :liquid] do
    test "#{op} backward matches finite differences" do
      op = unquote(op)
      dims = {2, 4, 3}
      n = 24
      inputs = Reference.random_inputs(op, n)
      h0 = Reference.random(6, -1.0, 1.0)
      w_y = Reference.random(n, -1.0, 1.0)
      w_f = Reference.random(6, -1.0, 1.0)
      {grads, grad_h0} = Reference.backward(op, inputs, dims, h0, w_y, w_f)
      eps = 1.0e-6

      numeric = fn f -> (f.(eps) - f.(-eps)) / (2 * eps) end
      close = fn a, b -> abs(a - b) <= 1.0e-6 + 1.0e-5 * abs(b) end

      for {input, k} <- Enum.with_index(inputs), i <- 0..(n - 1) do
        fd =
          numeric.(fn e ->
            loss(op, List.replace_at(inputs, k, bump(input, i, e)), dims, h0, w_y, w_f)
          end)

        assert close.(Enum.at(Enum.at(grads, k), i), fd), "#{op} input #{k} element #{i}"
      end

      for i <- 0..5 do
        fd = numeric.(fn e -> loss(op, inputs, dims, bump(h0, i, e), w_y, w_f) end)
        assert close.(Enum.at(grad_h0, i), fd), "#{op} h0 element #{i}"
      end
    end
  end
end
