# The library's Torchx tests, from its own test folder.
Code.require_file("../../../test/torchx_test.exs", __DIR__)
