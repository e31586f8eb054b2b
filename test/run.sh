#!/usr/bin/env bash
# Builds everything and runs every test: through CTest, first all tests that
# need no GPU, then, where a CUDA device is usable, the GPU tests (CTest
# label "gpu"); then the ExUnit suite of mix_stub/ (its :gpu tests likewise
# only with a device). Without a GPU those are not run, and the script says
# how many and why: they neither fail nor count as passed.
#
#   EXPHIL_BUILD_DIR   build folder (default: build/ at the top)
#   CUDAARCHS          CUDA architectures (default: CMakeLists.txt's list)
#   EXPHIL_DEPS_PATH   folder of the Elixir packages' sources, used instead
#                      of Hex (default: ../shared/vendor beside the checkout,
#                      where it exists; its elixir/bin then comes first on
#                      PATH: Nx needs Elixir 1.17 or newer)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${EXPHIL_BUILD_DIR:-$root/build}
# The cores, and no more compilers than GiB of memory available (an nvcc
# process takes hundreds of MB to over a GB).
jobs=$(nproc)
mem_gib=$(awk '/^MemAvailable:/ { print int($2 / 1048576) }' /proc/meminfo 2>/dev/null || true)
if [ -n "$mem_gib" ] && [ "$mem_gib" -lt "$jobs" ]; then jobs=$((mem_gib > 0 ? mem_gib : 1)); fi

if [ -z "${EXPHIL_DEPS_PATH:-}" ] && [ -d "$root/../shared/vendor/nx" ]; then
  EXPHIL_DEPS_PATH=$root/../shared/vendor
fi
if [ -n "${EXPHIL_DEPS_PATH:-}" ]; then
  # The physical path: the packages name each other as ../nx and so on, which
  # Mix resolves from where they really are, and a path through a symbolic
  # link would make it see two different dependencies.
  EXPHIL_DEPS_PATH=$(cd "$EXPHIL_DEPS_PATH" && pwd -P)
  export EXPHIL_DEPS_PATH
  if [ -x "$EXPHIL_DEPS_PATH/elixir/bin/mix" ]; then
    export PATH="$EXPHIL_DEPS_PATH/elixir/bin:$PATH"
  fi
fi

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
  echo "Elixir: $(elixir --version | tail -n 1); dependencies: ${EXPHIL_DEPS_PATH:-Hex}"
  (cd "$root/mix_stub" && LANG=C.UTF-8 EXPHIL_BUILD_DIR="$build" MIX_ENV=test \
     mix do deps.get + compile --warnings-as-errors + test --warnings-as-errors) || status=$?
else
  echo "mix not found: install Elixir 1.17 or newer, or set EXPHIL_DEPS_PATH to a" \
       "folder with elixir/ and the packages (see README), to run the ExUnit suite" >&2
  status=1
fi
echo "== The EXLA change that pins custom-call layouts (mix_stub/upstream/exla)"
if [ -n "${EXPHIL_DEPS_PATH:-}" ]; then
  bash "$root/mix_stub/upstream/exla/run_tests.sh" || status=$?
else
  echo "not run: it patches a copy of EXLA's sources, and EXPHIL_DEPS_PATH names none" >&2
fi
exit "$status"
