defmodule ExPhil.Native.XlaRegistrationTest do
  # Registration without user action: where the libraries are looked for,
  # every way it fails (each an error value and one warning, never a raise),
  # and that it is tried once per VM. A successful registration needs a live
  # EXLA, which these machines cannot have (README).
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias ExPhil.Native.XlaRegistration

  defp nif_path, do: Path.join(:code.priv_dir(:exphil_native), "libexphil_nif.so")

  setup do
    on_exit(fn ->
      Application.delete_env(:exphil_native, :xla_ffi_library)
      Application.delete_env(:exphil_native, :xla_library)
      XlaRegistration.forget()
    end)
  end

  test "a missing handler library is named" do
    assert XlaRegistration.register("/nonexistent/libexphil_xla_ffi.so", "libxla_extension.so") ==
             {:error, {:no_handler_library, "/nonexistent/libexphil_xla_ffi.so"}}
  end

  test "a library that is not the handler library is refused" do
    assert {:error, {:xla_ffi_registration, message}} =
             XlaRegistration.register(nif_path(), "libxla_extension.so")

    assert message =~ "does not define exphil_xla_ffi_register"
  end

  @tag :xla_ffi
  test "an XLA runtime that this VM has not loaded is refused" do
    handlers = ExPhil.Native.XlaFfiLibrary.path()

    assert {:error, {:xla_ffi_registration, message}} =
             XlaRegistration.register(handlers, "/nonexistent/libxla_extension.so")

    assert message =~ "is not loaded in this process"
  end

  test "configured paths are used; a failure is one warning, and the result is kept" do
    Application.put_env(:exphil_native, :xla_ffi_library, nif_path())
    Application.put_env(:exphil_native, :xla_library, "libxla_extension.so")
    XlaRegistration.forget()

    log =
      capture_log(fn ->
        results = Enum.map(1..3, fn _ -> XlaRegistration.ensure_registered() end)
        assert [{:error, {:xla_ffi_registration, message}} | _] = results
        assert Enum.uniq(results) == [hd(results)]
        assert message =~ "does not define exphil_xla_ffi_register"
      end)

    assert length(String.split(log, "could not be registered")) == 2, log
    assert log =~ "does not define exphil_xla_ffi_register"
  end

  test "concurrent first uses register once" do
    Application.put_env(:exphil_native, :xla_ffi_library, "/nonexistent/libexphil_xla_ffi.so")
    XlaRegistration.forget()

    log =
      capture_log(fn ->
        results =
          1..16
          |> Enum.map(fn _ -> Task.async(&XlaRegistration.ensure_registered/0) end)
          |> Enum.map(&Task.await/1)

        assert Enum.uniq(results) == [
                 {:error, {:no_handler_library, "/nonexistent/libexphil_xla_ffi.so"}}
               ]
      end)

    assert length(String.split(log, "could not be registered")) == 2, log
    assert log =~ "/nonexistent/libexphil_xla_ffi.so does not exist"
  end
end
