defmodule ExPhil.Native.DescribedTensors do
  @moduledoc false
  # Fake device tensors for a description's slots (ExPhil.Native.OpDescriptions),
  # for the tests that call the NIF as a row describes it without a GPU: the
  # NIF checks them, and fails only where it needs the device.

  # Extents for the dimensions the rows name: distinct where they may
  # differ, and what the kernels take (head width 32, Hq a multiple of Hkv,
  # K = L - 1).
  @extents %{
    "B" => 2,
    "T" => 5,
    "H" => 4,
    "D" => 3,
    "N" => 4,
    "Hq" => 2,
    "Hkv" => 1,
    "S" => 6,
    "d" => 32,
    # The stacks' layers, and the layers above the first (L - 1).
    "L" => 3,
    "K" => 2
  }

  @doc """
  The extent the tests give dimension `name`; "3H" (a multiple of a named
  dimension: the GRU's gates side by side) is 3 times H's.
  """
  def extent(name) do
    case Integer.parse(name) do
      {factor, dimension} when dimension != "" -> factor * Map.fetch!(@extents, dimension)
      _ -> Map.fetch!(@extents, name)
    end
  end

  @doc """
  A fake f32 device tensor of `slot`'s shape at a distinct address per
  `index`; `swap_middle: true` swaps the middle dimensions of a 4-D one
  (attention's layout :bthd, where the rows give bhtd).
  """
  def fake(%{dims: dims}, index, opts \\ []) do
    shape = Enum.map(dims, &extent/1)

    shape =
      case {shape, Keyword.get(opts, :swap_middle, false)} do
        {[b, x, y, d], true} -> [b, y, x, d]
        _ -> shape
      end

    bytes = Enum.product(shape) * 4

    {%{kind: :local, address: (index + 1) * 1_048_576, data_size: bytes}, {:f, 32},
     List.to_tuple(shape)}
  end
end
