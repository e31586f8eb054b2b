# This project exists to run the Torchx tests: without Torchx on CUDA, or
# without the NIF, that is a failure, not an exclusion.
unless Torchx.device_available?(:cuda), do: raise("Torchx sees no CUDA device")

if reason = ExPhil.Native.load_error(),
  do: raise("ExPhil.Native NIF not loaded: #{inspect(reason)}")

IO.puts(
  "Torchx on CUDA (#{Torchx.device_count(:cuda)} devices); ExPhil.Native sees " <>
    "#{ExPhil.Native.device_count()}: #{inspect(ExPhil.Native.device_info(0))}"
)

# As the library's own helper does without libexphil_xla_ffi.so (not built
# here).
ExUnit.start(exclude: [:xla_ffi])
