#!/usr/bin/env python3
"""Checks the y-only scan targets (Edifice's operand and result lists) from JAX.

The targets ExPhil.Native.Edifice maps Edifice's fused scan ops to
(mix_stub/EDIFICE.md; include/exphil/xla_ffi.h, "Scans, y-only form"):

  exphil_min_gru_activated_fwd   (z, candidate, h0) -> y           :fused_mingru_scan
  exphil_min_gru_activated_bwd   (z, candidate, h0, y, g)
                                 -> (grad_z, grad_candidate, grad_h0)
                                 :fused_mingru_scan_backward (and the ELU-GRU
                                 and Real-GRU backward ops)
  exphil_min_lstm_activated_fwd  (f, i, candidate, h0) -> y        :fused_minlstm_scan
  exphil_min_lstm_activated_bwd  (f, i, candidate, h0, y, g)
                                 -> (grad_f, grad_i, grad_candidate, grad_h0)
  exphil_min_gru_y_fwd           (gate, candidate, h0) -> y        :fused_real_gru_scan
  exphil_liquid_y_fwd            (tau, target, h0) -> y            :fused_liquid_scan
  exphil_liquid_y_bwd            (tau, target, h0, y, g) -> (grad_tau, grad_target, grad_h0)
  exphil_linear_scan_y_fwd       (a, b, h0) -> y                   :fused_linear_scan

Each is registered by pointer from the library (after exphil_jax.load, which
registers the others) and called with jax.ffi.ffi_call inside jax.jit, against
float64 JAX references of Edifice's math on the same (rounded) inputs:
Edifice's forward recurrences (lib/edifice/cuda/fused_scan.ex:523, 585-597,
753-754, 824-825, 876) and, for the activated backward ops, Edifice's
hand-written backward with the forward's y as h_prev (fused_scan.ex:548-581,
623-676); the liquid backward against jax.vjp of the reference. The backward
targets get the reference forward's y rounded to the dtype as `fwd`, as
Edifice passes its forward's output. Gates after the sigmoid are sigmoid of
normal logits (so in (0, 1)), rounded to the dtype.

f32, bf16 and f16; h0 of the sequence dtype (as Edifice passes it) or f32;
T = 1, odd sizes and random shapes. Tolerances and scales are
check_jax_ffi.py's for the scans (SCAN_TOL; y against max|y_ref|, the
gradients against the largest reference gradient of the call).

    python3 test/xla_ffi/check_edifice_ffi.py --lib PATH [--seed N] [--quick]

Exit status 0 only if every case passed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_jax_ffi as cj  # noqa: E402  (sets jax_enable_x64, imports exphil_jax)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

ex, ref = cj.ex, cj.ref
F64 = jnp.float64
EPS = 1e-6  # Edifice's norm_eps (fused_scan.ex:585)

# target -> (kind, forward inputs)
FORWARD = {
    "exphil_min_gru_activated_fwd": ("min_gru_activated", ("z", "candidate")),
    "exphil_min_lstm_activated_fwd": ("min_lstm_activated", ("f", "i", "candidate")),
    "exphil_min_gru_y_fwd": ("min_gru", ("gate", "candidate")),
    "exphil_liquid_y_fwd": ("liquid", ("tau", "target")),
    "exphil_linear_scan_y_fwd": ("linear_scan", ("a", "b")),
}
BACKWARD = {
    "exphil_min_gru_activated_bwd": "min_gru_activated",
    "exphil_min_lstm_activated_bwd": "min_lstm_activated",
    "exphil_liquid_y_bwd": "liquid",
}
NEW_TARGETS = tuple(FORWARD) + tuple(BACKWARD)


def register(lib):
    for name in NEW_TARGETS:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA")


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


def inputs_for(kind, rng, shape):
    n = rng.standard_normal
    if kind == "min_gru_activated":
        return [sigmoid64(2.0 * n(shape)), n(shape)]
    if kind == "min_lstm_activated":
        return [sigmoid64(2.0 * n(shape)), sigmoid64(2.0 * n(shape)), n(shape)]
    if kind == "min_gru":
        return [2.0 * n(shape), n(shape)]
    if kind == "liquid":
        return [rng.uniform(0.5, 5.0, shape), n(shape)]
    if kind == "linear_scan":
        a = rng.uniform(0.5, 1.0, shape) * np.where(rng.random(shape) < 0.1, -1.0, 1.0)
        return [a, n(shape)]
    raise AssertionError(kind)


def coefficients(kind, xs):
    """Edifice's step h = a h + b, float64."""
    if kind == "min_gru_activated":  # fused_scan.ex:523
        z, c = xs
        return 1.0 - z, z * c
    if kind == "min_lstm_activated":  # fused_scan.ex:585-597
        f, i, c = xs
        s = f + (i + EPS)
        return f / s, (i / s) * c
    return ref.scan_coefficients(kind, xs)


def forward_ref(kind, xs, h0):
    a, b = coefficients(kind, xs)

    def step(h, ab):
        h = ab[0] * h + ab[1]
        return h, h

    _, ys = lax.scan(step, h0, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))
    return jnp.swapaxes(ys, 0, 1)


def backward_ref(kind, xs, h0, fwd, g):
    """Edifice's backward (the activated ops), with h_prev from fwd; the
    liquid backward as jax.vjp of the reference forward."""
    if kind == "liquid":
        _, vjp = jax.vjp(lambda x, s: forward_ref(kind, x, s), list(xs), h0)
        gx, gh0 = vjp(g)
        return list(gx), gh0
    h_prev = jnp.concatenate([h0[:, None, :], fwd[:, :-1, :]], axis=1)
    if kind == "min_gru_activated":  # fused_scan.ex:570-572
        z, c = xs
        a = 1.0 - z
    else:  # fused_scan.ex:623-676
        f, i, c = xs
        s = f + (i + EPS)
        a = f / s

    def step(carry, t_in):
        g_t, a_t = t_in
        dh = g_t + carry
        return dh * a_t, dh

    carry, dhs = lax.scan(step, jnp.zeros_like(h0),
                          (jnp.swapaxes(g, 0, 1), jnp.swapaxes(a, 0, 1)), reverse=True)
    dh = jnp.swapaxes(dhs, 0, 1)
    if kind == "min_gru_activated":
        return [dh * (c - h_prev), dh * z], carry
    s2 = s * s
    return [dh * (h_prev * (i + EPS) - c * i) / s2,
            dh * (c * (f + EPS) - f * h_prev) / s2,
            dh * i / s], carry


def check_forward(target, dtype, shape, state_dtype, seed, tol_scale):
    kind, _ = FORWARD[target]
    rng = np.random.default_rng(seed)
    b, t, h = shape
    xs = [cj.dev(v, dtype) for v in inputs_for(kind, rng, shape)]
    h0 = cj.dev(rng.standard_normal((b, h)), state_dtype)

    @jax.jit
    def ours(xs, h0):
        return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, dtype))(*xs, h0)

    y = jax.block_until_ready(ours(xs, h0))
    ry = jax.jit(lambda x, s: forward_ref(kind, x, s))([cj.up(x) for x in xs], cj.up(h0))
    k = cj.key_of(dtype)
    m = [cj.compare("y", y, ry, cj.SCAN_TOL[k], dtype, cj.amax(ry), tol_scale)]
    if jnp.dtype(y.dtype) != jnp.dtype(dtype):
        m.append(cj.Metric("dtype", False, float("inf"), float("inf"), f"y {y.dtype}"))
    return cj.summarize(m)


def check_backward(target, dtype, shape, state_dtype, seed, tol_scale):
    kind = BACKWARD[target]
    rng = np.random.default_rng(seed)
    b, t, h = shape
    xs = [cj.dev(v, dtype) for v in inputs_for(kind, rng, shape)]
    h0 = cj.dev(rng.standard_normal((b, h)), state_dtype)
    g = cj.dev(rng.standard_normal(shape), dtype)
    xs64, h064, g64 = [cj.up(x) for x in xs], cj.up(h0), cj.up(g)
    # Edifice passes its forward's output as fwd: the reference's, rounded.
    fwd = jax.jit(lambda x, s: forward_ref(kind, x, s))(xs64, h064).astype(dtype)
    results = tuple(jax.ShapeDtypeStruct(shape, dtype) for _ in xs) + (
        jax.ShapeDtypeStruct((b, h), state_dtype),)

    @jax.jit
    def ours(xs, h0, fwd, g):
        return jax.ffi.ffi_call(target, results)(*xs, h0, fwd, g)

    out = jax.block_until_ready(ours(xs, h0, fwd, g))
    rgx, rgh0 = jax.jit(lambda x, s, y, gy: backward_ref(kind, x, s, y, gy))(
        xs64, h064, cj.up(fwd), g64)
    scale = max(cj.amax(r) for r in list(rgx) + [rgh0])
    k, ks = cj.key_of(dtype), cj.key_of(state_dtype)
    m = [cj.compare(f"grad_{i}", o, r, cj.SCAN_TOL[k], dtype, scale, tol_scale)
         for i, (o, r) in enumerate(zip(out[:-1], rgx))]
    m.append(cj.compare("grad_h0", out[-1], rgh0, cj.SCAN_TOL[ks], state_dtype, scale, tol_scale))
    bad = [str(o.dtype) for o in out[:-1] if jnp.dtype(o.dtype) != jnp.dtype(dtype)]
    if bad or jnp.dtype(out[-1].dtype) != jnp.dtype(state_dtype):
        m.append(cj.Metric("dtypes", False, float("inf"), float("inf"), f"{bad} {out[-1].dtype}"))
    return cj.summarize(m)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default=None)
    p.add_argument("--dtypes", default="f32,bf16,f16")
    p.add_argument("--tol-scale", type=float, default=1.0)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") % 1_000_000
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    devs = jax.devices()
    print(f"check_edifice_ffi: seed {args.seed}; jax {jax.__version__}, "
          f"device {devs[0].platform}:{devs[0].device_kind}")
    lib = ex.load(args.lib)
    register(lib)
    print(f"registered {len(NEW_TARGETS)} y-only targets from {ex.loaded_path()} by pointer")

    runner = cj.Runner(args)
    rng = np.random.default_rng([args.seed, 7])
    fixed = [(1, 1, 1), (2, 5, 3), (1, 64, 256)] if args.quick else \
        [(1, 1, 1), (1, 1, 8), (2, 5, 3), (3, 33, 4), (1, 300, 17), (2, 128, 256), (1, 1000, 64)]
    idx = 0
    for target in NEW_TARGETS:
        check = check_forward if target in FORWARD else check_backward
        for dn in dtypes:
            dtype = cj.DTYPES[dn]
            shapes = fixed + [(int(rng.integers(1, 5)), int(rng.integers(1, 600)),
                               int(rng.integers(1, 300)))]
            for shape in shapes:
                # h0 as Edifice passes it (the sequence dtype), every third f32
                state_dtype = jnp.float32 if idx % 3 == 2 else dtype
                idx += 1
                seed = int(rng.integers(0, 2 ** 31))
                name = (f"{target} {dn} B{shape[0]} T{shape[1]} H{shape[2]} "
                        f"h0 {cj.key_of(state_dtype)}")
                runner.case("edifice", name, lambda: check(target, dtype, shape, state_dtype,
                                                           seed, args.tol_scale))
    failed = [(n, d) for _, n, ok, d, _ in runner.results if not ok]
    total = len(runner.results)
    print(f"\ntotal {total - len(failed)}/{total} passed (seed {args.seed})")
    for n, d in failed:
        print(f"  FAILED {n}: {d}")
    return 0 if (not failed and total > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
