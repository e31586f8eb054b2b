#!/usr/bin/env bash
# Builds everything and runs every test through CTest: the reference and C ABI
# suites everywhere, the GPU suites where a CUDA device is usable. Without a
# GPU the GPU tests are reported as skipped (never failed, never passed) and
# the reason is printed at the end.
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
ctest --test-dir "$build" --output-on-failure -j "$jobs" || status=$?

log=$build/Testing/Temporary/LastTest.log
skipped=$(grep -c '^SKIPPED: ' "$log" 2>/dev/null || true)
if [ "${skipped:-0}" -gt 0 ]; then
  echo "$skipped GPU tests were skipped, not run: $(grep -m1 '^SKIPPED: ' "$log" | sed 's/^SKIPPED: //')"
fi
exit "$status"
