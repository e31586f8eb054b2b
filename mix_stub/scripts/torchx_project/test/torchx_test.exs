# The library's Torchx tests, from its own test folder.
Code.require_file("../../../test/torchx_test.exs", __DIR__)
Code.require_file("../../../test/torchx_axon_test.exs", __DIR__)
Code.require_file("../../../test/torchx_edifice_test.exs", __DIR__)
