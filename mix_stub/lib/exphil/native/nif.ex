defmodule ExPhil.Native.NIF do
  @moduledoc false
  # `defnative name(args)` defines the public function `name/arity` over the
  # NIF function `nif_name/arity`. The NIF reports a malformed argument as
  # {:exphil_bad_argument, argument, expected, got}; the public function
  # raises it as an ArgumentError that shows `got` in Elixir syntax. Every
  # other exception, and every return value, passes through unchanged.

  defmacro defnative({name, _, args}) do
    args = args || []
    vars = Enum.map(args, fn {:\\, _, [var, _default]} -> var; var -> var end)
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

      @doc false
      def unquote(nif)(unquote_splicing(stub_args)), do: nif_not_loaded!()
    end
  end
end
