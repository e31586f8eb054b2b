defmodule ExPhil.Native.TorchxProject.MixProject do
  # A project that runs the library's Torchx tests (../../test/torchx_test.exs)
  # with Torchx as a dependency: the library itself does not depend on
  # Torchx. Run by ../torchx_gpu.sh on a machine with libtorch and CUDA,
  # with some of the library's NIF-level GPU tests (test/library_test.exs),
  # and the model-level benchmark (bench/elixir/model_latency.exs, with Axon).
  #
  # EXPHIL_DEPS_PATH names the folder holding the packages' sources (nx,
  # complex, telemetry, fine, torchx), as for the library's own mix.exs;
  # Torchx builds against LIBTORCH_DIR (see its mix.exs).
  use Mix.Project

  def project do
    [
      app: :exphil_torchx_tests,
      version: "0.1.0",
      elixir: "~> 1.17",
      # The library's test helpers, for the NIF-level tests run beside the
      # Torchx ones (test/library_test.exs).
      elixirc_paths:
        if(Mix.env() == :test, do: [Path.expand("../../test/support", __DIR__)], else: []),
      deps: deps()
    ]
  end

  def application, do: [extra_applications: [:logger]]

  defp deps do
    vendor =
      System.get_env("EXPHIL_DEPS_PATH") ||
        Mix.raise("EXPHIL_DEPS_PATH must name the folder of package sources (nx, torchx, ...)")

    vendor = Path.expand(vendor)

    [
      {:exphil_native, path: Path.expand("../..", __DIR__)},
      {:nx, path: Path.join(vendor, "nx"), override: true},
      {:torchx, path: Path.join(vendor, "torchx")},
      # the model-level benchmark (bench/elixir/model_latency.exs)
      {:axon, path: Path.join(vendor, "axon")},
      {:polaris, path: Path.join(vendor, "polaris"), override: true},
      # Edifice's math against our ops on Torchx (test/torchx_edifice_test.exs)
      {:edifice, path: Path.join(vendor, "edifice")}
    ]
  end
end
