defmodule ExPhil.Native.LoadError do
  @moduledoc "Raised by every `ExPhil.Native` function when the NIF library failed to load."
  defexception [:reason]

  @impl true
  def message(%{reason: reason}) do
    "ExPhil.Native: the NIF library (priv/libexphil_nif.so) failed to load: #{inspect(reason)}"
  end
end
