#!/usr/bin/env python3
"""Run every peer check and benchmark of ExPhil.Native in one command.

Steps (each in its own process, so one crash does not stop the rest):

  interop     bench/peers/interop_jax.py     XLA buffers, DLPack, synchronisation
  grads       bench/peers/grads_jax.py       gradients vs jax.vjp in float64
  speed       bench/peers/speed_scans.py     scans vs JAX / PyTorch / cuDNN (+ PNG)
  attention   bench/peers/attention_sdpa.py  --check --bench (vs torch SDPA)
  ffi-check   test/xla_ffi/check_jax_ffi.py  (if present and libexphil_xla_ffi.so exists)
  ffi-stack   bench/peers/stack_jax.py       (if present and libexphil_xla_ffi.so exists)

Libraries: --lib (default $EXPHIL_LIB, else <build-dir>/c_src/libexphil.so)
and --ffi-lib (default $EXPHIL_XLA_FFI_LIB, else
<build-dir>/c_src/xla_ffi/libexphil_xla_ffi.so); --build-dir defaults to
build-gpu. If libexphil.so is missing (and --no-build is not given) the
library is built first:

    cmake -S . -B <build-dir> [-G Ninja] -DCMAKE_CUDA_ARCHITECTURES=native \
          -DCMAKE_BUILD_TYPE=Release -DEXPHIL_BUILD_TESTS=OFF -DEXPHIL_BUILD_BENCH=OFF
    cmake --build <build-dir> -j --target exphil      (then exphil_xla_ffi, optional:
                                                       built where jax's FFI headers are)

Every step's output is streamed (PYTHONUNBUFFERED=1) and saved to
<out>/<step>.log; JSON results go to <out>/<step>.json and the sweep plot to
<out>/speed_sweep.png; a summary table is printed at the end and written to
<out>/summary.json. --out defaults to bench/peers/out. Exit status 0 only if
every step that ran passed.

    python3 bench/peers/run_all.py [--out DIR] [--lib PATH] [--ffi-lib PATH]
        [--steps interop,grads,...] [--quick] [--seed N] [--no-build] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STEPS = ("interop", "grads", "speed", "attention", "ffi-check", "ffi-stack")


def log(msg):
    print(f"[run_all {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_streamed(cmd, logfile, env, timeout, dry):
    """Run cmd, streaming its output to stdout and logfile. Returns (rc, seconds, tail)."""
    log("$ " + " ".join(shlex.quote(str(c)) for c in cmd))
    if dry:
        return 0, 0.0, []
    t0 = time.time()
    tail = []
    with open(logfile, "w") as fh:
        try:
            proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", bufsize=1)
        except OSError as e:
            fh.write(f"cannot start: {e}\n")
            return 127, 0.0, [f"cannot start: {e}"]
        try:
            deadline = t0 + timeout if timeout else None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                fh.write(line)
                tail.append(line.rstrip("\n"))
                if len(tail) > 40:
                    tail.pop(0)
                if deadline and time.time() > deadline:
                    proc.kill()
                    tail.append(f"killed after {timeout} s")
                    break
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            raise
    return rc, time.time() - t0, tail


def help_text(script, env):
    try:
        r = subprocess.run([sys.executable, str(script), "--help"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
        return r.stdout + r.stderr
    except Exception:
        return ""


def build(args, env):
    bdir = Path(args.build_dir)
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (bdir / "CMakeCache.txt").exists() else []
    # only the libraries: the tests need Catch2, the benchmark is not used here
    cmds = [["cmake", "-S", REPO, "-B", bdir] + gen + ["-DCMAKE_CUDA_ARCHITECTURES=native",
             "-DCMAKE_BUILD_TYPE=Release", "-DEXPHIL_BUILD_TESTS=OFF", "-DEXPHIL_BUILD_BENCH=OFF"],
            ["cmake", "--build", bdir, "-j", str(os.cpu_count() or 4), "--target", "exphil"]]
    out = Path(args.out)
    for i, c in enumerate(cmds):
        rc, _, _ = run_streamed(c, out / f"build{i}.log", env, None, args.dry_run)
        if rc:
            return rc
    # the XLA FFI library is optional (built only where jax's FFI headers are found)
    rc, _, _ = run_streamed(["cmake", "--build", bdir, "-j", str(os.cpu_count() or 4), "--target",
                             "exphil_xla_ffi"], out / "build_ffi.log", env, None, args.dry_run)
    if rc:
        log("exphil_xla_ffi not built (optional; see build_ffi.log)")
    return 0


def verdict(rc, tail):
    """A short note from the tail of a step's output."""
    for line in reversed(tail):
        s = line.strip()
        if s.startswith(("ALL PASSED", "FAILED")) or " passed" in s or "sections" in s:
            return s[:120]
    return tail[-1][:120] if tail else ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=str(REPO / "build-gpu"))
    p.add_argument("--lib", default=None)
    p.add_argument("--ffi-lib", default=None)
    p.add_argument("--out", default=str(HERE / "out"))
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--quick", action="store_true", help="shorter runs where a script offers it")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--timeout", type=float, default=None, help="seconds per step (default none)")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = p.parse_args(argv)

    steps = [s for s in args.steps.split(",") if s]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        p.error(f"unknown steps {bad}; choose from {STEPS}")
    bdir = Path(args.build_dir)
    lib = Path(args.lib or os.environ.get("EXPHIL_LIB") or bdir / "c_src" / "libexphil.so")
    ffi = Path(args.ffi_lib or os.environ.get("EXPHIL_XLA_FFI_LIB")
               or bdir / "c_src" / "xla_ffi" / "libexphil_xla_ffi.so")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", EXPHIL_LIB=str(lib),
               EXPHIL_XLA_FFI_LIB=str(ffi))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    py = sys.executable
    results = []
    log(f"repository {REPO}; library {lib}; XLA FFI library {ffi}; output {out}")

    if not lib.exists():
        if args.no_build:
            log(f"{lib} does not exist and --no-build was given")
            return 2
        log(f"{lib} does not exist: building")
        if build(args, env):
            log("build failed")
            results.append({"step": "build", "status": "FAIL", "seconds": 0, "note": "see build logs"})
            _summary(results, out)
            return 1
        if not lib.exists() and not args.dry_run:
            log(f"the build did not produce {lib}")
            return 1

    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    quick = ["--quick"] if args.quick else []
    plan = {
        "interop": [py, HERE / "interop_jax.py", "--lib", lib, "--json", out / "interop.json"]
        + seed + (["--trials", "5"] if args.quick else []),
        "grads": [py, HERE / "grads_jax.py", "--lib", lib, "--json", out / "grads.json", "-q"]
        + seed + (["--scan-cases", "2", "--ss-cases", "4"] if args.quick else []),
        "speed": [py, HERE / "speed_scans.py", "--lib", lib, "--json", out / "speed.json",
                  "--plot", out / "speed_sweep.png"] + quick,
        "attention": [py, HERE / "attention_sdpa.py", "--check", "--bench", "--lib", lib,
                      "--json", out / "attention_sdpa.json", "-q"] + seed,
    }
    for name, script in (("ffi-check", REPO / "test" / "xla_ffi" / "check_jax_ffi.py"),
                         ("ffi-stack", HERE / "stack_jax.py")):
        if name not in steps:
            continue
        if not script.exists():
            results.append({"step": name, "status": "SKIP", "seconds": 0,
                            "note": f"{script.relative_to(REPO)} not present"})
            continue
        if not ffi.exists() and not args.dry_run:
            results.append({"step": name, "status": "SKIP", "seconds": 0,
                            "note": f"{ffi} not built"})
            continue
        h = help_text(script, env) if not args.dry_run else "--lib --json --quick --seed"
        cmd = [py, script]
        if "--lib" in h:
            cmd += ["--lib", ffi]
        if "--json" in h:
            cmd += ["--json", out / f"{name}.json"]
        if args.quick and "--quick" in h:
            cmd += ["--quick"]
        if args.seed is not None and "--seed" in h:
            cmd += seed
        plan[name] = cmd

    for name in steps:
        if name not in plan:
            continue
        log(f"=== step {name} ===")
        rc, secs, tail = run_streamed(plan[name], out / f"{name}.log", env, args.timeout,
                                      args.dry_run)
        status = "DRY" if args.dry_run else ("PASS" if rc == 0 else "FAIL")
        results.append({"step": name, "status": status, "seconds": round(secs, 1), "rc": rc,
                        "note": verdict(rc, tail), "log": str(out / f"{name}.log")})
        log(f"=== step {name}: {status} (rc {rc}, {secs:.0f} s) ===")

    return _summary(results, out)


def _summary(results, out):
    print()
    print("## run_all summary")
    print()
    print("| step | status | seconds | note |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['step']} | {r['status']} | {r['seconds']} | {r.get('note', '')} |")
    for f in ("interop.json", "grads.json", "speed.json", "speed_sweep.png", "attention_sdpa.json"):
        if (out / f).exists():
            print(f"written: {out / f}")
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    failed = [r for r in results if r["status"] == "FAIL"]
    print("ALL PASSED" if not failed else f"FAILED: {', '.join(r['step'] for r in failed)}")
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
