#!/usr/bin/env bash
# Runs every GPU test case under compute-sanitizer, memcheck and racecheck,
# several processes at a time, and prints one line per run plus a summary.
# A run fails on any sanitizer error (exit code 99) or test failure.
#
#   test/sanitize.sh BUILD_DIR [JOBS] [TIMEOUT_S] [TOOLS]
#   TOOLS                  "memcheck racecheck" by default
#   SANITIZER_LOGS=dir     keeps each run's full log there (default BUILD_DIR/sanitizer)
#   Tests tagged [api-error] make a failing CUDA call on purpose; they run
#   with --report-api-errors no, so only memory errors and hazards count.
#   SANITIZE_SPEC="..."    runs only the GPU test cases that also match this
#                          Catch2 test spec, e.g. "*selective_scan*"
#   RACECHECK_MAX_ELEMENTS caps B*T*H under racecheck (default 262144): it
#                          instruments every shared-memory access, and the
#                          access pattern does not depend on the size; the
#                          tests print each shape they leave out, and a run
#                          whose every shape is over the cap counts as left
#                          out, not as clean.
set -uo pipefail

build=${1:?usage: test/sanitize.sh BUILD_DIR [JOBS] [TIMEOUT_S]}
jobs=${2:-8}
limit=${3:-300}
tools=${4:-memcheck racecheck}
logs=${SANITIZER_LOGS:-$build/sanitizer}
mkdir -p "$logs"

run_one() {
  local tool=$1 binary=$2 name=$3
  # The name as a Catch2 test spec: ',', '[' and ']' escaped (a '[' would
  # start a tag, and select nothing).
  local spec=${name//,/\\,}
  spec=${spec//\[/\\[}
  spec=${spec//]/\\]}
  local log="$logs/$tool-$binary-$(printf '%s' "$name" | tr -c 'A-Za-z0-9' '_' | cut -c1-80).log"
  local cap="" api_errors=explicit
  if [ "$tool" = racecheck ]; then cap=${RACECHECK_MAX_ELEMENTS:-262144}; fi
  if grep -Fxq -- "$name" "$logs/api-error-$binary.txt"; then api_errors=no; fi
  EXPHIL_TEST_MAX_ELEMENTS=$cap timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 \
    --report-api-errors "$api_errors" "$build/test/$binary" "$spec" > "$log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -m1 "ERROR SUMMARY\|RACECHECK SUMMARY" "$log" | sed 's/^========= //')
  # A case whose every shape is over the cap makes no CUDA call, and
  # compute-sanitizer then exits 255 with no summary: left out, not clean.
  if [ "$rc" -eq 255 ] && grep -q "terminated before first instrumented API call" "$log" &&
     grep -q "^All tests passed" "$log"; then
    rc=0
    summary="left out: no CUDA call (every shape over EXPHIL_TEST_MAX_ELEMENTS)"
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$rc" "$tool" "$binary" "$name" "${summary:-no summary}"
}
export -f run_one
export build logs limit

for binary in exphil_gpu_tests exphil_abi_tests; do
  "$build/test/$binary" "[api-error]" --list-test-names-only | sed '/^$/d' > "$logs/api-error-$binary.txt"
done

for tool in $tools; do
  for binary in exphil_gpu_tests exphil_abi_tests; do
    "$build/test/$binary" "[gpu]${SANITIZE_SPEC:+ $SANITIZE_SPEC}" --list-test-names-only | sed '/^$/d' |
      while IFS= read -r name; do printf '%s\t%s\t%s\n' "$tool" "$binary" "$name"; done
  done
done | xargs -P "$jobs" -d '\n' -I{} bash -c 'IFS=$'"'"'\t'"'"' read -r t b n <<< "$1"; run_one "$t" "$b" "$n"' _ {} \
  | tee "$logs/summary.tsv"

failed=$(awk -F'\t' '$1 != 0' "$logs/summary.tsv" | wc -l)
left=$(awk -F'\t' '$1 == 0 && $5 ~ /^left out/' "$logs/summary.tsv" | wc -l)
total=$(wc -l < "$logs/summary.tsv")
echo "compute-sanitizer: $((total - failed - left)) of $total runs clean, $left left out, $failed failed"
[ "$failed" -eq 0 ]
