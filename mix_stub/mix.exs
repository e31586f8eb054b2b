defmodule ExPhil.Native.MixProject do
  use Mix.Project

  def project do
    [
      app: :exphil_native,
      version: "0.2.0",
      # Nx 0.12 needs 1.17; Edifice 1.18.
      elixir: "~> 1.17",
      compilers: [:exphil_nif] ++ Mix.compilers(),
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: deps(),
      docs: [main: "ExPhil.Native"]
    ]
  end

  def application, do: [extra_applications: [:logger]]

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]

  # Hex requirements, as users write them. On a machine without Hex,
  # EXPHIL_DEPS_PATH names a folder holding each package's source under its
  # own name (e.g. ../shared/vendor), and every dependency is taken from
  # there instead. EXLA is optional: with it the ops compile into XLA custom
  # calls; Axon and Edifice are optional too.
  defp deps do
    [
      dep(:nx, "~> 0.12"),
      dep(:exla, "~> 0.12", optional: true),
      dep(:axon, "~> 0.8", optional: true),
      dep(:edifice, "~> 0.2", optional: true)
    ]
  end

  defp dep(name, requirement, opts \\ []) do
    case System.get_env("EXPHIL_DEPS_PATH") do
      nil ->
        {name, requirement, opts}

      "" ->
        {name, requirement, opts}

      folder ->
        {name,
         [path: Path.join(Path.expand(folder), Atom.to_string(name))] ++ path_opts(name) ++ opts}
    end
  end

  # A source folder of EXLA has no XLA binary beside it (its Elixir modules
  # compile; its NIF does not load), so Mix must not start it.
  defp path_opts(:exla), do: [runtime: false]
  defp path_opts(_), do: []
end

defmodule Mix.Tasks.Compile.ExphilNif do
  @moduledoc """
  Builds the `ExPhil.Native` NIF (`libexphil_nif.so`) with the repository's
  CMake project and copies it to the application's `priv/`; likewise the XLA
  FFI handlers (`libexphil_xla_ffi.so`) where XLA's FFI headers are found:
  those of the EXLA this project compiles against (its
  `cache/xla_extension/include`, from the XLA that will load them), or else
  what CMake finds (`EXPHIL_XLA_FFI_INCLUDE_DIR`, JAX's).

  Environment:

    * `EXPHIL_BUILD_DIR` - the CMake build folder to build in; by default
      the repository's `build/`, the README's, for every Mix environment:
      the CUDA code is built once, not again for `dev` and for `test`.
    * `CUDAARCHS` - CUDA architectures, as for CMake.

  CMake's progress lines are printed as they come (a first build takes
  minutes); a build with nothing to do prints nothing. The parallelism is
  bounded by the cores and by the memory available, a GiB per compiler.
  """
  use Mix.Task.Compiler

  @shortdoc "Builds libexphil_nif.so (and libexphil_xla_ffi.so) with CMake"

  @impl true
  def run(_args) do
    unless System.find_executable("cmake") do
      Mix.raise(
        "cmake not found: the NIF is built with CMake (3.25 or newer), a C++17 compiler " <>
          "and the CUDA toolkit (12.8 or newer); see the repository's README"
      )
    end

    root = Path.expand("..", __DIR__)

    build = System.get_env("EXPHIL_BUILD_DIR") || Path.join(root, "build")
    jobs = Integer.to_string(build_jobs())

    unless File.exists?(Path.join(build, "CMakeCache.txt")),
      do: Mix.shell().info("exphil_native: configuring the CMake build in #{build}")

    cmake!(["-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=Release" | exla_ffi_headers()])
    cmake!(["--build", build, "--target", "exphil_nif", "-j", jobs])

    nif = Path.join([build, "c_src", "nif", "libexphil_nif.so"])

    unless File.exists?(nif) do
      Mix.raise("CMake did not build #{nif}: is erl_nif.h installed (erlang-dev)?")
    end

    # The handler library is a target only where CMake found XLA's headers.
    ffi =
      if has_target?(build, "exphil_xla_ffi") do
        cmake!(["--build", build, "--target", "exphil_xla_ffi", "-j", jobs])
        [Path.join([build, "c_src", "xla_ffi", "libexphil_xla_ffi.so"])]
      else
        []
      end

    priv = Path.join(Mix.Project.app_path(), "priv")
    File.mkdir_p!(priv)

    if Enum.map([nif | ffi], &install(&1, priv)) |> Enum.any?(), do: {:ok, []}, else: {:noop, []}
  end

  # Copies `built` into `priv`; whether it changed.
  defp install(built, priv) do
    target = Path.join(priv, Path.basename(built))

    if File.exists?(target) and File.read!(built) == File.read!(target) do
      false
    else
      # A fresh file, not an overwrite: a running VM may have the old one mapped.
      File.rm(target)
      File.cp!(built, target)
      true
    end
  end

  defp exla_ffi_headers do
    exla = Mix.Project.deps_paths()[:exla]
    include = exla && Path.join(exla, "cache/xla_extension/include")

    if System.get_env("EXPHIL_XLA_FFI_INCLUDE_DIR") == nil and include != nil and
         File.regular?(Path.join(include, "xla/ffi/api/ffi.h")) do
      ["-DEXPHIL_XLA_FFI_INCLUDE_DIR=#{include}"]
    else
      []
    end
  end

  defp has_target?(build, target) do
    {help, _} =
      System.cmd("cmake", ["--build", build, "--target", "help"], stderr_to_stdout: true)

    help =~ ~r/\b#{target}\b/
  end

  # Runs cmake, printing its progress lines ("[ 42%] Building CUDA object
  # ...", "[7/80] Linking ...") as they come; its whole output goes into
  # the error if it fails.
  defp cmake!(args) do
    port =
      Port.open({:spawn_executable, System.find_executable("cmake")}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        {:line, 4096},
        args: args
      ])

    case collect(port, []) do
      {_, 0} ->
        :ok

      {output, status} ->
        Mix.raise("cmake #{Enum.join(args, " ")} failed (#{status}):\n#{output}")
    end
  end

  defp collect(port, lines) do
    receive do
      {^port, {:data, {_, line}}} ->
        if line =~ ~r/^\[\s*\d+(%|\/\d+)\]\s+(Building|Linking)/,
          do: Mix.shell().info("exphil_native: " <> line)

        collect(port, [line | lines])

      {^port, {:exit_status, status}} ->
        {lines |> Enum.reverse() |> Enum.join("\n"), status}
    end
  end

  # The cores, and no more compilers than GiB of memory available: nvcc
  # processes take hundreds of MB to over a GB each.
  defp build_jobs do
    cores = System.schedulers_online()

    with {:ok, meminfo} <- File.read("/proc/meminfo"),
         [_, kib] <- Regex.run(~r/MemAvailable:\s+(\d+) kB/, meminfo) do
      kib |> String.to_integer() |> div(1024 * 1024) |> max(1) |> min(cores)
    else
      _ -> cores
    end
  end
end
