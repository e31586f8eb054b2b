#!/usr/bin/env python3
"""ExPhil.Native ops as JAX functions, through the typed XLA FFI (issue 7).

What
----
``libexphil_xla_ffi.so`` exports one typed XLA FFI handler per op and
direction for the CUDA platform (target name == exported symbol name):

    exphil_{linear_scan,min_gru,min_lstm,liquid}_{fwd,bwd}
    exphil_selective_scan_{fwd,bwd}
    exphil_attention_{fwd,bwd}

This module loads the library, registers every target by pointer
(``jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)),
platform="CUDA")``, typed FFI api_version) and exposes differentiable JAX
functions built on ``jax.ffi.ffi_call`` and ``jax.custom_vjp`` (the forward
saves its inputs and outputs as residuals, the backward calls the ``_bwd``
target). Everything works inside ``jax.jit``.

    import exphil_jax as ex
    ex.load()                               # optional: first use loads too
    y, h_final = ex.scan("min_gru", (gate, candidate), h0)
    y, h_final = ex.selective_scan(x, dt, A, B, C, dt_bias, D, z, h0,
                                   softplus=True, clamp=(1e-3, 0.1))
    o, lse = ex.attention(q, k, v, mask="causal", layout="bhtd")

Semantics, shapes and dtypes are those of include/exphil/exphil.h:

* ``scan(op, inputs, h0=None) -> (y, h_final)``: ``inputs`` is the tuple of
  the op's sequence inputs, all ``[B, T, H]`` of one dtype (f32, bf16 or
  f16): linear_scan (a, b), min_gru (gate, candidate), min_lstm (forget,
  input, candidate), liquid (tau > 0, target). ``h0`` is ``[B, H]`` in f32 or
  the sequence dtype; None means a zero initial state (the targets get a
  zero-element array, so no zeros are filled). ``y`` has the sequence dtype,
  ``h_final`` the dtype of ``h0`` (f32 when h0 is None). Gradients flow to
  every input and to h0, from the cotangents of both y and h_final; a
  cotangent of h_final that JAX knows to be zero (h_final unused) is passed
  as a zero-element array, which the backward skips.
* ``selective_scan(x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
  softplus=False, clamp=None) -> (y, h_final)``: x, dt, z ``[B, T, D]`` and
  B, C ``[B, T, N]`` in one sequence dtype; A ``[D, N]``, dt_bias and D
  ``[D]``, h0 ``[B, D, N]`` in f32. ``clamp`` is None or ``(dt_min,
  dt_max)``. ``h_final`` is f32. An absent optional input is passed to the
  targets as a zero-element array (f32 ``(0,)``; the sequence dtype for z);
  its gradient is not returned (the public function has no such argument).
  A cotangent of h_final that JAX knows to be zero (h_final unused) is passed
  as a zero-element array too, so the backward skips it.
* ``attention(q, k, v, mask="none", window=0, layout="bhtd", scale=None,
  precision="exact") -> (o, lse)``: q ``[B, Hq, T, d]``, k and v
  ``[B, Hkv, S, d]`` (layout "bhtd"), or ``[B, T, Hq, d]`` / ``[B, S, Hkv, d]``
  (layout "bthd"); d in 32/64/96/128; Hq a multiple of Hkv; one dtype. mask
  "none", "causal" (bottom-right aligned) or "window" (with ``window >= 1``);
  scale None means 1/sqrt(d); precision "tf32x3" (f32 only) runs the f32
  products on tensor cores as three TF32 products each. ``o`` has q's shape and dtype, ``lse`` is ``[B, Hq, T]`` f32.

  Gradients of lse. The ``_bwd`` target takes the cotangent of o only. The
  custom VJP is defined with ``symbolic_zeros=True``: when the cotangent of
  lse is a symbolic zero (lse unused by the loss, the usual case) nothing
  extra runs. When it is not, its contribution is computed exactly with
  the same two targets: with g the lse cotangent and P the attention
  probabilities, d lse_i / d s_ij = P_ij, so
  grad_q += scale * g_i * sum_j P_ij k_j = scale * g * attention(q, k, k)
  and grad_k_j += scale * sum_i P_ij g_i q_i, the grad_v of a backward call
  on (q, k, v=k) with grad_o = g * q. That costs one more forward and one
  more backward call, only in that case. Rows that see no key (lse = -inf)
  take no gradient.

Under ``jax.vmap`` every ffi_call uses ``vmap_method="sequential"`` (a loop
over the mapped axis): correct for every op, not fast. The targets take
fixed ranks, so folding a mapped axis into B is left to the caller.

Validation. The public functions check shapes, dtypes and options in Python
at trace time and raise ``ValueError``/``TypeError`` naming the argument and
what was expected, because a failing FFI handler can only report at run
time. The raw wrappers (``scan_fwd``, ``scan_bwd``, ``selective_scan_fwd``,
``selective_scan_bwd``, ``attention_fwd``, ``attention_bwd``) take
``validate=False`` to skip those checks, which is how
test/xla_ffi/check_jax_ffi.py exercises the handlers' own error path (the
error then surfaces as a JAX runtime error when the computation runs).

Attributes are passed to ffi_call as: softplus and clamp as Python bools
(an MLIR i1 BoolAttr, the same attribute ``np.bool_`` is meant to give;
Python bools are used because every JAX version lowers them to i1, while
``np.bool_`` goes through an integer conversion that NumPy 2 may refuse),
dt_min, dt_max and scale as ``np.float32`` (f32 FloatAttr), mask, window and
layout as ``np.int32`` (i32 IntegerAttr). A Python int or float would arrive
as i64 / f64, which a handler binding i32 / f32 rejects.

Library path: ``load(path)``, else ``$EXPHIL_XLA_FFI_LIB``, else
``build-gpu/c_src/xla_ffi/libexphil_xla_ffi.so`` under the repository root.

Dependencies: jax with a CUDA backend (jax-cuda12/13 plugin), numpy.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
from pathlib import Path

import numpy as np

import jax
import jax.numpy as jnp

try:  # public home of SymbolicZero (custom_vjp symbolic_zeros=True)
    from jax.custom_derivatives import SymbolicZero as _SymbolicZero
except ImportError:  # pragma: no cover - very old jax
    _SymbolicZero = None

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LIB = REPO_ROOT / "build-gpu" / "c_src" / "xla_ffi" / "libexphil_xla_ffi.so"

# op -> names of its sequence inputs, in the order the targets take them.
SCAN_OPS = {
    "linear_scan": ("a", "b"),
    "min_gru": ("gate", "candidate"),
    "min_lstm": ("forget", "input", "candidate"),
    "liquid": ("tau", "target"),
}
TARGETS = tuple(
    f"exphil_{op}_{direction}"
    for op in (*SCAN_OPS, "selective_scan", "attention")
    for direction in ("fwd", "bwd")
)

SEQ_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
F32 = jnp.dtype(jnp.float32)

MASKS = {"none": 0, "causal": 1, "window": 2}
LAYOUTS = {"bhtd": 0, "bthd": 1}
PRECISIONS = {"exact": 0, "tf32x3": 1}
HEAD_WIDTHS = (32, 64, 96, 128)
SELECTIVE_SCAN_MAX_N = 256

VMAP_METHOD = "sequential"


# ---------------------------------------------------------------------------
# Loading and registration
# ---------------------------------------------------------------------------
class _State:
    lock = threading.Lock()
    lib = None
    path = None
    registered: tuple = ()
    missing: tuple = ()


def library_path(path=None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get("EXPHIL_XLA_FFI_LIB")
    return Path(env) if env else DEFAULT_LIB


def load(path=None):
    """Loads the library and registers every exported target for CUDA.

    Idempotent: a second call returns the library already loaded (a different
    path after the first load is an error, since XLA keeps the first
    registration of a name). Targets the library does not export are listed
    in ``missing_targets()``; calling one raises RuntimeError. Returns the
    ctypes handle."""
    with _State.lock:
        p = library_path(path)
        if _State.lib is not None:
            if path is not None and Path(path).resolve() != Path(_State.path).resolve():
                raise RuntimeError(
                    f"exphil_jax: library already loaded from {_State.path}; "
                    f"cannot switch to {p} in the same process")
            return _State.lib
        if not p.exists():
            raise FileNotFoundError(
                f"exphil_jax: XLA FFI library not found at {p} (build it, pass "
                f"--lib/path, or set EXPHIL_XLA_FFI_LIB)")
        lib = ctypes.CDLL(str(p))
        registered, missing = [], []
        for name in TARGETS:
            try:
                fn = getattr(lib, name)
            except AttributeError:
                missing.append(name)
                continue
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(fn), platform="CUDA")
            registered.append(name)
        _State.lib, _State.path = lib, str(p)
        _State.registered, _State.missing = tuple(registered), tuple(missing)
        return lib


def loaded_path():
    return _State.path


def registered_targets():
    return _State.registered


def missing_targets():
    return _State.missing


def _target(name):
    if _State.lib is None:
        load()
    if name not in _State.registered:
        raise RuntimeError(f"exphil_jax: {name} is not exported by {_State.path}")
    return name


def _call(name, result_shapes, *operands, **attrs):
    return jax.ffi.ffi_call(_target(name), result_shapes, vmap_method=VMAP_METHOD)(
        *operands, **attrs)


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), jnp.dtype(dtype))


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _is_absent(x):
    return x is None or (hasattr(x, "size") and x.size == 0)


def _is_symbolic_zero(x):
    return _SymbolicZero is not None and isinstance(x, _SymbolicZero)


def _bool_attr(v):
    return bool(v)


# ---------------------------------------------------------------------------
# Validation (Python side, at trace time: shapes and dtypes are static)
# ---------------------------------------------------------------------------
def _shape(x):
    return tuple(int(s) for s in x.shape)


def _dtype_name(dt):
    return jnp.dtype(dt).name


def _check_array(name, x):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"argument '{name}': expected an array, got {type(x).__name__}")


def _check_seq_dtype(where, name, x):
    if jnp.dtype(x.dtype) not in SEQ_DTYPES:
        raise TypeError(
            f"{where}: argument '{name}': dtype {_dtype_name(x.dtype)} is not supported "
            f"(expected float32, bfloat16 or float16)")


def _check_same(where, name, x, ref_name, ref, what_shape):
    if _shape(x) != _shape(ref):
        raise ValueError(
            f"{where}: argument '{name}': expected shape {list(_shape(ref))} "
            f"({what_shape} of '{ref_name}'), got {list(_shape(x))}")
    if jnp.dtype(x.dtype) != jnp.dtype(ref.dtype):
        raise TypeError(
            f"{where}: argument '{name}': expected dtype {_dtype_name(ref.dtype)} "
            f"(the dtype of '{ref_name}'), got {_dtype_name(x.dtype)}")


def _check_shape(where, name, x, expected, what):
    if _shape(x) != tuple(expected):
        raise ValueError(
            f"{where}: argument '{name}': expected shape {list(expected)} ({what}), "
            f"got {list(_shape(x))}")


def _check_f32(where, name, x):
    if jnp.dtype(x.dtype) != F32:
        raise TypeError(
            f"{where}: argument '{name}': expected dtype float32, got {_dtype_name(x.dtype)}")


def _validate_scan(op, inputs, h0, where=None):
    if op not in SCAN_OPS:
        raise ValueError(f"scan: unknown op {op!r} (expected one of {', '.join(SCAN_OPS)})")
    names = SCAN_OPS[op]
    where = where or f"{op} forward"
    if not isinstance(inputs, (tuple, list)) or len(inputs) != len(names):
        got = len(inputs) if isinstance(inputs, (tuple, list)) else type(inputs).__name__
        raise ValueError(f"{where}: expected {len(names)} inputs ({', '.join(names)}), got {got}")
    for n, x in zip(names, inputs):
        _check_array(n, x)
    first = inputs[0]
    _check_seq_dtype(where, names[0], first)
    if first.ndim != 3 or min(_shape(first)) < 1:
        raise ValueError(
            f"{where}: argument '{names[0]}': expected shape [B, T, H] with every "
            f"dimension >= 1, got {list(_shape(first))}")
    for n, x in zip(names[1:], inputs[1:]):
        _check_same(where, n, x, names[0], first, "[B, T, H]")
    if h0 is not None:
        _check_array("h0", h0)
        b, _, h = _shape(first)
        _check_shape(where, "h0", h0, (b, h), "[B, H] of the inputs")
        if jnp.dtype(h0.dtype) not in (F32, jnp.dtype(first.dtype)):
            raise TypeError(
                f"{where}: argument 'h0': expected dtype float32 or "
                f"{_dtype_name(first.dtype)}, got {_dtype_name(h0.dtype)}")


# ---------------------------------------------------------------------------
# Scans
# ---------------------------------------------------------------------------
def scan_fwd(op, inputs, h0=None, validate=True):
    """Raw forward target: (y, h_final). h0 None (or zero-element) is a zero
    initial state, passed to the target as a zero-element array; h_final is
    then f32, otherwise h0's dtype."""
    inputs = tuple(inputs)
    if _is_absent(h0):
        h0 = None
    if validate:
        _validate_scan(op, inputs, h0)
    first = inputs[0]
    b, _, h = _shape(first)
    state_dtype = F32 if h0 is None else h0.dtype
    out = (_sds(first.shape, first.dtype), _sds((b, h), state_dtype))
    y, h_final = _call(f"exphil_{op}_fwd", out, *inputs, _empty(F32) if h0 is None else h0)
    return y, h_final


def scan_bwd(op, inputs, h0, y, grad_y, grad_h_final, validate=True):
    """Raw backward target: (grad of each input..., grad_h0). h0 None (or
    zero-element) as in scan_fwd: grad_h0 is then a zero-element f32 array.
    grad_h_final None (or zero-element): no gradient into the final state."""
    inputs = tuple(inputs)
    h0 = None if _is_absent(h0) else h0
    grad_h_final = None if _is_absent(grad_h_final) else grad_h_final
    first = inputs[0]
    if validate:
        where = f"{op} backward"
        _validate_scan(op, inputs, h0, where)
        _check_same(where, "y", y, SCAN_OPS[op][0], first, "[B, T, H]")
        _check_same(where, "grad_y", grad_y, SCAN_OPS[op][0], first, "[B, T, H]")
        if grad_h_final is not None:
            b, _, h = _shape(first)
            _check_shape(where, "grad_h_final", grad_h_final, (b, h), "[B, H] of the inputs")
    grad_h0 = _sds((0,), F32) if h0 is None else _sds(h0.shape, h0.dtype)
    out = tuple(_sds(x.shape, x.dtype) for x in inputs) + (grad_h0,)
    grads = _call(f"exphil_{op}_bwd", out, *inputs, _empty(F32) if h0 is None else h0, y, grad_y,
                  _empty(F32) if grad_h_final is None else grad_h_final)
    return tuple(grads)


@functools.lru_cache(maxsize=None)
def _scan_vjp(op):
    # h0 travels as an array, zero-element when absent (as the targets take
    # it), so one custom_vjp serves both; its gradient is then zero-element
    # too, matching the primal.
    @jax.custom_vjp
    def f(inputs, h0):
        return scan_fwd(op, inputs, h0, validate=False)

    def f_fwd(inputs, h0):
        # symbolic_zeros=True: each argument arrives as a CustomVJPPrimal
        inputs = tuple(x.value for x in inputs)
        h0 = h0.value
        y, h_final = scan_fwd(op, inputs, h0, validate=False)
        return (y, h_final), (inputs, h0, y)

    def f_bwd(res, cts):
        inputs, h0, y = res
        grad_y, grad_h_final = cts
        if _is_symbolic_zero(grad_y):
            grad_y = jnp.zeros(y.shape, y.dtype)
        if _is_symbolic_zero(grad_h_final):
            grad_h_final = None  # absent: no gradient into the final state, nothing to fill
        else:
            grad_h_final = grad_h_final.astype(F32 if _is_absent(h0) else h0.dtype)
        grads = scan_bwd(op, inputs, h0, y, grad_y.astype(y.dtype), grad_h_final, validate=False)
        return tuple(grads[:-1]), grads[-1]

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return f


def scan(op, inputs, h0=None):
    """Differentiable fused scan: (y [B, T, H], h_final [B, H])."""
    _validate_scan(op, inputs, h0)
    return _scan_vjp(op)(tuple(inputs), _empty(F32) if h0 is None else h0)


def linear_scan(a, b, h0=None):
    return scan("linear_scan", (a, b), h0)


def min_gru(gate, candidate, h0=None):
    return scan("min_gru", (gate, candidate), h0)


def min_lstm(forget, input, candidate, h0=None):  # noqa: A002 - the op's name for it
    return scan("min_lstm", (forget, input, candidate), h0)


def liquid(tau, target, h0=None):
    return scan("liquid", (tau, target), h0)


# ---------------------------------------------------------------------------
# Selective scan
# ---------------------------------------------------------------------------
def _ss_attrs(softplus, clamp):
    if clamp is None:
        dt_min, dt_max, do_clamp = 0.0, 0.0, False
    else:
        try:
            dt_min, dt_max = (float(c) for c in clamp)
        except (TypeError, ValueError):
            raise ValueError(
                f"selective_scan: clamp must be None or (dt_min, dt_max), got {clamp!r}") from None
        do_clamp = True
    return dict(softplus=_bool_attr(softplus), clamp=_bool_attr(do_clamp),
                dt_min=np.float32(dt_min), dt_max=np.float32(dt_max))


def _validate_selective_scan(x, dt, A, B, C, dt_bias, D, z, h0, clamp,
                             where="selective_scan forward"):
    for n, v in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        _check_array(n, v)
    _check_seq_dtype(where, "x", x)
    if x.ndim != 3 or min(_shape(x)) < 1:
        raise ValueError(f"{where}: argument 'x': expected shape [B, T, D] with every "
                         f"dimension >= 1, got {list(_shape(x))}")
    b, t, d = _shape(x)
    _check_same(where, "dt", dt, "x", x, "[B, T, D]")
    if A.ndim != 2 or A.shape[0] != d:
        raise ValueError(f"{where}: argument 'A': expected shape [D, N] = [{d}, N], "
                         f"got {list(_shape(A))}")
    _check_f32(where, "A", A)
    n = int(A.shape[1])
    if not 1 <= n <= SELECTIVE_SCAN_MAX_N:
        raise ValueError(f"{where}: argument 'A': state size N = {n} is not supported "
                         f"(1 <= N <= {SELECTIVE_SCAN_MAX_N})")
    for name, v in (("B", B), ("C", C)):
        _check_shape(where, name, v, (b, t, n), "[B, T, N]")
        if jnp.dtype(v.dtype) != jnp.dtype(x.dtype):
            raise TypeError(f"{where}: argument '{name}': expected dtype "
                            f"{_dtype_name(x.dtype)} (the dtype of 'x'), got {_dtype_name(v.dtype)}")
    for name, v, shape, what in (("dt_bias", dt_bias, (d,), "[D]"), ("D", D, (d,), "[D]"),
                                 ("h0", h0, (b, d, n), "[B, D, N]")):
        if v is not None:
            _check_array(name, v)
            _check_shape(where, name, v, shape, what)
            _check_f32(where, name, v)
    if z is not None:
        _check_array("z", z)
        _check_same(where, "z", z, "x", x, "[B, T, D]")
    if clamp is not None:
        attrs = _ss_attrs(False, clamp)
        lo, hi = float(attrs["dt_min"]), float(attrs["dt_max"])
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"{where}: clamp: dt_min and dt_max must be finite with "
                             f"dt_min <= dt_max, got ({lo}, {hi})")


def _ss_fill(x, dt_bias, D, z, h0):
    """Absent optional inputs as zero-element arrays (the targets' convention)."""
    return (dt_bias if not _is_absent(dt_bias) else _empty(F32),
            D if not _is_absent(D) else _empty(F32),
            z if not _is_absent(z) else _empty(x.dtype),
            h0 if not _is_absent(h0) else _empty(F32))


def _none_if_absent(v):
    return None if _is_absent(v) else v


def selective_scan_fwd(x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
                       softplus=False, clamp=None, validate=True):
    """Raw forward target: (y [B, T, D], h_final [B, D, N] f32). Optional
    inputs may be None or zero-element arrays (absent)."""
    if validate:
        _validate_selective_scan(x, dt, A, B, C, _none_if_absent(dt_bias), _none_if_absent(D),
                                 _none_if_absent(z), _none_if_absent(h0), clamp)
    dt_bias, D, z, h0 = _ss_fill(x, dt_bias, D, z, h0)
    b, _, d = _shape(x)
    n = int(A.shape[-1])
    out = (_sds(x.shape, x.dtype), _sds((b, d, n), F32))
    y, h_final = _call("exphil_selective_scan_fwd", out, x, dt, A, B, C, dt_bias, D, z, h0,
                       **_ss_attrs(softplus, clamp))
    return y, h_final


def selective_scan_bwd(x, dt, A, B, C, dt_bias, D, z, h0, grad_y, grad_h_final,
                       softplus=False, clamp=None, validate=True):
    """Raw backward target. Optional inputs and grad_h_final may be None or
    zero-element arrays (absent). Returns the nine gradients (grad_x, grad_dt,
    grad_A, grad_B, grad_C, grad_dt_bias, grad_D, grad_z, grad_h0); those of
    absent inputs are zero-element arrays."""
    if validate:
        where = "selective_scan backward"
        _validate_selective_scan(x, dt, A, B, C, _none_if_absent(dt_bias), _none_if_absent(D),
                                 _none_if_absent(z), _none_if_absent(h0), clamp, where)
        _check_same(where, "grad_y", grad_y, "x", x, "[B, T, D]")
        if not _is_absent(grad_h_final):
            _check_shape(where, "grad_h_final", grad_h_final,
                         (x.shape[0], x.shape[2], A.shape[1]), "[B, D, N]")
            _check_f32(where, "grad_h_final", grad_h_final)
    dt_bias, D, z, h0 = _ss_fill(x, dt_bias, D, z, h0)
    if grad_h_final is None:
        grad_h_final = _empty(F32)
    operands = (x, dt, A, B, C, dt_bias, D, z, h0)
    out = tuple(_sds(v.shape, v.dtype) for v in operands)
    grads = _call("exphil_selective_scan_bwd", out, *operands, grad_y, grad_h_final,
                  **_ss_attrs(softplus, clamp))
    return tuple(grads)


@functools.lru_cache(maxsize=None)
def _selective_scan_vjp(softplus, clamp):
    # Every optional input travels as an array (zero-element when absent), so
    # one custom_vjp serves every combination; its absent gradients are
    # zero-element arrays, matching the zero-element primals.
    @jax.custom_vjp
    def f(x, dt, A, B, C, dt_bias, D, z, h0):
        return selective_scan_fwd(x, dt, A, B, C, dt_bias, D, z, h0,
                                  softplus=softplus, clamp=clamp, validate=False)

    def f_fwd(x, dt, A, B, C, dt_bias, D, z, h0):
        # symbolic_zeros=True: each argument arrives as a CustomVJPPrimal
        args = tuple(a.value for a in (x, dt, A, B, C, dt_bias, D, z, h0))
        y, h_final = selective_scan_fwd(*args, softplus=softplus, clamp=clamp, validate=False)
        return (y, h_final), args

    def f_bwd(args, cts):
        grad_y, grad_h_final = cts
        x = args[0]
        if _is_symbolic_zero(grad_y):
            grad_y = jnp.zeros(x.shape, x.dtype)
        if _is_symbolic_zero(grad_h_final):
            grad_h_final = _empty(F32)  # absent: no gradient into the final state
        else:
            grad_h_final = grad_h_final.astype(F32)
        return selective_scan_bwd(*args, grad_y.astype(x.dtype), grad_h_final,
                                  softplus=softplus, clamp=clamp, validate=False)

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return f


def selective_scan(x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
                   softplus=False, clamp=None):
    """Differentiable Mamba S6 scan: (y [B, T, D], h_final [B, D, N] f32)."""
    _validate_selective_scan(x, dt, A, B, C, dt_bias, D, z, h0, clamp)
    clamp_key = None if clamp is None else tuple(float(np.float32(c)) for c in clamp)
    filled = _ss_fill(x, dt_bias, D, z, h0)
    return _selective_scan_vjp(bool(softplus), clamp_key)(x, dt, A, B, C, *filled)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------
def _code(table, value, what):
    if isinstance(value, str):
        key = value.lower()
        if key not in table:
            raise ValueError(f"attention: unknown {what} {value!r} (expected one of "
                             f"{', '.join(table)})")
        return table[key]
    code = int(value)
    if code not in table.values():
        raise ValueError(f"attention: unknown {what} code {code}")
    return code


def _attention_attrs(mask, window, layout, scale, precision):
    return dict(mask=np.int32(mask), window=np.int32(window), layout=np.int32(layout),
                scale=np.float32(0.0 if scale is None else scale),
                precision=np.int32(_code(PRECISIONS, precision, "precision")))


def _attention_rows(q, layout):
    """(B, Hq, T) of q in either layout."""
    if layout == 0:
        return int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    return int(q.shape[0]), int(q.shape[2]), int(q.shape[1])


def _validate_attention(q, k, v, mask, window, layout, scale, where="attention forward"):
    for n, t in (("q", q), ("k", k), ("v", v)):
        _check_array(n, t)
        if t.ndim != 4 or min(_shape(t)) < 1:
            raise ValueError(f"{where}: argument '{n}': expected a rank-4 tensor with every "
                             f"dimension >= 1, got shape {list(_shape(t))}")
    _check_seq_dtype(where, "q", q)
    for n, t in (("k", k), ("v", v)):
        if jnp.dtype(t.dtype) != jnp.dtype(q.dtype):
            raise TypeError(f"{where}: argument '{n}': expected dtype {_dtype_name(q.dtype)} "
                            f"(the dtype of 'q'), got {_dtype_name(t.dtype)}")
    if layout == 0:
        b, hq, _, d = _shape(q)
        _, hkv, _, dk = _shape(k)
        what = "[B, Hkv, S, d]"
    else:
        b, _, hq, d = _shape(q)
        _, _, hkv, dk = _shape(k)
        what = "[B, S, Hkv, d]"
    if d not in HEAD_WIDTHS:
        raise ValueError(f"{where}: head width d = {d} is not supported "
                         f"(expected one of {', '.join(map(str, HEAD_WIDTHS))})")
    if k.shape[0] != b or dk != d:
        raise ValueError(f"{where}: argument 'k': expected {what} with B = {b} and d = {d}, "
                         f"got {list(_shape(k))}")
    if _shape(v) != _shape(k):
        raise ValueError(f"{where}: argument 'v': expected shape {list(_shape(k))} "
                         f"(the shape of 'k'), got {list(_shape(v))}")
    if hq % hkv != 0:
        raise ValueError(f"{where}: query heads Hq = {hq} must be a multiple of key/value "
                         f"heads Hkv = {hkv}")
    if b > 65535 or hq > 65535:
        raise ValueError(f"{where}: B and Hq must be at most 65535, got B = {b}, Hq = {hq}")
    if mask == MASKS["window"] and int(window) < 1:
        raise ValueError(f"{where}: mask 'window' needs window >= 1, got {window}")
    if scale is not None and (not math.isfinite(float(scale)) or float(scale) == 0.0):
        raise ValueError(f"{where}: scale must be finite and nonzero (None for 1/sqrt(d)), "
                         f"got {scale}")


def attention_fwd(q, k, v, mask="none", window=0, layout="bhtd", scale=None, validate=True,
                  precision="exact"):
    """Raw forward target: (o, lse [B, Hq, T] f32)."""
    mask_c, layout_c = _code(MASKS, mask, "mask"), _code(LAYOUTS, layout, "layout")
    if validate:
        _validate_attention(q, k, v, mask_c, window, layout_c, scale)
    out = (_sds(q.shape, q.dtype), _sds(_attention_rows(q, layout_c), F32))
    o, lse = _call("exphil_attention_fwd", out, q, k, v,
                   **_attention_attrs(mask_c, window, layout_c, scale, precision))
    return o, lse


def attention_bwd(q, k, v, o, lse, grad_o, mask="none", window=0, layout="bhtd", scale=None,
                  validate=True, precision="exact"):
    """Raw backward target: (grad_q, grad_k, grad_v)."""
    mask_c, layout_c = _code(MASKS, mask, "mask"), _code(LAYOUTS, layout, "layout")
    if validate:
        where = "attention backward"
        _validate_attention(q, k, v, mask_c, window, layout_c, scale, where)
        _check_same(where, "o", o, "q", q, "the shape")
        _check_same(where, "grad_o", grad_o, "q", q, "the shape")
        _check_shape(where, "lse", lse, _attention_rows(q, layout_c), "[B, Hq, T]")
        _check_f32(where, "lse", lse)
    out = (_sds(q.shape, q.dtype), _sds(k.shape, k.dtype), _sds(v.shape, v.dtype))
    gq, gk, gv = _call("exphil_attention_bwd", out, q, k, v, o, lse, grad_o,
                       **_attention_attrs(mask_c, window, layout_c, scale, precision))
    return gq, gk, gv


def _rows_to_q_layout(g, layout_c):
    """[B, Hq, T] -> broadcastable against q ([B, Hq, T, 1] or [B, T, Hq, 1])."""
    if layout_c == 1:
        g = jnp.swapaxes(g, 1, 2)
    return g[..., None]


@functools.lru_cache(maxsize=None)
def _attention_vjp(mask_c, window, layout_c, scale, precision):
    kw = dict(mask=mask_c, window=window, layout=layout_c, scale=scale, validate=False,
              precision=precision)

    @jax.custom_vjp
    def f(q, k, v):
        return attention_fwd(q, k, v, **kw)

    def f_fwd(q, k, v):
        # symbolic_zeros=True: each argument arrives as a CustomVJPPrimal
        q, k, v = q.value, k.value, v.value
        o, lse = attention_fwd(q, k, v, **kw)
        return (o, lse), (q, k, v, o, lse)

    def f_bwd(res, cts):
        q, k, v, o, lse = res
        grad_o, grad_lse = cts
        if _is_symbolic_zero(grad_o):
            grad_o = jnp.zeros(o.shape, o.dtype)
        gq, gk, gv = attention_bwd(q, k, v, o, lse, grad_o.astype(o.dtype), **kw)
        if not _is_symbolic_zero(grad_lse):
            d = q.shape[-1]
            s = float(scale) if scale is not None else 1.0 / math.sqrt(d)
            g = jnp.where(jnp.isfinite(lse), grad_lse.astype(F32), 0.0)
            g = _rows_to_q_layout(g, layout_c)
            o_k, _ = attention_fwd(q, k, k, **kw)  # sum_j P_ij k_j
            gq = (gq.astype(F32) + s * g * o_k.astype(F32)).astype(q.dtype)
            g_q = (g * q.astype(F32)).astype(q.dtype)
            _, _, gk_extra = attention_bwd(q, k, k, o_k, lse, g_q, **kw)  # sum_i P_ij g_i q_i
            gk = (gk.astype(F32) + s * gk_extra.astype(F32)).astype(k.dtype)
        return gq, gk, gv

    f.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
    return f


def attention(q, k, v, mask="none", window=0, layout="bhtd", scale=None, precision="exact"):
    """Differentiable fused attention: (o, lse). See the module docstring for
    how a cotangent of lse is handled."""
    mask_c, layout_c = _code(MASKS, mask, "mask"), _code(LAYOUTS, layout, "layout")
    _validate_attention(q, k, v, mask_c, window, layout_c, scale)
    window = int(window) if mask_c == MASKS["window"] else 0
    scale_key = None if scale is None else float(np.float32(scale))
    precision_c = _code(PRECISIONS, precision, "precision")
    return _attention_vjp(mask_c, window, layout_c, scale_key, precision_c)(q, k, v)


# ---------------------------------------------------------------------------
# Where XLA put the targets
# ---------------------------------------------------------------------------
# XLA forms its command buffers (CUDA graphs) on the thunk sequence, after
# HLO optimization, so the optimized HLO does not show them; its dumps do.
# Run with XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_module_re=NAME" (NAME
# matching the jitted function's module, jit_<function name>) to get them.
def placement_dump_flags(dump_dir, module_re):
    """The XLA_FLAGS entries that make XLA dump what command_buffer_placement
    reads, for the modules matching module_re only."""
    return f"--xla_dump_to={dump_dir} --xla_dump_hlo_module_re={module_re}"


def _latest_dump(dump_dir, module, suffix):
    files = sorted(Path(dump_dir).glob(f"module_*.{module}.*{suffix}"))
    files = [f for f in files if f.name.endswith(suffix)]
    if not files:
        raise FileNotFoundError(f"no XLA dump *{module}*{suffix} in {dump_dir} (were the "
                                f"placement_dump_flags in XLA_FLAGS when JAX started?)")
    return files[-1]  # module ids grow with each compilation


def command_buffer_placement(dump_dir, module, targets):
    """{target: [(instruction, inside a command buffer?)...]} for the last
    compiled module named `module` (e.g. "jit_probe") in an XLA dump: each
    custom call to one of `targets`, and whether XLA runs it as a command
    of a command buffer (traced into a CUDA graph) or as a thunk of its own
    between graphs. A target XLA does not call is absent from the result."""
    hlo = _latest_dump(dump_dir, module, "gpu_after_optimizations.txt").read_text()
    instr_target = {}
    for line in hlo.splitlines():
        line = line.strip()
        if "custom_call_target=" not in line or " = " not in line:
            continue
        name = line.split(" = ", 1)[0].split()[-1].lstrip("%")
        target = line.split('custom_call_target="', 1)[1].split('"', 1)[0]
        if target in targets:
            instr_target[name] = target
    # thunk id -> HLO instruction (the thunk's profile annotation)
    thunk_instr, block = {}, {}
    for line in _latest_dump(dump_dir, module, "thunk_metadata.txt").read_text().splitlines():
        line = line.strip()
        if line.startswith("thunk_metadata {"):
            block = {}
        elif line.startswith("profile_annotation:"):
            block["annotation"] = line.split(":", 1)[1].strip().strip('"')
        elif line.startswith("thunk_id:"):
            block["id"] = int(line.split(":", 1)[1])
        elif line.startswith("thunk_kind:"):
            thunk_instr[block.get("id", 0)] = block.get("annotation", "")
    # nesting: "NNN: kKind ..." lines, indented under the thunk that holds them
    placement = {}
    enclosing = []  # (indent, kind) of the thunks above the current line
    for line in _latest_dump(dump_dir, module, "thunk_sequence_after_thunk_passes.txt") \
            .read_text().splitlines():
        head = line.lstrip()
        indent = len(line) - len(head)
        parts = head.split(None, 2)
        if len(parts) < 2 or not parts[0].rstrip(":").isdigit():
            continue
        while enclosing and enclosing[-1][0] >= indent:
            enclosing.pop()
        thunk_id, kind = int(parts[0].rstrip(":")), parts[1]
        instr = thunk_instr.get(thunk_id, "")
        if kind == "kCustomCall" and instr in instr_target:
            inside = any(k == "kCommandBuffer" for _, k in enclosing)
            placement.setdefault(instr_target[instr], []).append((instr, inside))
        enclosing.append((indent, kind))
    return placement


__all__ = [
    "DEFAULT_LIB", "SCAN_OPS", "TARGETS", "load", "loaded_path", "registered_targets",
    "missing_targets", "scan", "linear_scan", "min_gru", "min_lstm", "liquid",
    "selective_scan", "attention", "scan_fwd", "scan_bwd", "selective_scan_fwd",
    "selective_scan_bwd", "attention_fwd", "attention_bwd", "placement_dump_flags",
    "command_buffer_placement",
]
