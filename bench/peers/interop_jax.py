#!/usr/bin/env python3
"""ExPhil.Native on XLA's own buffers: interop with JAX through the C ABI.

Three independent sections (one failing reports and the others still run;
the exit status is nonzero if any failed):

A. xla-buffers: inputs made by JAX on the GPU (jax.random); their device
   addresses (Array.unsafe_buffer_pointer()) passed to the C ABI; every
   output written into an array XLA allocated (jnp.full(NaN), blocked on,
   so an element the library forgets stays NaN); the results read back
   through JAX and compared with bench/peers/jax_reference.py (f32
   arithmetic on the same rounded inputs, gradients by jax.vjp). Every op,
   forward and backward (h0, h_final, grad_h_final, grad_h0 included),
   f32 / bf16 / f16.

B. dlpack: the reverse direction. Memory the library allocated
   (exphil_device_alloc) is wrapped in a DLPack capsule built here with
   ctypes (DLManagedTensor, kDLCUDA) and exposed through __dlpack__ /
   __dlpack_device__; jax.dlpack.from_dlpack wraps it without a copy
   (proved: the jax array's unsafe_buffer_pointer() is the library's
   address); a library kernel writes into it; a jitted JAX function
   consumes it; the result is compared with the expectation. Ownership
   follows the protocol: the consumer renames the capsule "used_dltensor"
   and calls the deleter when it releases the buffer, and the deleter frees
   the memory with exphil_device_free; a capsule never consumed frees it
   from its destructor; a buffer never exported frees it itself. The
   section checks that the deleter ran exactly once after the jax array
   was dropped.

C. sync: the rule, and the evidence that it is needed.
     The library runs on its own stream (stream NULL) or the caller's;
     XLA runs on its own streams; neither waits for the other. So:
       before the call:  jax.block_until_ready(inputs and outputs)
       after the call:   exphil_synchronize(device) (or synchronise the
                         stream passed) before JAX reads what it wrote.
   (i)  input from a slow jitted producer (a chain of large f32 matmuls,
        tens of ms): with block_until_ready N/N correct; without it the
        library reads memory XLA has not written yet. The early address is
        that of a donated buffer (jit(..., donate_argnums=0) writes its
        result in place), because with this JAX unsafe_buffer_pointer() on
        a not-yet-computed result may itself wait for it (measured and
        printed).
   (ii) a long library call (a queue of large scans, tens of ms, then the
        op whose output is read): with exphil_synchronize N/N correct;
        without it a jitted JAX reader sees the NaN poison.
   "without" counts are evidence, not failures; if "without" is never wrong
   the output says so.

Run (GPU machine, jax with the CUDA plugin; library built):
    python3 bench/peers/interop_jax.py [--lib PATH] [--seed N] [--trials N]
        [--sections A,B,C] [--json PATH]
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import exphil_ctypes as xc  # noqa: E402
import jax_reference as ref  # noqa: E402
import lib_on_jax as LJ  # noqa: E402
import peer_util as pu  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 in the references

JDT = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
# (rtol, atol relative to max|ref|) against an f32 reference on the same rounded inputs
TOL = {"f32": (1e-4, 1e-4), "bf16": (2e-2, 2e-2), "f16": (5e-3, 5e-3)}
ATT_TOL = {  # attention: as attention_sdpa.py
    "f32": {"o": (1e-4, 1e-4), "lse": (1e-5, 1e-5), "grad": (2e-4, 2e-4)},
    "f16": {"o": (5e-3, 5e-3), "lse": (1e-3, 1e-3), "grad": (1e-2, 1e-2)},
    "bf16": {"o": (1e-2, 1e-2), "lse": (2e-3, 2e-3), "grad": (2e-2, 2e-2)},
}


# ---------------------------------------------------------------------------
# A. inputs from JAX, outputs in XLA-allocated arrays
# ---------------------------------------------------------------------------
def scan_inputs(op, key, shape, dtype):
    ks = jax.random.split(key, 3)
    nrm = lambda k, s=1.0: (s * jax.random.normal(k, shape, jnp.float32)).astype(dtype)
    if op == "linear_scan":
        return [jax.random.uniform(ks[0], shape, jnp.float32, -1.0, 1.0).astype(dtype), nrm(ks[1])]
    if op == "min_gru":
        return [nrm(ks[0], 2.0), nrm(ks[1])]
    if op == "min_lstm":
        return [nrm(ks[0], 2.0), nrm(ks[1], 2.0), nrm(ks[2])]
    if op == "liquid":
        return [jax.random.uniform(ks[0], shape, jnp.float32, 0.5, 4.0).astype(dtype), nrm(ks[1])]
    raise ValueError(op)


def _report(label, metrics, extra=""):
    ok = all(m["ok"] for m in metrics.values())
    line = f"{'PASS' if ok else 'FAIL'} {label}  " + " ".join(
        f"{n}={pu.fmt_metric(m)}" for n, m in metrics.items()) + extra
    if not ok:
        line += "\n" + pu.fmt_failures(metrics)
    print(line, flush=True)
    return ok


def check_scan(lib, op, dt, key):
    dtype = JDT[dt]
    B, T, H = 2, 200, 96
    k1, k2, k3, k4 = jax.random.split(key, 4)
    xs = scan_inputs(op, k1, (B, T, H), dtype)
    h0 = jax.random.normal(k2, (B, H), jnp.float32)
    gy = jax.random.normal(k3, (B, T, H), jnp.float32).astype(dtype)
    ghf = jax.random.normal(k4, (B, H), jnp.float32)
    ptrs = [x.unsafe_buffer_pointer() for x in xs]

    y, hT = LJ.scan_forward(lib, op, xs, h0=h0, h_final_dtype=jnp.float32)
    grads, gh0 = LJ.scan_backward(lib, op, xs, y, gy, h0=h0, grad_h_final=ghf,
                                  grad_h0_dtype=jnp.float32)
    # the inputs are still JAX's buffers (nothing was copied or moved)
    same = all(x.unsafe_buffer_pointer() == p for x, p in zip(xs, ptrs))

    xs32 = [x.astype(jnp.float32) for x in xs]
    f = lambda xs_, h0_: ref.scan_ref(op, xs_, h0_, state_dtype=jnp.float32)
    (ry, rhT), pull = jax.vjp(f, xs32, h0)
    rgrads, rgh0 = pull((gy.astype(jnp.float32), ghf))
    rtol, atol = TOL[dt]
    m = {"y": pu.compare(y, ry, rtol, atol), "h_final": pu.compare(hT, rhT, rtol, atol)}
    for n, g, r in zip(xc.SCAN_INPUTS[op], grads, rgrads):
        m["grad_" + n] = pu.compare(g, r, rtol, atol)
    m["grad_h0"] = pu.compare(gh0, rgh0, rtol, atol)
    ok = _report(f"{op:<14} {dt:<4} B{B} T{T} H{H} fwd+bwd", m,
                 "" if same else "  INPUT BUFFERS CHANGED")
    return ok and same


def check_selective(lib, dt, key):
    dtype = JDT[dt]
    Bsz, T, Dn, N = 2, 100, 64, 16
    ks = jax.random.split(key, 12)
    f32 = jnp.float32
    x = jax.random.normal(ks[0], (Bsz, T, Dn), f32).astype(dtype)
    dtv = (jax.random.normal(ks[1], (Bsz, T, Dn), f32) - 1.5).astype(dtype)
    A = -jax.random.uniform(ks[2], (Dn, N), f32, 0.2, 3.0)
    Bm = jax.random.normal(ks[3], (Bsz, T, N), f32).astype(dtype)
    Cm = jax.random.normal(ks[4], (Bsz, T, N), f32).astype(dtype)
    dt_bias = 0.3 * jax.random.normal(ks[5], (Dn,), f32)
    Dv = jax.random.normal(ks[6], (Dn,), f32)
    z = jax.random.normal(ks[7], (Bsz, T, Dn), f32).astype(dtype)
    h0 = jax.random.normal(ks[8], (Bsz, Dn, N), f32)
    gy = jax.random.normal(ks[9], (Bsz, T, Dn), f32).astype(dtype)
    ghf = jax.random.normal(ks[10], (Bsz, Dn, N), f32)
    kw = dict(dt_bias=dt_bias, D=Dv, z=z, h0=h0, softplus=True, clamp=None)
    y, hT = LJ.selective_scan_forward(lib, x, dtv, A, Bm, Cm, **kw)
    g = LJ.selective_scan_backward(lib, x, dtv, A, Bm, Cm, gy, grad_h_final=ghf, **kw)

    names = ("x", "dt", "A", "B", "C", "dt_bias", "D", "z", "h0")
    vals = [t.astype(f32) for t in (x, dtv, A, Bm, Cm, dt_bias, Dv, z, h0)]

    def f(*a):
        return ref.selective_scan_ref(a[0], a[1], a[2], a[3], a[4], dt_bias=a[5], D=a[6], z=a[7],
                                      h0=a[8], softplus=True)

    (ry, rhT), pull = jax.vjp(f, *vals)
    rg = pull((gy.astype(f32), ghf))
    rtol, atol = TOL[dt]
    m = {"y": pu.compare(y, ry, rtol, atol), "h_final": pu.compare(hT, rhT, rtol, atol)}
    for n, r in zip(names, rg):
        m["grad_" + n] = pu.compare(g[n], r, rtol, atol)
    return _report(f"selective_scan {dt:<4} B{Bsz} T{T} D{Dn} N{N} fwd+bwd "
                   "(dt_bias, D, z, h0, softplus)", m)


def check_attention(lib, dt, key):
    dtype = JDT[dt]
    B, Hq, Hkv, T, S, d = 2, 4, 2, 96, 80, 64  # T > S causal: 16 rows see no key
    layout = "BTHD"
    ks = jax.random.split(key, 4)
    f32 = jnp.float32
    q = jax.random.normal(ks[0], (B, T, Hq, d), f32).astype(dtype)
    k = jax.random.normal(ks[1], (B, S, Hkv, d), f32).astype(dtype)
    v = jax.random.normal(ks[2], (B, S, Hkv, d), f32).astype(dtype)
    go = jax.random.normal(ks[3], (B, T, Hq, d), f32).astype(dtype)
    o, lse = LJ.attention_forward(lib, q, k, v, mask="causal", layout=layout)
    gq, gk, gv = LJ.attention_backward(lib, q, k, v, o, lse, go, mask="causal", layout=layout)
    q32, k32, v32 = (t.astype(f32) for t in (q, k, v))
    f = lambda a, b, c: ref.attention_ref(a, b, c, mask="causal", layout="bthd")
    (ro, rlse), pull = jax.vjp(f, q32, k32, v32)
    rgq, rgk, rgv = pull((go.astype(f32), jnp.zeros_like(rlse)))
    t = ATT_TOL[dt]
    amax = lambda a: float(jnp.max(jnp.abs(a.astype(f32))))
    terms = amax(go) * amax(v) * max(amax(q), amax(k)) / math.sqrt(d)
    m = {"o": pu.compare(o, ro, *t["o"]), "lse": pu.compare(lse, rlse, *t["lse"]),
         "grad_q": pu.compare(gq, rgq, *t["grad"], mag_floor=terms),
         "grad_k": pu.compare(gk, rgk, *t["grad"], mag_floor=terms),
         "grad_v": pu.compare(gv, rgv, *t["grad"], mag_floor=terms)}
    empty = np.asarray(~ref.attention_visibility(T, S, "causal").any(axis=1))
    o_e = pu.to_f64(o)[:, empty]
    gq_e = pu.to_f64(gq)[:, empty]
    zero_ok = bool((o_e == 0).all() and (gq_e == 0).all())
    return _report(f"attention      {dt:<4} {layout} B{B} Hq{Hq} Hkv{Hkv} T{T} S{S} d{d} causal "
                   "fwd+bwd", m, f"  empty rows {int(empty.sum())} zero: {zero_ok}") and zero_ok


def section_xla_buffers(lib, args):
    print("Inputs: jax.random arrays on the GPU; outputs: jnp.full(NaN) arrays XLA allocated; "
          "stream NULL + exphil_synchronize; reference: jax_reference in f32 on the same rounded "
          "inputs (jax.vjp for gradients). Per tensor: max|err|/max|ref| (worst err/tol).")
    print("Tolerances (rtol, atol/max|ref|): scans " + json.dumps(TOL) + "; attention "
          + json.dumps(ATT_TOL))
    key = jax.random.PRNGKey(args.seed)
    failures = 0
    n = 0
    for dt in args.dtypes:
        for op in xc.SCAN_INPUTS:
            key, sub = jax.random.split(key)
            n += 1
            failures += not check_scan(lib, op, dt, sub)
        key, sub = jax.random.split(key)
        n += 1
        failures += not check_selective(lib, dt, sub)
        key, sub = jax.random.split(key)
        n += 1
        failures += not check_attention(lib, dt, sub)
    print(f"{n - failures}/{n} cases passed")
    return failures == 0, f"{n - failures}/{n} cases"


# ---------------------------------------------------------------------------
# B. library memory -> JAX through DLPack (no copy)
# ---------------------------------------------------------------------------
KDL_CUDA = 2
KDL_FLOAT = 2
KDL_BFLOAT = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLPACK_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLPACK_DELETER),
]

_DLTENSOR_NAME = b"dltensor"  # module constant: the capsule keeps a pointer to it
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# address of a DLManagedTensor -> what keeps it (and its memory) alive
_EXPORTS = {}
DELETER_LOG = []  # (address, device pointer, who) for every deleter run


def _managed_deleter_impl(addr, who):
    rec = _EXPORTS.pop(addr, None)
    if rec is None:
        DELETER_LOG.append((addr, None, who + " (unknown tensor)"))
        return
    try:
        rec["lib"].device_free(rec["ptr"])
    finally:
        DELETER_LOG.append((addr, rec["ptr"], who))
        buf = rec.get("owner")
        if buf is not None:
            buf.freed_by = who


def _managed_deleter(mptr):
    """DLManagedTensor.deleter: called by the consumer when it releases the
    buffer (possibly from one of its threads; ctypes takes the GIL)."""
    try:
        _managed_deleter_impl(ctypes.cast(mptr, ctypes.c_void_p).value, "consumer deleter")
    except Exception as e:  # never raise into C
        print(f"dlpack deleter failed: {type(e).__name__}: {e}", file=sys.stderr)


def _capsule_destructor(capsule):
    """PyCapsule destructor: if the capsule was never consumed (still named
    "dltensor"), the producer still owns the tensor and deletes it."""
    try:
        if _PyCapsule_IsValid(capsule, _DLTENSOR_NAME):
            p = _PyCapsule_GetPointer(capsule, _DLTENSOR_NAME)
            _managed_deleter_impl(p, "capsule destructor (never consumed)")
    except Exception as e:
        print(f"dlpack capsule destructor failed: {type(e).__name__}: {e}", file=sys.stderr)


_DELETER_C = DLPACK_DELETER(_managed_deleter)
_CAPSULE_DESTRUCTOR_C = _CAPSULE_DESTRUCTOR(_capsule_destructor)


class LibraryBuffer:
    """Device memory from exphil_device_alloc, exportable once through DLPack."""

    def __init__(self, lib, device, shape, dtype):
        self.lib, self.device = lib, int(device)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype  # "f32", "f16", "bf16"
        self.code = xc.DTYPE_CODES[dtype]
        self.nbytes = xc.DTYPE_SIZES[self.code] * int(np.prod(self.shape))
        self.ptr = lib.device_alloc(self.device, self.nbytes)
        self.exported = False
        self.freed_by = None

    def desc(self):
        return xc.tensor_desc(self.ptr, self.code, self.shape)

    def __dlpack_device__(self):
        return (KDL_CUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None, **_):
        if self.exported or self.freed_by:
            raise BufferError("LibraryBuffer: already exported or freed (one consumer only)")
        if copy:
            raise BufferError("LibraryBuffer: copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, self.device):
            raise BufferError(f"LibraryBuffer lives on (kDLCUDA, {self.device}), not {dl_device}")
        # The data must be ready for work the consumer enqueues on `stream`:
        # wait for everything on the library's stream (a host wait satisfies any
        # consumer stream). max_version: we produce the legacy DLManagedTensor
        # (capsule "dltensor"), which the protocol allows.
        self.lib.synchronize(self.device)
        nd = len(self.shape)
        shape = (ctypes.c_int64 * nd)(*self.shape)
        strides_list, acc = [], 1
        for s in reversed(self.shape):
            strides_list.append(acc)
            acc *= s
        strides = (ctypes.c_int64 * nd)(*reversed(strides_list))  # row-major, in elements
        mt = DLManagedTensor()
        mt.dl_tensor.data = ctypes.c_void_p(self.ptr)
        mt.dl_tensor.device = DLDevice(KDL_CUDA, self.device)
        mt.dl_tensor.ndim = nd
        code = KDL_BFLOAT if self.dtype == "bf16" else KDL_FLOAT
        bits = 32 if self.dtype == "f32" else 16
        mt.dl_tensor.dtype = DLDataType(code, bits, 1)
        mt.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        mt.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        mt.dl_tensor.byte_offset = 0
        mt.manager_ctx = None
        mt.deleter = _DELETER_C
        addr = ctypes.addressof(mt)
        _EXPORTS[addr] = {"lib": self.lib, "ptr": self.ptr, "mt": mt, "shape": shape,
                          "strides": strides, "owner": self}
        capsule = _PyCapsule_New(addr, _DLTENSOR_NAME, _CAPSULE_DESTRUCTOR_C)
        self.exported = True
        return capsule

    def close(self):
        """Free the memory if it was never handed to a consumer."""
        if not self.exported and not self.freed_by:
            self.lib.device_free(self.ptr)
            self.freed_by = "close()"

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def section_dlpack(lib, args):
    if not lib.has_device_alloc:
        print(f"{lib.path} does not export exphil_device_alloc / exphil_device_free")
        return False, "library lacks exphil_device_alloc"
    device = xc.jax_cuda_ordinal(jax.devices()[0])
    B, T, H = 4, 333, 128
    ok = True
    notes = []

    buf = LibraryBuffer(lib, device, (B, T, H), "f32")
    print(f"library allocation: 0x{buf.ptr:x} ({buf.nbytes} bytes, 256-byte aligned: "
          f"{buf.ptr % 256 == 0})")
    arr = jax.dlpack.from_dlpack(buf)
    jptr = arr.unsafe_buffer_pointer()
    no_copy = jptr == buf.ptr
    print(f"jax.dlpack.from_dlpack -> {arr.dtype}{list(arr.shape)} on {list(arr.devices())[0]}; "
          f"unsafe_buffer_pointer 0x{jptr:x}: {'same address, no copy' if no_copy else 'A COPY'}")
    ok &= no_copy
    ok &= buf.exported and buf.freed_by is None

    # the library writes into it (a min_gru forward over JAX-made inputs)
    k1, k2 = jax.random.split(jax.random.PRNGKey(args.seed + 1))
    gate = 2.0 * jax.random.normal(k1, (B, T, H), jnp.float32)
    cand = jax.random.normal(k2, (B, T, H), jnp.float32)
    jax.block_until_ready((gate, cand, arr))
    lib.call("min_gru_forward", gate=gate, candidate=cand, y=buf.desc(), stream=None)
    lib.synchronize(device)

    # a jitted JAX function consumes it
    consume = jax.jit(lambda y: (jnp.tanh(y) * 2.0 + jnp.cumsum(y, axis=1)).sum(axis=2))
    got = consume(arr)
    ry, _ = jax.jit(lambda g, c: ref.scan_ref("min_gru", (g, c)))(gate, cand)
    want = consume(ry)
    m_y = pu.compare(arr, ry, *TOL["f32"])
    m_f = pu.compare(got, want, 1e-4, 1e-4)
    print(f"{'PASS' if m_y['ok'] else 'FAIL'} library-written data seen by JAX (vs lax.scan "
          f"reference): {pu.fmt_metric(m_y)}")
    print(f"{'PASS' if m_f['ok'] else 'FAIL'} jitted consumer on the library's buffer vs on the "
          f"reference: {pu.fmt_metric(m_f)}")
    ok &= m_y["ok"] and m_f["ok"]

    # ownership: dropping the jax array runs the deleter once, which frees the memory
    n_before = len(DELETER_LOG)
    jax.block_until_ready(got)
    del arr, got
    gc.collect()
    t0 = time.time()
    while len(DELETER_LOG) == n_before and time.time() - t0 < 5.0:
        time.sleep(0.01)
        gc.collect()
    ran = DELETER_LOG[n_before:]
    good_del = len(ran) == 1 and ran[0][1] == buf.ptr and buf.freed_by == "consumer deleter"
    print(f"{'PASS' if good_del else 'FAIL'} after `del` of the jax array: deleter runs "
          f"{[(hex(a), hex(p) if p else None, w) for a, p, w in ran]}; freed by: {buf.freed_by}")
    ok &= good_del
    if not good_del:
        notes.append("deleter not run exactly once")

    # a capsule that nobody consumes is freed by its destructor
    buf2 = LibraryBuffer(lib, device, (16,), "bf16")
    cap = buf2.__dlpack__(stream=None)
    n_before = len(DELETER_LOG)
    del cap
    gc.collect()
    good_cap = len(DELETER_LOG) == n_before + 1 and buf2.freed_by.startswith("capsule destructor")
    print(f"{'PASS' if good_cap else 'FAIL'} unconsumed capsule: freed by {buf2.freed_by}")
    ok &= good_cap

    # bf16 and f16 through the same path (dtype codes kDLBfloat / kDLFloat 16)
    for dt in ("bf16", "f16"):
        b3 = LibraryBuffer(lib, device, (2, 64, 32), dt)
        a3 = jax.dlpack.from_dlpack(b3)
        g3 = gate[:2, :64, :32].astype(JDT[dt])
        c3 = cand[:2, :64, :32].astype(JDT[dt])
        jax.block_until_ready((g3, c3))
        lib.call("min_gru_forward", gate=g3, candidate=c3, y=b3.desc(), stream=None)
        lib.synchronize(device)
        r3, _ = ref.scan_ref("min_gru", (g3.astype(jnp.float32), c3.astype(jnp.float32)))
        m3 = pu.compare(jax.jit(lambda y: y * 1)(a3), r3, *TOL[dt])
        same = a3.unsafe_buffer_pointer() == b3.ptr and a3.dtype == JDT[dt]
        print(f"{'PASS' if m3['ok'] and same else 'FAIL'} {dt}: dtype {a3.dtype}, no copy {same}, "
              f"{pu.fmt_metric(m3)}")
        ok &= m3["ok"] and same
        del a3
    gc.collect()
    return bool(ok), "; ".join(notes)


# ---------------------------------------------------------------------------
# C. synchronisation: sufficient and necessary
# ---------------------------------------------------------------------------
def section_sync(lib, args):
    dev0 = jax.devices()[0]
    device = xc.jax_cuda_ordinal(dev0)
    N = args.trials
    results = {}
    ok = True

    # ---- (i) slow producer -> library input -------------------------------------------
    B, T, H = 4, 512, 256
    M, n_mm = args.producer_size, args.producer_matmuls
    n_el = 2 * B * T * H
    if M * M < n_el:
        M = int(math.ceil(math.sqrt(n_el)))
    w = jax.random.normal(jax.random.PRNGKey(7), (M, M), jnp.float32)
    ws = w / math.sqrt(M)

    def produce_values(i):
        m0 = w * (1.0 + 0.01 * i)
        m = lax.fori_loop(0, n_mm, lambda _, m: jnp.tanh(m @ ws), m0)
        return (jnp.tanh(3.0 * m.reshape(-1)[:n_el]) + 0.01 * i).reshape(2, B, T, H)

    produce = jax.jit(produce_values)
    produce_into = jax.jit(lambda buf, i: produce_values(i) + 0.0 * buf, donate_argnums=0)
    ref_fwd = jax.jit(lambda gc_: ref.scan_ref("min_gru", (gc_[0], gc_[1]))[0])
    probe_y = jax.jit(lambda y, r: (jnp.sum(jnp.isnan(y)), jnp.max(jnp.abs(y - r)),
                                    jnp.max(jnp.abs(r))))

    def y_correct(y, vals):
        nan_n, err, mag = (float(v) for v in probe_y(y, ref_fwd(vals)))
        return nan_n == 0 and err <= 1e-4 * max(mag, 1e-30) + 1e-6, nan_n, err

    # warm up and measure the producer
    jax.block_until_ready(produce(jnp.float32(0)))
    t0 = time.perf_counter()
    jax.block_until_ready(produce(jnp.float32(1)))
    prod_ms = (time.perf_counter() - t0) * 1e3
    zb = jnp.zeros((2, B, T, H), jnp.float32)
    jax.block_until_ready(produce_into(zb, jnp.float32(0)))
    print(f"(i) producer: {n_mm} chained f32 {M}x{M} matmuls (HIGHEST precision), "
          f"{prod_ms:.1f} ms per call; library op min_gru forward B{B} T{T} H{H} reading its "
          "gate/candidate from the producer's output")

    # does unsafe_buffer_pointer() on an unfinished result wait for it?
    vals = produce(jnp.float32(2))
    t0 = time.perf_counter()
    _ = vals.unsafe_buffer_pointer()
    ptr_ms = (time.perf_counter() - t0) * 1e3
    jax.block_until_ready(vals)
    ptr_blocks = ptr_ms > 0.5 * prod_ms
    print(f"    unsafe_buffer_pointer() on a just-dispatched result took {ptr_ms:.2f} ms "
          f"({'it waited for the producer' if ptr_blocks else 'it did not wait'})")
    results["unsafe_buffer_pointer_ms"] = ptr_ms
    results["producer_ms"] = prod_ms

    def run_i(sync, donated, i):
        y = LJ.poison((B, T, H), jnp.float32)
        jax.block_until_ready(y)
        if donated:
            buf = jnp.zeros((2, B, T, H), jnp.float32)
            jax.block_until_ready(buf)
            ptr = buf.unsafe_buffer_pointer()
            vals = produce_into(buf, jnp.float32(i))  # XLA writes into ptr, later
        else:
            vals = produce(jnp.float32(i))
            ptr = None
        if sync:
            jax.block_until_ready(vals)
        if ptr is None:
            ptr = vals.unsafe_buffer_pointer()
        g = xc.tensor_desc(ptr, "f32", (B, T, H))
        c = xc.tensor_desc(ptr + B * T * H * 4, "f32", (B, T, H))
        lib.call("min_gru_forward", gate=g, candidate=c, y=y, stream=None)
        lib.synchronize(device)
        jax.block_until_ready(vals)
        aliased = vals.unsafe_buffer_pointer() == ptr
        good, nan_n, err = y_correct(y, vals)
        return good, aliased, err

    for donated in (True, False):
        name = "donated" if donated else "fresh"
        counts = {}
        aliased_all = True
        for sync in (True, False):
            good_n = 0
            for t in range(N):
                good, aliased, err = run_i(sync, donated, 10 + t + (0 if sync else 1000))
                good_n += good
                aliased_all &= aliased
            counts[sync] = good_n
        results[f"i_{name}"] = {"with_sync_correct": counts[True], "without_sync_wrong": N - counts[False],
                                "trials": N, "buffer_aliased": aliased_all}
        label = ("(i) slow producer, address of the donated buffer taken before dispatch"
                 if donated else "(i) slow producer, address of the fresh result")
        print(f"{label}: with block_until_ready: {counts[True]}/{N} correct; "
              f"without: {N - counts[False]}/{N} wrong")
        if donated and not aliased_all:
            print("    note: XLA did not write the result into the donated buffer every time, "
                  "so the early address was not the producer's output")
        if not donated and ptr_blocks and counts[False] == N:
            print("    (expected: unsafe_buffer_pointer() itself waited for the producer, so "
                  "the omission was covered by JAX here; do not rely on it)")
        if counts[False] == N and donated:
            print("    honest note: leaving block_until_ready out never gave a wrong result here")
        ok &= counts[True] == N

    # ---- (ii) long library call -> JAX reads the output -----------------------------
    Bb, Tb, Hb = args.delay_shape
    kb = jax.random.split(jax.random.PRNGKey(11), 4)
    a_big = jax.random.uniform(kb[0], (Bb, Tb, Hb), jnp.float32, -1.0, 1.0)
    b_big = jax.random.normal(kb[1], (Bb, Tb, Hb), jnp.float32)
    y_big = jnp.zeros((Bb, Tb, Hb), jnp.float32)
    Bs, Ts, Hs = 4, 1024, 256
    a_s = jax.random.uniform(kb[2], (Bs, Ts, Hs), jnp.float32, -1.0, 1.0)
    b_s = jax.random.normal(kb[3], (Bs, Ts, Hs), jnp.float32)
    jax.block_until_ready((a_big, b_big, y_big, a_s, b_s))

    def library_chain(out):
        for _ in range(args.delay_calls):
            lib.call("linear_scan_forward", a=a_big, b=b_big, y=y_big, stream=None)
        lib.call("linear_scan_forward", a=a_s, b=b_s, y=out, stream=None)

    # expected output (library, synchronised; checked against the reference)
    expected = LJ.poison((Bs, Ts, Hs), jnp.float32)
    jax.block_until_ready(expected)
    t0 = time.perf_counter()
    library_chain(expected)
    lib.synchronize(device)
    chain_ms = (time.perf_counter() - t0) * 1e3
    r_s, _ = jax.jit(lambda a, b: ref.scan_ref("linear_scan", (a, b)))(a_s, b_s)
    m = pu.compare(expected, r_s, *TOL["f32"])
    print(f"(ii) library chain: {args.delay_calls} x linear_scan forward B{Bb} T{Tb} H{Hb} f32, "
          f"then the op read by JAX (B{Bs} T{Ts} H{Hs}); {chain_ms:.1f} ms synchronised; "
          f"its output vs lax.scan: {pu.fmt_metric(m)}")
    ok &= m["ok"]
    reader = jax.jit(lambda y, e: (jnp.sum(jnp.isnan(y)), jnp.sum(y != e)))

    counts, poison_seen = {}, 0
    for sync in (True, False):
        good_n = 0
        for _ in range(N):
            out = LJ.poison((Bs, Ts, Hs), jnp.float32)
            jax.block_until_ready(out)
            library_chain(out)
            if sync:
                lib.synchronize(device)
            nan_n, diff_n = (int(v) for v in reader(out, expected))  # JAX reads the output
            lib.synchronize(device)  # clean up before the next trial in either case
            good = nan_n == 0 and diff_n == 0
            good_n += good
            if not sync and nan_n:
                poison_seen += 1
        counts[sync] = good_n
    results["ii"] = {"with_sync_correct": counts[True], "without_sync_wrong": N - counts[False],
                     "trials": N, "without_sync_poison_seen": poison_seen, "chain_ms": chain_ms}
    print(f"(ii) long library call, JAX reads the output: with exphil_synchronize: "
          f"{counts[True]}/{N} correct; without: {N - counts[False]}/{N} wrong "
          f"({poison_seen} saw the NaN poison)")
    if counts[False] == N:
        print("    honest note: leaving exphil_synchronize out never gave a wrong result here")
    ok &= counts[True] == N
    del a_big, b_big, y_big
    section_sync.results = results
    return bool(ok), (f"(i) donated: without {results['i_donated']['without_sync_wrong']}/{N} wrong; "
                      f"(ii): without {results['ii']['without_sync_wrong']}/{N} wrong")


# ---------------------------------------------------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=xc.default_lib_path(),
                   help="libexphil.so (default $EXPHIL_LIB or build-gpu/c_src/libexphil.so)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtypes", default="f32,bf16,f16")
    p.add_argument("--sections", default="A,B,C", help="any of A (xla buffers), B (dlpack), C (sync)")
    p.add_argument("--trials", type=int, default=10, help="repetitions of each sync experiment")
    p.add_argument("--producer-size", type=int, default=4096)
    p.add_argument("--producer-matmuls", type=int, default=8)
    p.add_argument("--delay-calls", type=int, default=100,
                   help="large library scans queued before the op JAX reads")
    p.add_argument("--delay-shape", default="8,8192,1024", help="B,T,H of the queued scans")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    a.dtypes = [s for s in a.dtypes.split(",") if s]
    a.sections = [s.strip().upper() for s in a.sections.split(",") if s.strip()]
    a.delay_shape = tuple(int(s) for s in a.delay_shape.split(","))
    if a.seed is None:
        a.seed = time.time_ns() % (1 << 31)
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    print("# ExPhil.Native interop with JAX/XLA buffers")
    try:
        lib = xc.Exphil(args.lib)
    except (OSError, xc.ExphilError) as e:
        print(f"cannot load {args.lib}: {e}")
        return 2
    devs = jax.devices()
    print(f"library {args.lib} (version {lib.version()}, {lib.device_count()} device(s)); "
          f"jax {jax.__version__}, {devs[0].platform} {getattr(devs[0], 'device_kind', '')}; "
          f"seed {args.seed}", flush=True)
    if devs[0].platform != "gpu":
        print("JAX has no GPU backend: nothing to test")
        return 2
    sec = pu.Sections()
    if "A" in args.sections:
        sec.run("A xla-buffers", section_xla_buffers, lib, args)
    if "B" in args.sections:
        sec.run("B dlpack", section_dlpack, lib, args)
    if "C" in args.sections:
        sec.run("C sync", section_sync, lib, args)
    rc = sec.summary("interop_jax summary")
    if args.json:
        out = {"seed": args.seed, "sections": sec.results,
               "sync": getattr(section_sync, "results", None)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(pu.jsonable(out), indent=1))
        print(f"results written to {args.json}")
    gc.collect()
    try:
        lib.synchronize(xc.jax_cuda_ordinal(devs[0]))
    except Exception:
        pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
