defmodule ExPhil.Native.FiniteDifferences do
  @moduledoc """
  Checks a reference backward against central finite differences of a
  scalar loss: every element of every named input, in double precision.
  """
  import ExUnit.Assertions

  @eps 1.0e-6

  @doc """
  `params` maps each name to a flat list of floats; `loss` takes such a map;
  `grads` maps `:"grad_\#{name}"` to the analytic gradient of each name.
  """
  def assert_matches(loss, params, grads, names) do
    bump = fn name, k, e ->
      Map.update!(params, name, &List.update_at(&1, k, fn x -> x + e end))
    end

    for name <- names, {analytic, k} <- Enum.with_index(grads[:"grad_#{name}"]) do
      numeric = (loss.(bump.(name, k, @eps)) - loss.(bump.(name, k, -@eps))) / (2 * @eps)

      assert abs(analytic - numeric) <= 1.0e-6 + 1.0e-5 * abs(numeric),
             "grad_#{name}[#{k}]: #{analytic}, finite differences #{numeric}"
    end
  end
end
