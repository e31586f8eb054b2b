defmodule ExPhil.Native.LoadTest do
  use ExUnit.Case, async: true

  test "the NIF library is loaded, GPU or not" do
    assert ExPhil.Native.load_error() == nil
    assert is_integer(ExPhil.Native.device_count())
  end

  test "every public function is the NIF's, with the documented arities" do
    for {name, arity} <- [
          device_count: 0,
          device_info: 1,
          memory_held: 1,
          synchronize: 0,
          synchronize: 1,
          await: 1,
          allocate: 3,
          upload: 4,
          download: 1,
          free: 1,
          pointer: 1,
          export_ipc: 1,
          import_ipc: 4,
          open_ipc_handles: 0,
          allocation_offset: 1,
          linear_scan_forward: 3,
          linear_scan_backward: 5,
          min_gru_forward: 3,
          min_gru_backward: 5,
          min_lstm_forward: 4,
          min_lstm_backward: 6,
          liquid_forward: 3,
          liquid_backward: 5,
          selective_scan_forward: 6,
          selective_scan_backward: 7,
          attention_forward: 4,
          attention_backward: 7,
          register_xla_ffi: 2
        ] do
      assert function_exported?(ExPhil.Native, name, arity), "#{name}/#{arity}"
      assert function_exported?(ExPhil.Native, :"nif_#{name}", arity), "nif_#{name}/#{arity}"
    end
  end

  test "a missing library is reported with its reason" do
    message =
      Exception.message(%ExPhil.Native.LoadError{reason: {:error, {:load_failed, ~c"nope"}}})

    assert message =~ "failed to load"
    assert message =~ "load_failed"
  end
end
