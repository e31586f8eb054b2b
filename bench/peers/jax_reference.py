"""Straightforward JAX implementations of every ExPhil.Native op.

Independent references for the checks (evaluated in float64 with
``jax.config.update("jax_enable_x64", True)``) and JAX baselines for the
benchmarks (float32 / bfloat16). Nothing here calls the library; the
formulas are those of include/exphil/exphil.h.

Public functions (other scripts import them; keep the signatures):

    SCAN_OPS                                   op name -> input names, ABI order
    scan_coefficients(op, inputs) -> (a, b)    per-step affine map h = a h + b
    scan_ref(op, inputs, h0=None) -> (y, h_final)      lax.scan over time
    scan_assoc(op, inputs, h0=None) -> (y, h_final)    lax.associative_scan
    selective_scan_ref(x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
                       softplus=False, clamp=None) -> (y, h_final)
    selective_scan_assoc(...)                  same, associative_scan (extra)
    attention_ref(q, k, v, mask="none", window=0, layout="bhtd", scale=None)
        -> (o, lse)
    attention_visibility(T, S, mask, window) -> bool [T, S]

Conventions
-----------
* Scan inputs: ``inputs`` is a sequence of arrays in the C ABI's order
  (linear_scan: a, b; min_gru: gate, candidate; min_lstm: forget, input,
  candidate; liquid: tau, target), each [B, T, H]; a dict keyed by those
  names is accepted too. h0 is [B, H] or None (zeros).
* Arithmetic runs in ``promote_types(dtype, float32)`` (float32 for
  f32/f16/bf16 inputs, float64 for float64 inputs); outputs are cast back
  to the dtype of the first sequence input. For the scans h_final is cast
  back too (the library lets each state tensor be f32 or the sequence
  dtype; pass ``state_dtype=jnp.float32`` to keep it in f32). For
  selective_scan, h_final stays in the compute dtype (the library's
  h_final is always f32).
* scan_coefficients returns (a, b) in the compute dtype.
* selective_scan: x, dt, z [B, T, D]; A [D, N]; B, C [B, T, N]; dt_bias,
  D [D]; h0 [B, D, N]. ``clamp`` is None or (dt_min, dt_max), applied last;
  its gradient is zero where it is active (u < dt_min or u > dt_max) and 1
  elsewhere, as the library's.
* attention: layout "bhtd" ([B, H, T, d]) or "bthd" ([B, T, H, d]),
  case-insensitive; causal aligned to the bottom right (query i sits at
  position i + S - T); query head h reads key/value head h // (Hq // Hkv);
  a row that sees no key gets o = 0 and lse = -inf, with NaN-free
  gradients. lse is returned in the compute dtype (float32 unless the
  inputs are float64), [B, Hq, T] for either layout.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

SCAN_OPS = {
    "linear_scan": ("a", "b"),
    "min_gru": ("gate", "candidate"),
    "min_lstm": ("forget", "input", "candidate"),
    "liquid": ("tau", "target"),
}

MIN_LSTM_EPS = 1e-6


def compute_dtype(dtype):
    """promote_types(dtype, float32): float32 for f32/f16/bf16, float64 for
    float64 (which needs jax_enable_x64)."""
    return jnp.promote_types(dtype, jnp.float32)


def _as_list(op, inputs):
    if op not in SCAN_OPS:
        raise ValueError(f"unknown scan op {op!r}; expected one of {sorted(SCAN_OPS)}")
    names = SCAN_OPS[op]
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(f"{op}: missing inputs {missing}")
        inputs = [inputs[n] for n in names]
    inputs = list(inputs)
    if len(inputs) != len(names):
        raise ValueError(f"{op} takes {len(names)} inputs {names}, got {len(inputs)}")
    return inputs


def scan_coefficients(op, inputs):
    """(a, b), each [B, T, H] in the compute dtype, such that the op's step
    is h_t = a_t * h_{t-1} + b_t."""
    xs = _as_list(op, inputs)
    ct = compute_dtype(xs[0].dtype)
    xs = [jnp.asarray(x).astype(ct) for x in xs]
    if op == "linear_scan":
        a, b = xs
        return a, b
    if op == "min_gru":
        gate, cand = xs
        z = jax.nn.sigmoid(gate)
        return 1.0 - z, z * cand
    if op == "min_lstm":
        forget, inp, cand = xs
        f = jax.nn.sigmoid(forget)
        i = jax.nn.sigmoid(inp)
        s = f + i + MIN_LSTM_EPS
        return f / s, (i / s) * cand
    if op == "liquid":
        tau, target = xs
        e = jnp.exp(-1.0 / tau)
        # h = target + (h - target) e = e h + (1 - e) target
        return e, (1.0 - e) * target
    raise AssertionError(op)


def _initial_state(h0, batch_shape, ct):
    if h0 is None:
        return jnp.zeros(batch_shape, ct)
    return jnp.asarray(h0).astype(ct)


def scan_ref(op, inputs, h0=None, *, state_dtype=None):
    """(y [B, T, H], h_final [B, H]) by lax.scan over time."""
    xs = _as_list(op, inputs)
    out_dtype = xs[0].dtype
    a, b = scan_coefficients(op, xs)
    ct = a.dtype
    h = _initial_state(h0, (a.shape[0], a.shape[2]), ct)

    def step(h, ab):
        at, bt = ab
        h = at * h + bt
        return h, h

    h_final, ys = lax.scan(step, h, (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))
    y = jnp.swapaxes(ys, 0, 1)
    return y.astype(out_dtype), h_final.astype(state_dtype or out_dtype)


def _affine_combine(left, right):
    """Composition of h -> a1 h + b1 followed by h -> a2 h + b2."""
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def scan_assoc(op, inputs, h0=None, *, state_dtype=None):
    """(y, h_final) by lax.associative_scan over the (a, b) pairs along time.
    h0 is folded into the first step: b_0 += a_0 * h0."""
    xs = _as_list(op, inputs)
    out_dtype = xs[0].dtype
    a, b = scan_coefficients(op, xs)
    if h0 is not None:
        h0c = jnp.asarray(h0).astype(a.dtype)
        b = b.at[:, 0, :].add(a[:, 0, :] * h0c)
    _, y = lax.associative_scan(_affine_combine, (a, b), axis=1)
    return y.astype(out_dtype), y[:, -1, :].astype(state_dtype or out_dtype)


# ---------------------------------------------------------------------------
# selective scan (Mamba S6)
# ---------------------------------------------------------------------------
def _clamp_with_library_gradient(u, lo, hi):
    """clamp(u, lo, hi) whose gradient is 0 where the clamp is active
    (u < lo or u > hi) and 1 elsewhere (ties pass)."""
    return jnp.where(u < lo, jnp.asarray(lo, u.dtype), jnp.where(u > hi, jnp.asarray(hi, u.dtype), u))


def _selective_prepare(x, dt, A, B, C, dt_bias, D, z, h0, softplus, clamp):
    ct = compute_dtype(x.dtype)
    cast = lambda t: None if t is None else jnp.asarray(t).astype(ct)
    x, dt, A, B, C, dt_bias, D, z, h0 = (cast(t) for t in (x, dt, A, B, C, dt_bias, D, z, h0))
    u = dt if dt_bias is None else dt + dt_bias
    if softplus:
        u = jax.nn.softplus(u)
    if clamp is not None:
        lo, hi = clamp
        u = _clamp_with_library_gradient(u, float(lo), float(hi))
    delta = u  # [B, T, D]
    Bsz, _, Dn = x.shape
    N = A.shape[1]
    if h0 is None:
        h0 = jnp.zeros((Bsz, Dn, N), ct)
    return ct, x, delta, A, B, C, D, z, h0


def _selective_output(hs_dot_c, x, D, z):
    y = hs_dot_c
    if D is not None:
        y = y + D * x
    if z is not None:
        y = y * (z * jax.nn.sigmoid(z))
    return y


def selective_scan_ref(x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
                       softplus=False, clamp=None):
    """(y [B, T, D] in x's dtype, h_final [B, D, N] in the compute dtype) by
    lax.scan over time, one [B, D, N] state per step."""
    out_dtype = x.dtype
    ct, x, delta, A, Bm, Cm, D, z, h0 = _selective_prepare(x, dt, A, B, C, dt_bias, D, z, h0,
                                                           softplus, clamp)

    def step(h, inp):
        dlt, xt, bt, cvec = inp  # [B, D], [B, D], [B, N], [B, N]
        h = jnp.exp(dlt[:, :, None] * A[None]) * h + (dlt * xt)[:, :, None] * bt[:, None, :]
        yt = jnp.sum(h * cvec[:, None, :], axis=-1)
        return h, yt

    sw = lambda t: jnp.swapaxes(t, 0, 1)
    h_final, ys = lax.scan(step, h0, (sw(delta), sw(x), sw(Bm), sw(Cm)))
    y = _selective_output(sw(ys), x, D, z)
    return y.astype(out_dtype), h_final


def selective_scan_assoc(x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
                         softplus=False, clamp=None):
    """Same as selective_scan_ref, by lax.associative_scan over [B, T, D, N]
    (a, b) pairs (materialises T * D * N per batch: for benchmarks)."""
    out_dtype = x.dtype
    ct, x, delta, A, Bm, Cm, D, z, h0 = _selective_prepare(x, dt, A, B, C, dt_bias, D, z, h0,
                                                           softplus, clamp)
    a = jnp.exp(delta[..., None] * A[None, None])          # [B, T, D, N]
    b = (delta * x)[..., None] * Bm[:, :, None, :]          # [B, T, D, N]
    b = b.at[:, 0].add(a[:, 0] * h0)
    _, hs = lax.associative_scan(_affine_combine, (a, b), axis=1)
    y = jnp.einsum("btdn,btn->btd", hs, Cm)
    y = _selective_output(y, x, D, z)
    return y.astype(out_dtype), hs[:, -1]


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------
def attention_visibility(T, S, mask="none", window=0):
    """bool [T, S]: query i sees key j (causal aligned to the bottom right)."""
    if mask == "none":
        return jnp.ones((T, S), bool)
    i = jnp.arange(T)[:, None] + (S - T)
    j = jnp.arange(S)[None, :]
    vis = j <= i
    if mask == "window":
        if window < 1:
            raise ValueError("window mask needs window >= 1")
        vis = vis & (j > i - window)
    elif mask != "causal":
        raise ValueError(f"unknown mask {mask!r}")
    return vis


def attention_ref(q, k, v, mask="none", window=0, layout="bhtd", scale=None):
    """(o in q's dtype with q's layout, lse [B, Hq, T] in the compute dtype)."""
    layout = layout.lower()
    if layout not in ("bhtd", "bthd"):
        raise ValueError(f"unknown layout {layout!r}")
    out_dtype = q.dtype
    ct = compute_dtype(q.dtype)
    q, k, v = (jnp.asarray(t).astype(ct) for t in (q, k, v))
    if layout == "bthd":
        q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    Bsz, Hq, T, d = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    rep = Hq // Hkv
    if rep > 1:
        k = jnp.repeat(k, rep, axis=1)
        v = jnp.repeat(v, rep, axis=1)
    sc = (1.0 / math.sqrt(d)) if not scale else float(scale)
    s = jnp.einsum("bhtd,bhsd->bhts", q, k) * jnp.asarray(sc, ct)
    vis = attention_visibility(T, S, mask, window)
    s = jnp.where(vis, s, -jnp.inf)
    m = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)                       # 0 where masked, no NaN
    zsum = jnp.sum(e, axis=-1, keepdims=True)
    nonempty = zsum > 0
    p = e / jnp.where(nonempty, zsum, 1.0)   # rows with no key: p = 0, o = 0
    o = jnp.einsum("bhts,bhsd->bhtd", p, v)
    lse = jnp.where(nonempty, m + jnp.log(jnp.where(nonempty, zsum, 1.0)), -jnp.inf)[..., 0]
    if layout == "bthd":
        o = jnp.swapaxes(o, 1, 2)
    return o.astype(out_dtype), lse
