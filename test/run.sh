#!/usr/bin/env bash
# Builds everything and runs every test: through CTest, first all tests that
# need no GPU, then, where a CUDA device is usable, the GPU tests (CTest
# label "gpu"); then the ExUnit suite of mix_stub/ (its :gpu tests likewise
# only with a device). Without a GPU those are not run, and the script says
# how many and why: they neither fail nor count as passed.
#
#   EXPHIL_BUILD_DIR   build folder (default: build/ at the top)
#   CUDAARCHS          CUDA architectures (default: CMakeLists.txt's list)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${EXPHIL_BUILD_DIR:-$root/build}
jobs=$(nproc)

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"

status=0
echo "== tests that need no GPU"
ctest --test-dir "$build" --output-on-failure -j "$jobs" -LE gpu || status=$?

gpu_tests=$(ctest --test-dir "$build" -N -L gpu | sed -n 's/^Total Tests: //p')
if probe=$("$build/test/exphil_gpu_tests" --require-gpu --list-tests 2>&1); then
  echo "== GPU tests"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" -L gpu || status=$?
else
  echo "== GPU tests: not run (${gpu_tests:-?} tests labelled gpu): ${probe#SKIPPED: }"
fi
echo "== ExUnit (mix_stub)"
if command -v mix >/dev/null 2>&1; then
  (cd "$root/mix_stub" && LANG=C.UTF-8 EXPHIL_BUILD_DIR="$build" mix test) || status=$?
else
  echo "mix not found: install Elixir (Debian: elixir erlang-dev) to run the ExUnit suite" >&2
  status=1
fi
exit "$status"
