defmodule ExPhil.Native.HostTransfers do
  @moduledoc false
  # Counts the Torchx calls that move tensor data out of or into a device:
  # every way Torchx.Backend copies a tensor to the host (to_binary,
  # backend_copy/transfer to another backend, to_number and the slices that
  # read a start index: Torchx.to_blob, Torchx.item), from the host
  # (from_binary, Nx.tensor of a list or number: Torchx.from_blob) or to
  # another device (Torchx.to_device). The native path must make none.
  #
  # Erlang's call-count tracing (:erlang.trace_pattern/3 with :call_count)
  # counts calls of a function in every process, with no tracer process and
  # no change to the code counted; the counters are global, so the tests
  # that use this are not async.

  @functions [
    {Torchx, :to_blob, 1},
    {Torchx, :to_blob, 2},
    {Torchx, :item, 1},
    {Torchx, :from_blob, 4},
    {Torchx, :to_device, 2}
  ]

  @doc "The functions counted, as {module, function, arity}."
  def functions, do: @functions

  @doc """
  Runs `fun` and returns `{result, transfers}`: the functions of
  `functions/0` called while it ran, each with its number of calls (each
  call a tensor moved to or from the host or between devices); `%{}` when
  none was.
  """
  def count(fun) when is_function(fun, 0) do
    for {module, _, _} = mfa <- @functions do
      Code.ensure_loaded!(module)
      # 0: the function does not exist, a silent count of nothing
      if :erlang.trace_pattern(mfa, true, [:call_count]) != 1,
        do: raise("cannot count calls of #{inspect(mfa)}: no such function")
    end

    before = counts()

    try do
      result = fun.()

      transfers =
        for {mfa, n} <- counts(), n > before[mfa], into: %{}, do: {mfa, n - before[mfa]}

      {result, transfers}
    after
      for mfa <- @functions, do: :erlang.trace_pattern(mfa, false, [:call_count])
    end
  end

  defp counts do
    Map.new(@functions, fn mfa ->
      {:call_count, n} = :erlang.trace_info(mfa, :call_count)
      {mfa, n}
    end)
  end
end
