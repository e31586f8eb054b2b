# The library's NIF-level tests that the stream: option and events touch,
# from its own test folder (they need no EXLA, Axon or Edifice).
for file <- ~w(errors_test.exs fuzz_test.exs ops_test.exs) do
  Code.require_file(Path.join("../../../test", file), __DIR__)
end
