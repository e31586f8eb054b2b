#!/usr/bin/env python3
"""Checks the XLA FFI targets of libexphil_xla_ffi.so from JAX (issue 7).

What
----
Registers every target by pointer (bench/peers/exphil_jax.py: ctypes.CDLL,
then jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn),
platform="CUDA")) and, inside jax.jit, runs each op forward and backward
(jax.vjp with random cotangents) through the custom_vjp wrappers, comparing
with the pure-JAX references of bench/peers/jax_reference.py evaluated in
float64 (jax_enable_x64) on the same inputs, rounded to the case's dtype
first so that both sides see identical values. Sections, each independent
(a failure is reported and the rest still runs):

  scans      linear_scan, min_gru, min_lstm, liquid x f32/bf16/f16: fixed
             edge shapes (T = 1, H = 1, odd H, H not a multiple of 4) and
             random ones; h0 in f32 or the sequence dtype, or absent (zeros);
             cotangents of y and of h_final; plus one jax.vmap case.
  selective  selective_scan x f32/bf16/f16 with options off, all on, and
             mixes (softplus, clamp, dt_bias, D, z, h0), N from 1 to 256, T
             past the backward's shared-memory checkpoint range; half the
             cases take a cotangent of h_final, half leave h_final unused
             (the wrapper then passes the target a zero-element
             grad_h_final).
  attention  every dtype x mask (none, causal, window) x layout (BHTD,
             BTHD) x GQA ratio (1, 2, 4), random B/H/T/S/d/window/scale,
             plus edge cases (T = 1, S = 1, T > S under causal so that rows
             see no key, window 1, window > S); cotangent of o only (lse
             unused) or of both o and lse (the wrapper's extra pass).
  gated      the GRU, LSTM and sLSTM targets, exphil_{gru,lstm,slstm}_fwd and _bwd,
             and the stacks', exphil_{gru,lstm}_stack_fwd and _bwd (2 to 4
             layers, every optional operand or none, against the stack of
             the float64 layers and its jax.vjp)
             (registered here by pointer, as exphil_jax does the others), f32/
             bf16/f16, R and the states in f32 or the sequence dtype: the
             forward, then the backward on its y, in one jit, against jax.vjp
             of a float64 GRU/LSTM (exphil/gated_rnn.hpp's math; grad_rh as
             the gradient of a zero added to h R + bias); the optional
             operands (bias, h0, c0, the final states' cotangents) all
             present, all absent and mixed, absent ones passed as
             zero-element buffers (JAX's way) or as scalars with has_* =
             false (Nx's way); T = 1, H = 1, B past a batch tile of 32, H past
             a block's 256 columns; and a bad R, named by the handler. The
             sLSTM (states h, c, n, m; n0 in [1, 2]) against jax.vjp of a
             float64 slstm_scan_fallback; in f32 with the cotangents of all
             four final states (inputs redrawn until no step is within 2e-5
             of a tie of m's max()), in f16/bf16 of h_final alone.
  errors     bad calls must raise a Python exception whose message names the
             problem: the Python-side validation (mismatched T between gate
             and candidate, float64 inputs) and the handlers' own checks,
             reached with validate=False (mismatched T, float64, head width
             48, selective-scan N = 300); after each, a good call must still
             run and match the reference (the process survives).
  graphs     (with --graphs) where XLA put each target: for every op
             family, forward and backward jitted at shapes that need the
             library's temporary memory (T = 2049 scans, the selective-scan
             backward, the attention backward, the GRU and the GRU stack at
             B1 T32, cooperative launches), every exphil custom call must be
             a command of one of XLA's command buffers (read from XLA's
             dump of the thunk sequence), and the results must match the
             reference (the LSTM and the stacks among them).
  stack      jax.grad of a scalar loss through the two-layer MinGRU stack of
             bench/peers/stack_jax.py with the FFI scan against the same
             stack with lax.scan (jax_reference.scan_ref), f32 and bf16:
             every parameter gradient and the loss must agree.

Tolerances
----------
An element passes when |ours - ref| <= tol_scale * (atol * scale + rtol *
|ref|), over the reference's finite entries; non-finite reference entries
(lse = -inf for rows that see no key) must match exactly and NaN in ours
always fails. (atol, rtol) by the output's own dtype:

    scans, selective scan    f32 (1e-4, 1e-4)   f16 (5e-3, 5e-3)   bf16 (3e-2, 2e-2)
    attention o              f32 (1e-4, 1e-4)   f16 (5e-3, 5e-3)   bf16 (1e-2, 1e-2)
    attention lse (f32)      f32 (1e-5, 1e-5)   f16 (1e-3, 1e-3)   bf16 (2e-3, 2e-3)
    attention gradients      f32 (2e-4, 2e-4)   f16 (1e-2, 1e-2)   bf16 (2e-2, 2e-2)
    stack (loss, gradients)  f32 (1e-4, 1e-4)                      bf16 (3e-2, 2e-2)
    GRU and LSTM             f32 (1e-4, 1e-4)   f16 (5e-3, 5e-3)   bf16 (4e-2, 3e-2)

scale: GRU and LSTM as test/gpu/test_gated_rnn.cpp: y and h_final share
max(|y_ref|, |h_final_ref|, |h0|), c_final max(|c_final_ref|, |c0|); the
gradients the largest of grad_wx, grad_rh, grad_h0 and grad_c0, and grad_R and
grad_bias (sums over batch and time) at least the largest sum of their terms'
magnitudes; an f32 weight or state output of a half-precision call is held to
that dtype's tolerance. Scans: y and h_final share max(|y_ref|, |h_final_ref|), the input
gradients and grad_h0 share the largest reference gradient of the call (the
backward rebuilds its states from y, rounded to the dtype, so its error is
relative to the states and gradients, not to each element). Selective scan
and stack: each tensor's own max|ref| (f32 outputs of a half-precision call
owe f32 accuracy: every state and sum is f32 and the reference shares the
rounded inputs). Attention: o and lse their own max|ref|; gradients
max(max|ref|, |scale| max|dO| max|V| max(|Q|, |K|)) (plus |scale| max|g_lse|
max(|Q|, |K|) with an lse cotangent), the size of their terms, since a
gradient can cancel to zero (S = 1). For f16 outputs the scale is at least
2^-24 / atol (subnormal spacing). Each case prints max err / tol (<= 1
passes) for its worst tensor.

Run (GPU machine, jax with the CUDA plugin; build the library first):

    python3 test/xla_ffi/check_jax_ffi.py [--lib PATH] [--seed N] [--quick]
        [--only SUBSTRING] [--sections scans,selective,attention,gated,errors,stack]
        [--tol-scale X] [--graphs]

--graphs adds --xla_gpu_graph_min_graph_size=1 to XLA_FLAGS before JAX
starts its GPU backend, so that XLA traces every call, even a jit holding
one custom call, into its command buffers (CUDA graphs), and runs the
graphs section; every other section then checks the targets as replayed
from those graphs.

The seed is printed; --seed repeats a run (case names and shapes depend
only on it). Exit status 0 only if every case passed.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)  # the references run in float64

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench" / "peers"))

import exphil_jax as ex  # noqa: E402
import jax_reference as ref  # noqa: E402
import peer_util as pu  # noqa: E402
import stack_jax  # noqa: E402

F64 = jnp.float64
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
DTYPE_KEY = {jnp.dtype(v): k for k, v in DTYPES.items()}

SCAN_TOL = {"f32": (1e-4, 1e-4), "f16": (5e-3, 5e-3), "bf16": (3e-2, 2e-2)}
# GRU and LSTM: test/gpu/test_gated_rnn.cpp's bf16 (a third more than the
# scans', for the gates the backward recomputes from y rounded to bf16).
GATED_TOL = {"f32": (1e-4, 1e-4), "f16": (5e-3, 5e-3), "bf16": (4e-2, 3e-2),
             # f32 at precision 1 (tf32; test/support/tolerance.hpp's line)
             "tf32": (1e-3, 1e-3)}
ATTN_TOL = {
    "f32": {"o": (1e-4, 1e-4), "lse": (1e-5, 1e-5), "grad": (2e-4, 2e-4)},
    "f16": {"o": (5e-3, 5e-3), "lse": (1e-3, 1e-3), "grad": (1e-2, 1e-2)},
    "bf16": {"o": (1e-2, 1e-2), "lse": (2e-3, 2e-3), "grad": (2e-2, 2e-2)},
}


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def key_of(dtype):
    return DTYPE_KEY[jnp.dtype(dtype)]


def np_round(a, dtype):
    """Rounds a float64 numpy array to dtype; returns float64 numpy."""
    return np.asarray(a, np.float64).astype(np.dtype(dtype)).astype(np.float64)


def dev(a, dtype):
    """A device array of dtype from float64 numpy values (rounded)."""
    return jnp.asarray(np.asarray(a, np.float64).astype(np.dtype(dtype)))


def up(x):
    """Exact float64 copy of a device array (for the reference)."""
    return None if x is None else jnp.asarray(x).astype(F64)


def to_np(x):
    x = jnp.asarray(x)
    if x.dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        x = x.astype(jnp.float32)
    return np.asarray(x).astype(np.float64)


def amax(x):
    a = to_np(x)
    a = a[np.isfinite(a)]
    return float(np.max(np.abs(a))) if a.size else 0.0


class Metric:
    def __init__(self, name, ok, ratio, rel, note=""):
        self.name, self.ok, self.ratio, self.rel, self.note = name, ok, ratio, rel, note

    def __str__(self):
        s = f"{self.name} {self.rel:.1e} ({self.ratio:.2g})"
        return s + (f" [{self.note}]" if self.note else "")


def compare(name, ours, reference, tol, dtype, scale=None, tol_scale=1.0):
    """|ours - ref| <= tol_scale * (atol * scale + rtol * |ref|), through
    peer_util.compare. tol is (atol, rtol); dtype the output's dtype (f16
    raises the scale to the subnormal spacing); scale defaults to max|ref|
    over finite entries."""
    atol, rtol = tol
    floor = 0.0 if scale is None else float(scale)
    if jnp.dtype(dtype) == jnp.dtype(jnp.float16):
        floor = max(floor, 2.0 ** -24 / atol)
    m = pu.compare(to_np(ours), to_np(reference), tol_scale * rtol, tol_scale * atol, floor)
    if m.get("error"):
        return Metric(name, False, math.inf, math.inf, m["error"])
    note = []
    if m["nonfinite_mismatch"]:
        note.append(f"{m['nonfinite_mismatch']} non-finite mismatches")
    if m["bad"]:
        note.append(f"{m['bad']}/{m['numel']} out of tolerance")
    return Metric(name, m["ok"], m["worst"], m["rel_err"], ", ".join(note))


def summarize(metrics):
    ok = all(m.ok for m in metrics)
    worst = max(metrics, key=lambda m: (math.inf if math.isnan(m.ratio) else m.ratio))
    bad = [str(m) for m in metrics if not m.ok]
    detail = f"worst {worst.name} err/tol {worst.ratio:.2g}"
    if bad:
        detail += "; FAILED: " + "; ".join(bad)
    return ok, detail


class Runner:
    def __init__(self, args):
        self.args = args
        self.results = []  # (section, name, ok, detail, seconds)

    def case(self, section, name, fn):
        if self.args.only and self.args.only not in name:
            return None
        t0 = time.perf_counter()
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 - a failing case is reported, the rest runs
            ok, detail = False, f"{type(e).__name__}: {first_line(str(e))}"
            if self.args.verbose:
                traceback.print_exc()
        dt = time.perf_counter() - t0
        self.results.append((section, name, ok, detail, dt))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail} ({dt:.1f} s)", flush=True)
        return ok


def first_line(s, limit=400):
    s = s.strip().splitlines()[0] if s.strip() else s
    return s if len(s) <= limit else s[:limit] + "..."


# ---------------------------------------------------------------------------
# Scans
# ---------------------------------------------------------------------------
def scan_inputs(op, rng, shape, dtype):
    b, t, h = shape
    n = rng.standard_normal
    if op == "linear_scan":
        a = rng.uniform(0.5, 1.0, shape) * np.where(rng.random(shape) < 0.1, -1.0, 1.0)
        vals = [a, n(shape)]
    elif op == "min_gru":
        vals = [2.0 * n(shape), n(shape)]
    elif op == "min_lstm":
        vals = [2.0 * n(shape), 2.0 * n(shape), n(shape)]
    elif op == "liquid":
        vals = [rng.uniform(0.5, 5.0, shape), n(shape)]
    else:
        raise AssertionError(op)
    return [dev(v, dtype) for v in vals]


def check_scan_case(op, dtype, shape, h0_kind, seed, tol_scale, vmap=False):
    """h0_kind: 'f32', 'seq' (the sequence dtype) or 'none' (public scan's zeros)."""
    rng = np.random.default_rng(seed)
    b, t, h = shape
    inputs = tuple(scan_inputs(op, rng, shape, dtype))
    state_dtype = jnp.float32 if h0_kind in ("f32", "none") else dtype
    h0 = None if h0_kind == "none" else dev(rng.standard_normal((b, h)), state_dtype)
    gy = dev(rng.standard_normal(shape), dtype)
    ghf = dev(rng.standard_normal((b, h)), state_dtype)

    if h0 is None:
        def ours_fn(inputs, gy, ghf):
            (y, hf), vjp = jax.vjp(lambda i: ex.scan(op, i), inputs)
            (gi,) = vjp((gy, ghf))
            return y, hf, gi, None

        def ref_fn(inputs, gy, ghf):
            (y, hf), vjp = jax.vjp(lambda i: ref.scan_ref(op, i, None), inputs)
            (gi,) = vjp((gy, ghf))
            return y, hf, gi, None
        args_ours, args_ref = (inputs, gy, ghf), (tuple(up(x) for x in inputs), up(gy), up(ghf))
    else:
        def ours_fn(inputs, h0, gy, ghf):
            (y, hf), vjp = jax.vjp(lambda i, s: ex.scan(op, i, s), inputs, h0)
            gi, gh0 = vjp((gy, ghf))
            return y, hf, gi, gh0

        def ref_fn(inputs, h0, gy, ghf):
            (y, hf), vjp = jax.vjp(lambda i, s: ref.scan_ref(op, i, s), inputs, h0)
            gi, gh0 = vjp((gy, ghf))
            return y, hf, gi, gh0
        args_ours = (inputs, h0, gy, ghf)
        args_ref = (tuple(up(x) for x in inputs), up(h0), up(gy), up(ghf))

    if vmap:
        # two independent problems stacked on a new leading axis
        ours_call = jax.jit(jax.vmap(ours_fn))
        ref_call = jax.jit(jax.vmap(ref_fn))
        args_ours = jax.tree_util.tree_map(lambda x: jnp.stack([x, x[::-1]]), args_ours)
        args_ref = jax.tree_util.tree_map(lambda x: jnp.stack([x, x[::-1]]), args_ref)
    else:
        ours_call, ref_call = jax.jit(ours_fn), jax.jit(ref_fn)

    y, hf, gi, gh0 = jax.block_until_ready(ours_call(*args_ours))
    ry, rhf, rgi, rgh0 = jax.block_until_ready(ref_call(*args_ref))

    names = ref.SCAN_OPS[op]
    state_scale = max(amax(ry), amax(rhf))
    grads_ref = list(rgi) + ([rgh0] if rgh0 is not None else [])
    grad_scale = max(amax(g) for g in grads_ref)
    k = key_of(dtype)
    ks = key_of(state_dtype)
    m = [compare("y", y, ry, SCAN_TOL[k], dtype, state_scale, tol_scale),
         compare("h_final", hf, rhf, SCAN_TOL[ks], state_dtype, state_scale, tol_scale)]
    for n_, g, rg in zip(names, gi, rgi):
        m.append(compare(f"grad_{n_}", g, rg, SCAN_TOL[k], dtype, grad_scale, tol_scale))
    if gh0 is not None:
        m.append(compare("grad_h0", gh0, rgh0, SCAN_TOL[ks], state_dtype, grad_scale, tol_scale))
    # dtypes of what the wrapper returns
    if jnp.dtype(y.dtype) != jnp.dtype(dtype) or jnp.dtype(hf.dtype) != jnp.dtype(state_dtype):
        m.append(Metric("dtypes", False, math.inf, math.inf,
                        f"y {y.dtype} (want {jnp.dtype(dtype)}), h_final {hf.dtype} "
                        f"(want {jnp.dtype(state_dtype)})"))
    return summarize(m)


def section_scans(runner, args):
    rng = np.random.default_rng([args.seed, 1])
    fixed = [(1, 1, 1), (2, 5, 3), (1, 64, 256)] if args.quick else \
        [(1, 1, 1), (1, 1, 8), (2, 5, 3), (3, 33, 4), (1, 300, 17), (2, 128, 256), (1, 1000, 64)]
    n_random = 1 if args.quick else 2
    kinds = ("f32", "seq", "none")
    idx = 0
    for op in ref.SCAN_OPS:
        for dn in args.dtypes:
            shapes = list(fixed) + [
                (int(rng.integers(1, 5)), int(rng.integers(1, 600)), int(rng.integers(1, 300)))
                for _ in range(n_random)]
            for shape in shapes:
                h0_kind = kinds[idx % 3]
                seed = int(rng.integers(0, 2 ** 31))
                idx += 1
                name = f"scan {op} {dn} B{shape[0]} T{shape[1]} H{shape[2]} h0={h0_kind}"
                runner.case("scans", name, lambda op=op, dn=dn, shape=shape, h0_kind=h0_kind, seed=seed:
                            check_scan_case(op, DTYPES[dn], shape, h0_kind, seed, args.tol_scale))
    seed = int(rng.integers(0, 2 ** 31))
    runner.case("scans", "scan min_gru f32 vmap x2 B2 T40 H12 h0=f32",
                lambda: check_scan_case("min_gru", jnp.float32, (2, 40, 12), "f32", seed,
                                        args.tol_scale, vmap=True))


# ---------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------
SS_OPTION_SETS = [
    dict(softplus=False, clamp=None, dt_bias=False, D=False, z=False, h0=False),
    dict(softplus=True, clamp=(1e-3, 0.1), dt_bias=True, D=True, z=True, h0=True),
    dict(softplus=True, clamp=None, dt_bias=True, D=True, z=False, h0=False),
    dict(softplus=False, clamp=(5e-3, 5e-2), dt_bias=False, D=False, z=True, h0=True),
]


def _softplus64(u):
    return np.where(u > 0, u + np.log1p(np.exp(-np.abs(u))), np.log1p(np.exp(np.minimum(u, 0))))


def _ulp(x, dtype):
    """One unit in the last place of each |x| in dtype (at least the
    smallest normal's)."""
    fi = jnp.finfo(dtype)
    ax = np.maximum(np.abs(x), float(fi.tiny))
    return np.exp2(np.floor(np.log2(ax)) - fi.nmant)


def keep_dt_clear_of_clamp(dt, dt_bias, softplus, clamp, dtype):
    """Moves dt (already rounded) where u = softplus?(dt + bias) lies within
    1e-5 of a clamp edge, where the f32 kernel and the f64 reference could
    fall on opposite sides (gradient 0 vs 1). Each move is 1/64 or one unit
    in dt's last place if that is more (in bf16 from |dt| = 4 on, where
    1/64 is half a unit and rounds back to dt)."""
    if clamp is None:
        return dt
    lo, hi = (float(np.float32(c)) for c in clamp)
    bias = 0.0 if dt_bias is None else dt_bias[None, None, :]
    for _ in range(16):
        u = dt + bias
        if softplus:
            u = _softplus64(u)
        near = (np.abs(u - lo) < 1e-5) | (np.abs(u - hi) < 1e-5)
        if not near.any():
            return dt
        dt = np.where(near, np_round(dt + np.maximum(1.0 / 64, _ulp(dt, dtype)), dtype), dt)
    raise RuntimeError("keep_dt_clear_of_clamp: dt does not move")


def check_selective_case(dtype, shape, opts, with_h_final_ct, seed, tol_scale):
    rng = np.random.default_rng(seed)
    b, t, d, n = shape
    nrm = rng.standard_normal
    softplus, clamp = opts["softplus"], opts["clamp"]
    x = np_round(nrm((b, t, d)), dtype)
    if softplus:
        dt = np_round(rng.normal(-2.5, 1.0, (b, t, d)), dtype)
        dt_bias = np_round(rng.normal(0.0, 0.3, d), jnp.float32) if opts["dt_bias"] else None
    else:
        dt = np_round(rng.uniform(1e-3, 0.1, (b, t, d)), dtype)
        dt_bias = np_round(rng.uniform(0.0, 0.02, d), jnp.float32) if opts["dt_bias"] else None
    dt = keep_dt_clear_of_clamp(dt, dt_bias, softplus, clamp, dtype)
    A = np_round(-np.exp(rng.uniform(math.log(0.5), math.log(8.0), (d, n))), jnp.float32)
    Bm = np_round(nrm((b, t, n)), dtype)
    Cm = np_round(nrm((b, t, n)), dtype)
    Dv = np_round(nrm(d), jnp.float32) if opts["D"] else None
    z = np_round(nrm((b, t, d)), dtype) if opts["z"] else None
    h0 = np_round(nrm((b, d, n)), jnp.float32) if opts["h0"] else None
    gy = np_round(nrm((b, t, d)), dtype)
    ghf = np_round(nrm((b, d, n)), jnp.float32)

    f32 = jnp.float32
    diff_names = ["x", "dt", "A", "B", "C"]
    diff_vals = [dev(x, dtype), dev(dt, dtype), dev(A, f32), dev(Bm, dtype), dev(Cm, dtype)]
    optional = [("dt_bias", dt_bias, f32), ("D", Dv, f32), ("z", z, dtype), ("h0", h0, f32)]
    for nm, v, dt_ in optional:
        if v is not None:
            diff_names.append(nm)
            diff_vals.append(dev(v, dt_))
    diff_vals = tuple(diff_vals)

    def build(fn, vals):
        kw = dict(zip(diff_names, vals))
        return fn(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], dt_bias=kw.get("dt_bias"),
                  D=kw.get("D"), z=kw.get("z"), h0=kw.get("h0"), softplus=softplus, clamp=clamp)

    def make(fn):
        if with_h_final_ct:
            def run(vals, gy, ghf):
                out, vjp = jax.vjp(lambda *v: build(fn, v), *vals)
                return out, vjp((gy, ghf))
        else:
            def run(vals, gy, ghf):
                out, vjp = jax.vjp(lambda *v: build(fn, v)[0], *vals)
                return (out, None), vjp(gy)
        return jax.jit(run)

    (y, hf), grads = jax.block_until_ready(
        make(ex.selective_scan)(diff_vals, dev(gy, dtype), dev(ghf, f32)))
    (ry, rhf), rgrads = jax.block_until_ready(
        make(ref.selective_scan_ref)(tuple(up(v) for v in diff_vals), up(dev(gy, dtype)),
                                     up(dev(ghf, f32))))
    k = key_of(dtype)
    m = [compare("y", y, ry, SCAN_TOL[k], dtype, None, tol_scale)]
    if with_h_final_ct:
        m.append(compare("h_final", hf, rhf, SCAN_TOL["f32"], f32, None, tol_scale))
    for nm, g, rg, v in zip(diff_names, grads, rgrads, diff_vals):
        gd = v.dtype
        m.append(compare(f"grad_{nm}", g, rg, SCAN_TOL[key_of(gd)], gd, None, tol_scale))
    return summarize(m)


def section_selective(runner, args):
    rng = np.random.default_rng([args.seed, 2])
    shapes = [(1, 17, 8, 4), (2, 300, 33, 16)] if args.quick else \
        [(1, 1, 1, 1), (1, 17, 8, 4), (2, 300, 33, 16), (2, 64, 64, 64), (1, 700, 5, 16),
         (1, 40, 3, 256)]
    case = 0
    for dn in args.dtypes:
        for oi, opts in enumerate(SS_OPTION_SETS):
            picks = [shapes[(oi + case) % len(shapes)]]
            if not args.quick:
                picks.append((int(rng.integers(1, 3)), int(rng.integers(1, 400)),
                              int(rng.integers(1, 80)), int(rng.choice([1, 3, 8, 16, 32, 64]))))
            for shape in picks:
                with_hf = case % 2 == 0
                seed = int(rng.integers(0, 2 ** 31))
                case += 1
                on = [k for k in ("softplus", "dt_bias", "D", "z", "h0") if opts[k]]
                if opts["clamp"]:
                    on.append(f"clamp{tuple(opts['clamp'])}")
                name = (f"selective {dn} B{shape[0]} T{shape[1]} D{shape[2]} N{shape[3]} "
                        f"[{','.join(on) or 'plain'}] ct_h_final={'yes' if with_hf else 'no'}")
                runner.case("selective", name,
                            lambda dn=dn, shape=shape, opts=opts, with_hf=with_hf, seed=seed:
                            check_selective_case(DTYPES[dn], shape, opts, with_hf, seed,
                                                 args.tol_scale))


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------
def check_attention_case(dtype, spec, seed, tol_scale):
    """spec: B, Hkv, gqa, T, S, d, mask, window, layout, scale, lse_ct."""
    rng = np.random.default_rng(seed)
    B, Hkv, gqa, T, S, d = (spec[k] for k in ("B", "Hkv", "gqa", "T", "S", "d"))
    Hq = Hkv * gqa
    mask, window, layout, scale, lse_ct = (spec[k] for k in ("mask", "window", "layout", "scale", "lse_ct"))
    if layout == "bhtd":
        qs, ks = (B, Hq, T, d), (B, Hkv, S, d)
    else:
        qs, ks = (B, T, Hq, d), (B, S, Hkv, d)
    q, k, v = (dev(rng.standard_normal(s), dtype) for s in (qs, ks, ks))
    go = dev(rng.standard_normal(qs), dtype)
    gl = dev(rng.standard_normal((B, Hq, T)), jnp.float32)
    kw = dict(mask=mask, window=window, layout=layout, scale=scale)
    ours_kw = dict(precision=spec.get("precision", "exact"))

    def make(fn, extra):
        if lse_ct:
            def run(q, k, v, go, gl):
                out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kw, **extra), q, k, v)
                return out, vjp((go, gl))
        else:
            # lse as aux: not differentiated, so its cotangent is a symbolic
            # zero (the wrapper's fast path)
            def run(q, k, v, go, gl):
                o, vjp, lse = jax.vjp(lambda q, k, v: fn(q, k, v, **kw, **extra), q, k, v,
                                      has_aux=True)
                return (o, lse), vjp(go)
        return jax.jit(run)

    (o, lse), (gq, gk, gv) = jax.block_until_ready(make(ex.attention, ours_kw)(q, k, v, go, gl))
    (ro, rlse), (rgq, rgk, rgv) = jax.block_until_ready(
        make(ref.attention_ref, {})(up(q), up(k), up(v), up(go), up(gl)))
    tol = ATTN_TOL[key_of(dtype)]
    s = scale if scale else 1.0 / math.sqrt(d)
    terms = abs(s) * amax(go) * amax(v) * max(amax(q), amax(k))
    if lse_ct:
        terms = max(terms, abs(s) * amax(gl) * max(amax(q), amax(k)))
    m = [compare("o", o, ro, tol["o"], dtype, None, tol_scale),
         compare("lse", lse, rlse, tol["lse"], jnp.float32, None, tol_scale),
         compare("grad_q", gq, rgq, tol["grad"], dtype, terms, tol_scale),
         compare("grad_k", gk, rgk, tol["grad"], dtype, terms, tol_scale),
         compare("grad_v", gv, rgv, tol["grad"], dtype, terms, tol_scale)]
    # rows that see no key: o and grad_q exactly zero, lse -inf (compare checks lse)
    vis = np.asarray(ref.attention_visibility(T, S, mask, window))
    empty = ~vis.any(axis=1)
    n_empty = int(empty.sum())
    if n_empty:
        ax = 2 if layout == "bhtd" else 1
        o_e = np.take(to_np(o), np.nonzero(empty)[0], axis=ax)
        gq_e = np.take(to_np(gq), np.nonzero(empty)[0], axis=ax)
        zero = bool(np.all(o_e == 0) and np.all(gq_e == 0))
        m.append(Metric("empty rows", zero, 0.0 if zero else math.inf, 0.0,
                        "" if zero else "o or grad_q not exactly 0 on rows that see no key"))
    ok, detail = summarize(m)
    if n_empty:
        detail += f"; {n_empty} empty rows"
    return ok, detail


def attention_specs(args):
    rng = np.random.default_rng([args.seed, 3])
    specs = []

    def rand_spec(dn, mask, layout, gqa):
        B = int(rng.integers(1, 3))
        Hkv = int(rng.integers(1, 3))
        d = int(rng.choice(ex.HEAD_WIDTHS))
        S = int(rng.integers(1, 161))
        # T <= S mostly; T > S now and then under masks (rows with no key)
        T = int(rng.integers(1, S + 1)) if (mask == "none" or rng.random() < 0.8) else \
            int(rng.integers(S + 1, S + 40))
        if mask == "none" and rng.random() < 0.5:
            T = int(rng.integers(1, 161))
        window = int(rng.integers(1, S + 4)) if mask == "window" else 0
        scale = None if rng.random() < 0.7 else float(rng.uniform(0.05, 0.3))
        return dict(dn=dn, B=B, Hkv=Hkv, gqa=gqa, T=T, S=S, d=d, mask=mask, window=window,
                    layout=layout, scale=scale, lse_ct=bool(rng.random() < 0.4),
                    seed=int(rng.integers(0, 2 ** 31)))

    for dn in args.dtypes:
        for mask in ("none", "causal", "window"):
            for layout in ("bhtd", "bthd"):
                ratios = [int(rng.choice([1, 2, 4]))] if args.quick else [1, 2, 4]
                for gqa in ratios:
                    specs.append(rand_spec(dn, mask, layout, gqa))
        edge = [
            dict(B=1, Hkv=1, gqa=1, T=1, S=1, d=64, mask="none", window=0, layout="bhtd"),
            dict(B=1, Hkv=2, gqa=2, T=1, S=37, d=32, mask="causal", window=0, layout="bthd"),
            dict(B=2, Hkv=1, gqa=4, T=50, S=20, d=128, mask="causal", window=0, layout="bhtd"),
            dict(B=1, Hkv=1, gqa=1, T=33, S=33, d=96, mask="window", window=1, layout="bthd"),
            dict(B=1, Hkv=1, gqa=2, T=20, S=16, d=64, mask="window", window=40, layout="bhtd"),
        ]
        if args.quick:
            edge = edge[1:3]
        for e in edge:
            specs.append(dict(e, dn=dn, scale=None, lse_ct=True, seed=int(rng.integers(0, 2 ** 31))))
    # f32 with precision tf32x3 (products on tensor cores), held to f32's
    # tolerances: every f32 case again
    specs += [dict(sp, precision="tf32x3") for sp in specs if sp["dn"] == "f32"]
    return specs


def section_attention(runner, args):
    for sp in attention_specs(args):
        name = (f"attention {sp['dn']} {sp['mask']}"
                + (f"(w={sp['window']})" if sp["mask"] == "window" else "")
                + f" {sp['layout'].upper()} B{sp['B']} Hq{sp['Hkv'] * sp['gqa']}/Hkv{sp['Hkv']} "
                f"T{sp['T']} S{sp['S']} d{sp['d']}"
                + (f" scale={sp['scale']:.3f}" if sp["scale"] else "")
                + (" ct=o,lse" if sp["lse_ct"] else " ct=o")
                + (" precision=tf32x3" if sp.get("precision") == "tf32x3" else ""))
        runner.case("attention", name, lambda sp=sp: check_attention_case(
            DTYPES[sp["dn"]], sp, sp["seed"], args.tol_scale))


# ---------------------------------------------------------------------------
# GRU, LSTM and sLSTM sequences (exphil/gated_rnn.hpp; targets
# exphil_{gru,lstm,slstm}_{fwd,bwd})
# ---------------------------------------------------------------------------
GATED_TARGETS = ("exphil_gru_fwd", "exphil_gru_bwd", "exphil_lstm_fwd", "exphil_lstm_bwd",
                 "exphil_slstm_fwd", "exphil_slstm_bwd")
GATES = {"gru": 3, "lstm": 4}
_registered_here = set()


def register_targets(names):
    """Registers targets that exphil_jax does not (by pointer, for CUDA),
    from the library it loaded; once each."""
    lib = ex.load()
    for name in names:
        if name not in _registered_here:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA")
            _registered_here.add(name)


def _sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def gated_ref(cell, wx, R, bias, h0, c0, e):
    """exphil/gated_rnn.hpp's GRU (gates r, z, n; the bias of n inside the
    reset product) or LSTM (i, f, g, o) over the sequence: y, h_final and
    c_final (None for the GRU). e [B, T, G*H] is added to the recurrent
    pre-activations h R + bias: zeros, so that its gradient is grad_rh."""
    H = R.shape[0]

    def step(carry, t_in):
        wx_t, e_t = t_in
        h = carry[0]
        rh = h @ R + bias + e_t
        if cell == "gru":
            r = _sigmoid(wx_t[:, :H] + rh[:, :H])
            z = _sigmoid(wx_t[:, H:2 * H] + rh[:, H:2 * H])
            n = jnp.tanh(wx_t[:, 2 * H:] + r * rh[:, 2 * H:])
            h = (1.0 - z) * n + z * h
            return (h,), h
        g = wx_t + rh
        i, f = _sigmoid(g[:, :H]), _sigmoid(g[:, H:2 * H])
        gg, o = jnp.tanh(g[:, 2 * H:3 * H]), _sigmoid(g[:, 3 * H:])
        c = f * carry[1] + i * gg
        h = o * jnp.tanh(c)
        return (h, c), h

    init = (h0,) if cell == "gru" else (h0, c0)
    carry, ys = lax.scan(step, init, (jnp.swapaxes(wx, 0, 1), jnp.swapaxes(e, 0, 1)))
    return jnp.swapaxes(ys, 0, 1), carry[0], (carry[1] if cell == "lstm" else None)


def gated_all_ref(cell, wx, R, bias, h0, c0, gy, ghf, gcf):
    """The forward's outputs and jax.vjp of gated_ref: the gradients of wx,
    R, bias, h0, c0 (None for the GRU) and of the recurrent pre-activations
    (grad_rh), and the sums of the magnitudes of grad_R's and grad_bias's
    terms over batch and time (the scale of a float sum's rounding)."""
    e = jnp.zeros_like(wx)
    if cell == "gru":
        (y, hf), vjp = jax.vjp(lambda a, r, b, h, z: gated_ref(cell, a, r, b, h, None, z)[:2],
                               wx, R, bias, h0, e)
        gwx, gR, gb, gh0, grh = vjp((gy, ghf))
        cf = gc0 = None
    else:
        (y, hf, cf), vjp = jax.vjp(lambda a, r, b, h, c, z: gated_ref(cell, a, r, b, h, c, z),
                                   wx, R, bias, h0, c0, e)
        gwx, gR, gb, gh0, gc0, grh = vjp((gy, ghf, gcf))
    h_prev = jnp.concatenate([h0[:, None, :], y[:, :-1, :]], axis=1)
    return dict(y=y, h_final=hf, c_final=cf, wx=gwx, R=gR, bias=gb, h0=gh0, c0=gc0, rh=grh,
                R_terms=jnp.einsum("bti,btj->ij", jnp.abs(h_prev), jnp.abs(grh)),
                bias_terms=jnp.sum(jnp.abs(grh), axis=(0, 1)))


def gated_tol_key(dtype, own):
    """The tolerance of an output in `own` dtype (weights, states) of a call
    in `dtype`: an f32 output computed from rounded half-precision inputs
    owes that dtype's accuracy (test_gated_rnn.cpp's rule)."""
    return key_of(dtype if jnp.dtype(own) == jnp.dtype(jnp.float32) else own)


def gated_inputs(rng, shape, gates, dtype, weight_dtype, present):
    """What every gated case draws first, in this order: wx, R, gy and the
    bias (None unless "bias" is in present); and maybe(name, values, dtype,
    wanted=True), which keeps a further optional input only where `name` is
    present. Returns (wx, R, gy, bias, uniform, maybe)."""
    b, t, h = shape
    gh = gates * h
    u = rng.uniform
    r = 1.5 / math.sqrt(h)
    wx = dev(u(-1.5, 1.5, (b, t, gh)), dtype)
    R = dev(u(-r, r, (h, gh)), weight_dtype)
    gy = dev(u(-1.0, 1.0, (b, t, h)), dtype)

    def maybe(name, values, dt, wanted=True):
        return dev(values, dt) if wanted and name in present else None

    bias = maybe("bias", u(-0.5, 0.5, gh), weight_dtype)
    return wx, R, gy, bias, u, maybe


def gated_ffi_pair(op, placeholders, fwd_optional, bwd_optional, fwd_results, bwd_results,
                   precision=None):
    """exphil_<op>_fwd, then exphil_<op>_bwd on its y, as one jitted
    function of (wx, R, gy, the forward's optional inputs, the backward's
    further ones). Absent optional inputs (None) pass as zero-element
    buffers without has_* attributes (placeholders "empty", JAX's way) or
    as f32 scalars with has_* = false ("has", Nx's way; the present ones
    then get has_* = true); fwd_optional and bwd_optional name them.
    precision: the optional attribute's value (None: left out, exact)."""
    placeholder = jnp.zeros((0,) if placeholders == "empty" else (), jnp.float32)

    def attrs(optional):
        own = {} if precision is None else {"precision": np.int32(precision)}
        if placeholders != "has":
            return own
        return {f"has_{n}": np.bool_(v is not None) for n, v in optional} | own

    fwd_attrs, bwd_attrs = attrs(fwd_optional), attrs(bwd_optional)

    @jax.jit
    def ours(wx, R, gy, fwd_opt, bwd_extra):
        fwd_opt = [placeholder if v is None else v for v in fwd_opt]
        bwd_extra = [placeholder if v is None else v for v in bwd_extra]
        outs = jax.ffi.ffi_call(f"exphil_{op}_fwd", fwd_results)(wx, R, *fwd_opt, **fwd_attrs)
        grads = jax.ffi.ffi_call(f"exphil_{op}_bwd", bwd_results)(
            wx, R, outs[0], gy, *fwd_opt, *bwd_extra, **bwd_attrs)
        return outs, grads

    return ours


def result_dtypes_metric(fwd_results, bwd_results, outs, grads):
    """A failed Metric if the results' dtypes are not the declared ones,
    else None."""
    want = [o.dtype for o in fwd_results + bwd_results]
    got = [o.dtype for o in list(outs) + list(grads)]
    if [jnp.dtype(x) for x in got] != [jnp.dtype(x) for x in want]:
        return Metric("dtypes", False, math.inf, math.inf, f"got {got}, want {want}")
    return None


def check_gated_case(cell, dtype, weight_dtype, state_dtype, shape, present, placeholders, seed,
                     tol_scale, precision=None):
    """exphil_<cell>_fwd, then exphil_<cell>_bwd on its y, in one jit, against
    gated_all_ref in float64. present: which of bias, h0, c0 and the final
    states' cotangents ("finals") are passed; the others are absent, as
    zero-element buffers without has_* attributes (placeholders "empty",
    JAX's way) or as f32 scalars with has_* = false ("has", Nx's way; the
    present ones then get has_* = true)."""
    b, t, h = shape
    lstm = cell == "lstm"
    gh = GATES[cell] * h
    wx, R, gy, bias, u, maybe = gated_inputs(np.random.default_rng(seed), shape, GATES[cell],
                                             dtype, weight_dtype, present)
    h0 = maybe("h0", u(-1.0, 1.0, (b, h)), state_dtype)
    c0 = maybe("c0", u(-1.0, 1.0, (b, h)), state_dtype, lstm)
    ghf = maybe("finals", u(-1.0, 1.0, (b, h)), state_dtype)
    gcf = maybe("finals", u(-1.0, 1.0, (b, h)), state_dtype, lstm)

    fwd_optional = [("bias", bias), ("h0", h0)] + ([("c0", c0)] if lstm else [])
    bwd_optional = fwd_optional + [("grad_h_final", ghf)] + ([("grad_c_final", gcf)] if lstm else [])
    S = jax.ShapeDtypeStruct
    state = S((b, h), state_dtype)
    fwd_results = (S((b, t, h), dtype), state) + ((state,) if lstm else ())
    bwd_results = ((S((b, t, gh), dtype), S((h, gh), weight_dtype), S((gh,), weight_dtype), state)
                   + ((state,) if lstm else ()) + (S((b, t, gh), dtype),))
    ours = gated_ffi_pair(cell, placeholders, fwd_optional, bwd_optional, fwd_results, bwd_results,
                          precision)

    outs, grads = jax.block_until_ready(
        ours(wx, R, gy, [v for _, v in fwd_optional], [ghf] + ([gcf] if lstm else [])))

    def up_or_zeros(x, shp):
        return up(x) if x is not None else jnp.zeros(shp, F64)

    ref_args = (up(wx), up(R), up_or_zeros(bias, (gh,)), up_or_zeros(h0, (b, h)),
                up_or_zeros(c0, (b, h)) if lstm else None, up(gy), up_or_zeros(ghf, (b, h)),
                up_or_zeros(gcf, (b, h)) if lstm else None)
    ref_ = jax.block_until_ready(jax.jit(lambda *a: gated_all_ref(cell, *a))(*ref_args))

    k = key_of(dtype)
    kw, ks = gated_tol_key(dtype, weight_dtype), gated_tol_key(dtype, state_dtype)
    if precision == 1:  # f32 throughout, on the tf32 line
        k = kw = ks = "tf32"
    hscale = max(amax(ref_["y"]), amax(ref_["h_final"]), amax(ref_args[3]))
    m = [compare("y", outs[0], ref_["y"], GATED_TOL[k], dtype, hscale, tol_scale),
         compare("h_final", outs[1], ref_["h_final"], GATED_TOL[ks], state_dtype, hscale, tol_scale)]
    if lstm:
        cscale = max(amax(ref_["c_final"]), amax(ref_args[4]))
        m.append(compare("c_final", outs[2], ref_["c_final"], GATED_TOL[ks], state_dtype, cscale,
                         tol_scale))
    gscale = max(amax(ref_[n]) for n in (("wx", "rh", "h0", "c0") if lstm else ("wx", "rh", "h0")))
    names = ["grad_wx", "grad_R", "grad_bias", "grad_h0"] + (["grad_c0"] if lstm else []) + ["grad_rh"]
    for name, got in zip(names, grads):
        key = name[5:]
        if key in ("R", "bias"):
            tol, dt, scale = GATED_TOL[kw], weight_dtype, max(gscale, amax(ref_[key + "_terms"]))
        elif key in ("h0", "c0"):
            tol, dt, scale = GATED_TOL[ks], state_dtype, gscale
        else:
            tol, dt, scale = GATED_TOL[k], dtype, gscale
        m.append(compare(name, got, ref_[key], tol, dt, scale, tol_scale))
    if bad := result_dtypes_metric(fwd_results, bwd_results, outs, grads):
        m.append(bad)
    return summarize(m)


def slstm_ref(wx, R, bias, h0, c0, n0, m0, e):
    """exphil/gated_rnn.hpp's sLSTM, exactly Edifice's slstm_scan_fallback
    (gates i, f, z, o of wx + h R + bias; m = max(f + m, i), i = exp(i - m),
    f = exp(f + m_prev - m), c = f c + i tanh(z), n = f n + i,
    h = sigmoid(o) c / max(|n|, 1)): y, h_final, c_final, n_final, m_final
    and the gaps (f + m_prev) - i [B, T, H] of the max() of m. e as in
    gated_ref (its gradient is grad_rh)."""
    H = R.shape[0]

    def step(carry, t_in):
        wx_t, e_t = t_in
        h, c, n, m = carry
        g = wx_t + h @ R + bias + e_t
        li, lf = g[:, :H], g[:, H:2 * H]
        z, o = jnp.tanh(g[:, 2 * H:3 * H]), _sigmoid(g[:, 3 * H:])
        m_new = jnp.maximum(lf + m, li)
        i = jnp.exp(li - m_new)
        f = jnp.exp(lf + m - m_new)
        c = f * c + i * z
        n = f * n + i
        h = o * c / jnp.maximum(jnp.abs(n), 1.0)
        return (h, c, n, m_new), (h, lf + m - li)

    carry, (ys, gaps) = lax.scan(step, (h0, c0, n0, m0),
                                 (jnp.swapaxes(wx, 0, 1), jnp.swapaxes(e, 0, 1)))
    return (jnp.swapaxes(ys, 0, 1),) + tuple(carry) + (jnp.swapaxes(gaps, 0, 1),)


def slstm_all_ref(wx, R, bias, h0, c0, n0, m0, gy, ghf, gcf, gnf, gmf):
    """slstm_ref's outputs and jax.vjp: the gradients of wx, R, bias, the
    four initial states and grad_rh, with gated_all_ref's R_terms and
    bias_terms, and the smallest |gap| of m's max() (min_gap)."""
    e = jnp.zeros_like(wx)
    outs, vjp = jax.vjp(lambda *a: slstm_ref(*a)[:5], wx, R, bias, h0, c0, n0, m0, e)
    gwx, gR, gb, gh0, gc0, gn0, gm0, grh = vjp((gy, ghf, gcf, gnf, gmf))
    y = outs[0]
    gaps = slstm_ref(wx, R, bias, h0, c0, n0, m0, e)[5]
    h_prev = jnp.concatenate([h0[:, None, :], y[:, :-1, :]], axis=1)
    return dict(y=y, h_final=outs[1], c_final=outs[2], n_final=outs[3], m_final=outs[4],
                wx=gwx, R=gR, bias=gb, h0=gh0, c0=gc0, n0=gn0, m0=gm0, rh=grh,
                R_terms=jnp.einsum("bti,btj->ij", jnp.abs(h_prev), jnp.abs(grh)),
                bias_terms=jnp.sum(jnp.abs(grh), axis=(0, 1)),
                min_gap=jnp.min(jnp.abs(gaps)))


SLSTM_STATES = ("h0", "c0", "n0", "m0")
SLSTM_FINALS = ("grad_h_final", "grad_c_final", "grad_n_final", "grad_m_final")
# The smallest |gap| of m's max() a case with cotangents of c, n or m_final
# keeps (f32 only): y and h_final do not depend on m while |n| > 1 (n0 >= 1
# here), but c, n and m do, and their gradients change side at a tie.
SLSTM_MIN_GAP = 2e-5


def check_slstm_case(dtype, weight_dtype, state_dtype, shape, present, placeholders, seed,
                     tol_scale):
    """exphil_slstm_fwd, then exphil_slstm_bwd on its y, in one jit, against
    slstm_all_ref in float64; present and placeholders as check_gated_case's
    (states h0, c0, n0, m0). n0 in [1, 2] (absent: ones), so |n| > 1 and
    max(|n|, 1) never ties. "finals" passes grad_h_final, and in f32 also the
    cotangents of c, n and m_final, whose gradients jump at ties of m's
    max(): inputs are redrawn (seed + 1, ...) until no step comes within
    SLSTM_MIN_GAP of one. Half-precision backwards recompute the states from
    y rounded to that dtype, so there a near tie may fall on the other side;
    they take grad_h_final alone (y and h_final do not depend on m)."""
    b, t, h = shape
    gh = 4 * h
    f32_only = jnp.dtype(dtype) == jnp.dtype(jnp.float32)
    full_finals = "finals" in present and f32_only
    for attempt in range(50):
        wx, R, gy, bias, u, maybe = gated_inputs(np.random.default_rng(seed + attempt), shape, 4,
                                                 dtype, weight_dtype, present)
        states = {"h0": maybe("h0", u(-1.0, 1.0, (b, h)), state_dtype),
                  "c0": maybe("c0", u(-1.0, 1.0, (b, h)), state_dtype),
                  "n0": maybe("n0", u(1.0, 2.0, (b, h)), state_dtype),
                  "m0": maybe("m0", u(-1.0, 1.0, (b, h)), state_dtype)}
        finals = {name: maybe("finals", u(-1.0, 1.0, (b, h)), state_dtype,
                              name == "grad_h_final" or full_finals)
                  for name in SLSTM_FINALS}

        def up_or(x, shp, fill=0.0):
            return up(x) if x is not None else jnp.full(shp, fill, F64)

        defaults = {"h0": 0.0, "c0": 0.0, "n0": 1.0, "m0": 0.0}
        ref_args = ((up(wx), up(R), up_or(bias, (gh,)))
                    + tuple(up_or(states[n], (b, h), defaults[n]) for n in SLSTM_STATES)
                    + (up(gy),) + tuple(up_or(finals[n], (b, h)) for n in SLSTM_FINALS))
        ref_ = jax.block_until_ready(jax.jit(slstm_all_ref)(*ref_args))
        if not full_finals or float(ref_["min_gap"]) >= SLSTM_MIN_GAP:
            break
    else:
        return False, f"no inputs without a tie of m's max() within {SLSTM_MIN_GAP} in 50 draws"

    fwd_optional = [("bias", bias)] + [(n, states[n]) for n in SLSTM_STATES]
    bwd_optional = fwd_optional + [(n, finals[n]) for n in SLSTM_FINALS]
    S = jax.ShapeDtypeStruct
    state = S((b, h), state_dtype)
    fwd_results = (S((b, t, h), dtype),) + (state,) * 4
    bwd_results = ((S((b, t, gh), dtype), S((h, gh), weight_dtype), S((gh,), weight_dtype))
                   + (state,) * 4 + (S((b, t, gh), dtype),))
    ours = gated_ffi_pair("slstm", placeholders, fwd_optional, bwd_optional, fwd_results,
                          bwd_results)

    outs, grads = jax.block_until_ready(
        ours(wx, R, gy, [v for _, v in fwd_optional], [finals[n] for n in SLSTM_FINALS]))

    k = key_of(dtype)
    kw, ks = gated_tol_key(dtype, weight_dtype), gated_tol_key(dtype, state_dtype)
    hscale = max(amax(ref_["y"]), amax(ref_["h_final"]), amax(ref_args[3]))
    m = [compare("y", outs[0], ref_["y"], GATED_TOL[k], dtype, hscale, tol_scale),
         compare("h_final", outs[1], ref_["h_final"], GATED_TOL[ks], state_dtype, hscale,
                 tol_scale)]
    for i, name in enumerate(("c_final", "n_final", "m_final")):
        scale = max(amax(ref_[name]), amax(ref_args[4 + i]), 1.0)
        m.append(compare(name, outs[2 + i], ref_[name], GATED_TOL[ks], state_dtype, scale,
                         tol_scale))
    gscale = max(amax(ref_[n]) for n in ("wx", "rh", "h0", "c0", "n0", "m0"))
    names = ["grad_wx", "grad_R", "grad_bias", "grad_h0", "grad_c0", "grad_n0", "grad_m0",
             "grad_rh"]
    for name, got in zip(names, grads):
        key = name[5:]
        if key in ("R", "bias"):
            tol, dt, scale = GATED_TOL[kw], weight_dtype, max(gscale, amax(ref_[key + "_terms"]))
        elif key in SLSTM_STATES:
            tol, dt, scale = GATED_TOL[ks], state_dtype, gscale
        else:
            tol, dt, scale = GATED_TOL[k], dtype, gscale
        m.append(compare(name, got, ref_[key], tol, dt, scale, tol_scale))
    if bad := result_dtypes_metric(fwd_results, bwd_results, outs, grads):
        m.append(bad)
    return summarize(m)


SLSTM_PRESENT = [
    ("bias", "h0", "c0", "n0", "m0", "finals"),
    (),
    ("h0", "n0", "finals"),
    ("bias", "c0", "m0"),
]

GATED_PRESENT = [
    ("bias", "h0", "c0", "finals"),
    (),
    ("h0", "finals"),
    ("bias", "c0"),
]


STACK_TARGETS = ("exphil_gru_stack_fwd", "exphil_gru_stack_bwd", "exphil_lstm_stack_fwd",
                 "exphil_lstm_stack_bwd")


def stack_ref(cell, wx, R, W, bias, W_bias, h0, c0):
    """The stack of gated_ref layers (ops gru_stack, lstm_stack): layer 0 on
    wx, layer l > 0 on y_{l-1} W[l-1] + W_bias[l-1]. Returns y, y_lower
    [K, B, T, H], h_final [L, B, H] and c_final (None for the GRU)."""
    L = R.shape[0]
    ys, hs, cs = [], [], []
    inp = wx
    for l in range(L):
        e = jnp.zeros_like(inp)
        y, hf, cf = gated_ref(cell, inp, R[l], bias[l], h0[l], None if c0 is None else c0[l], e)
        ys.append(y), hs.append(hf), cs.append(cf)
        if l + 1 < L:
            inp = jnp.einsum("bth,hg->btg", y, W[l]) + W_bias[l]
    return ys[-1], jnp.stack(ys[:-1]), jnp.stack(hs), (jnp.stack(cs) if cell == "lstm" else None)


def check_stack_case(cell, dtype, shape, placeholders, seed, tol_scale):
    """exphil_<cell>_stack_fwd, then exphil_<cell>_stack_bwd on its y and
    y_lower, in one jit, with every optional operand present and has_* true
    (placeholders "all"), or none, as zero-element buffers without has_*
    ("empty", JAX's way) or as scalars with has_* false ("scalar", Nx's
    way), against
    stack_ref and its jax.vjp in float64. Weights and states in f32; the
    tolerances of the one-layer cases, the gradients of W and R at the scale
    of the largest sequence gradient or their own largest value."""
    L, b, t, h = shape
    K, lstm = L - 1, cell == "lstm"
    gh = GATES[cell] * h
    rng = np.random.default_rng(seed)
    u = rng.uniform
    r = 1.5 / math.sqrt(h)
    f32 = jnp.float32
    present = placeholders == "all"
    wx = dev(u(-1.5, 1.5, (b, t, gh)), dtype)
    R = dev(u(-r, r, (L, h, gh)), f32)
    W = dev(u(-r, r, (K, h, gh)), f32)
    gy = dev(u(-1.0, 1.0, (b, t, h)), dtype)
    opt = lambda values, dt: dev(values, dt) if present else None  # noqa: E731
    bias, W_bias = opt(u(-0.5, 0.5, (L, gh)), f32), opt(u(-0.5, 0.5, (K, gh)), f32)
    h0 = opt(u(-1.0, 1.0, (L, b, h)), f32)
    c0 = opt(u(-1.0, 1.0, (L, b, h)), f32) if lstm else None
    gyl = opt(u(-1.0, 1.0, (K, b, t, h)), dtype)
    ghf = opt(u(-1.0, 1.0, (L, b, h)), f32)
    gcf = opt(u(-1.0, 1.0, (L, b, h)), f32) if lstm else None

    fwd_optional = [("bias", bias), ("W_bias", W_bias), ("h0", h0)] + ([("c0", c0)] if lstm else [])
    bwd_extra = [("grad_y_lower", gyl), ("grad_h_final", ghf)] + ([("grad_c_final", gcf)] if lstm else [])
    S = jax.ShapeDtypeStruct
    state = S((L, b, h), f32)
    fwd_results = (S((b, t, h), dtype), S((K, b, t, h), dtype), state) + ((state,) if lstm else ())
    bwd_results = ((S((b, t, gh), dtype), S((L, h, gh), f32), S((K, h, gh), f32), S((L, gh), f32),
                    S((K, gh), f32), state) + ((state,) if lstm else ()))
    placeholder = jnp.zeros((0,) if placeholders == "empty" else (), f32)
    with_has = placeholders != "empty"

    def attrs(optional):
        return {f"has_{n}": np.bool_(v is not None) for n, v in optional} if with_has else {}

    @jax.jit
    def ours(wx, R, W, gy, fwd_opt, extra):
        fwd_opt = [placeholder if v is None else v for v in fwd_opt]
        extra = [placeholder if v is None else v for v in extra]
        outs = jax.ffi.ffi_call(f"exphil_{cell}_stack_fwd", fwd_results)(
            wx, R, W, *fwd_opt, **attrs(fwd_optional))
        grads = jax.ffi.ffi_call(f"exphil_{cell}_stack_bwd", bwd_results)(
            wx, R, W, outs[0], outs[1], gy, *fwd_opt, *extra, **attrs(fwd_optional + bwd_extra))
        return outs, grads

    outs, grads = jax.block_until_ready(
        ours(wx, R, W, gy, [v for _, v in fwd_optional], [v for _, v in bwd_extra]))

    def up_or_zeros(x, shp):
        return up(x) if x is not None else jnp.zeros(shp, F64)

    a = dict(wx=up(wx), R=up(R), W=up(W), bias=up_or_zeros(bias, (L, gh)),
             W_bias=up_or_zeros(W_bias, (K, gh)), h0=up_or_zeros(h0, (L, b, h)),
             c0=up_or_zeros(c0, (L, b, h)) if lstm else None)
    names = ["wx", "R", "W", "bias", "W_bias", "h0"] + (["c0"] if lstm else [])

    def fwd(*xs):
        kw = dict(zip(names, xs))
        return stack_ref(cell, kw["wx"], kw["R"], kw["W"], kw["bias"], kw["W_bias"], kw["h0"],
                         kw.get("c0"))[: 4 if lstm else 3]

    ref_out, vjp = jax.vjp(fwd, *[a[n] for n in names])
    cts = (up(gy), up_or_zeros(gyl, (K, b, t, h)), up_or_zeros(ghf, (L, b, h)))
    if lstm:
        cts = cts + (up_or_zeros(gcf, (L, b, h)),)
    ref_grads = vjp(cts)

    k = key_of(dtype)
    hscale = max(amax(ref_out[0]), amax(ref_out[1]), amax(ref_out[2]), amax(a["h0"]))
    m = [compare("y", outs[0], ref_out[0], GATED_TOL[k], dtype, hscale, tol_scale),
         compare("y_lower", outs[1], ref_out[1], GATED_TOL[k], dtype, hscale, tol_scale),
         compare("h_final", outs[2], ref_out[2], GATED_TOL[k], f32, hscale, tol_scale)]
    if lstm:
        m.append(compare("c_final", outs[3], ref_out[3], GATED_TOL[k], f32,
                         max(amax(ref_out[3]), amax(a["c0"])), tol_scale))
    gscale = max(amax(ref_grads[0]), amax(ref_grads[5]), amax(ref_grads[6]) if lstm else 0.0)
    for name, got, want in zip(names, grads, ref_grads):
        dt = dtype if name == "wx" else f32
        scale = gscale if name in ("wx", "h0", "c0") else max(gscale, amax(want))
        m.append(compare(f"grad_{name}", got, want, GATED_TOL[k], dt, scale, tol_scale))
    if bad := result_dtypes_metric(fwd_results, bwd_results, outs, grads):
        m.append(bad)
    return summarize(m)


def gated_shapes(quick):
    """The fixed [B, T, H] of the gated cases (a random one joins them per
    dtype): T = 1, H = 1, H not a multiple of 32, B above 32, long T."""
    return [(1, 1, 1), (2, 5, 3), (3, 20, 37)] if quick else \
        [(1, 1, 1), (1, 2, 7), (2, 5, 3), (5, 7, 37), (33, 3, 130), (1, 300, 64), (2, 20, 257)]


def section_gated(runner, args):
    register_targets(GATED_TARGETS)
    rng = np.random.default_rng([args.seed, 7])
    fixed = gated_shapes(args.quick)
    idx = 0
    # The GRU, the LSTM, then the sLSTM (its states h, c, n and m) the same way.
    for cell in (*GATES, "slstm"):
        slstm = cell == "slstm"
        for dn in args.dtypes:
            dtype = DTYPES[dn]
            shapes = fixed + [(int(rng.integers(1, 5)), int(rng.integers(1, 200)),
                               int(rng.integers(1, 300)))]
            for shape in shapes:
                # every option set with both ways of passing an absent operand;
                # weights and states in f32 or the sequence dtype, by turns
                present = (SLSTM_PRESENT if slstm else GATED_PRESENT)[idx % 4]
                placeholders = ("empty", "has")[(idx // 4) % 2]
                weight_dtype = jnp.float32 if idx % 2 else dtype
                state_dtype = jnp.float32 if idx % 3 == 0 else dtype
                idx += 1
                seed = int(rng.integers(0, 2 ** 31))
                shown = [n for n in present if cell != "gru" or n != "c0"]
                name = (f"gated {cell} {dn} B{shape[0]} T{shape[1]} H{shape[2]} "
                        f"[{','.join(shown) or 'none'}] absent={placeholders} "
                        f"R {key_of(weight_dtype)} states {key_of(state_dtype)}")
                common = (dtype, weight_dtype, state_dtype, shape, present, placeholders, seed,
                          args.tol_scale)
                runner.case("gated", name,
                            (lambda common=common: check_slstm_case(*common)) if slstm else
                            (lambda cell=cell, common=common: check_gated_case(cell, *common)))

    # The stacks (L, B, T, H): B1 (the forward's one launch), B > 1 (layer by
    # layer), 2 to 4 layers; every optional operand present, or none passed
    # either way.
    register_targets(STACK_TARGETS)
    stack_shapes = [(2, 1, 32, 64), (3, 3, 7, 37)] if args.quick else \
        [(2, 1, 1, 1), (2, 1, 32, 256), (3, 3, 7, 37), (4, 1, 40, 100), (2, 33, 5, 64)]
    turn = 0  # each way of passing the optional operands in turn
    for cell in GATES:
        for dn in args.dtypes:
            for shape in stack_shapes:
                placeholders = ("all", "empty", "scalar")[turn % 3]
                turn += 1
                seed = int(rng.integers(0, 2 ** 31))
                name = (f"gated {cell}_stack {dn} L{shape[0]} B{shape[1]} T{shape[2]} H{shape[3]} "
                        f"optional: {placeholders}")
                runner.case("gated", name, lambda cell=cell, dtype=DTYPES[dn], shape=shape,
                            placeholders=placeholders, seed=seed:
                            check_stack_case(cell, dtype, shape, placeholders, seed, args.tol_scale))

    # The handler's own check comes back as a Python exception naming R; a
    # good call still runs afterwards.
    f32 = jnp.float32
    wx = jnp.ones((2, 4, 12), f32)
    r_bad = jnp.ones((4, 9), f32)
    empty = jnp.zeros((0,), f32)

    def bad_call():
        results = (jax.ShapeDtypeStruct((2, 4, 4), f32), jax.ShapeDtypeStruct((2, 4), f32))
        return jax.jit(lambda wx, r: jax.ffi.ffi_call("exphil_gru_fwd", results)(wx, r, empty, empty))(
            wx, r_bad)

    def error_case():
        ok, detail = expect_error(bad_call, ["exphil_gru_fwd: gru forward: argument 'R'"],
                                  "R [4, 9] for wx [2, 4, 12]")
        ok2, detail2 = check_gated_case("gru", f32, f32, f32, (2, 6, 4), ("h0",), "empty", 99,
                                        args.tol_scale)
        return ok and ok2, detail + ("" if ok2 else f"; good call afterwards FAILED: {detail2}")
    runner.case("gated", "error handler: gru_fwd R of the wrong shape names R", error_case)

    # precision 1 (tf32) on f32 at a shape whose products take the tensor
    # cores (B 24 in tiles of 8, H a multiple of 16), with has_* or without;
    # and precision 0 given outright.
    for cell in GATES:
        for precision, placeholders in ((1, "has"), (1, "empty"), (0, "has")):
            seed = int(rng.integers(0, 2 ** 31))
            name = f"gated {cell} f32 B24 T9 H48 [all] absent={placeholders} precision={precision}"
            runner.case("gated", name, lambda cell=cell, precision=precision,
                        placeholders=placeholders, seed=seed:
                        check_gated_case(cell, f32, f32, f32, (24, 9, 48), GATED_PRESENT[0],
                                         placeholders, seed, args.tol_scale, precision))


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def expect_error(fn, keywords, what):
    """Runs fn (which must raise); passes when the message contains one of
    keywords (case-insensitive)."""
    try:
        out = fn()
        jax.block_until_ready(out)
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        low = msg.lower()
        hit = [kw for kw in keywords if kw.lower() in low]
        one = first_line(msg, 300)
        if hit:
            return True, f"{type(e).__name__}: {one}"
        return False, (f"{type(e).__name__} raised but its message names none of "
                       f"{keywords}: {one}")
    return False, f"no exception for {what}"


def good_call_still_works(tol_scale):
    """A fresh jit of a good call after errors: must run and match."""
    return check_scan_case("min_gru", jnp.float32, (2, 24, 12), "f32", 1234, tol_scale)


def section_errors(runner, args):
    f32 = jnp.float32
    g = jnp.ones((2, 8, 4), f32)
    c_bad = jnp.ones((2, 9, 4), f32)
    h0 = jnp.zeros((2, 4), f32)
    g64, c64, h064 = (jnp.ones((2, 8, 4), jnp.float64), jnp.ones((2, 8, 4), jnp.float64),
                      jnp.zeros((2, 4), jnp.float64))

    def after(fn, keywords, what):
        def run():
            ok, detail = expect_error(fn, keywords, what)
            ok2, detail2 = good_call_still_works(args.tol_scale)
            return ok and ok2, detail + ("" if ok2 else f"; good call afterwards FAILED: {detail2}")
        return run

    runner.case("errors", "error python: min_gru mismatched T (gate T8, candidate T9)",
                after(lambda: jax.jit(lambda a, b: ex.scan("min_gru", (a, b), h0))(g, c_bad),
                      ["candidate"], "mismatched T"))
    runner.case("errors", "error python: min_gru float64 inputs",
                after(lambda: jax.jit(lambda a, b: ex.scan("min_gru", (a, b)))(g64, c64),
                      ["float64"], "float64 inputs"))
    runner.case("errors", "error python: attention head width 48",
                after(lambda: ex.attention(jnp.ones((1, 1, 4, 48), f32), jnp.ones((1, 1, 4, 48), f32),
                                           jnp.ones((1, 1, 4, 48), f32)),
                      ["48"], "d = 48"))
    runner.case("errors", "error handler: min_gru_fwd mismatched T (validate=False)",
                after(lambda: jax.jit(lambda a, b, s: ex.scan_fwd("min_gru", (a, b), s, validate=False))(
                    g, c_bad, h0), ["candidate", "shape"], "mismatched T"))
    runner.case("errors", "error handler: min_gru_fwd float64 (validate=False)",
                after(lambda: jax.jit(lambda a, b, s: ex.scan_fwd("min_gru", (a, b), s, validate=False))(
                    g64, c64, h064), ["dtype", "type", "f64", "float64"], "float64 inputs"))
    runner.case("errors", "error handler: min_gru_bwd mismatched grad_y T (validate=False)",
                after(lambda: jax.jit(lambda a, b, s, y, gy, ghf: ex.scan_bwd(
                    "min_gru", (a, b), s, y, gy, ghf, validate=False))(
                    g, g, h0, g, c_bad, h0), ["grad_y", "shape"], "mismatched grad_y"))
    q48 = jnp.ones((1, 1, 4, 48), f32)
    runner.case("errors", "error handler: attention_fwd head width 48 (validate=False)",
                after(lambda: jax.jit(lambda q, k, v: ex.attention_fwd(q, k, v, validate=False))(
                    q48, q48, q48), ["48", "head", "not supported"], "d = 48"))
    x = jnp.ones((1, 4, 3), f32)
    A300 = -jnp.ones((3, 300), f32)
    B300 = jnp.ones((1, 4, 300), f32)
    runner.case("errors", "error handler: selective_scan_fwd N = 300 (validate=False)",
                after(lambda: jax.jit(lambda x, A, Bm: ex.selective_scan_fwd(
                    x, x, A, Bm, Bm, validate=False))(x, A300, B300),
                      ["300", "256", "not supported"], "N = 300"))


# ---------------------------------------------------------------------------
# Two-layer MinGRU stack: jax.grad with the FFI scan vs lax.scan
# ---------------------------------------------------------------------------
def check_stack(dn, seed, tol_scale, seq=32, embed=64, hidden=48):
    dtype = DTYPES[dn]
    params = stack_jax.init_params(seed, embed, hidden, 2, dtype)
    x, target = stack_jax.make_inputs(seed, 2, seq, embed, hidden, dtype)

    def grad_fn(scan_fn):
        return jax.jit(jax.value_and_grad(lambda p, x, t: stack_jax.stack_loss(p, x, t, scan_fn)))

    ours = jax.block_until_ready(grad_fn(stack_jax.scan_ffi)(params, x, target))
    theirs = jax.block_until_ready(grad_fn(stack_jax.scan_lax)(params, x, target))
    tol = stack_jax.TOL[dn]
    leaves_o = jax.tree_util.tree_flatten_with_path(ours)[0]
    leaves_r = jax.tree_util.tree_flatten(theirs)[0]
    m = []
    for (path, a), r in zip(leaves_o, leaves_r):
        name = jax.tree_util.keystr(path) or "loss"
        m.append(compare(name, a, r, tol, jnp.asarray(a).dtype, None, tol_scale))
    nonzero = all(amax(a) > 0 for _, a in leaves_o)
    if not nonzero:
        m.append(Metric("nonzero", False, math.inf, math.inf, "a gradient is all zeros"))
    return summarize(m)


def section_stack(runner, args):
    rng = np.random.default_rng([args.seed, 5])
    for dn in [d for d in ("f32", "bf16") if d in args.dtypes]:
        seed = int(rng.integers(0, 2 ** 31))
        runner.case("stack", f"stack 2-layer MinGRU {dn} B2 T32 E64 H48: jax.grad FFI vs lax.scan",
                    lambda dn=dn, seed=seed: check_stack(dn, seed, args.tol_scale))
        seed = int(rng.integers(0, 2 ** 31))
        runner.case("stack", f"stack 2-layer MinGRU {dn} B1 T32 E256 H256: jax.grad FFI vs lax.scan",
                    lambda dn=dn, seed=seed: check_stack(dn, seed, args.tol_scale, 32, 256, 256))


# ---------------------------------------------------------------------------
# Graphs: the targets inside XLA's command buffers
# ---------------------------------------------------------------------------
GRAPH_FLAG = "--xla_gpu_graph_min_graph_size=1"
PROBE_MODULES = "jit_graph_probe_.*"


def check_in_command_buffers(name, fn, args, targets):
    """Compiles and runs fn as jit_graph_probe_<name>, then reads XLA's dump:
    every custom call to `targets` must be a command of a command buffer."""
    fn.__name__ = f"graph_probe_{name}"
    jax.block_until_ready(jax.jit(fn)(*args))
    placement = ex.command_buffer_placement(os.environ["EXPHIL_GRAPH_DUMP"], f"jit_graph_probe_{name}",
                                            targets)
    ok = all(t in placement and all(inside for _, inside in placement[t]) for t in targets)
    detail = "; ".join(
        f"{t}: " + (", ".join(f"{i} {'in a command buffer' if inside else 'OUTSIDE'}"
                              for i, inside in placement[t]) if t in placement else "not called")
        for t in targets)
    return ok, detail


def section_graphs(runner, args):
    if GRAPH_FLAG not in os.environ.get("XLA_FLAGS", "") or "EXPHIL_GRAPH_DUMP" not in os.environ:
        runner.results.append(("graphs", "graphs: XLA_FLAGS", False,
                               f"run with --graphs (XLA_FLAGS lacks {GRAPH_FLAG} or the dump)", 0.0))
        print("FAIL graphs: run with --graphs")
        return
    rng = np.random.default_rng([args.seed, 6])
    f32 = jnp.float32

    def scan_placement():
        shape = (1, 2049, 64)
        inputs = tuple(scan_inputs("min_gru", rng, shape, f32))
        gy = dev(rng.standard_normal(shape), f32)

        def f(inputs, gy):
            (y, hf), vjp = jax.vjp(lambda i: ex.scan("min_gru", i), inputs)
            return vjp((gy, jnp.zeros_like(hf)))
        return check_in_command_buffers("min_gru", f, (inputs, gy),
                                        ["exphil_min_gru_fwd", "exphil_min_gru_bwd"])

    def selective_placement():
        b, t, d, n = 2, 600, 64, 16
        x, dt, z = (dev(rng.uniform(-1, 1, (b, t, d)), f32) for _ in range(3))
        A = dev(-rng.uniform(0.01, 2, (d, n)), f32)
        Bm, Cm = (dev(rng.uniform(-1, 1, (b, t, n)), f32) for _ in range(2))
        gy = dev(rng.standard_normal((b, t, d)), f32)

        def f(x, dt, A, Bm, Cm, z, gy):
            # y is returned: the backward recomputes the states from the
            # inputs, so a forward whose y went unused would be dead code.
            y, vjp = jax.vjp(lambda *v: ex.selective_scan(*v[:5], z=v[5], softplus=True)[0],
                             x, dt, A, Bm, Cm, z)
            return y, vjp(gy)
        return check_in_command_buffers("selective_scan", f, (x, dt, A, Bm, Cm, z, gy),
                                        ["exphil_selective_scan_fwd", "exphil_selective_scan_bwd"])

    def attention_placement():
        q = dev(rng.standard_normal((1, 4, 300, 64)), jnp.bfloat16)
        k, v = (dev(rng.standard_normal((1, 2, 300, 64)), jnp.bfloat16) for _ in range(2))
        go = dev(rng.standard_normal((1, 4, 300, 64)), jnp.bfloat16)

        def f(q, k, v, go):
            o, vjp = jax.vjp(lambda q, k, v: ex.attention(q, k, v, mask="causal")[0], q, k, v)
            return vjp(go)
        return check_in_command_buffers("attention", f, (q, k, v, go),
                                        ["exphil_attention_fwd", "exphil_attention_bwd"])

    def gated_placement(cell, stack):
        """The GRU's (or the GRU stack's) targets, forward then backward on
        its y (and y_lower), at B1 T32 H64 (the stack: 2 layers; the
        forward in one launch at B1), with every optional operand absent."""
        register_targets(GATED_TARGETS + STACK_TARGETS)
        b, t, h, L = 1, 32, 64, 2
        gh = GATES[cell] * h
        S = jax.ShapeDtypeStruct
        empty = jnp.zeros((0,), f32)
        wx = dev(rng.uniform(-1, 1, (b, t, gh)), f32)
        gy = dev(rng.uniform(-1, 1, (b, t, h)), f32)
        r = 1.5 / math.sqrt(h)
        if stack:
            R, W = dev(rng.uniform(-r, r, (L, h, gh)), f32), dev(rng.uniform(-r, r, (L - 1, h, gh)), f32)
            fwd = f"exphil_{cell}_stack_fwd"
            bwd = f"exphil_{cell}_stack_bwd"
            fwd_results = (S((b, t, h), f32), S((L - 1, b, t, h), f32), S((L, b, h), f32))
            bwd_results = (S((b, t, gh), f32), S((L, h, gh), f32), S((L - 1, h, gh), f32),
                           S((L, gh), f32), S((L - 1, gh), f32), S((L, b, h), f32))

            def f(wx, R, W, gy):
                y, y_lower, _ = jax.ffi.ffi_call(fwd, fwd_results)(wx, R, W, empty, empty, empty)
                return jax.ffi.ffi_call(bwd, bwd_results)(wx, R, W, y, y_lower, gy, empty, empty, empty,
                                                          empty, empty)
            args_ = (wx, R, W, gy)
        else:
            R = dev(rng.uniform(-r, r, (h, gh)), f32)
            fwd, bwd = f"exphil_{cell}_fwd", f"exphil_{cell}_bwd"
            fwd_results = (S((b, t, h), f32), S((b, h), f32))
            bwd_results = (S((b, t, gh), f32), S((h, gh), f32), S((gh,), f32), S((b, h), f32),
                           S((b, t, gh), f32))

            def f(wx, R, gy):
                y, _ = jax.ffi.ffi_call(fwd, fwd_results)(wx, R, empty, empty)
                return jax.ffi.ffi_call(bwd, bwd_results)(wx, R, y, gy, empty, empty, empty)
            args_ = (wx, R, gy)
        return check_in_command_buffers(f"{cell}{'_stack' if stack else ''}", f, args_, [fwd, bwd])

    runner.case("graphs", "graphs: gru f32 B1 T32 H64 fwd+bwd in XLA command buffers",
                lambda: gated_placement("gru", False))
    runner.case("graphs", "graphs: gru_stack f32 L2 B1 T32 H64 fwd+bwd in XLA command buffers",
                lambda: gated_placement("gru", True))
    runner.case("graphs", "graphs: min_gru f32 B1 T2049 H64 fwd+bwd in XLA command buffers", scan_placement)
    runner.case("graphs", "graphs: selective_scan f32 B2 T600 D64 N16 fwd+bwd in XLA command buffers",
                selective_placement)
    runner.case("graphs", "graphs: attention bf16 B1 H4/2 T300 d64 causal fwd+bwd in XLA command buffers",
                attention_placement)
    # The same shapes checked against the reference while replayed from the
    # graphs (the other sections cover the rest).
    for dn in args.dtypes:
        seed = int(rng.integers(0, 2 ** 31))
        runner.case("graphs", f"graphs: scan min_gru {dn} B1 T2049 H64 against the reference",
                    lambda dn=dn, seed=seed: check_scan_case("min_gru", DTYPES[dn], (1, 2049, 64), "f32",
                                                             seed, args.tol_scale))
        seed = int(rng.integers(0, 2 ** 31))
        runner.case("graphs", f"graphs: selective_scan {dn} B2 T600 D64 N16 all options against the reference",
                    lambda dn=dn, seed=seed: check_selective_case(DTYPES[dn], (2, 600, 64, 16), SS_OPTION_SETS[1],
                                                                  True, seed, args.tol_scale))
        seed = int(rng.integers(0, 2 ** 31))
        spec = dict(B=1, Hkv=2, gqa=2, T=300, S=300, d=64, mask="causal", window=0, layout="bhtd",
                    scale=None, lse_ct=False)
        runner.case("graphs", f"graphs: attention {dn} B1 H4/2 T300 d64 causal against the reference",
                    lambda dn=dn, seed=seed, spec=spec: check_attention_case(DTYPES[dn], spec, seed, args.tol_scale))
        # The gated RNNs: one layer and the stacks (B1, the k-split
        # wavefront; B3, the block layout's; B9, layer by layer) replayed
        # from the graphs.
        seed = int(rng.integers(0, 2 ** 31))
        runner.case("graphs", f"graphs: gated lstm {dn} B3 T20 H37 all optional against the reference",
                    lambda dn=dn, seed=seed: check_gated_case("lstm", DTYPES[dn], DTYPES[dn], jnp.float32,
                                                              (3, 20, 37), GATED_PRESENT[0], "has", seed,
                                                              args.tol_scale))
        for cell, shape in (("gru", (2, 1, 32, 64)), ("lstm", (3, 3, 7, 37)), ("gru", (2, 9, 7, 37))):
            seed = int(rng.integers(0, 2 ** 31))
            runner.case("graphs", f"graphs: gated {cell}_stack {dn} L{shape[0]} B{shape[1]} T{shape[2]} "
                        f"H{shape[3]} against the reference",
                        lambda cell=cell, dn=dn, shape=shape, seed=seed: check_stack_case(
                            cell, DTYPES[dn], shape, "all", seed, args.tol_scale))


# ---------------------------------------------------------------------------
SECTIONS = {
    "scans": section_scans,
    "selective": section_selective,
    "attention": section_attention,
    "gated": section_gated,
    "errors": section_errors,
    "stack": section_stack,
    "graphs": section_graphs,
}
DEFAULT_SECTIONS = [k for k in SECTIONS if k != "graphs"]


def main(argv=None):
    p = argparse.ArgumentParser(description="XLA FFI targets vs JAX references",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=None, help="libexphil_xla_ffi.so (default $EXPHIL_XLA_FFI_LIB, "
                   "else build-gpu/c_src/xla_ffi/libexphil_xla_ffi.so)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="fewer shapes per op")
    p.add_argument("--only", default=None, help="run only cases whose name contains this")
    p.add_argument("--sections", default=None,
                   help=f"comma-separated, of {','.join(SECTIONS)} (default: all; graphs only with --graphs)")
    p.add_argument("--graphs", action="store_true",
                   help=f"add {GRAPH_FLAG} to XLA_FLAGS and run the graphs section too")
    p.add_argument("--dtypes", default="f32,bf16,f16")
    p.add_argument("--tol-scale", type=float, default=1.0)
    p.add_argument("--verbose", action="store_true", help="tracebacks of failing cases")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") % 1_000_000
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.sections is None:
        sections = DEFAULT_SECTIONS + (["graphs"] if args.graphs else [])
    else:
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if args.graphs:
        # Read when JAX creates its GPU backend, which nothing has done yet.
        # The dump (of the graphs section's probes only) shows where XLA put
        # each call.
        dump = tempfile.mkdtemp(prefix="exphil_graph_dump_")
        os.environ["EXPHIL_GRAPH_DUMP"] = dump
        os.environ["XLA_FLAGS"] = " ".join(
            [os.environ.get("XLA_FLAGS", ""), GRAPH_FLAG, ex.placement_dump_flags(dump, PROBE_MODULES)]).strip()
    unknown = [s for s in sections if s not in SECTIONS] + [d for d in args.dtypes if d not in DTYPES]
    if unknown:
        p.error(f"unknown sections/dtypes: {unknown}")

    devs = jax.devices()
    print(f"check_jax_ffi: seed {args.seed} (--seed {args.seed} repeats this run); jax {jax.__version__}, "
          f"python {platform.python_version()}, device {devs[0].platform}:{devs[0].device_kind}; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    runner = Runner(args)
    load_ok = True
    try:
        lib = ex.load(args.lib)
        print(f"registered {len(ex.registered_targets())} targets from {ex.loaded_path()} "
              f"(by pointer: {type(lib).__name__})")
        if ex.missing_targets():
            print(f"MISSING targets: {', '.join(ex.missing_targets())}")
            runner.results.append(("load", "load: every target exported", False,
                                   f"missing {list(ex.missing_targets())}", 0.0))
        if devs[0].platform != "gpu":
            print("note: the default JAX device is not a GPU; the targets are registered for CUDA only")
    except Exception as e:  # noqa: BLE001
        load_ok = False
        print(f"FAIL load: {type(e).__name__}: {e}")
        runner.results.append(("load", "load", False, str(e), 0.0))

    if load_ok:
        for s in sections:
            print(f"\n== {s} ==", flush=True)
            try:
                SECTIONS[s](runner, args)
            except Exception as e:  # noqa: BLE001 - a broken section must not stop the others
                print(f"FAIL section {s}: {type(e).__name__}: {e}")
                traceback.print_exc()
                runner.results.append((s, f"section {s}", False, str(e), 0.0))

    print("\n== summary ==")
    by = {}
    for section, _, ok, _, _ in runner.results:
        n_pass, n_all = by.get(section, (0, 0))
        by[section] = (n_pass + int(ok), n_all + 1)
    for section, (n_pass, n_all) in by.items():
        print(f"{section:10} {n_pass}/{n_all} passed")
    failed = [(s, n, d) for s, n, ok, d, _ in runner.results if not ok]
    total = len(runner.results)
    print(f"total {total - len(failed)}/{total} passed (seed {args.seed})")
    for s, n, d in failed:
        print(f"  FAILED {n}: {d}")
    return 0 if (not failed and total > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
