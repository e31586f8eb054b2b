defmodule ExPhil.Native.XlaRegistration do
  @moduledoc """
  Registers the library's XLA FFI handlers with the XLA runtime that EXLA
  loaded, once per VM, before the first compilation that emits one of their
  targets. `ExPhil.Native.CustomCall` calls `ensure_registered/0` while EXLA
  lowers a block, so users do nothing.

  The handler library is `libexphil_xla_ffi.so` in this application's
  `priv/` (built by `mix compile` where XLA's FFI headers are found: EXLA's
  own `xla_extension/include`, or JAX's); the XLA runtime is EXLA's
  `priv/xla_extension/lib/libxla_extension.so`, which EXLA's NIF has loaded.
  Both can be set instead:

      config :exphil_native,
        xla_ffi_library: "/path/to/libexphil_xla_ffi.so",
        xla_library: "/path/to/libxla_extension.so"

  A failure is logged once as a warning, and the ops then run their pure-Nx
  default functions under EXLA: slower, never wrong.
  """

  require Logger

  @key {__MODULE__, :result}

  @doc """
  `:ok` once the handlers are registered in this VM, or
  `{:error, reason}` (the same every time: registration is tried once).
  """
  @spec ensure_registered() :: :ok | {:error, term()}
  def ensure_registered do
    case :persistent_term.get(@key, nil) do
      nil -> :global.trans({__MODULE__, self()}, &register_once/0, [node()])
      result -> result
    end
  end

  # Under the lock: another process may have registered meanwhile.
  defp register_once do
    case :persistent_term.get(@key, nil) do
      nil ->
        result = register(handler_library(), xla_library())

        with {:error, reason} <- result do
          Logger.warning(
            "ExPhil.Native: the XLA FFI handlers could not be registered with EXLA's XLA " <>
              "(#{format(reason)}); ExPhil.Native ops run their pure-Nx default functions under EXLA"
          )
        end

        :persistent_term.put(@key, result)
        result

      result ->
        result
    end
  end

  @doc false
  # Forgets the result, so that the next ensure_registered/0 tries again
  # (for tests).
  def forget, do: :persistent_term.erase(@key)

  @doc false
  # The registration itself, without the once-per-VM memory (for tests).
  def register(handler_library, xla_library) do
    cond do
      handler_library == nil or not File.regular?(handler_library) ->
        {:error, {:no_handler_library, handler_library}}

      true ->
        try do
          ExPhil.Native.register_xla_ffi(handler_library, xla_library)
        rescue
          error in ExPhil.Native.LoadError -> {:error, {:nif_not_loaded, error.reason}}
        end
    end
  end

  defp handler_library do
    Application.get_env(:exphil_native, :xla_ffi_library) ||
      with dir when is_list(dir) <- :code.priv_dir(:exphil_native) do
        Path.join(dir, "libexphil_xla_ffi.so")
      else
        _ -> nil
      end
  end

  # EXLA's runtime by its path under EXLA's priv/, or else by its name, which
  # the handler library looks up among the libraries already loaded.
  defp xla_library do
    Application.get_env(:exphil_native, :xla_library) ||
      with dir when is_list(dir) <- :code.priv_dir(:exla),
           path = Path.join(dir, "xla_extension/lib/libxla_extension.so"),
           true <- File.regular?(path) do
        path
      else
        _ -> "libxla_extension.so"
      end
  end

  defp format({:no_handler_library, nil}),
    do: "no libexphil_xla_ffi.so: the application has no priv directory"

  defp format({:no_handler_library, path}),
    do: "#{path} does not exist: XLA's FFI headers were not found when it was built"

  defp format({:xla_ffi_registration, message}), do: message
  defp format(reason), do: inspect(reason)
end
