"""ctypes binding of the whole ExPhil.Native C ABI (include/exphil/exphil.h).

Pure Python (ctypes only): importing this module needs neither torch nor
jax; the helpers for their tensors import them lazily.

    lib = Exphil(path)                       # loads libexphil.so, sets every prototype
    lib.version(), lib.device_count(), lib.synchronize(device)
    ptr = lib.device_alloc(device, nbytes); lib.device_free(ptr)   # if exported

    # any op, arguments by the header's names; tensors may be torch tensors,
    # jax arrays, exphil_tensor descriptors, (ptr, dtype, shape) tuples or None
    lib.call("min_gru_forward", gate=g, candidate=c, y=y, stream=None)

    # a no-argument callable with descriptors built once (for CUDA graphs);
    # `stream` may be a callable evaluated at every call
    run = lib.bind("attention_forward", q=q, k=k, v=v, options=opts, o=o,
                   lse=lse, stream=torch_current_stream)

Failures raise ExphilError(status, status name, exphil_last_error()).

Descriptors: tensor_desc(ptr, dtype, shape) for raw device pointers,
torch_desc(t) for contiguous CUDA torch tensors, jax_desc(a) for
single-device GPU jax arrays (a.unsafe_buffer_pointer()). The descriptor
only records the address: the caller keeps the memory alive, and, for jax
arrays, makes sure the data is ready (jax.block_until_ready) before the
call and synchronises the library (synchronize(device), or the stream it
passed) before JAX reads what the library wrote.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LIB = REPO_ROOT / "build-gpu" / "c_src" / "libexphil.so"
DEFAULT_XLA_FFI_LIB = REPO_ROOT / "build-gpu" / "c_src" / "xla_ffi" / "libexphil_xla_ffi.so"


def default_lib_path():
    return os.environ.get("EXPHIL_LIB", str(DEFAULT_LIB))


# ---------------------------------------------------------------------------
# Constants and structs of exphil.h
# ---------------------------------------------------------------------------
EXPHIL_OK = 0
STATUS_NAMES = {
    0: "EXPHIL_OK",
    1: "EXPHIL_ERROR_INVALID_ARGUMENT",
    2: "EXPHIL_ERROR_NO_DEVICE",
    3: "EXPHIL_ERROR_OUT_OF_MEMORY",
    4: "EXPHIL_ERROR_CUDA",
    5: "EXPHIL_ERROR_NOT_SUPPORTED",
    6: "EXPHIL_ERROR_INTERNAL",
}
EXPHIL_MAX_RANK = 8
EXPHIL_F32, EXPHIL_F16, EXPHIL_BF16 = 0, 1, 2
DTYPE_CODES = {"f32": EXPHIL_F32, "f16": EXPHIL_F16, "bf16": EXPHIL_BF16}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
DTYPE_SIZES = {EXPHIL_F32: 4, EXPHIL_F16: 2, EXPHIL_BF16: 2}
# spellings accepted by dtype_code(): ours, numpy/jax names, torch names
_DTYPE_ALIASES = {
    "f32": EXPHIL_F32, "float32": EXPHIL_F32, "torch.float32": EXPHIL_F32, "float": EXPHIL_F32,
    "f16": EXPHIL_F16, "float16": EXPHIL_F16, "torch.float16": EXPHIL_F16, "half": EXPHIL_F16,
    "bf16": EXPHIL_BF16, "bfloat16": EXPHIL_BF16, "torch.bfloat16": EXPHIL_BF16,
}
MASK_CODES = {"none": 0, "causal": 1, "window": 2}
LAYOUT_CODES = {"BHTD": 0, "BTHD": 1, "bhtd": 0, "bthd": 1}


class ExphilTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * EXPHIL_MAX_RANK),
    ]

    def __repr__(self):
        shape = list(self.shape[: self.rank])
        return (f"ExphilTensor(data=0x{(self.data or 0):x}, dtype={DTYPE_NAMES.get(self.dtype, self.dtype)}, "
                f"shape={shape})")


class SelectiveScanOptions(ctypes.Structure):
    _fields_ = [
        ("softplus", ctypes.c_int32),
        ("clamp", ctypes.c_int32),
        ("dt_min", ctypes.c_float),
        ("dt_max", ctypes.c_float),
    ]


class AttentionOptions(ctypes.Structure):
    _fields_ = [
        ("mask", ctypes.c_int32),
        ("window", ctypes.c_int32),
        ("layout", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("precision", ctypes.c_int32),
    ]


PRECISION_CODES = {"exact": 0, "tf32x3": 1}


def selective_scan_options(softplus=False, clamp=None):
    """clamp: None or (dt_min, dt_max)."""
    if clamp is None:
        return SelectiveScanOptions(int(bool(softplus)), 0, 0.0, 0.0)
    return SelectiveScanOptions(int(bool(softplus)), 1, float(clamp[0]), float(clamp[1]))


def attention_options(mask="none", window=0, layout="BHTD", scale=0.0, precision="exact"):
    """scale 0 or None: 1 / sqrt(d); precision "tf32x3": f32 products on
    tensor cores (f32 inputs only)."""
    return AttentionOptions(MASK_CODES[mask], int(window), LAYOUT_CODES[layout],
                            float(scale or 0.0), PRECISION_CODES[precision])


class ExphilError(RuntimeError):
    def __init__(self, message, status=None, status_name=None, detail=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.detail = detail


# ---------------------------------------------------------------------------
# Descriptors
# ---------------------------------------------------------------------------
def dtype_code(dtype):
    """The exphil_dtype of a dtype given as a code, a name ("f32", "bfloat16"),
    a numpy/jax dtype or a torch dtype."""
    if isinstance(dtype, int) and dtype in DTYPE_SIZES:
        return dtype
    key = str(dtype)
    if key not in _DTYPE_ALIASES:
        # numpy / ml_dtypes dtype objects and scalar types
        key = str(getattr(dtype, "name", getattr(dtype, "__name__", key)))
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"dtype {dtype!r} is not f32, f16 or bf16")
    return _DTYPE_ALIASES[key]


def tensor_desc(ptr, dtype, shape):
    """An exphil_tensor over device address ptr (int), dtype (anything
    dtype_code accepts) and shape (outermost first)."""
    shape = [int(s) for s in shape]
    if len(shape) > EXPHIL_MAX_RANK:
        raise ValueError(f"rank {len(shape)} > {EXPHIL_MAX_RANK}")
    dims = (ctypes.c_int64 * EXPHIL_MAX_RANK)(*(shape + [0] * (EXPHIL_MAX_RANK - len(shape))))
    return ExphilTensor(ctypes.c_void_p(int(ptr)), dtype_code(dtype), len(shape), dims)


def nbytes(desc):
    n = DTYPE_SIZES[desc.dtype]
    for s in desc.shape[: desc.rank]:
        n *= s
    return n


def torch_desc(t):
    """An exphil_tensor over a contiguous CUDA torch tensor (t must outlive it)."""
    if not t.is_cuda or not t.is_contiguous():
        raise ValueError("exphil tensors must be contiguous CUDA tensors")
    if t.dim() > EXPHIL_MAX_RANK:
        raise ValueError("rank > 8")
    return tensor_desc(t.data_ptr(), str(t.dtype), tuple(t.shape))


def _is_torch_tensor(x):
    mod = type(x).__module__
    return mod.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_cuda")


def _is_jax_array(x):
    return hasattr(x, "unsafe_buffer_pointer") and hasattr(x, "devices")


def jax_device(a):
    """The single jax Device holding array a."""
    devs = a.devices()
    if len(devs) != 1:
        raise ValueError(f"jax array on {len(devs)} devices; the library takes single-device arrays")
    return next(iter(devs))


def jax_cuda_ordinal(a_or_device):
    """The CUDA device ordinal (for synchronize/device_alloc) of a jax array or Device."""
    dev = jax_device(a_or_device) if hasattr(a_or_device, "devices") else a_or_device
    hw = getattr(dev, "local_hardware_id", None)
    return int(dev.id if hw is None else hw)


def jax_desc(a):
    """An exphil_tensor over a single-device GPU jax array through
    a.unsafe_buffer_pointer(). JAX's default layout is dense row-major.
    The caller keeps `a` alive while the library uses it and blocks on it
    (jax.block_until_ready) before the call."""
    dev = jax_device(a)
    if dev.platform not in ("gpu", "cuda"):
        raise ValueError(f"jax array lives on {dev.platform}, not a GPU")
    return tensor_desc(a.unsafe_buffer_pointer(), str(a.dtype), tuple(a.shape))


def as_desc(x):
    """None, ExphilTensor, torch tensor, jax array or (ptr, dtype, shape) ->
    ExphilTensor or None."""
    if x is None or isinstance(x, ExphilTensor):
        return x
    if _is_torch_tensor(x):
        return torch_desc(x)
    if _is_jax_array(x):
        return jax_desc(x)
    if isinstance(x, tuple) and len(x) == 3:
        return tensor_desc(*x)
    raise TypeError(f"cannot describe {type(x).__name__} as an exphil_tensor")


def torch_current_stream():
    """torch's current cudaStream_t as an int. It must not be 0: a NULL stream
    means the library's own non-blocking stream, not torch's legacy default
    stream; run under `with torch.cuda.stream(side_stream):`."""
    import torch

    handle = torch.cuda.current_stream().cuda_stream
    if handle == 0:
        raise RuntimeError("run on a non-default torch stream (with torch.cuda.stream(...))")
    return handle


# ---------------------------------------------------------------------------
# Prototypes: every function of exphil.h, arguments by the header's names
# ---------------------------------------------------------------------------
_T = "tensor"
_S = "stream"
_SSO = "ss_options"
_ATO = "att_options"

# name (without the exphil_ prefix) -> [(argument, kind)] in header order
OP_SIGNATURES = {
    "linear_scan_forward": [("a", _T), ("b", _T), ("h0", _T), ("y", _T), ("h_final", _T), ("stream", _S)],
    "linear_scan_backward": [("a", _T), ("b", _T), ("h0", _T), ("y", _T), ("grad_y", _T),
                             ("grad_h_final", _T), ("grad_a", _T), ("grad_b", _T), ("grad_h0", _T),
                             ("stream", _S)],
    "min_gru_forward": [("gate", _T), ("candidate", _T), ("h0", _T), ("y", _T), ("h_final", _T),
                        ("stream", _S)],
    "min_gru_backward": [("gate", _T), ("candidate", _T), ("h0", _T), ("y", _T), ("grad_y", _T),
                         ("grad_h_final", _T), ("grad_gate", _T), ("grad_candidate", _T),
                         ("grad_h0", _T), ("stream", _S)],
    "min_lstm_forward": [("forget", _T), ("input", _T), ("candidate", _T), ("h0", _T), ("y", _T),
                         ("h_final", _T), ("stream", _S)],
    "min_lstm_backward": [("forget", _T), ("input", _T), ("candidate", _T), ("h0", _T), ("y", _T),
                          ("grad_y", _T), ("grad_h_final", _T), ("grad_forget", _T),
                          ("grad_input", _T), ("grad_candidate", _T), ("grad_h0", _T),
                          ("stream", _S)],
    "liquid_forward": [("tau", _T), ("target", _T), ("h0", _T), ("y", _T), ("h_final", _T),
                       ("stream", _S)],
    "liquid_backward": [("tau", _T), ("target", _T), ("h0", _T), ("y", _T), ("grad_y", _T),
                        ("grad_h_final", _T), ("grad_tau", _T), ("grad_target", _T),
                        ("grad_h0", _T), ("stream", _S)],
    "selective_scan_forward": [("x", _T), ("dt", _T), ("A", _T), ("B", _T), ("C", _T),
                               ("dt_bias", _T), ("D", _T), ("z", _T), ("h0", _T),
                               ("options", _SSO), ("y", _T), ("h_final", _T), ("stream", _S)],
    "selective_scan_backward": [("x", _T), ("dt", _T), ("A", _T), ("B", _T), ("C", _T),
                                ("dt_bias", _T), ("D", _T), ("z", _T), ("h0", _T),
                                ("options", _SSO), ("grad_y", _T), ("grad_h_final", _T),
                                ("grad_x", _T), ("grad_dt", _T), ("grad_A", _T), ("grad_B", _T),
                                ("grad_C", _T), ("grad_dt_bias", _T), ("grad_D", _T),
                                ("grad_z", _T), ("grad_h0", _T), ("stream", _S)],
    "attention_forward": [("q", _T), ("k", _T), ("v", _T), ("options", _ATO), ("o", _T),
                          ("lse", _T), ("stream", _S)],
    "attention_backward": [("q", _T), ("k", _T), ("v", _T), ("o", _T), ("lse", _T),
                           ("grad_o", _T), ("options", _ATO), ("grad_q", _T), ("grad_k", _T),
                           ("grad_v", _T), ("stream", _S)],
}

# The scans' argument names by op (inputs, gradient names), for generic drivers.
SCAN_INPUTS = {
    "linear_scan": ("a", "b"),
    "min_gru": ("gate", "candidate"),
    "min_lstm": ("forget", "input", "candidate"),
    "liquid": ("tau", "target"),
}

_CTYPE_OF_KIND = {
    _T: ctypes.POINTER(ExphilTensor),
    _S: ctypes.c_void_p,
    _SSO: ctypes.POINTER(SelectiveScanOptions),
    _ATO: ctypes.POINTER(AttentionOptions),
}


def _stream_value(stream):
    """None/0 -> NULL (library stream); int, c_void_p, torch Stream, or a
    callable returning one of those."""
    if callable(stream) and not isinstance(stream, ctypes.c_void_p):
        stream = stream()
    if stream is None:
        return None
    if isinstance(stream, ctypes.c_void_p):
        return stream.value
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream) or None
    return int(stream) or None


class Exphil:
    """libexphil.so with every prototype of exphil.h set."""

    def __init__(self, path=None):
        self.path = str(path or default_lib_path())
        self.lib = ctypes.CDLL(self.path)
        lib = self.lib
        self._fns = {}
        # library and devices
        self._proto("exphil_version", ctypes.c_char_p, [])
        self._proto("exphil_last_error", ctypes.c_char_p, [])
        self._proto("exphil_status_name", ctypes.c_char_p, [ctypes.c_int])
        self._proto("exphil_device_count", ctypes.c_int, [ctypes.POINTER(ctypes.c_int)])
        self._proto("exphil_synchronize", ctypes.c_int, [ctypes.c_int])
        # memory (newer libraries): cudaMalloc / cudaFree wrappers
        self.has_device_alloc = hasattr(lib, "exphil_device_alloc") and hasattr(lib, "exphil_device_free")
        if self.has_device_alloc:
            self._proto("exphil_device_alloc", ctypes.c_int,
                        [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)])
            self._proto("exphil_device_free", ctypes.c_int, [ctypes.c_void_p])
        # ops
        for name, sig in OP_SIGNATURES.items():
            self._proto("exphil_" + name, ctypes.c_int, [_CTYPE_OF_KIND[k] for _, k in sig])

    def _proto(self, cname, restype, argtypes):
        if not hasattr(self.lib, cname):
            raise ExphilError(f"{self.path} does not export {cname}")
        fn = getattr(self.lib, cname)
        fn.restype = restype
        fn.argtypes = argtypes
        self._fns[cname] = fn
        return fn

    # -- errors ------------------------------------------------------------
    def status_name(self, status):
        return self.lib.exphil_status_name(int(status)).decode()

    def last_error(self):
        return self.lib.exphil_last_error().decode(errors="replace")

    def check(self, status, what):
        """Raise ExphilError naming `what`, the status and exphil_last_error()
        unless status is EXPHIL_OK."""
        if status != EXPHIL_OK:
            name = self.status_name(status)
            msg = self.last_error()
            raise ExphilError(f"{what}: {name} ({status}): {msg}", status, name, msg)

    # keep the old private name (attention_sdpa.py used it)
    _raise = check

    # -- library and devices -------------------------------------------------
    def version(self):
        return self.lib.exphil_version().decode()

    def device_count(self):
        n = ctypes.c_int(-1)
        self.check(self.lib.exphil_device_count(ctypes.byref(n)), "exphil_device_count")
        return n.value

    def synchronize(self, device=0):
        self.check(self.lib.exphil_synchronize(int(device)), f"exphil_synchronize({device})")

    def device_alloc(self, device, nbytes):
        """Device address (int) of nbytes from cudaMalloc on `device`."""
        if not self.has_device_alloc:
            raise ExphilError(f"{self.path} does not export exphil_device_alloc/exphil_device_free")
        ptr = ctypes.c_void_p()
        self.check(self.lib.exphil_device_alloc(int(device), ctypes.c_size_t(int(nbytes)),
                                                ctypes.byref(ptr)),
                   f"exphil_device_alloc({device}, {nbytes})")
        return int(ptr.value or 0)

    def device_free(self, ptr):
        if not self.has_device_alloc:
            raise ExphilError(f"{self.path} does not export exphil_device_free")
        self.check(self.lib.exphil_device_free(ctypes.c_void_p(int(ptr))), "exphil_device_free")

    # -- ops -----------------------------------------------------------------
    def _prepare(self, op, kwargs):
        """(fn, builders, keep): builders produce the positional arguments
        (the stream last, possibly from a callable)."""
        if op.startswith("exphil_"):
            op = op[len("exphil_"):]
        if op not in OP_SIGNATURES:
            raise ValueError(f"unknown op {op!r}; one of {sorted(OP_SIGNATURES)}")
        sig = OP_SIGNATURES[op]
        names = {n for n, _ in sig}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"{op}: unknown argument(s) {sorted(unknown)}; takes {[n for n, _ in sig]}")
        fixed, keep = [], []
        stream = None
        for name, kind in sig:
            val = kwargs.get(name)
            if kind == _T:
                d = as_desc(val)
                keep.append((val, d))
                fixed.append(ctypes.byref(d) if d is not None else None)
            elif kind in (_SSO, _ATO):
                if val is None:
                    fixed.append(None)
                else:
                    want = SelectiveScanOptions if kind == _SSO else AttentionOptions
                    if not isinstance(val, want):
                        raise TypeError(f"{op}: options must be a {want.__name__}")
                    keep.append(val)
                    fixed.append(ctypes.byref(val))
            else:
                stream = val
                fixed.append(None)  # placeholder, filled per call
        return "exphil_" + op, self._fns["exphil_" + op], fixed, stream, keep

    def call(self, op, **kwargs):
        """Run one op now. Arguments by the header's names (omitted = NULL);
        stream=None is the library's own stream."""
        cname, fn, args, stream, keep = self._prepare(op, kwargs)
        args[-1] = _stream_value(stream)
        status = fn(*args)
        del keep
        self.check(status, cname)

    def bind(self, op, **kwargs):
        """A no-argument callable running the op with descriptors built once
        (cheap enough to time, and capturable in a CUDA graph). `stream` may be
        a callable (e.g. torch_current_stream), evaluated at every call."""
        cname, fn, args, stream, keep = self._prepare(op, kwargs)
        head = tuple(args[:-1])
        check = self.check

        def run():
            _ = keep
            status = fn(*head, _stream_value(stream))
            if status != EXPHIL_OK:
                check(status, cname)

        return run


def load(path=None):
    return Exphil(path)
