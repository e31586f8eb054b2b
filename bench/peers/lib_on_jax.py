"""Run ExPhil.Native ops on JAX's own GPU buffers through the ctypes binding (lib_on_jax.py).

Every output is an array that XLA allocated (jnp.full with NaN, so that an
element the library does not write shows up), and the calls follow the
synchronisation rule that interop_jax.py proves:

  1. jax.block_until_ready(inputs and outputs)   before the call
     (XLA runs asynchronously on its own streams; the library's stream does
     not wait for them);
  2. the library call on stream NULL (the library's own stream);
  3. exphil_synchronize(device)                   before JAX touches the outputs.

Functions return jax arrays; gradients of absent inputs are None.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import exphil_ctypes as xc


def poison(shape, dtype):
    """A fresh XLA-allocated array full of NaN."""
    return jnp.full(tuple(shape), jnp.nan, dtype=dtype)


def _device(arrays):
    for a in arrays:
        if a is not None:
            return xc.jax_cuda_ordinal(a)
    raise ValueError("no array given")


def run(lib, op, inputs, outputs, options=None, sync=True):
    """inputs: {name: jax array or None}; outputs: {name: (shape, dtype) or
    None}. Allocates the outputs (NaN), waits for inputs and outputs, calls
    the op on the library's stream and, with sync, waits for it. Returns
    {name: jax array or None}."""
    outs = {n: (poison(*spec) if spec is not None else None) for n, spec in outputs.items()}
    live = [a for a in list(inputs.values()) + list(outs.values()) if a is not None]
    jax.block_until_ready(live)
    kwargs = dict(inputs)
    kwargs.update(outs)
    if options is not None:
        kwargs["options"] = options
    lib.call(op, stream=None, **kwargs)
    if sync:
        lib.synchronize(_device(live))
    return outs


# ---------------------------------------------------------------------------
# scans
# ---------------------------------------------------------------------------
def scan_forward(lib, op, xs, h0=None, h_final_dtype=jnp.float32):
    """(y, h_final or None). xs in the ABI's order (exphil_ctypes.SCAN_INPUTS);
    h_final_dtype None: h_final not asked for."""
    names = xc.SCAN_INPUTS[op]
    B, T, H = xs[0].shape
    inputs = dict(zip(names, xs))
    inputs["h0"] = h0
    outs = run(lib, op + "_forward", inputs,
               {"y": ((B, T, H), xs[0].dtype),
                "h_final": ((B, H), h_final_dtype) if h_final_dtype is not None else None})
    return outs["y"], outs["h_final"]


def scan_backward(lib, op, xs, y, grad_y, h0=None, grad_h_final=None, grad_h0_dtype=None):
    """([grad of each input], grad_h0 or None)."""
    names = xc.SCAN_INPUTS[op]
    B, T, H = xs[0].shape
    inputs = dict(zip(names, xs))
    inputs.update(h0=h0, y=y, grad_y=grad_y, grad_h_final=grad_h_final)
    outputs = {"grad_" + n: ((B, T, H), xs[0].dtype) for n in names}
    outputs["grad_h0"] = ((B, H), grad_h0_dtype) if grad_h0_dtype is not None else None
    outs = run(lib, op + "_backward", inputs, outputs)
    return [outs["grad_" + n] for n in names], outs["grad_h0"]


# ---------------------------------------------------------------------------
# selective scan
# ---------------------------------------------------------------------------
def selective_scan_forward(lib, x, dt, A, B, C, dt_bias=None, D=None, z=None, h0=None,
                           softplus=False, clamp=None, want_h_final=True):
    """(y, h_final f32 or None)."""
    Bsz, T, Dn = x.shape
    N = A.shape[1]
    opts = xc.selective_scan_options(softplus, clamp)
    outs = run(lib, "selective_scan_forward",
               dict(x=x, dt=dt, A=A, B=B, C=C, dt_bias=dt_bias, D=D, z=z, h0=h0),
               {"y": ((Bsz, T, Dn), x.dtype),
                "h_final": ((Bsz, Dn, N), jnp.float32) if want_h_final else None},
               options=opts)
    return outs["y"], outs["h_final"]


SELECTIVE_GRADS = ("x", "dt", "A", "B", "C", "dt_bias", "D", "z", "h0")


def selective_scan_backward(lib, x, dt, A, B, C, grad_y, dt_bias=None, D=None, z=None, h0=None,
                            softplus=False, clamp=None, grad_h_final=None):
    """{name: gradient or None} for every input in SELECTIVE_GRADS (None where
    the input is absent)."""
    opts = xc.selective_scan_options(softplus, clamp)
    ins = dict(x=x, dt=dt, A=A, B=B, C=C, dt_bias=dt_bias, D=D, z=z, h0=h0)
    outputs = {}
    for n in SELECTIVE_GRADS:
        t = ins[n]
        outputs["grad_" + n] = (t.shape, t.dtype) if t is not None else None
    inputs = dict(ins)
    inputs.update(grad_y=grad_y, grad_h_final=grad_h_final)
    outs = run(lib, "selective_scan_backward", inputs, outputs, options=opts)
    return {n: outs["grad_" + n] for n in SELECTIVE_GRADS}


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------
def _lse_shape(q, layout):
    if layout.upper() == "BTHD":
        B, T, Hq, _ = q.shape
    else:
        B, Hq, T, _ = q.shape
    return (B, Hq, T)


def attention_forward(lib, q, k, v, mask="none", window=0, layout="BHTD", scale=0.0,
                      want_lse=True, precision="exact"):
    """(o, lse f32 [B, Hq, T] or None)."""
    opts = xc.attention_options(mask, window, layout.upper(), scale, precision)
    outs = run(lib, "attention_forward", dict(q=q, k=k, v=v),
               {"o": (q.shape, q.dtype),
                "lse": (_lse_shape(q, layout), jnp.float32) if want_lse else None},
               options=opts)
    return outs["o"], outs["lse"]


def attention_backward(lib, q, k, v, o, lse, grad_o, mask="none", window=0, layout="BHTD",
                       scale=0.0, precision="exact"):
    """(grad_q, grad_k, grad_v)."""
    opts = xc.attention_options(mask, window, layout.upper(), scale, precision)
    outs = run(lib, "attention_backward", dict(q=q, k=k, v=v, o=o, lse=lse, grad_o=grad_o),
               {"grad_q": (q.shape, q.dtype), "grad_k": (k.shape, k.dtype),
                "grad_v": (v.shape, v.dtype)},
               options=opts)
    return outs["grad_q"], outs["grad_k"], outs["grad_v"]
