#!/usr/bin/env bash
# Applies custom_call_layouts.patch to a temporary copy of the vendored EXLA,
# compiles it (with --warnings-as-errors) against the vendored Nx and Elixir,
# and runs the patch's tests that need no EXLA NIF. Offline; nothing is written
# into shared/vendor.
#
#   mix_stub/upstream/exla/run_tests.sh      (env: EXPHIL_DEPS_PATH, KEEP_TMP=1)
#
# What runs:
#   test/exla/custom_call/spec_test.exs   EXLA.CustomCall.Spec defaults and layouts!/3
#   test/exla/mlir/value_test.exs         layout attribute text (Value.custom_call_layout_attributes/1)
# What is only compiled (its tests need libexla.so, which is not built here):
#   test/exla/custom_call_layouts_test.exs
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCH_FILE="$HERE/custom_call_layouts.patch"

fail() {
  echo "run_tests.sh: FAIL: $*" >&2
  exit 1
}

# The folder of package sources, as for mix_stub (default: ../shared/vendor
# beside the checkout).
if [[ -n "${EXPHIL_DEPS_PATH:-}" ]]; then
  VENDOR="$EXPHIL_DEPS_PATH"
elif [[ -d "$HERE/../../../../shared/vendor/exla" ]]; then
  VENDOR="$(cd "$HERE/../../../../shared/vendor" && pwd)"
else
  fail "set EXPHIL_DEPS_PATH to a folder holding elixir/, nx/, exla/ and their dependencies"
fi


[[ -f "$PATCH_FILE" ]] || fail "missing $PATCH_FILE"
[[ -x "$VENDOR/elixir/bin/elixir" ]] || fail "no vendored Elixir at $VENDOR/elixir"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/exla-layouts.XXXXXX")"
if [[ "${KEEP_TMP:-0}" != 1 ]]; then
  trap 'rm -rf "$TMP"' EXIT
else
  echo "keeping $TMP"
fi

export PATH="$VENDOR/elixir/bin:$PATH"
export MIX_ENV=test
export MIX_HOME="$TMP/mix_home"
export HEX_OFFLINE=1
unset MIX_BUILD_ROOT MIX_BUILD_PATH MIX_DEPS_PATH

echo "==> copying nx exla telemetry nimble_pool fine complex from $VENDOR"
for pkg in nx exla telemetry nimble_pool fine complex; do
  [[ -d "$VENDOR/$pkg" ]] || fail "missing $VENDOR/$pkg"
  cp -R "$VENDOR/$pkg" "$TMP/$pkg"
done
chmod -R u+w "$TMP"
rm -rf "$TMP/exla/_build" "$TMP/nx/_build"

cd "$TMP/exla"

echo "==> applying $(basename "$PATCH_FILE")"
patch -p1 --dry-run --quiet < "$PATCH_FILE" >/dev/null || fail "patch does not apply to $VENDOR/exla"
patch -p1 --quiet < "$PATCH_FILE"
if find . -name '*.rej' -o -name '*.orig' | grep -q .; then
  fail "patch left .rej/.orig files"
fi

# EXLA's own test_helper starts the NIF-backed client; these tests need none.
cat > test/test_helper.exs <<'EOF'
ExUnit.start()
EOF

echo "==> mix compile --warnings-as-errors (MIX_ENV=test; libexla.so is not built, its on_load failure is expected and not shown)"
if ! mix compile --warnings-as-errors > "$TMP/compile.log" 2>&1; then
  cat "$TMP/compile.log"
  fail "EXLA does not compile with the patch"
fi
grep -E "^(==>|Compiling|Generated)" "$TMP/compile.log" || true

echo "==> mix format --check-formatted (files touched by the patch)"
changed_files=$(grep -E '^\+\+\+ b/' "$PATCH_FILE" | sed 's|^+++ b/||')
# shellcheck disable=SC2086
mix format --check-formatted $changed_files || fail "files touched by the patch are not formatted"

echo "==> mix test (no NIF needed)"
set +e
mix test --no-start --warnings-as-errors \
  test/exla/custom_call/spec_test.exs test/exla/mlir/value_test.exs 2>&1 | tee "$TMP/test.log"
test_rc=${PIPESTATUS[0]}
set -e

echo "==> compiling test/exla/custom_call_layouts_test.exs (its tests need the NIF: all excluded)"
set +e
mix test --no-start --warnings-as-errors --exclude test \
  test/exla/custom_call_layouts_test.exs > "$TMP/nif_compile.log" 2>&1
nif_rc=$?
set -e
if [[ $nif_rc -ne 0 ]]; then
  cat "$TMP/nif_compile.log"
fi
grep -E "[0-9]+ tests?, [0-9]+ failures?" "$TMP/nif_compile.log" || true

summary=$(grep -E "^[0-9]+ tests?, [0-9]+ failures?" "$TMP/test.log" | tail -1 || true)
echo
echo "==> summary"
echo "patch: applies cleanly; EXLA compiles without warnings; formatted"
echo "no-NIF tests: ${summary:-no ExUnit summary line} (mix test exit $test_rc)"
echo "NIF test file compiles: $([[ $nif_rc -eq 0 ]] && echo yes || echo NO)"

if [[ $test_rc -ne 0 || -z "$summary" || $nif_rc -ne 0 ]]; then
  echo "RESULT: FAIL"
  exit 1
fi
echo "RESULT: PASS"
