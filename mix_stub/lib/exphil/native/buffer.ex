defmodule ExPhil.Native.Buffer do
  @moduledoc """
  Device memory owned by the NIF: made by `ExPhil.Native.allocate/3`,
  `ExPhil.Native.upload/4`, `ExPhil.Native.import_ipc/4`, or returned by an
  op called without `:outputs`.

  The memory is freed by `ExPhil.Native.free/1` or when the last reference
  to the buffer is garbage-collected, and in either case not before work in
  flight that uses it has finished. A buffer can stand wherever a tensor is
  expected, with its own `:type` and `:shape`, or as the pointer of a
  `{buffer, type, shape}` view that fits in it.
  """

  @enforce_keys [:ref, :type, :shape, :device]
  defstruct [:ref, :type, :shape, :device]

  @type t :: %__MODULE__{
          ref: reference(),
          type: ExPhil.Native.type(),
          shape: tuple(),
          device: non_neg_integer()
        }
end
