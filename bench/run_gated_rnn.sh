#!/usr/bin/env bash
# Issue 30's benchmark in one go, on a GPU machine with PyTorch: builds
# exphil_bench (target only), runs its gated_rnn section (GRU and LSTM: ours,
# the per-step baseline, the floors, validation), then cuDNN's GRU and LSTM
# through PyTorch (bench/peers/cudnn_rnn.py) on the same GPU, then prints the
# comparison and issue 30's targets (bench/peers/compare_gated_rnn.py); then
# the f32 rows again with every product as f32 FMAs on both sides (cuDNN with
# cudnn.allow_tf32 False; ours with the projections' cuBLAS products
# without TF32, exphil_bench --exact-f32; our recurrent kernels take f32
# FMAs either way, while PyTorch's default lets cuDNN take TF32 for all its
# products) and that comparison; then the f32 rows once more with our
# kernels at TF32's precision or better (exphil_bench --f32-tensor-cores:
# GatedRnnPrecision::tf32) against cuDNN's default run.
#
# usage: bench/run_gated_rnn.sh [--small] [--quick]
#   --small  batch-1 shapes only; --quick  fewer repetitions (both passed to both)
# environment:
#   BUILD_DIR  build folder (default build-gpu); configured here if it has no
#              CMakeCache.txt: Release, CUDAARCHS (default 90a), tests off
#              (no Catch2 needed; -DEXPHIL_BUILD_TESTS=ON later adds them)
#   OUT_DIR    where the three outputs and the build log go (default
#              bench/peers/out): gated_rnn_ours.txt, gated_rnn_cudnn.txt,
#              gated_rnn_compare.txt, and for f32 in FMAs throughout
#              gated_rnn_ours_exact_f32.txt, gated_rnn_cudnn_exact_f32.txt,
#              gated_rnn_compare_exact_f32.txt; with our f32 on tensor cores
#              gated_rnn_ours_f32_tensor_cores.txt and
#              gated_rnn_compare_f32_tensor_cores.txt
#   PYTHON     the python with torch (default python3)
# Wall time, measured: on an H100 (16 cores) 3 min in all before the f32
# rerun (the build from scratch 35 s, exphil_bench 95 s, cudnn_rnn.py
# 45 s); with it, --quick 218 s on an H200, the build included
# (bench/RESULTS.md, issue 30 run CT); with the third table, --quick 189 s
# on an H200, exphil_bench already built (run DK).
set -uo pipefail
cd "$(dirname "$0")/.."
flags=()
for a in "$@"; do
  case "$a" in
    --small | --quick) flags+=("$a") ;;
    *) echo "usage: bench/run_gated_rnn.sh [--small] [--quick]" >&2; exit 2 ;;
  esac
done
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT_DIR=${OUT_DIR:-bench/peers/out}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
log="$OUT_DIR/gated_rnn_build.log"
SECONDS=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || true

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  gen=()
  command -v ninja > /dev/null && gen=(-G Ninja)
  cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDAARCHS:-90a}" -DEXPHIL_BUILD_TESTS=OFF \
    -DEXPHIL_PYTHON3=/bin/false > "$log" 2>&1 || { tail -30 "$log"; echo "configure failed"; exit 1; }
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target exphil_bench >> "$log" 2>&1 ||
  { grep -E "error|Error" "$log" | head -30; echo "build failed (see $log)"; exit 1; }
echo "build: ${SECONDS} s, $(grep -ci 'warning' "$log") warning lines ($log)"

"$BUILD_DIR/bench/exphil_bench" --op gated_rnn ${flags[@]+"${flags[@]}"} | tee "$OUT_DIR/gated_rnn_ours.txt"
ours_rc=${PIPESTATUS[0]}
echo "exphil_bench: rc ${ours_rc} at ${SECONDS} s"
"$PYTHON" bench/peers/cudnn_rnn.py ${flags[@]+"${flags[@]}"} | tee "$OUT_DIR/gated_rnn_cudnn.txt"
peer_rc=${PIPESTATUS[0]}
echo "cudnn_rnn.py: rc ${peer_rc} at ${SECONDS} s"
"$PYTHON" bench/peers/compare_gated_rnn.py "$OUT_DIR/gated_rnn_ours.txt" "$OUT_DIR/gated_rnn_cudnn.txt" |
  tee "$OUT_DIR/gated_rnn_compare.txt"
compare_rc=${PIPESTATUS[0]}
echo "== f32, every product as f32 FMAs on both sides =="
"$BUILD_DIR/bench/exphil_bench" --op gated_rnn --exact-f32 ${flags[@]+"${flags[@]}"} |
  tee "$OUT_DIR/gated_rnn_ours_exact_f32.txt"
ours_exact_rc=${PIPESTATUS[0]}
"$PYTHON" bench/peers/cudnn_rnn.py ${flags[@]+"${flags[@]}"} --exact-f32 --dtypes f32 |
  tee "$OUT_DIR/gated_rnn_cudnn_exact_f32.txt"
exact_rc=${PIPESTATUS[0]}
"$PYTHON" bench/peers/compare_gated_rnn.py "$OUT_DIR/gated_rnn_ours_exact_f32.txt" \
  "$OUT_DIR/gated_rnn_cudnn_exact_f32.txt" | tee "$OUT_DIR/gated_rnn_compare_exact_f32.txt"
exact_compare_rc=${PIPESTATUS[0]}
echo "== f32 at TF32's precision or better on both sides: ours at precision tf32, cuDNN's default =="
"$BUILD_DIR/bench/exphil_bench" --op gated_rnn --f32-tensor-cores ${flags[@]+"${flags[@]}"} |
  tee "$OUT_DIR/gated_rnn_ours_f32_tensor_cores.txt"
ours_tc_rc=${PIPESTATUS[0]}
"$PYTHON" bench/peers/compare_gated_rnn.py "$OUT_DIR/gated_rnn_ours_f32_tensor_cores.txt" \
  "$OUT_DIR/gated_rnn_cudnn.txt" | tee "$OUT_DIR/gated_rnn_compare_f32_tensor_cores.txt"
tc_compare_rc=${PIPESTATUS[0]}
echo "done in ${SECONDS} s (exphil_bench rc ${ours_rc}, ${ours_exact_rc} and ${ours_tc_rc}, cudnn_rnn.py" \
  "rc ${peer_rc} and ${exact_rc}, validation rc ${compare_rc}, ${exact_compare_rc} and ${tc_compare_rc})"
[ "$ours_rc" -eq 0 ] && [ "$peer_rc" -eq 0 ] && [ "$compare_rc" -eq 0 ] && [ "$ours_exact_rc" -eq 0 ] &&
  [ "$exact_rc" -eq 0 ] && [ "$exact_compare_rc" -eq 0 ] && [ "$ours_tc_rc" -eq 0 ] &&
  [ "$tc_compare_rc" -eq 0 ]
