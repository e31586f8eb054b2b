defmodule ExPhil.Native.Stream do
  @moduledoc """
  A CUDA stream made by `ExPhil.Native.new_stream/1`, for the `:stream`
  option of the ops: calls on different streams need not wait for each
  other. Destroyed when garbage-collected, once the work queued on it is
  done.
  """

  @enforce_keys [:ref, :device]
  defstruct [:ref, :device]

  @type t :: %__MODULE__{ref: reference(), device: non_neg_integer()}
end
