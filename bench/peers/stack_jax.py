#!/usr/bin/env python3
"""A model-sized figure under JAX (issues 6 and 7): a 2-layer MinGRU stack
with the scan as an XLA FFI call to ExPhil.Native, against lax.scan and
lax.associative_scan.

The model
---------
B 1, T 32, embedding E 256, hidden H 256 by default (the shape of issue 6's
figure, a batch of one 32-frame window):

    h = x @ W_in + b_in                                   # Dense E -> H
    per layer (2):
        u    = layer_norm(h) * ln_scale + ln_bias         # statistics in f32
        gate = u @ W_gate + b_gate                        # Dense H -> H
        cand = u @ W_cand + b_cand                        # Dense H -> H
        y    = min_gru_scan(gate, cand, h0 = 0)           # [B, T, H]
        h    = h + y                                      # residual
    out = h

Parameters, activations and the residual stream are in the run's dtype (f32
or bf16); dots use Precision.HIGHEST (true f32 for f32, no TF32) so that the
variants' agreement check is meaningful (--precision default times them as
JAX does by default instead: TF32 for f32); the scan computes in f32 in all
three variants and rounds y to the dtype. Three variants share the
parameters and differ only in the scan:

    ffi     exphil_jax.scan("min_gru", ...)  (exphil_min_gru_fwd / _bwd)
    scan    jax_reference.scan_ref             (lax.scan over time)
    assoc   jax_reference.scan_assoc           (lax.associative_scan)

Inference = the jitted forward; training step = the jitted
value_and_grad of 0.5 * mean((out - target)^2) (f32) w.r.t. every parameter.

What is measured
----------------
Before any timing, the three variants' outputs (and, for training, loss and
every parameter gradient) are compared: |a - b| <= atol * max|b| +
rtol * |b| against the lax.scan variant, (atol, rtol) = (1e-4, 1e-4) f32,
(3e-2, 2e-2) bf16. A failure is reported and makes the exit status nonzero;
the timings still run.

* latency: median (and p10/p90/min) over many calls, each call followed by
  block_until_ready: what one synchronous call costs, dispatch included.
  Every candidate is first called for --warmup-s seconds; the candidates
  compared with each other (the three variants; the K values below) are then
  timed interleaved, in rounds that each take a slice of every candidate's
  calls, with Python's GC off, so that a drift of the machine (clocks, other
  load) hits them alike. Single-call latencies on these machines vary from
  run to run by tens of microseconds (host-side wake-up after the wait):
  compare figures from one run, and look at p10 as well as the median.
* bounds (inference only, timed in the same rounds): "noscan", the stack
  with the scan replaced by y = cand (XLA then drops the gate's dense layer
  as dead code, so this bound lacks one product per layer too); "cell",
  the scan replaced by y = sigmoid(gate) * cand (every dense layer kept,
  only the recurrence missing: what XLA's own ops around the scan cost);
  and "floor", a
  jit of one elementwise op on the same arguments: what XLA and JAX cost
  per call before any scan runs.
* weights closed over (inference only, same rounds): "ffi-c", "assoc-c",
  "cell-c" and "floor-c" are the same functions jitted with the parameters
  closed over, so that XLA holds them as constants of the executable and a
  call passes x alone: how a fixed model answers frame after frame. The
  plain rows pass the 14 parameter arrays with every call, and JAX's
  dispatch cost grows with the arguments. "ffi-c" is checked against the
  lax.scan variant like the others.
* pipelined: --calls (100) calls dispatched back to back, then one block;
  wall time / calls, median over --pipe-reps repetitions. The gap to the
  latency is the per-call synchronisation and host round trip; what
  remains is dispatch plus device time.
* kernel share: a jit that runs the FFI scan K times in sequence with a
  data dependency (the forward's y becomes the next gate; the backward's
  grad_gate becomes the next grad_y, so values decay towards zero, which
  does not change the kernels' work), timed for several K; the least-squares
  slope is the cost of one FFI call inside a compiled program (the larger of
  its GPU time and XLA's host-side cost to launch it, as in the stack). The
  stack runs 2 forward calls per inference and 2 forward + 2 backward per
  training step; their share of the stack's latency is reported. The
  profiler is kept out of these timings (it slows every call by 30 to 60
  us); stack_profile.py splits single calls with it instead.
* frame budget: each latency as a share of 16.67 ms (60 Hz); the issue-7
  target is < 100 us per inference call on H100/H200.
* T sweep (f32; --sweep-train adds the training step): the stack latency of
  the three variants for T = 1, 2, 4, ..., 4096 (each point's outputs
  checked first), saved with everything else to --json.

Run (GPU machine with jax + the CUDA plugin; build the FFI library first):

    python3 bench/peers/stack_jax.py [--quick] [--json out.json] [--placement]
           [--lib build-gpu/c_src/xla_ffi/libexphil_xla_ffi.so]

--placement has XLA dump the FFI stack's modules and reports whether the
scans are commands of XLA's command buffers (CUDA graphs); the FFI variant's
scan passes no h0 (a zero state costs no fill) and, in training, no
gradient of the unused final state.

Exit status 0 only if every section ran and every agreement check passed.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import exphil_jax  # noqa: E402
import jax_reference  # noqa: E402
import peer_util as pu  # noqa: E402

FRAME_BUDGET_US = 1e6 / 60.0
ISSUE7_TARGET_US = 100.0
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
TOL = {"f32": (1e-4, 1e-4), "bf16": (3e-2, 2e-2), "f16": (5e-3, 5e-3)}
LN_EPS = 1e-5
HIGHEST = lax.Precision.HIGHEST
# --precision: the dense layers' lax.Precision (None is XLA's default: TF32
# products for f32 on Ampere and later), and the f32 tolerance that goes
# with it (TF32 rounds the products' inputs to 10 mantissa bits, so the
# variants' f32 results agree to about 1e-3, not 1e-4).
PRECISIONS = {"highest": (HIGHEST, TOL["f32"]), "default": (None, (3e-3, 3e-3))}
DENSE_PRECISION = HIGHEST


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------
def init_params(seed, embed=256, hidden=256, layers=2, dtype=jnp.float32):
    """Parameters as a pytree of jnp arrays in `dtype`, drawn from a numpy
    generator (the same seed gives the same values in every dtype, rounded)."""
    rng = np.random.default_rng(seed)

    def arr(a):
        return jnp.asarray(np.asarray(a, np.float32), dtype)

    p = {
        "w_in": arr(rng.standard_normal((embed, hidden)) / math.sqrt(embed)),
        "b_in": arr(0.1 * rng.standard_normal(hidden)),
        "layers": [],
    }
    for _ in range(layers):
        p["layers"].append({
            "ln_scale": arr(1.0 + 0.1 * rng.standard_normal(hidden)),
            "ln_bias": arr(0.1 * rng.standard_normal(hidden)),
            "w_gate": arr(rng.standard_normal((hidden, hidden)) / math.sqrt(hidden)),
            "b_gate": arr(0.1 * rng.standard_normal(hidden)),
            "w_cand": arr(rng.standard_normal((hidden, hidden)) / math.sqrt(hidden)),
            "b_cand": arr(0.1 * rng.standard_normal(hidden)),
        })
    return p


def make_inputs(seed, batch, seq, embed, hidden, dtype):
    rng = np.random.default_rng(seed + 1)
    x = jnp.asarray(rng.standard_normal((batch, seq, embed)).astype(np.float32), dtype)
    target = jnp.asarray(rng.standard_normal((batch, seq, hidden)).astype(np.float32), dtype)
    return x, target


def cast_params(params, dtype):
    return jax.tree_util.tree_map(lambda a: a.astype(dtype), params)


def layer_norm(h, scale, bias):
    hf = h.astype(jnp.float32)
    mean = jnp.mean(hf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(hf - mean), axis=-1, keepdims=True)
    u = (hf - mean) * lax.rsqrt(var + LN_EPS)
    return u.astype(h.dtype) * scale + bias


def dense(u, w, b):
    return jnp.matmul(u, w, precision=DENSE_PRECISION) + b


def scan_ffi(gate, cand):
    y, _ = exphil_jax.scan("min_gru", (gate, cand))  # h0 = 0: nothing to fill
    return y


def scan_lax(gate, cand):
    y, _ = jax_reference.scan_ref("min_gru", (gate, cand), None)
    return y


def scan_assoc(gate, cand):
    y, _ = jax_reference.scan_assoc("min_gru", (gate, cand), None)
    return y


def scan_none(gate, cand):
    return cand


def scan_cell(gate, cand):
    return jax.nn.sigmoid(gate) * cand


VARIANTS = {"ffi": scan_ffi, "scan": scan_lax, "assoc": scan_assoc}
REFERENCE_VARIANT = "scan"
# Timed beside the inference variants, as bounds: what the stack costs with
# no scan at all (y = cand), and what any jitted call of one elementwise op
# costs (dispatch, launch and the wait), on the same arguments.
BOUNDS = {"noscan": "stack, y = cand", "cell": "stack, y = sigmoid(gate) * cand",
          "floor": "one-op jit", "assoc-c": "assoc, weights closed over",
          "cell-c": "cell, weights closed over", "floor-c": "one-op jit of x alone"}
# The variant whose inference is held against issue 7's target, in both forms.
TARGET_VARIANTS = ("ffi", "ffi-c")


def stack_forward(params, x, scan_fn):
    h = dense(x, params["w_in"], params["b_in"])
    for lp in params["layers"]:
        u = layer_norm(h, lp["ln_scale"], lp["ln_bias"])
        gate = dense(u, lp["w_gate"], lp["b_gate"])
        cand = dense(u, lp["w_cand"], lp["b_cand"])
        h = h + scan_fn(gate, cand).astype(h.dtype)
    return h


def stack_loss(params, x, target, scan_fn):
    out = stack_forward(params, x, scan_fn).astype(jnp.float32)
    return 0.5 * jnp.mean(jnp.square(out - target.astype(jnp.float32)))


def make_closed_inference(params, scan_fn, name):
    """The jitted inference with `params` closed over (constants of the
    executable): a call takes x alone. Named jit_stack_<name>_inference."""
    def inference(x):
        return stack_forward(params, x, scan_fn)
    inference.__name__ = f"stack_{name}_inference"
    return jax.jit(inference)


def make_fns(scan_fn, name="stack"):
    """(inference, training step), jitted; named so that XLA's modules are
    jit_stack_<name>_inference and jit_stack_<name>_train."""
    def inference(p, x):
        return stack_forward(p, x, scan_fn)

    def train(p, x, t):
        return jax.value_and_grad(lambda p, x, t: stack_loss(p, x, t, scan_fn))(p, x, t)
    inference.__name__, train.__name__ = f"stack_{name}_inference", f"stack_{name}_train"
    return jax.jit(inference), jax.jit(train)


# What y becomes in each stack the tables time: the three variants, then the
# bounds (BOUNDS).
SCAN_FNS = {**VARIANTS, "noscan": scan_none, "cell": scan_cell}
# Every inference candidate_inferences() builds.
CANDIDATE_NAMES = tuple(SCAN_FNS) + tuple(f"{n}-c" for n in SCAN_FNS) + ("floor", "floor-c")


def candidate_inferences(params, x, names):
    """{name: (jitted inference, its arguments)} for each of `names`
    (CANDIDATE_NAMES): a SCAN_FNS name is that stack on (params, x); with
    "-c", the same with the parameters closed over, on x alone; "floor" and
    "floor-c" are a jit of one elementwise op on those same arguments."""
    out = {}
    for name in names:
        if name == "floor":
            out[name] = (jax.jit(lambda p, x: x * 2), (params, x))
        elif name == "floor-c":
            out[name] = (jax.jit(lambda x: x * 2), (x,))
        elif name.endswith("-c"):
            base = name[:-2]
            out[name] = (make_closed_inference(params, SCAN_FNS[base], f"{base}_c"), (x,))
        else:
            out[name] = (make_fns(SCAN_FNS[name], name)[0], (params, x))
    return out


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------
def compare_trees(ours, ref, dtype_name, tol_scale=1.0):
    """Per leaf, peer_util.compare: |a - b| <= atol * max|b| + rtol * |b|
    (scaled by tol_scale). Returns (ok, worst_ratio, worst_leaf)."""
    atol, rtol = TOL[dtype_name]
    leaves_o, tree_o = jax.tree_util.tree_flatten(ours)
    leaves_r, tree_r = jax.tree_util.tree_flatten(ref)
    if tree_o != tree_r:
        return False, math.inf, "tree structure differs"
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(ref)[0]]
    worst, where, ok = 0.0, "", True
    for path, a, b in zip(paths, leaves_o, leaves_r):
        m = pu.compare(a, b, tol_scale * rtol, tol_scale * atol)
        if m.get("error"):
            return False, math.inf, f"{path}: {m['error']}"
        r = m["worst"] if not math.isnan(m["worst"]) else math.inf
        if r > worst:
            worst, where = r, path or "(root)"
        ok &= m["ok"]
    return ok, worst, where


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------
def block_ready(x):
    return jax.block_until_ready(x)


def _timed_call(fn, args):
    t0 = time.perf_counter()
    block_ready(fn(*args))
    return time.perf_counter() - t0


class NoGC:
    """Python's cyclic GC off while timing (its pauses land in single calls)."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


def warm_up(cands, warmup_s):
    """Calls each candidate for at least warmup_s (and 3 calls), so that
    clocks and caches are in their steady state; returns one call's time."""
    est = {}
    for name, (fn, args) in cands.items():
        t_end = time.perf_counter() + warmup_s
        k = 0
        while k < 3 or time.perf_counter() < t_end:
            block_ready(fn(*args))
            k += 1
        est[name] = _timed_call(fn, args)
    return est


def time_latency(cands, reps, budget_s, warmup_s, rounds=10):
    """cands: {name: (fn, args)}. Each sample is one call followed by
    block_until_ready. The candidates are interleaved in `rounds` rounds
    (each round takes a slice of every candidate's calls), so that a drift
    of the machine's state hits all of them alike. Calls per candidate:
    reps, cut so that it takes about budget_s (at least 5). Returns {name:
    {median_s, p10_s, p90_s, min_s, n}}."""
    with NoGC():
        est = warm_up(cands, warmup_s)
        n = {k: max(5, min(reps, int(budget_s / max(t, 1e-7)))) for k, t in est.items()}
        samples = {k: [] for k in cands}
        for _ in range(rounds):
            for k, (fn, args) in cands.items():
                for _ in range(math.ceil(n[k] / rounds)):
                    samples[k].append(_timed_call(fn, args))
    out = {}
    for k, ts in samples.items():
        ts.sort()
        m = len(ts)
        out[k] = {"median_s": statistics.median(ts), "p10_s": ts[int(0.1 * (m - 1))],
                  "p90_s": ts[int(0.9 * (m - 1))], "min_s": ts[0], "n": m}
    return out


def time_pipelined(cands, calls, reps):
    """cands: {name: (fn, args)}. `calls` back-to-back dispatches, then one
    block: seconds per call, median over reps (candidates interleaved)."""
    per = {k: [] for k in cands}
    with NoGC():
        for fn, args in cands.values():
            block_ready(fn(*args))
        for _ in range(reps):
            for k, (fn, args) in cands.items():
                t0 = time.perf_counter()
                outs = [fn(*args) for _ in range(calls)]
                block_ready(outs)
                per[k].append((time.perf_counter() - t0) / calls)
                del outs
    return {k: statistics.median(v) for k, v in per.items()}


def make_chain(direction, k):
    """A jit running the FFI min_gru target k times with a data dependency."""
    if direction == "fwd":
        def f(g, c, h0):
            for _ in range(k):
                g, _ = exphil_jax.scan_fwd("min_gru", (g, c), h0, validate=False)
            return g
    else:
        def f(g, c, h0, y, gy, ghf):
            for _ in range(k):
                gy, _, _ = exphil_jax.scan_bwd("min_gru", (g, c), h0, y, gy, ghf, validate=False)
            return gy
    return jax.jit(f)


def kernel_slope(direction, dtype, batch, seq, hidden, ks, reps, budget_s, warmup_s, seed):
    rng = np.random.default_rng(seed + 7)
    g = jnp.asarray(rng.standard_normal((batch, seq, hidden)).astype(np.float32), dtype)
    c = jnp.asarray(rng.standard_normal((batch, seq, hidden)).astype(np.float32), dtype)
    h0 = jnp.zeros((batch, hidden), jnp.float32)
    if direction == "fwd":
        args = (g, c, h0)
    else:
        y, _ = exphil_jax.scan_fwd("min_gru", (g, c), h0)
        gy = jnp.asarray(rng.standard_normal((batch, seq, hidden)).astype(np.float32), dtype)
        args = (g, c, h0, y, gy, jnp.zeros((batch, hidden), jnp.float32))
    cands = {k: (make_chain(direction, k), args) for k in ks}
    lat = time_latency(cands, reps, budget_s, warmup_s)
    points = [(k, lat[k]["median_s"]) for k in ks]
    xs = np.array([p[0] for p in points], np.float64)
    ts = np.array([p[1] for p in points], np.float64)
    slope, intercept = np.polyfit(xs, ts, 1) if len(points) > 1 else (ts[0], 0.0)
    return {"per_call_s": float(slope), "intercept_s": float(intercept),
            "points": [{"k": int(k), "median_s": float(t)} for k, t in points]}


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------
def us(s):
    return s * 1e6


def verify(params, x, target, dtype_name, modes, fns, tol_scale):
    """Runs every variant once and compares with the lax.scan variant.
    Returns {mode: {variant: {ok, worst_ratio, where}}} and overall ok."""
    out, all_ok = {}, True
    for mode in modes:
        res = {}
        for v, (fwd, train) in fns.items():
            if mode == "inference":
                res[v] = block_ready(fwd(params, x))
            else:
                res[v] = block_ready(train(params, x, target))
        ref = res[REFERENCE_VARIANT]
        out[mode] = {}
        for v in fns:
            if v == REFERENCE_VARIANT:
                continue
            ok, worst, where = compare_trees(res[v], ref, dtype_name, tol_scale)
            out[mode][v] = {"ok": bool(ok), "worst_ratio": worst, "where": where}
            all_ok &= ok
    return out, all_ok


def report_placement(dn, results):
    """With --placement: whether XLA made the FFI scans commands of its
    command buffers (CUDA graphs) or runs them as thunks between graphs."""
    dump = os.environ.get("EXPHIL_STACK_DUMP")
    if not dump:
        return
    for mode in ("inference", "train"):
        targets = ["exphil_min_gru_fwd"] + (["exphil_min_gru_bwd"] if mode == "train" else [])
        placement = exphil_jax.command_buffer_placement(dump, f"jit_stack_ffi_{mode}", targets)
        inside = all(t in placement and all(i for _, i in placement[t]) for t in targets)
        results["placement"][f"{dn} {mode}"] = {"in_command_buffers": inside, "calls": placement}
        print(f"{dn} {mode}: FFI scans {'inside' if inside else 'NOT all inside'} XLA's command buffers "
              f"{placement}")


def section_main_table(args, results, failures):
    print(f"\n== Stack B{args.batch} T{args.seq} E{args.embed} H{args.hidden} "
          f"layers {args.layers}: latency per call (us) ==")
    header = (f"{'dtype':5} {'mode':9} {'variant':7} {'median':>9} {'p10':>9} {'p90':>9} "
              f"{'pipelined':>10} {'%frame':>7}  check")
    print(header)
    print("-" * len(header))
    for dn in args.dtypes:
        dtype = DTYPES[dn]
        try:
            params = init_params(args.seed, args.embed, args.hidden, args.layers, dtype)
            x, target = make_inputs(args.seed, args.batch, args.seq, args.embed, args.hidden, dtype)
            fns = {v: make_fns(f, v) for v, f in VARIANTS.items()}
            checks, ok = verify(params, x, target, dn, ("inference", "train"), fns, args.tol_scale)
            if not ok:
                failures.append(f"{dn}: variants disagree: {checks}")
            report_placement(dn, results)
            # The bounds and the closed-over forms, in the table's order.
            extra = candidate_inferences(params, x, ("noscan", "cell", "floor", "ffi-c", "assoc-c",
                                                     "cell-c", "floor-c"))
            ref = block_ready(fns[REFERENCE_VARIANT][0](params, x))
            ok, worst, where = compare_trees(block_ready(extra["ffi-c"][0](x)), ref, dn, args.tol_scale)
            checks["inference"]["ffi-c"] = {"ok": bool(ok), "worst_ratio": worst, "where": where}
            if not ok:
                failures.append(f"{dn}: ffi-c disagrees with {REFERENCE_VARIANT}: {worst} at {where}")
            for mode in ("inference", "train"):
                cands = {v: ((fwd, (params, x)) if mode == "inference" else (train, (params, x, target)))
                         for v, (fwd, train) in fns.items()}
                if mode == "inference":
                    cands.update(extra)
                lats = time_latency(cands, args.reps, args.budget, args.warmup_s)
                pipes = time_pipelined(cands, args.calls, args.pipe_reps)
                for v in cands:
                    lat, pipe = lats[v], pipes[v]
                    chk = checks[mode].get(v)
                    chk_s = BOUNDS[v] if v in BOUNDS else "ref" if chk is None else (
                        f"{'ok' if chk['ok'] else 'FAIL'} ({chk['worst_ratio']:.2g})")
                    row = {"dtype": dn, "mode": mode, "variant": v,
                           "median_us": us(lat["median_s"]), "p10_us": us(lat["p10_s"]),
                           "p90_us": us(lat["p90_s"]), "min_us": us(lat["min_s"]), "n": lat["n"],
                           "pipelined_us": us(pipe),
                           "frame_share": lat["median_s"] * 1e6 / FRAME_BUDGET_US,
                           "check": chk}
                    results["table"].append(row)
                    print(f"{dn:5} {mode:9} {v:7} {row['median_us']:9.1f} {row['p10_us']:9.1f} "
                          f"{row['p90_us']:9.1f} {row['pipelined_us']:10.1f} "
                          f"{100 * row['frame_share']:6.2f}%  {chk_s}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            failures.append(f"main table {dn}: {type(e).__name__}: {e}")
            print(f"{dn}: FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()


def section_kernel_share(args, results, failures):
    print("\n== FFI scan inside a jit: cost per call (slope over K chained calls) ==")
    ks = (1, 8) if args.quick else (1, 4, 16, 32)
    for dn in args.dtypes:
        dtype = DTYPES[dn]
        try:
            share = {"dtype": dn}
            for direction in ("fwd", "bwd"):
                share[direction] = kernel_slope(direction, dtype, args.batch, args.seq,
                                                args.hidden, ks, args.reps, args.budget,
                                                args.warmup_s, args.seed)
            fwd_us, bwd_us = us(share["fwd"]["per_call_s"]), us(share["bwd"]["per_call_s"])
            rows = {r["mode"]: r for r in results["table"] if r["dtype"] == dn and r["variant"] == "ffi"}
            line = (f"{dn}: forward {fwd_us:.1f} us/call, backward {bwd_us:.1f} us/call "
                    f"(K = {', '.join(map(str, ks))})")
            if "inference" in rows:
                inf = rows["inference"]["median_us"]
                share["inference_share"] = args.layers * fwd_us / inf
                line += (f"; inference: {args.layers} x fwd = {args.layers * fwd_us:.1f} us of "
                         f"{inf:.1f} us ({100 * share['inference_share']:.1f}%)")
            if "train" in rows:
                tr = rows["train"]["median_us"]
                share["train_share"] = args.layers * (fwd_us + bwd_us) / tr
                line += (f"; training: {args.layers} x (fwd + bwd) = "
                         f"{args.layers * (fwd_us + bwd_us):.1f} us of {tr:.1f} us "
                         f"({100 * share['train_share']:.1f}%)")
            print(line, flush=True)
            results["kernel_share"].append(share)
        except Exception as e:  # noqa: BLE001
            failures.append(f"kernel share {dn}: {type(e).__name__}: {e}")
            print(f"{dn}: FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()


def section_targets(args, results):
    print("\n== Budgets ==")
    print(f"frame budget {FRAME_BUDGET_US:.0f} us (60 Hz); issue-7 target < {ISSUE7_TARGET_US:.0f} us "
          f"per inference call (FFI variant)")
    for r in results["table"]:
        if r["mode"] != "inference" or r["variant"] not in TARGET_VARIANTS:
            continue
        ok = r["median_us"] < ISSUE7_TARGET_US
        results["targets"].append({"dtype": r["dtype"], "variant": r["variant"],
                                   "median_us": r["median_us"], "meets_issue7_target": ok})
        print(f"{r['dtype']}: {r['variant']} inference {r['median_us']:.1f} us "
              f"(p10 {r['p10_us']:.1f}) = "
              f"{100 * r['frame_share']:.2f}% of a frame; issue-7 target "
              f"{'met' if ok else 'NOT met'}")
    for dn in args.dtypes:
        by = {(r["mode"], r["variant"]): r for r in results["table"] if r["dtype"] == dn}
        for mode in ("inference", "train"):
            if (mode, "ffi") not in by:
                continue
            base = by[(mode, "ffi")]["median_us"]
            parts = [f"{v} {by[(mode, v)]['median_us'] / base:.1f}x"
                     for v in ("scan", "assoc") if (mode, v) in by]
            print(f"{dn} {mode}: ffi {base:.1f} us; relative to it: {', '.join(parts)}")


def section_sweep(args, results, failures):
    modes = ("inference", "train") if args.sweep_train else ("inference",)
    print(f"\n== T sweep, f32, B{args.batch} E{args.embed} H{args.hidden}: latency (us), "
          f"{' and '.join(modes)} ==")
    header = f"{'T':>5} {'mode':9} " + " ".join(f"{v:>10}" for v in VARIANTS) + "  check"
    print(header)
    print("-" * len(header))
    dtype = jnp.float32
    params = init_params(args.seed, args.embed, args.hidden, args.layers, dtype)
    fns = {v: make_fns(f, v) for v, f in VARIANTS.items()}
    for t in args.sweep:
        try:
            x, target = make_inputs(args.seed, args.batch, t, args.embed, args.hidden, dtype)
            checks, ok = verify(params, x, target, "f32", modes, fns, args.tol_scale)
            if not ok:
                failures.append(f"sweep T={t}: variants disagree: {checks}")
            for mode in modes:
                point = {"T": t, "mode": mode, "check": checks[mode]}
                cells = []
                cands = {v: ((fwd, (params, x)) if mode == "inference" else (train, (params, x, target)))
                         for v, (fwd, train) in fns.items()}
                lats = time_latency(cands, args.sweep_reps, args.budget, args.warmup_s, rounds=5)
                for v in fns:
                    lat = lats[v]
                    point[f"{v}_median_us"] = us(lat["median_s"])
                    point[f"{v}_p10_us"] = us(lat["p10_s"])
                    point[f"{v}_p90_us"] = us(lat["p90_s"])
                    cells.append(f"{us(lat['median_s']):10.1f}")
                chk = " ".join(f"{v}:{'ok' if c['ok'] else 'FAIL'}" for v, c in checks[mode].items())
                print(f"{t:5d} {mode:9} " + " ".join(cells) + f"  {chk}", flush=True)
                results["sweep"].append(point)
        except Exception as e:  # noqa: BLE001
            failures.append(f"sweep T={t}: {type(e).__name__}: {e}")
            print(f"{t:5d}: FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=None, help="libexphil_xla_ffi.so (default $EXPHIL_XLA_FFI_LIB, "
                   "else build-gpu/c_src/xla_ffi/libexphil_xla_ffi.so)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and sweep points")
    p.add_argument("--json", default=None, help="write every figure to this JSON file")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--reps", type=int, default=None, help="timed calls per latency (default 300, quick 50)")
    p.add_argument("--warmup-s", type=float, default=None,
                   help="seconds of calls per candidate before timing (default 0.3, quick 0.1)")
    p.add_argument("--calls", type=int, default=100, help="back-to-back calls per pipelined figure")
    p.add_argument("--pipe-reps", type=int, default=None, help="pipelined repetitions (default 7, quick 3)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds per latency measurement at most (default 3, quick 1)")
    p.add_argument("--sweep", default=None, help="comma-separated T values "
                   "(default 1,2,4,...,4096; quick 1,32,512,4096)")
    p.add_argument("--sweep-reps", type=int, default=None, help="timed calls per sweep point "
                   "(default 50, quick 15)")
    p.add_argument("--sweep-train", action="store_true", help="also sweep the training step")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--tol-scale", type=float, default=1.0)
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="highest",
                   help="the dense layers' precision: highest (true f32 products, the default) or "
                        "default (XLA's choice: TF32 products for f32 on Ampere and later); the "
                        "f32 agreement tolerance follows it")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--placement", action="store_true",
                   help="dump the FFI stack's XLA modules and report whether the scans run inside "
                        "XLA's command buffers (CUDA graphs)")
    a = p.parse_args(argv)
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    bad = [d for d in a.dtypes if d not in DTYPES]
    if bad:
        p.error(f"unknown dtypes {bad} (expected {list(DTYPES)})")
    a.reps = a.reps or (50 if a.quick else 300)
    a.pipe_reps = a.pipe_reps or (3 if a.quick else 7)
    a.budget = a.budget or (1.0 if a.quick else 3.0)
    a.warmup_s = a.warmup_s if a.warmup_s is not None else (0.1 if a.quick else 0.3)
    a.sweep_reps = a.sweep_reps or (15 if a.quick else 50)
    if a.sweep:
        a.sweep = [int(t) for t in a.sweep.split(",") if t.strip()]
    else:
        a.sweep = [1, 32, 512, 4096] if a.quick else [2 ** i for i in range(13)]
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "little") % 1_000_000
    return a


def main(argv=None):
    global DENSE_PRECISION
    args = parse_args(argv)
    DENSE_PRECISION, TOL["f32"] = PRECISIONS[args.precision]
    failures = []
    if args.placement:
        # Read when JAX creates its GPU backend, below.
        dump = tempfile.mkdtemp(prefix="exphil_stack_dump_")
        os.environ["EXPHIL_STACK_DUMP"] = dump
        os.environ["XLA_FLAGS"] = " ".join(
            [os.environ.get("XLA_FLAGS", ""), exphil_jax.placement_dump_flags(dump, "jit_stack_ffi_.*")]).strip()
    dev = jax.devices()[0]
    print(f"stack_jax: jax {jax.__version__}, device {dev.platform}:{dev.device_kind}, "
          f"python {platform.python_version()}, seed {args.seed}, dense precision {args.precision}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    results = {"config": {k: v for k, v in vars(args).items()},
               "jax": jax.__version__, "device": dev.device_kind, "platform": dev.platform,
               "xla_flags": os.environ.get("XLA_FLAGS", ""), "placement": {},
               "table": [], "kernel_share": [], "targets": [], "sweep": [], "failures": failures}
    try:
        exphil_jax.load(args.lib)
        print(f"library {exphil_jax.loaded_path()}: {len(exphil_jax.registered_targets())} targets "
              f"registered" + (f", missing {list(exphil_jax.missing_targets())}"
                               if exphil_jax.missing_targets() else ""))
        if dev.platform != "gpu":
            print("note: the default device is not a GPU; the FFI targets are registered for CUDA only")
    except Exception as e:  # noqa: BLE001
        failures.append(f"load: {type(e).__name__}: {e}")
        print(f"FAILED to load the library: {e}")

    section_main_table(args, results, failures)
    try:
        section_kernel_share(args, results, failures)
    except Exception as e:  # noqa: BLE001
        failures.append(f"kernel share: {type(e).__name__}: {e}")
    try:
        section_targets(args, results)
    except Exception as e:  # noqa: BLE001
        failures.append(f"targets: {type(e).__name__}: {e}")
    if not args.no_sweep:
        try:
            section_sweep(args, results, failures)
        except Exception as e:  # noqa: BLE001
            failures.append(f"sweep: {type(e).__name__}: {e}")
            traceback.print_exc()

    if args.json:
        try:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
            print(f"\nwrote {args.json}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"json: {type(e).__name__}: {e}")
    print(f"\n{len(failures)} failure(s)" + ("" if not failures else ":"))
    for f in failures:
        print(f"  - {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
