"""Small helpers shared by the peer scripts: element-wise comparison with
tolerances, independent sections that report and go on, JSON cleanup,
wall-clock timing of jitted JAX functions, and CUDA-event / graph-replay
timing of torch work.

numpy is imported at module load; jax only inside time_jax, torch only
inside the torch timing.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback

import numpy as np


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------
def to_f64(x):
    """Any array (jax, numpy, ml_dtypes bfloat16, torch CPU/GPU) -> float64 numpy."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch: f64 keeps a float64 reference exact
        x = x.detach().double().cpu().numpy()
    return np.asarray(x).astype(np.float64)


def compare(ours, ref, rtol, atol_rel, mag_floor=0.0):
    """|ours - ref| <= atol_rel * mag + rtol * |ref| on the reference's finite
    entries, mag = max(max|ref|, mag_floor); the reference's non-finite
    entries (-inf lse) must be matched exactly; NaN in ours always fails.
    Returns a dict: ok, rel_err (max|err| / mag), worst (max err/tol, <= 1
    passes), bad, numel, max_abs_err, max_ref, nonfinite_mismatch."""
    a = to_f64(ours)
    r = to_f64(ref)
    if a.shape != r.shape:
        return {"ok": False, "rel_err": math.inf, "worst": math.inf, "bad": -1, "numel": a.size,
                "max_abs_err": math.inf, "max_ref": math.nan, "nonfinite_mismatch": 0,
                "error": f"shape {a.shape} != reference {r.shape}"}
    fin = np.isfinite(r)
    nonfinite_bad = int(np.sum(~fin & ~(a == r)))
    r0 = np.where(fin, r, 0.0)
    with np.errstate(invalid="ignore"):
        a0 = np.where(fin, a, 0.0)
        mag = max(float(np.max(np.abs(r0))) if r0.size else 0.0, float(mag_floor))
        err = np.abs(a0 - r0)
        tol = atol_rel * mag + rtol * np.abs(r0)
        bad = ~(err <= tol) & fin
        ratio = np.where(tol > 0, err / np.maximum(tol, 1e-300), np.where(err > 0, np.inf, 0.0))
    n_bad = int(np.sum(bad)) + nonfinite_bad
    if np.isnan(err).any():
        max_err = worst = math.nan
    else:
        max_err = float(np.max(err)) if err.size else 0.0
        worst = float(np.max(ratio)) if ratio.size else 0.0
    return {
        "ok": n_bad == 0,
        "rel_err": (max_err / mag) if mag > 0 else (0.0 if max_err == 0 else math.inf),
        "worst": worst,
        "bad": n_bad,
        "numel": int(a.size),
        "max_abs_err": max_err,
        "max_ref": mag,
        "nonfinite_mismatch": nonfinite_bad,
    }


def fmt_metric(m):
    if m.get("error"):
        return m["error"]
    return f"{m['rel_err']:.1e}({m['worst']:.2f})"


def fmt_failures(metrics, indent="      "):
    lines = []
    for name, m in metrics.items():
        if not m["ok"]:
            lines.append(f"{indent}{name}: {m['bad']}/{m['numel']} out of tolerance, max|err| "
                         f"{m['max_abs_err']:.3e}, max|ref| {m['max_ref']:.3e}, non-finite "
                         f"mismatches {m['nonfinite_mismatch']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Independent sections
# ---------------------------------------------------------------------------
class Sections:
    """Runs named sections; an exception or a False/nonzero return marks the
    section failed, prints the traceback and goes on. summary() prints one
    line per section and returns the exit status (0 = all passed)."""

    def __init__(self):
        self.results = []  # (name, status, seconds, note)

    def run(self, name, fn, *args, **kwargs):
        print(f"\n=== {name} ===", flush=True)
        t0 = time.time()
        note = ""
        try:
            ret = fn(*args, **kwargs)
            if isinstance(ret, tuple):
                ret, note = ret
            ok = ret is None or ret is True or ret == 0
            status = "PASS" if ok else "FAIL"
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            status, note = "ERROR", f"{type(e).__name__}: {str(e).strip()[:300]}"
            ret = None
        dt = time.time() - t0
        self.results.append((name, status, dt, note))
        print(f"=== {name}: {status} ({dt:.1f} s){' - ' + note if note else ''}", flush=True)
        return ret

    def failed(self):
        return [r for r in self.results if r[1] != "PASS"]

    def summary(self, title="Summary"):
        print(f"\n## {title}")
        w = max([len(r[0]) for r in self.results] + [7])
        for name, status, dt, note in self.results:
            print(f"  {name:<{w}}  {status:<5} {dt:7.1f} s  {note}")
        bad = self.failed()
        print("ALL PASSED" if not bad else f"FAILED: {len(bad)} of {len(self.results)} sections")
        sys.stdout.flush()
        return 1 if bad else 0


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------
def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


# ---------------------------------------------------------------------------
# Timing of jitted JAX functions (wall clock)
# ---------------------------------------------------------------------------
def time_jax(fn, args, reps=20, min_ms=1.0, max_n=100000):
    """Median microseconds per call of fn(*args): n back-to-back calls, then
    jax.block_until_ready on the last result, n chosen so that one
    measurement lasts >= min_ms; median over reps measurements. The first
    call (compilation) is not timed. Async dispatch overlaps the host's
    dispatch of call k+1 with the device's work of call k, so this is the
    steady-state cost per call, including dispatch when that dominates."""
    import jax

    out = fn(*args)  # compile
    jax.block_until_ready(out)
    # warm up: at least 5 calls and 50 ms (clocks, lazy module loading)
    t_end = time.perf_counter() + 0.05
    k = 0
    while k < 5 or time.perf_counter() < t_end:
        out = fn(*args)
        jax.block_until_ready(out)
        k += 1
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        ms = (time.perf_counter() - t0) * 1e3
        if ms >= min_ms or n >= max_n:
            break
        n = min(max_n, max(2 * n, int(n * min_ms * 1.2 / max(ms, 1e-3)) + 1))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) * 1e6 / n)
    del out
    return {"us": statistics.median(samples), "n": n, "method": "wall"}


# ---------------------------------------------------------------------------
# Timing of torch work (CUDA events; graph replay where capture works)
# ---------------------------------------------------------------------------
def _time_loop(run, reps, min_ms, max_n=100000):
    """Median microseconds per run() over reps measurements, each n back-to-back
    calls between two CUDA events with n chosen so one measurement >= min_ms."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    n = 1
    while True:
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        if ms >= min_ms or n >= max_n:
            break
        n = min(max_n, max(2 * n, int(n * min_ms * 1.2 / max(ms, 1e-3)) + 1))
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / n)
    return statistics.median(samples), n


def measure(fn, reps, min_ms, warmup=3):
    """Times fn (no arguments, enqueues GPU work on the current stream).
    Returns dict: us (graph replay if capture worked, else eager), method,
    eager_us, graph_us, copies, graph_error."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    eager_us, eager_n = _time_loop(fn, reps, min_ms)
    res = {"eager_us": eager_us, "eager_n": eager_n, "graph_us": None, "copies": 0,
           "graph_error": None}
    copies = int(max(1, min(20, math.ceil(2000.0 / max(eager_us, 1e-3)))))
    graph = None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(copies):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        graph_us, graph_n = _time_loop(graph.replay, reps, min_ms)
        res.update(graph_us=graph_us / copies, graph_n=graph_n, copies=copies)
    except Exception as e:  # capture refused or invalidated: keep the eager figure
        res["graph_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    finally:
        del graph
        torch.cuda.empty_cache()
    if res["graph_us"] is not None:
        res.update(us=res["graph_us"], method="graph")
    else:
        res.update(us=eager_us, method="eager")
    return res
