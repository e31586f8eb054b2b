defmodule ExPhil.Native.OpOptionValuesTest do
  # The values the NIF takes for the op options it spells as the
  # descriptions do (include/exphil/op_descriptions.h): every value of an
  # enum, as an atom, and the ends of an integer's range, under its
  # condition; an atom the enum lacks and an integer just outside the range
  # are refused naming the option. (An f32's "finite" needs no check here:
  # Erlang has no NaN or infinity.) The C++ API's side is
  # test/abi/test_op_descriptions.cpp's.
  #
  # Runs without a GPU: a call the NIF accepts gets as far as allocating
  # its outputs, which fails there, or runs, on a GPU machine; either way it
  # raises no ArgumentError about the option.
  use ExUnit.Case, async: true

  alias ExPhil.Native
  alias ExPhil.Native.{DescribedTensors, OpDescriptions}

  # The NIF's positional tensors of description `d` as fake device buffers.
  defp tensors(d, layout) do
    {names, _, _} = OpDescriptions.nif_signature(d)

    for {name, index} <- Enum.with_index(names) do
      slot = Enum.find(d.tensors, &(String.downcase(&1.name) == name))
      DescribedTensors.fake(slot, index, swap_middle: layout == :bthd)
    end
  end

  # nil when the call raised no ArgumentError naming `option`, else its message.
  defp refusal(d, opts, option) do
    layout = Keyword.get(opts, :layout)
    apply(Native, :"#{d.op}_#{d.direction}", tensors(d, layout) ++ [opts])
    nil
  rescue
    e in ArgumentError ->
      message = Exception.message(e)
      if message =~ "argument '#{option}'", do: message
  end

  # The options whose range or enum the NIF spells as the description does
  # (the selective scan's dt_min and dt_max are its clamp: tuple, and
  # input_scale is the C++ API's only: op_descriptions_test.exs).
  @checked for d <- OpDescriptions.all(),
               :nif in d.bindings,
               o <- d.options,
               o.name in ~w(mask window layout precision),
               do: {d.op, d.direction, o.name}

  test "the options checked here are those the descriptions give" do
    # attention's four of each direction, the GRU's, LSTM's and their
    # stacks' precision
    assert length(@checked) == 16
  end

  for {op, direction, name} <- @checked do
    test "#{op}_#{direction}: #{name}: its described values and no others" do
      d = OpDescriptions.fetch!(unquote(op), unquote(direction))
      o = Enum.find(d.options, &(&1.name == unquote(name)))
      option = String.to_atom(o.name)

      # its condition, as options: mask=window -> [mask: :window]
      condition =
        case o.only_if do
          nil -> []
          text -> [text |> String.split("=") |> Enum.map(&String.to_atom/1) |> List.to_tuple()]
        end

      case {OpDescriptions.enum_values(o.type), o.range} do
        {[_ | _] = values, _} ->
          for value <- values do
            # a value that brings in another option (mask: :window) with it
            # at the low end of that one's range
            brought =
              for p <- d.options, p.only_if == "#{o.name}=#{value}" do
                [low, _] = String.split(p.range, "..")
                {String.to_atom(p.name), String.to_integer(low)}
              end

            opts = [{option, String.to_atom(value)} | brought]
            assert refusal(d, opts, o.name) == nil, "#{inspect(opts)}"
          end

          assert refusal(d, [{option, :bogus}], o.name) =~ "got :bogus"

        {[], range} ->
          [low, high] = range |> String.split("..") |> Enum.map(&String.to_integer/1)
          assert refusal(d, condition ++ [{option, low}], o.name) == nil
          assert refusal(d, condition ++ [{option, high}], o.name) == nil
          assert refusal(d, condition ++ [{option, low - 1}], o.name) =~ "got #{low - 1}"
          assert refusal(d, condition ++ [{option, high + 1}], o.name) =~ "got #{high + 1}"
      end
    end
  end
end
