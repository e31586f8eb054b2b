# GPU tests carry the tag :gpu. Without a usable device they are excluded,
# and ExUnit reports them as excluded (neither failed nor passed).
case ExPhil.Native.device_count() do
  count when is_integer(count) and count > 0 ->
    ExUnit.start()

  other ->
    reason =
      case ExPhil.Native.device_info(0) do
        {:error, reason} -> inspect(reason)
        _ -> inspect(other)
      end

    IO.puts("ExPhil.Native: no usable CUDA device (#{reason}); tests tagged :gpu are excluded")
    ExUnit.start(exclude: [:gpu])
end

# Tests tagged :xla_ffi need libexphil_xla_ffi.so, which is built only where
# XLA's FFI headers are found; without it they are excluded, and reported so.
if ExPhil.Native.XlaFfiLibrary.path() == nil do
  IO.puts(
    "ExPhil.Native: libexphil_xla_ffi.so not built (no XLA FFI headers); tests tagged :xla_ffi are excluded"
  )

  ExUnit.configure(exclude: Keyword.get(ExUnit.configuration(), :exclude, []) ++ [:xla_ffi])
end

# Tests tagged :torchx need Torchx (not a dependency of this project: the
# project in scripts/torchx_project adds it) with a CUDA device; without
# them they are excluded, and reported so.
torchx_cuda? =
  Code.ensure_loaded?(Torchx.Backend) and
    apply(Torchx, :device_available?, [:cuda]) and ExPhil.Native.load_error() == nil

unless torchx_cuda? do
  IO.puts(
    "ExPhil.Native: Torchx with a CUDA device not loaded; tests tagged :torchx are excluded"
  )

  ExUnit.configure(exclude: Keyword.get(ExUnit.configuration(), :exclude, []) ++ [:torchx])
end
