#!/usr/bin/env bash
# Runs the Torchx tests (mix_stub/test/torchx_test.exs: the ops on Torchx
# CUDA tensors through ExPhil.Native.Eager) on a GPU machine that has CUDA,
# CMake, Ninja and PyTorch (whose libtorch Torchx builds against) but no
# Erlang or Elixir. Nothing is downloaded: everything else comes from the
# git-ignored folder .gpu/ of the repository:
#
#   .gpu/debs/*.deb  Debian bookworm's Erlang/OTP 25 packages (apt-get download
#                    erlang-base erlang-dev erlang-crypto erlang-syntax-tools
#                    erlang-parsetools erlang-tools erlang-inets erlang-ssl
#                    erlang-public-key erlang-asn1 erlang-runtime-tools
#                    erlang-eunit erlang-mnesia)
#   .gpu/vendor/     elixir, nx, complex, telemetry, fine and torchx, copied
#                    from ../shared/vendor
#
# It unpacks Erlang under $EXPHIL_TORCHX_WORK (default /tmp/exphil_torchx),
# configures the NIF's CMake build there (Ninja, CUDAARCHS or 90a, no tests
# or benchmarks, no XLA FFI library), and runs `mix test` in
# scripts/torchx_project, a Mix project that depends on this library and on
# Torchx: its compilation builds the NIF target and Torchx (against
# LIBTORCH_DIR, PyTorch's libtorch by default). Extra arguments go to
# `mix test`.
#
# Usage, from anywhere: mix_stub/scripts/torchx_gpu.sh [mix test args]
#                   or: mix_stub/scripts/torchx_gpu.sh --bench [benchmark args]
# --bench runs bench/elixir/model_latency.exs (the model-level figures)
# instead of the tests.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${EXPHIL_TORCHX_WORK:-/tmp/exphil_torchx}
jobs=$(nproc)
mkdir -p "$work"

step() { printf '\n== %s (at %ss)\n' "$*" "$SECONDS"; }

for need in "$root/.gpu/debs" "$root/.gpu/vendor/elixir" "$root/.gpu/vendor/torchx"; do
  [ -e "$need" ] || { echo "missing $need (see the head of $0)" >&2; exit 1; }
done

step "machine"
command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -2 || true
cmake --version | head -1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

step "Erlang/OTP from .gpu/debs"
E=$work/erlang/usr/lib/erlang
if [ ! -x "$E/bin/erl" ]; then
  for deb in "$root"/.gpu/debs/*.deb; do dpkg -x "$deb" "$work/erlang"; done
  # The packages' scripts expect /usr/lib/erlang.
  sed -i "s|ROOTDIR=/usr/lib/erlang|ROOTDIR=$E|" "$E/bin/erl" "$E"/erts-*/bin/erl
fi
export PATH="$E/bin:$root/.gpu/vendor/elixir/bin:$PATH" LANG=C.UTF-8
export EXPHIL_DEPS_PATH="$root/.gpu/vendor"
elixir --version | tail -1

step "the NIF's CMake build"
export EXPHIL_BUILD_DIR=$work/cmake
cmake -S "$root" -B "$EXPHIL_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDAARCHS:-90a}" -DEXPHIL_BUILD_TESTS=OFF -DEXPHIL_BUILD_BENCH=OFF \
  -DEXPHIL_PYTHON3=/bin/false -DEXPHIL_ERL_INCLUDE_DIR="$E/usr/include" >"$work/cmake-configure.log" 2>&1 ||
  { cat "$work/cmake-configure.log"; exit 1; }
grep "ExPhil.Native" "$work/cmake-configure.log" || true
# Built here with every core; the Mix compiler then finds it up to date.
cmake --build "$EXPHIL_BUILD_DIR" --target exphil_nif -j "$jobs" | tail -3

step "Torchx against PyTorch's libtorch, and the Mix projects"
LIBTORCH_DIR=${LIBTORCH_DIR:-$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')}
LIBTORCH_VERSION=${LIBTORCH_VERSION:-$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')}
export LIBTORCH_DIR LIBTORCH_VERSION LIBTORCH_TARGET=${LIBTORCH_TARGET:-cu130}
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# cuDNN of PyTorch's wheels, where libtorch's CMake config asks for it.
if cudnn=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__))' 2>/dev/null); then
  export CUDNN_ROOT=${CUDNN_ROOT:-$cudnn} CUDNN_INCLUDE_DIR=${CUDNN_INCLUDE_DIR:-$cudnn/include}
  export CUDNN_LIBRARY=${CUDNN_LIBRARY:-$(ls "$cudnn"/lib/libcudnn.so* | head -1)}
fi
echo "LIBTORCH_DIR=$LIBTORCH_DIR LIBTORCH_VERSION=$LIBTORCH_VERSION LIBTORCH_TARGET=$LIBTORCH_TARGET"

cd "$root/mix_stub/scripts/torchx_project"
export MIX_ENV=test MIX_BUILD_ROOT=$work/mix
mix compile 2>&1

if [ "${1:-}" = "--bench" ]; then
  shift
  step "bench/elixir/model_latency.exs $*"
  set +e
  mix run "$root/bench/elixir/model_latency.exs" "$@"
  status=$?
  step "done: the benchmark exited $status"
  exit $status
fi

step "mix test $*"
set +e
mix test "$@"
status=$?
step "done: mix test exited $status"
exit $status
