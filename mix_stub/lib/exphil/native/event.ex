defmodule ExPhil.Native.Event do
  @moduledoc """
  Work in flight from an op called with `sync: false`. `ExPhil.Native.await/1`
  waits for it and returns the op's outputs; until then the call's
  arguments and outputs stay alive. An event dropped without `await/1`
  waits for its work when it is garbage-collected.
  """

  @enforce_keys [:ref]
  defstruct [:ref]

  @type t :: %__MODULE__{ref: reference()}
end
