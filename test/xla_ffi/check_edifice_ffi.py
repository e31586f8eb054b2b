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
  exphil_linear_scan_y_bwd       (a, h0, y, g) -> (grad_a, grad_b, grad_h0)
                                 :fused_linear_scan_backward and
                                 :fused_diag_linear_scan_backward (no b: the
                                 states are read from y)
  exphil_diag_linear_y_fwd       (a, b, h0) -> y                   :fused_diag_linear_scan
  exphil_elu_gru_y_fwd           (gate, candidate, h0) -> y        :fused_elu_gru_scan

and the selective-scan backward and attention targets:

  exphil_selective_scan_y_fwd    (x, dt, A, B, C) -> y            :fused_selective_scan
                                 (f32 only; input_scale 1: the mean of delta
                                 over the channels scales the input term)
  exphil_selective_scan_y_bwd    (x, dt, A, B, C, g) -> (grad_x, grad_dt, grad_B, grad_C)
                                 :fused_selective_scan_backward (f32 only)
  exphil_attention_o_fwd         (q, k, v, causal_packed) -> o    :fused_flash_attention
  exphil_attention_o_bwd         (q, k, v, fwd, g, causal_packed) -> (grad_q, grad_k, grad_v)
                                 :fused_flash_attention_backward (lse recomputed)

and the GRU, LSTM and sLSTM targets:

  exphil_gru_y_fwd               (wx, R, h0) -> y                 :fused_gru_scan
  exphil_gru_y_bwd               (wx, R, h0, fwd, g) -> (grad_wx, grad_rh, grad_h0)
                                 :fused_gru_scan_backward
  exphil_lstm_y_fwd              (wx, R, h0, c0) -> y             :fused_lstm_scan
  exphil_lstm_y_bwd              (wx, R, h0, c0, fwd, g) -> (grad_wx, grad_h0, grad_c0)
                                 :fused_lstm_scan_backward
  exphil_slstm_y_fwd             (wx, R, h0, c0) -> y             :fused_slstm_scan
                                 (n0 = 1, m0 = 0 implicit; no backward op)

Each is registered by pointer from the library (after exphil_jax.load, which
registers the others) and called with jax.ffi.ffi_call inside jax.jit, against
float64 JAX references of Edifice's math on the same (rounded) inputs:
Edifice's forward recurrences (lib/edifice/cuda/fused_scan.ex:523, 585-597,
753-754, 824-825, 876, 715-717, 791) and, for the activated and linear-scan
backward ops, Edifice's hand-written backward with the forward's y as h_prev
(fused_scan.ex:548-581, 623-676, 884-916); the liquid backward against
jax.vjp of the reference. The backward
targets get the reference forward's y rounded to the dtype as `fwd`, as
Edifice passes its forward's output. Gates after the sigmoid are sigmoid of
normal logits (so in (0, 1)), rounded to the dtype.

The selective-scan forward is checked in f32 against Edifice's forward
default (ssm/common.ex:402-471, 661-668) in float64: dt clipped to [0.001,
0.1], A_bar = exp(dt A) per channel, B_bar = mean over the channels of the
clipped dt times B, y = sum_n C h; A = -(1..S) for every channel as Mamba
passes it (the default's own A), and, once per run, a random A, against
the same reference reading A from the operand (the target's contract).

The selective-scan backward is checked in f32 (the only dtype Edifice's
template, f32 grad_B and grad_C, lets it serve) against Edifice's
hand-written backward (fused_scan.ex:1453-1532) in float64: softplus off,
clamp [0.001, 0.1] (the f32 bounds, as Edifice compares f32 values), dt's
gradient masked to 0.001 <= dt <= 0.1 inclusive, with dt spread below, inside
and above the range and some of it exactly on each bound. Attention against
Edifice's fallback (fused_scan.ex:3476-3508): softmax(q k^T / sqrt(d)) v, with
the mask rows >= cols when causal, BHTD, T = S; the flag operand is
causal_packed, Nx.tensor([causal]) of q's dtype, as Edifice passes it. The
attention backward against Edifice's backward fallback (fused_scan.ex:3527-3570),
given as fwd the reference's o rounded to the dtype (as Edifice passes its
forward's output); tolerances and the gradients' scale are check_jax_ffi.py's.

The GRU and LSTM against Edifice's fallbacks in float64: the forward
recurrences (fused_scan.ex:2493-2531, 2437-2463: wx + h R, no recurrent
bias; GRU n = tanh(wx_n + r (h R)_n)) and Edifice's hand-written backward
ops (fused_scan.ex:1124-1182, 1044-1102), the GRU's with its h_prev from
fwd (the reference forward's y rounded to the dtype, as Edifice passes its
forward's output); each case also holds that backward, given the exact y,
to jax.vjp of the forward (grad_rh: of a zero added to h R), which it must
equal to 1e-9. R and the states (h0, c0) of the sequence dtype (as Edifice
passes them) or f32; the states zeros (Edifice's) or random. Tolerances and
scales are check_jax_ffi.py's GATED_TOL with one scale per call (the states
for y; the largest reference gradient for the gradients).
The sLSTM forward (exphil_slstm_y_fwd) against Edifice's
slstm_scan_fallback (fused_scan.ex:2371-2402, n0 = 1 and m0 = 0 as it
starts them) the same way; Edifice has no sLSTM backward op.

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
    "exphil_diag_linear_y_fwd": ("diag_linear", ("a", "b")),
    "exphil_elu_gru_y_fwd": ("elu_gru", ("gate", "candidate")),
}
BACKWARD = {
    "exphil_min_gru_activated_bwd": "min_gru_activated",
    "exphil_min_lstm_activated_bwd": "min_lstm_activated",
    "exphil_liquid_y_bwd": "liquid",
    "exphil_linear_scan_y_bwd": "linear_scan",
}
# Backward targets that take only the first input (Edifice passes no b).
WITHOUT_LAST_INPUT = {"exphil_linear_scan_y_bwd"}
SCAN_TARGETS = tuple(FORWARD) + tuple(BACKWARD)
SS_TARGET = "exphil_selective_scan_y_bwd"
SS_F_TARGET = "exphil_selective_scan_y_fwd"
ATT_F_TARGET = "exphil_attention_o_fwd"
ATT_B_TARGET = "exphil_attention_o_bwd"
# target -> cell (Edifice's :fused_gru_scan, :fused_lstm_scan and their backward
# ops; :fused_slstm_scan, which has none)
RNN_FORWARD = {"exphil_gru_y_fwd": "gru", "exphil_lstm_y_fwd": "lstm",
               "exphil_slstm_y_fwd": "slstm"}
RNN_BACKWARD = {"exphil_gru_y_bwd": "gru", "exphil_lstm_y_bwd": "lstm"}
RNN_TARGETS = tuple(RNN_FORWARD) + tuple(RNN_BACKWARD)
NEW_TARGETS = SCAN_TARGETS + (SS_TARGET, SS_F_TARGET, ATT_F_TARGET, ATT_B_TARGET) + RNN_TARGETS
SS_LO, SS_HI = float(np.float32(0.001)), float(np.float32(0.1))  # fused_scan.ex:1465, 1513


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
    if kind == "diag_linear":
        return [2.0 * n(shape), n(shape)]
    if kind == "elu_gru":  # candidates on both sides of elu's kink
        return [2.0 * n(shape), 1.5 * n(shape)]
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
    if kind == "diag_linear":  # fused_scan.ex:791
        a, b = xs
        return 1.0 / (1.0 + jnp.exp(-a)), b
    if kind == "elu_gru":  # fused_scan.ex:715-717
        gate, c = xs
        z = 1.0 / (1.0 + jnp.exp(-gate))
        c_act = 1.0 + jnp.where(c > 0, c, jnp.exp(c) - 1.0)
        return 1.0 - z, z * c_act
    return ref.scan_coefficients(kind, xs)


def forward_ref(kind, xs, h0):
    a, b = coefficients(kind, xs)

    def step(h, ab):
        h = ab[0] * h + ab[1]
        return h, h

    _, ys = lax.scan(step, h0, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))
    return jnp.swapaxes(ys, 0, 1)


def backward_ref(kind, xs, h0, fwd, g):
    """Edifice's backward (the activated ops and the linear scan), with
    h_prev from fwd; the liquid backward as jax.vjp of the reference
    forward."""
    if kind == "liquid":
        _, vjp = jax.vjp(lambda x, s: forward_ref(kind, x, s), list(xs), h0)
        gx, gh0 = vjp(g)
        return list(gx), gh0
    h_prev = jnp.concatenate([h0[:, None, :], fwd[:, :-1, :]], axis=1)
    if kind == "min_gru_activated":  # fused_scan.ex:570-572
        z, c = xs
        a = 1.0 - z
    elif kind == "linear_scan":  # fused_scan.ex:884-916
        a = xs[0]
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
    if kind == "linear_scan":
        return [dh * h_prev, dh], carry
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

    passed = xs[:-1] if target in WITHOUT_LAST_INPUT else xs

    @jax.jit
    def ours(xs, h0, fwd, g):
        return jax.ffi.ffi_call(target, results)(*xs, h0, fwd, g)

    out = jax.block_until_ready(ours(passed, h0, fwd, g))
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


# ---------------------------------------------------------------------------
# Selective-scan backward (Edifice's :fused_selective_scan_backward)
# ---------------------------------------------------------------------------
def selective_backward_ref(x, dt, A, B, C, g):
    """Edifice's selective_scan_backward_fallback (fused_scan.ex:1453-1532),
    float64: per-channel B_bar = dt B, A_bar = exp(dt A), dt clipped to the
    f32 bounds, its gradient kept where the unclipped dt is within them."""
    dtc = jnp.clip(dt, SS_LO, SS_HI)
    bsz, _, hid = x.shape
    n = A.shape[1]
    tm = lambda a: jnp.swapaxes(a, 0, 1)  # noqa: E731  [B, T, ...] -> [T, B, ...]

    def fwd_step(h, t_in):
        x_t, d_t, b_t = t_in
        h_new = jnp.exp(d_t[:, :, None] * A[None]) * h + d_t[:, :, None] * b_t[:, None, :] * \
            x_t[:, :, None]
        return h_new, h

    h0 = jnp.zeros((bsz, hid, n), F64)
    _, h_prevs = lax.scan(fwd_step, h0, (tm(x), tm(dtc), tm(B)))

    def bwd_step(dh_s, t_in):
        dy, x_t, d_raw, d_t, b_t, c_t, h_prev = t_in
        de = d_t[:, :, None]
        a_bar = jnp.exp(de * A[None])
        h_cur = a_bar * h_prev + de * b_t[:, None, :] * x_t[:, :, None]
        dh = dh_s + dy[:, :, None] * c_t[:, None, :]
        gc = jnp.sum(dy[:, :, None] * h_cur, axis=1)
        gx = jnp.sum(dh * de * b_t[:, None, :], axis=2)
        gdt = jnp.sum(dh * h_prev * a_bar * A[None], axis=2) + \
            jnp.sum(dh * b_t[:, None, :] * x_t[:, :, None], axis=2)
        gdt = jnp.where((d_raw >= SS_LO) & (d_raw <= SS_HI), gdt, 0.0)
        gb = jnp.sum(dh * x_t[:, :, None] * de, axis=1)
        return dh * a_bar, (gx, gdt, gb, gc)

    _, outs = lax.scan(bwd_step, h0, (tm(g), tm(x), tm(dt), tm(dtc), tm(B), tm(C), h_prevs),
                       reverse=True)
    return tuple(tm(o) for o in outs)


def selective_forward_ref(x, dt, A, B, C):
    """Edifice's selective_scan_fallback (ssm/common.ex:661-668, discretize_ssm
    :402-438), float64, with A from the operand."""
    dtc = jnp.clip(dt, SS_LO, SS_HI)
    mean = jnp.mean(dtc, axis=2)  # [B, T]
    bsz, _, hid = x.shape
    tm = lambda a: jnp.swapaxes(a, 0, 1)  # noqa: E731

    def step(h, t_in):
        x_t, d_t, m_t, b_t, c_t = t_in
        h = jnp.exp(d_t[:, :, None] * A[None]) * h + \
            (m_t[:, None, None] * b_t[:, None, :]) * x_t[:, :, None]
        return h, jnp.sum(c_t[:, None, :] * h, axis=2)

    h0 = jnp.zeros((bsz, hid, A.shape[1]), F64)
    _, ys = lax.scan(step, h0, (tm(x), tm(dtc), tm(mean), tm(B), tm(C)))
    return tm(ys)


def check_selective_forward(shape, seed, tol_scale, random_a):
    rng = np.random.default_rng(seed)
    b, t, d, n = shape
    f32 = jnp.float32
    nrm = rng.standard_normal
    x = cj.np_round(nrm((b, t, d)), f32)
    # below, inside and above [0.001, 0.1]: the channels' clipped dt differ
    dt = cj.np_round(rng.uniform(0.0, 0.13, (b, t, d)), f32)
    if random_a:
        A = cj.np_round(-np.exp(rng.uniform(np.log(0.5), np.log(8.0), (d, n))), f32)
    else:
        A = np.broadcast_to(-(np.arange(n, dtype=np.float64) + 1.0), (d, n)).copy()
    Bm = cj.np_round(nrm((b, t, n)), f32)
    Cm = cj.np_round(nrm((b, t, n)), f32)
    vals = [cj.dev(v, f32) for v in (x, dt, A, Bm, Cm)]

    @jax.jit
    def ours(*vals):
        return jax.ffi.ffi_call(SS_F_TARGET, jax.ShapeDtypeStruct((b, t, d), f32))(
            *vals, softplus=np.bool_(False), clamp=np.bool_(True), dt_min=np.float32(0.001),
            dt_max=np.float32(0.1), input_scale=np.int32(1))

    y = jax.block_until_ready(ours(*vals))
    ry = jax.jit(selective_forward_ref)(*[cj.up(v) for v in vals])
    m = [cj.compare("y", y, ry, cj.SCAN_TOL["f32"], f32, cj.amax(ry), tol_scale)]
    if jnp.dtype(y.dtype) != jnp.dtype(f32):
        m.append(cj.Metric("dtype", False, float("inf"), float("inf"), f"y {y.dtype}"))
    return cj.summarize(m)


def check_selective_backward(shape, seed, tol_scale):
    rng = np.random.default_rng(seed)
    b, t, d, n = shape
    f32 = jnp.float32
    nrm = rng.standard_normal
    x = cj.np_round(nrm((b, t, d)), f32)
    # below, inside and above [0.001, 0.1], and exactly on each bound
    dt = rng.uniform(0.0, 0.13, (b, t, d))
    pick = rng.random((b, t, d))
    dt = np.where(pick < 0.1, SS_LO, np.where(pick > 0.9, SS_HI, dt))
    dt = cj.np_round(dt, f32)
    A = cj.np_round(-np.exp(rng.uniform(np.log(0.5), np.log(8.0), (d, n))), f32)
    Bm = cj.np_round(nrm((b, t, n)), f32)
    Cm = cj.np_round(nrm((b, t, n)), f32)
    g = cj.np_round(nrm((b, t, d)), f32)
    vals = [cj.dev(v, f32) for v in (x, dt, A, Bm, Cm, g)]
    results = (jax.ShapeDtypeStruct((b, t, d), f32), jax.ShapeDtypeStruct((b, t, d), f32),
               jax.ShapeDtypeStruct((b, t, n), f32), jax.ShapeDtypeStruct((b, t, n), f32))

    @jax.jit
    def ours(*vals):
        return jax.ffi.ffi_call(SS_TARGET, results)(
            *vals, softplus=np.bool_(False), clamp=np.bool_(True), dt_min=np.float32(0.001),
            dt_max=np.float32(0.1))

    out = jax.block_until_ready(ours(*vals))
    refs = jax.jit(selective_backward_ref)(*[cj.up(v) for v in vals])
    m = [cj.compare(nm, o, r, cj.SCAN_TOL["f32"], f32, None, tol_scale)
         for nm, o, r in zip(("grad_x", "grad_dt", "grad_B", "grad_C"), out, refs)]
    # the mask: grad_dt exactly 0 where dt is outside the range
    outside = (dt < SS_LO) | (dt > SS_HI)
    zero = bool(np.all(cj.to_np(out[1])[outside] == 0.0))
    m.append(cj.Metric("mask", zero, 0.0 if zero else float("inf"), 0.0,
                       "" if zero else "grad_dt not 0 where dt is clipped"))
    bad = [str(o.dtype) for o in out if jnp.dtype(o.dtype) != jnp.dtype(f32)]
    if bad:
        m.append(cj.Metric("dtypes", False, float("inf"), float("inf"), f"{bad}"))
    ok, detail = cj.summarize(m)
    on_bound = int(np.sum(dt == SS_LO) + np.sum(dt == SS_HI))
    return ok, detail + f"; {int(outside.sum())} clipped, {on_bound} on a bound"


# ---------------------------------------------------------------------------
# Attention (Edifice's :fused_flash_attention)
# ---------------------------------------------------------------------------
def attention_ref(q, k, v, causal):
    """Edifice's flash_attention_fallback (fused_scan.ex:3476-3508), float64."""
    t, s, d = q.shape[2], k.shape[2], q.shape[3]
    scores = jnp.einsum("bhtd,bhsd->bhts", q, k) / jnp.sqrt(jnp.asarray(d, F64))
    if causal:
        rows = jnp.arange(t)[:, None]
        cols = jnp.arange(s)[None, :]
        scores = jnp.where(rows >= cols, scores, -jnp.inf)
    w = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    return jnp.einsum("bhts,bhsd->bhtd", w, v)


def attention_backward_ref(q, k, v, g, causal):
    """Edifice's flash_attention_backward_fallback (fused_scan.ex:3527-3570),
    float64: the softmax recomputed, dV = W^T g, dS = W (g V^T - rowsum),
    scaled, dQ = dS K, dK = dS^T Q."""
    t, s, d = q.shape[2], k.shape[2], q.shape[3]
    scale = jnp.sqrt(jnp.asarray(d, F64))
    scores = jnp.einsum("bhtd,bhsd->bhts", q, k) / scale
    if causal:
        scores = jnp.where(jnp.arange(t)[:, None] >= jnp.arange(s)[None, :], scores, -jnp.inf)
    w = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    grad_v = jnp.einsum("bhts,bhtd->bhsd", w, g)
    dw = jnp.einsum("bhtd,bhsd->bhts", g, v)
    ds = w * (dw - jnp.sum(dw * w, axis=-1, keepdims=True)) / scale
    return (jnp.einsum("bhts,bhsd->bhtd", ds, k), jnp.einsum("bhts,bhtd->bhsd", ds, q), grad_v)


def attention_attributes(causal):
    return dict(mask=np.int32(1 if causal else 0), window=np.int32(0), layout=np.int32(0),
                scale=np.float32(0.0), precision=np.int32(0))


def attention_inputs(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    return [cj.dev(rng.standard_normal(shape), dtype) for _ in range(4)]  # q, k, v, g


def check_attention_forward(dtype, shape, causal, seed, tol_scale):
    q, k, v, _ = attention_inputs(dtype, shape, seed)
    flag = jnp.asarray([1 if causal else 0], dtype)  # causal_packed, never read

    @jax.jit
    def ours(q, k, v, flag):
        return jax.ffi.ffi_call(ATT_F_TARGET, jax.ShapeDtypeStruct(shape, dtype))(
            q, k, v, flag, **attention_attributes(causal))

    o = jax.block_until_ready(ours(q, k, v, flag))
    ro = jax.jit(attention_ref, static_argnums=3)(cj.up(q), cj.up(k), cj.up(v), causal)
    m = [cj.compare("o", o, ro, cj.ATTN_TOL[cj.key_of(dtype)]["o"], dtype, None, tol_scale)]
    if jnp.dtype(o.dtype) != jnp.dtype(dtype):
        m.append(cj.Metric("dtype", False, float("inf"), float("inf"), f"o {o.dtype}"))
    return cj.summarize(m)


def check_attention_backward(dtype, shape, causal, seed, tol_scale):
    q, k, v, g = attention_inputs(dtype, shape, seed)
    flag = jnp.asarray([1 if causal else 0], dtype)  # causal_packed, never read
    q64, k64, v64, g64 = (cj.up(x) for x in (q, k, v, g))
    # Edifice passes its forward's output as fwd: the reference's, rounded.
    fwd = jax.jit(attention_ref, static_argnums=3)(q64, k64, v64, causal).astype(dtype)
    results = tuple(jax.ShapeDtypeStruct(shape, dtype) for _ in range(3))

    @jax.jit
    def ours(q, k, v, fwd, g, flag):
        return jax.ffi.ffi_call(ATT_B_TARGET, results)(
            q, k, v, fwd, g, flag, **attention_attributes(causal))

    out = jax.block_until_ready(ours(q, k, v, fwd, g, flag))
    refs = jax.jit(attention_backward_ref, static_argnums=4)(q64, k64, v64, g64, causal)
    tol = cj.ATTN_TOL[cj.key_of(dtype)]["grad"]
    # check_jax_ffi.py's scale of the gradients
    terms = cj.amax(g) * cj.amax(v) * max(cj.amax(q), cj.amax(k)) / np.sqrt(shape[3])
    m = [cj.compare(nm, o, r, tol, dtype, terms, tol_scale)
         for nm, o, r in zip(("grad_q", "grad_k", "grad_v"), out, refs)]
    bad = [str(o.dtype) for o in out if jnp.dtype(o.dtype) != jnp.dtype(dtype)]
    if bad:
        m.append(cj.Metric("dtypes", False, float("inf"), float("inf"), f"{bad}"))
    return cj.summarize(m)


# ---------------------------------------------------------------------------
# GRU, LSTM and sLSTM (Edifice's :fused_gru_scan, :fused_lstm_scan and their
# backward ops; :fused_slstm_scan)
# ---------------------------------------------------------------------------
def _sig(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def _tm(a):
    return jnp.swapaxes(a, 0, 1)  # [B, T, ...] <-> [T, B, ...]


def rnn_forward_ref(cell, wx, R, h0, c0):
    """Edifice's gru_scan_fallback, lstm_scan_fallback and
    slstm_scan_fallback (fused_scan.ex:2493-2531, 2437-2463, 2371-2402),
    float64: [y, then the GRU's r, z, n and (h R)_n, or the LSTM's i, f, g, o
    and c; the sLSTM's y alone], each [B, T, H]. The sLSTM starts n at ones
    and m at zeros (fused_scan.ex:2375-2376)."""
    H = R.shape[0]

    def step(carry, wx_t):
        h_p = carry[0]
        rh = h_p @ R
        if cell == "slstm":
            _, c_p, n_p, m_p = carry
            gates = wx_t + rh
            log_i, log_f = gates[:, :H], gates[:, H:2 * H]
            z, o = jnp.tanh(gates[:, 2 * H:3 * H]), _sig(gates[:, 3 * H:])
            m = jnp.maximum(log_f + m_p, log_i)
            i = jnp.exp(log_i - m)
            f = jnp.exp(log_f + m_p - m)
            c = f * c_p + i * z
            n = f * n_p + i
            h = o * (c / jnp.maximum(jnp.abs(n), 1.0))
            return (h, c, n, m), (h,)
        if cell == "gru":
            r = _sig(wx_t[:, :H] + rh[:, :H])
            z = _sig(wx_t[:, H:2 * H] + rh[:, H:2 * H])
            rh_n = rh[:, 2 * H:]
            n = jnp.tanh(wx_t[:, 2 * H:] + r * rh_n)
            h = (1.0 - z) * n + z * h_p
            return (h,), (h, r, z, n, rh_n)
        gates = wx_t + rh
        i, f = _sig(gates[:, :H]), _sig(gates[:, H:2 * H])
        g, o = jnp.tanh(gates[:, 2 * H:3 * H]), _sig(gates[:, 3 * H:])
        c = f * carry[1] + i * g
        h = o * jnp.tanh(c)
        return (h, c), (h, i, f, g, o, c)

    init = {"gru": (h0,), "lstm": (h0, c0),
            "slstm": (h0, c0, jnp.ones_like(h0), jnp.zeros_like(h0))}[cell]
    _, outs = lax.scan(step, init, _tm(wx))
    return [_tm(o) for o in outs]


def rnn_backward_ref(cell, wx, R, h0, c0, fwd, g):
    """Edifice's gru_backward_fallback and lstm_backward_fallback
    (fused_scan.ex:1124-1182, 1044-1102), float64, line by line: the gates
    recomputed by its own forward; the GRU's h_prev from fwd. Returns the
    target's results: GRU (grad_wx, grad_rh, grad_h0), LSTM (grad_wx,
    grad_h0, grad_c0)."""
    outs = rnn_forward_ref(cell, wx, R, h0, c0)
    zeros = jnp.zeros_like(h0)
    if cell == "gru":
        _, r, z, n, rh_n = outs
        h_prev = jnp.concatenate([h0[:, None, :], fwd[:, :-1, :]], axis=1)

        def step(dh_prev, t_in):
            g_t, r_t, z_t, n_t, rhn_t, hp_t = t_in
            dh = g_t + dh_prev
            dn = dh * (1.0 - z_t)
            dz_pre = dh * (hp_t - n_t) * (z_t * (1.0 - z_t))
            dn_pre = dn * (1.0 - n_t * n_t)
            dr_pre = dn_pre * rhn_t * (r_t * (1.0 - r_t))
            d_rh_n = dn_pre * r_t
            gwx = jnp.concatenate([dr_pre, dz_pre, dn_pre], axis=1)
            grh = jnp.concatenate([dr_pre, dz_pre, d_rh_n], axis=1)
            return dh * z_t + grh @ R.T, (gwx, grh)

        dh0, (gwx, grh) = lax.scan(
            step, zeros, tuple(_tm(a) for a in (g, r, z, n, rh_n, h_prev)), reverse=True)
        return [_tm(gwx), _tm(grh), dh0]

    _, i, f, gg, o, c = outs
    c_prev = jnp.concatenate([c0[:, None, :], c[:, :-1, :]], axis=1)

    def step(carry, t_in):
        dh_prev, dc_prev = carry
        g_t, i_t, f_t, gg_t, o_t, c_t, cp_t = t_in
        dh = g_t + dh_prev
        tanh_c = jnp.tanh(c_t)
        do_pre = dh * tanh_c * (o_t * (1.0 - o_t))
        dc = dh * o_t * (1.0 - tanh_c * tanh_c) + dc_prev
        di_pre = dc * gg_t * (i_t * (1.0 - i_t))
        df_pre = dc * cp_t * (f_t * (1.0 - f_t))
        dg_pre = dc * i_t * (1.0 - gg_t * gg_t)
        gwx = jnp.concatenate([di_pre, df_pre, dg_pre, do_pre], axis=1)
        return (gwx @ R.T, dc * f_t), gwx

    (dh0, dc0), gwx = lax.scan(
        step, (zeros, zeros), tuple(_tm(a) for a in (g, i, f, gg, o, c, c_prev)), reverse=True)
    return [_tm(gwx), dh0, dc0]


def rnn_vjp_ref(cell, wx, R, h0, c0, g):
    """The same results as jax.vjp of check_jax_ffi.py's gated_ref without
    bias (the exact gradient of the forward)."""
    b, h = h0.shape
    gh = wx.shape[2]
    zeros = jnp.zeros((b, h), F64)
    r = cj.gated_all_ref(cell, wx, R, jnp.zeros((gh,), F64), h0, c0, g, zeros,
                         zeros if cell == "lstm" else None)
    return [r["wx"], r["rh"], r["h0"]] if cell == "gru" else [r["wx"], r["h0"], r["c0"]]


def rnn_inputs(cell, dtype, weight_dtype, state_dtype, shape, zero_states, rng):
    """wx, R and the states (h0, and c0 for the LSTM), rounded to their
    dtypes; test_gated_rnn.cpp's ranges (R within 1.5 / sqrt(H))."""
    b, t, h = shape
    gh = (3 if cell == "gru" else 4) * h
    r = 1.5 / np.sqrt(h)
    wx = cj.dev(rng.uniform(-1.5, 1.5, (b, t, gh)), dtype)
    R = cj.dev(rng.uniform(-r, r, (h, gh)), weight_dtype)
    states = [cj.dev(np.zeros((b, h)) if zero_states else rng.uniform(-1.0, 1.0, (b, h)),
                     state_dtype) for _ in range(1 if cell == "gru" else 2)]
    return wx, R, states


def _states64(states):
    s = [cj.up(x) for x in states]
    return s[0], (s[1] if len(s) > 1 else None)


def check_rnn_forward(target, dtype, weight_dtype, state_dtype, shape, zero_states, seed,
                      tol_scale):
    cell = RNN_FORWARD[target]
    rng = np.random.default_rng(seed)
    b, t, h = shape
    wx, R, states = rnn_inputs(cell, dtype, weight_dtype, state_dtype, shape, zero_states, rng)

    @jax.jit
    def ours(wx, R, states):
        return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((b, t, h), dtype))(wx, R, *states)

    y = jax.block_until_ready(ours(wx, R, states))
    h0, c0 = _states64(states)
    ry = jax.jit(lambda wx, R, h0, c0: rnn_forward_ref(cell, wx, R, h0, c0)[0])(
        cj.up(wx), cj.up(R), h0, c0)
    scale = max([cj.amax(ry)] + [cj.amax(s) for s in states])
    m = [cj.compare("y", y, ry, cj.GATED_TOL[cj.key_of(dtype)], dtype, scale, tol_scale)]
    if jnp.dtype(y.dtype) != jnp.dtype(dtype):
        m.append(cj.Metric("dtype", False, float("inf"), float("inf"), f"y {y.dtype}"))
    return cj.summarize(m)


def check_rnn_backward(target, dtype, weight_dtype, state_dtype, shape, zero_states, seed,
                       tol_scale):
    cell = RNN_BACKWARD[target]
    rng = np.random.default_rng(seed)
    b, t, h = shape
    gh = cj.GATES[cell] * h
    wx, R, states = rnn_inputs(cell, dtype, weight_dtype, state_dtype, shape, zero_states, rng)
    g = cj.dev(rng.uniform(-1.0, 1.0, (b, t, h)), dtype)
    wx64, R64, g64 = cj.up(wx), cj.up(R), cj.up(g)
    h0, c0 = _states64(states)
    # Edifice passes its forward's output as fwd: the reference's, rounded.
    y64 = jax.jit(lambda wx, R, h0, c0: rnn_forward_ref(cell, wx, R, h0, c0)[0])(wx64, R64, h0, c0)
    fwd = y64.astype(dtype)
    S = jax.ShapeDtypeStruct
    seq, state = S((b, t, gh), dtype), S((b, h), state_dtype)
    results = (seq, seq, state) if cell == "gru" else (seq, state, state)
    names = ("grad_wx", "grad_rh", "grad_h0") if cell == "gru" else ("grad_wx", "grad_h0", "grad_c0")

    @jax.jit
    def ours(wx, R, states, fwd, g):
        return jax.ffi.ffi_call(target, results)(wx, R, *states, fwd, g)

    out = jax.block_until_ready(ours(wx, R, states, fwd, g))
    backward = jax.jit(lambda wx, R, h0, c0, y, g: rnn_backward_ref(cell, wx, R, h0, c0, y, g))
    refs = backward(wx64, R64, h0, c0, cj.up(fwd), g64)
    scale = max(cj.amax(r) for r in refs)
    k, ks = cj.key_of(dtype), cj.gated_tol_key(dtype, state_dtype)
    m = []
    for name, o, r, res in zip(names, out, refs, results):
        state_result = name in ("grad_h0", "grad_c0")
        m.append(cj.compare(name, o, r, cj.GATED_TOL[ks if state_result else k], res.dtype, scale,
                            tol_scale))
    # The reference itself: Edifice's backward, given the exact y, is the
    # exact gradient of its forward.
    exact = backward(wx64, R64, h0, c0, y64, g64)
    vjp = jax.jit(lambda wx, R, h0, c0, g: rnn_vjp_ref(cell, wx, R, h0, c0, g))(wx64, R64, h0, c0, g64)
    gap = max(float(jnp.max(jnp.abs(a - v))) for a, v in zip(exact, vjp))
    vscale = max(max(cj.amax(v) for v in vjp), 1e-300)
    ratio = gap / (1e-9 * vscale)
    m.append(cj.Metric("edifice=vjp", ratio <= 1.0, ratio, gap / vscale,
                       "" if ratio <= 1.0 else "Edifice's backward is not jax.vjp of its forward"))
    bad = [str(o.dtype) for o, res in zip(out, results) if jnp.dtype(o.dtype) != jnp.dtype(res.dtype)]
    if bad:
        m.append(cj.Metric("dtypes", False, float("inf"), float("inf"), f"{bad}"))
    return cj.summarize(m)


def rnn_cases(runner, args, dtypes, rng):
    fixed = cj.gated_shapes(args.quick)
    idx = 0
    for target in RNN_TARGETS:
        check = check_rnn_forward if target in RNN_FORWARD else check_rnn_backward
        for dn in dtypes:
            dtype = cj.DTYPES[dn]
            shapes = fixed + [(int(rng.integers(1, 5)), int(rng.integers(1, 200)),
                               int(rng.integers(1, 300)))]
            for shape in shapes:
                # Edifice's: R and zero states of the sequence dtype; also f32
                # R, f32 states and random states, by turns
                zero_states = idx % 4 == 0
                weight_dtype = jnp.float32 if idx % 2 == 1 else dtype
                state_dtype = jnp.float32 if idx % 3 == 2 else dtype
                idx += 1
                seed = int(rng.integers(0, 2 ** 31))
                name = (f"{target} {dn} B{shape[0]} T{shape[1]} H{shape[2]} "
                        f"R {cj.key_of(weight_dtype)} states {cj.key_of(state_dtype)} "
                        f"{'zero' if zero_states else 'random'}")
                runner.case("edifice", name,
                            lambda target=target, check=check, dtype=dtype,
                            weight_dtype=weight_dtype, state_dtype=state_dtype, shape=shape,
                            zero_states=zero_states, seed=seed:
                            check(target, dtype, weight_dtype, state_dtype, shape, zero_states,
                                  seed, args.tol_scale))


def scan_cases(runner, args, dtypes, rng):
    fixed = [(1, 1, 1), (2, 5, 3), (1, 64, 256)] if args.quick else \
        [(1, 1, 1), (1, 1, 8), (2, 5, 3), (3, 33, 4), (1, 300, 17), (2, 128, 256), (1, 1000, 64)]
    idx = 0
    for target in SCAN_TARGETS:
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


def selective_cases(runner, args, rng):
    shapes = [(1, 1, 1, 1), (1, 1, 8, 4), (2, 5, 3, 2), (1, 17, 8, 4), (3, 33, 5, 16),
              (2, 300, 33, 16), (1, 40, 3, 256), (1, 700, 64, 64)]
    if args.quick:
        shapes = shapes[:4]
    shapes += [(int(rng.integers(1, 4)), int(rng.integers(1, 400)), int(rng.integers(1, 80)),
                int(rng.choice([1, 3, 8, 16, 32, 64])))]
    for i, shape in enumerate(shapes):
        seed = int(rng.integers(0, 2 ** 31))
        name = f"{SS_TARGET} f32 B{shape[0]} T{shape[1]} D{shape[2]} N{shape[3]}"
        runner.case("edifice", name,
                    lambda shape=shape, seed=seed: check_selective_backward(shape, seed,
                                                                            args.tol_scale))
        random_a = i == len(shapes) - 1
        name = (f"{SS_F_TARGET} f32 B{shape[0]} T{shape[1]} D{shape[2]} N{shape[3]} "
                f"A {'random' if random_a else '-(1..N)'}")
        runner.case("edifice", name,
                    lambda shape=shape, seed=seed, random_a=random_a:
                    check_selective_forward(shape, seed, args.tol_scale, random_a))


def attention_shapes(args, rng):
    """BHTD shapes, T = S: odd T, d 32 and 64."""
    shapes = [(1, 1, 1, 32), (1, 2, 7, 32), (2, 3, 33, 64), (1, 2, 128, 64), (2, 4, 257, 32)]
    if args.quick:
        shapes = shapes[:3]
    shapes.append((int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 300)),
                   int(rng.choice([32, 64]))))
    return shapes


def attention_cases(runner, args, dtypes, rng):
    for dn in dtypes:
        for shape in attention_shapes(args, rng):
            for causal in (False, True):
                seed = int(rng.integers(0, 2 ** 31))
                for target, check in ((ATT_F_TARGET, check_attention_forward),
                                      (ATT_B_TARGET, check_attention_backward)):
                    name = (f"{target} {dn} B{shape[0]} H{shape[1]} T{shape[2]} "
                            f"d{shape[3]} {'causal' if causal else 'none'}")
                    runner.case("edifice", name,
                                lambda dn=dn, shape=shape, causal=causal, seed=seed, check=check:
                                check(cj.DTYPES[dn], shape, causal, seed, args.tol_scale))


PARTS = ("scans", "selective", "attention", "rnn")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default=None)
    p.add_argument("--dtypes", default="f32,bf16,f16")
    p.add_argument("--tol-scale", type=float, default=1.0)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated, some of {PARTS} (default all)")
    args = p.parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little") % 1_000_000
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    devs = jax.devices()
    print(f"check_edifice_ffi: seed {args.seed}; jax {jax.__version__}, "
          f"device {devs[0].platform}:{devs[0].device_kind}")
    lib = ex.load(args.lib)
    register(lib)
    print(f"registered {len(NEW_TARGETS)} Edifice targets from {ex.loaded_path()} by pointer")

    runner = cj.Runner(args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {unknown}; expected some of {PARTS}")
    # one generator per part, so that each part's cases do not depend on the others
    if "scans" in parts:
        scan_cases(runner, args, dtypes, np.random.default_rng([args.seed, 7]))
    if "selective" in parts:
        selective_cases(runner, args, np.random.default_rng([args.seed, 8]))
    if "attention" in parts:
        attention_cases(runner, args, dtypes, np.random.default_rng([args.seed, 9]))
    if "rnn" in parts:
        rnn_cases(runner, args, dtypes, np.random.default_rng([args.seed, 10]))
    failed = [(n, d) for _, n, ok, d, _ in runner.results if not ok]
    total = len(runner.results)
    print(f"\ntotal {total - len(failed)}/{total} passed (seed {args.seed})")
    for n, d in failed:
        print(f"  FAILED {n}: {d}")
    return 0 if (not failed and total > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
