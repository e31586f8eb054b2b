defmodule ExPhil.Native.Block do
  @moduledoc """
  The `Nx.block/4` tag of every `ExPhil.Native.Ops` call: which XLA FFI
  target computes the block, with which attribute values. The block's default
  function is the op's pure-Nx implementation; a compiler that knows this
  struct (EXLA on a CUDA client, through `ExPhil.Native.CustomCall`) runs the
  target instead.

    * `:target` - the custom-call target (`ExPhil.Native.Targets`)
    * `:attributes` - `%{name => value}` for the target's attributes: booleans
      for `i1`, integers for `i32`, floats for `f32`
    * `:eager` - whether the op was called on concrete tensors rather than
      inside `defn`. EXLA compiles an eager block as a wrapper whose operands
      and results are its own parameters and outputs, which XLA keeps
      row-major; inside a graph only a custom call that states its layouts is
      safe (see `ExPhil.Native.CustomCall`).
    * `:unsupported` - `nil`, or why the kernels cannot take these inputs
      (a dtype, a head width, a state size): the default function then runs
      everywhere.
  """

  @enforce_keys [:target, :attributes, :eager]
  defstruct [:target, :attributes, :eager, unsupported: nil]

  @type t :: %__MODULE__{
          target: String.t(),
          attributes: %{String.t() => boolean() | integer() | float()},
          eager: boolean(),
          unsupported: nil | String.t()
        }
end
