defmodule ExPhil.Native.XlaFfiTest do
  # register_xla_ffi/2. Registering into a live XLA runtime needs EXLA, which
  # this project cannot have on its machines (README); what is tested here is
  # every way it refuses, with the real handler library where it was built
  # (tag :xla_ffi, excluded otherwise), and without it.
  use ExUnit.Case, async: true

  alias ExPhil.Native

  # The NIF itself: a library that is loaded in this VM and is neither the
  # handler library nor an XLA runtime.
  defp nif_path, do: Path.join(:code.priv_dir(:exphil_native), "libexphil_nif.so")

  test "paths must be non-empty strings without NUL bytes" do
    assert_raise ArgumentError, ~r/argument 'handler_library': expected a non-empty path/, fn ->
      Native.register_xla_ffi(:nope, "libxla_extension.so")
    end

    assert_raise ArgumentError, ~r/argument 'xla_library'/, fn ->
      Native.register_xla_ffi("libexphil_xla_ffi.so", "")
    end

    assert_raise ArgumentError, ~r/argument 'xla_library'/, fn ->
      Native.register_xla_ffi("libexphil_xla_ffi.so", "lib\0xla.so")
    end
  end

  test "a handler library that cannot be opened is named, with the loader's reason" do
    assert {:error, {:xla_ffi_registration, message}} =
             Native.register_xla_ffi("/nonexistent/libexphil_xla_ffi.so", "libxla_extension.so")

    assert message =~ "cannot open the handler library /nonexistent/libexphil_xla_ffi.so: "
    assert message =~ "No such file"
  end

  test "a library that is not the handler library is refused" do
    assert {:error, {:xla_ffi_registration, message}} =
             Native.register_xla_ffi(nif_path(), "libxla_extension.so")

    assert message =~ "does not define exphil_xla_ffi_register"
  end

  describe "with libexphil_xla_ffi.so" do
    @describetag :xla_ffi

    setup do
      {:ok, handlers: ExPhil.Native.XlaFfiLibrary.path()}
    end

    test "an XLA library not loaded in this VM is an error, and nothing is loaded",
         %{handlers: handlers} do
      missing = "/nonexistent/libxla_extension.so"

      assert {:error, {:xla_ffi_registration, message}} =
               Native.register_xla_ffi(handlers, missing)

      assert message =~ "#{missing} is not loaded in this process"
    end

    test "a loaded library without XLA's FFI API is refused by name", %{handlers: handlers} do
      assert {:error, {:xla_ffi_registration, message}} =
               Native.register_xla_ffi(handlers, nif_path())

      assert message =~ nif_path()
      assert message =~ "GetXlaFfiApi"
    end
  end
end
