defmodule ExPhil.Native.NIF do
  @moduledoc false
  # `defnative name(args)` defines the public function `name/arity` over the
  # NIF function `nif_name/arity`. The NIF reports a malformed argument as
  # {:exphil_bad_argument, argument, expected, got}; the public function
  # raises it as an ArgumentError that shows `got` in Elixir syntax. Every
  # other exception, and every return value, passes through unchanged.

  defmacro defnative({name, _, args}) do
    args = args || []

    vars =
      Enum.map(args, fn
        {:\\, _, [var, _default]} -> var
        var -> var
      end)

    nif = :"nif_#{name}"
    stub_args = Enum.map(vars, fn _ -> Macro.var(:_, nil) end)

    quote do
      def unquote(name)(unquote_splicing(args)) do
        unquote(nif)(unquote_splicing(vars))
      catch
        :error, {:exphil_bad_argument, argument, expected, got} ->
          reraise ArgumentError,
                  [message: "argument '#{argument}': expected #{expected}, got #{inspect(got)}"],
                  __STACKTRACE__
      end

      # Replaced when the NIF library loads. :erlang.nif_error/1 raises its
      # argument as :erlang.error/1 would, so callers see the LoadError; the
      # type checker reads it as a NIF stub, whose result may be anything.
      @doc false
      def unquote(nif)(unquote_splicing(stub_args)), do: :erlang.nif_error(nif_load_error())
    end
  end
end
