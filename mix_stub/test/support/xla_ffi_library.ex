defmodule ExPhil.Native.XlaFfiLibrary do
  @moduledoc false
  # Where the tests find libexphil_xla_ffi.so: $EXPHIL_XLA_FFI_LIB, else the
  # CMake build the NIF was built in ($EXPHIL_BUILD_DIR, else mix.exs's
  # default). nil where it was not built (no XLA FFI headers, as in CI).

  @relative "c_src/xla_ffi/libexphil_xla_ffi.so"

  def path do
    build = System.get_env("EXPHIL_BUILD_DIR") || Path.expand("../../../build", __DIR__)

    [System.get_env("EXPHIL_XLA_FFI_LIB"), Path.join(build, @relative)]
    |> Enum.find(&(&1 && File.regular?(&1)))
  end
end
