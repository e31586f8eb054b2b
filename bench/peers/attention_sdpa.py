#!/usr/bin/env python3
"""ExPhil.Native attention against PyTorch: an independent check and a benchmark.

What
----
1. ``--check``: calls ``exphil_attention_forward`` / ``exphil_attention_backward``
   from libexphil.so through ctypes on torch CUDA tensors and compares o, lse,
   grad_q, grad_k and grad_v with a float64 reference differentiated by torch
   autograd (explicit matmul + mask + softmax, ``repeat_interleave`` for
   grouped-query heads). It shares no code with the library or its C++ tests.
   Cases: every combination of dtype (f32, f32x3 = f32 with precision
   tf32x3, bf16, f16), mask (none, causal,
   window), GQA ratio Hq/Hkv (1, 2, 4), layout (BHTD, BTHD) and head width d
   (32, 64, 96, 128), each with a random B, Hkv, T, S (T != S mostly), window
   and sometimes an explicit scale, drawn fresh each run from a printed seed
   (``--seed`` repeats a run), plus a fixed list of edge cases (T = 1, S = 1,
   T > S under causal so that some query rows see no key, window 1, window
   larger than S). Each case also reruns the library and requires bitwise
   identical results (the header promises determinism).
2. ``--bench``: causal self-attention (T = S, Hq = Hkv, layout BHTD), f32 and
   bf16, forward and forward + backward, timed in one process for the library
   and for ``torch.nn.functional.scaled_dot_product_attention`` under each
   backend that ``torch.nn.attention.sdpa_kernel`` offers (flash, efficient,
   cudnn, math; "n/a" where a backend refuses the dtype or shape). Every
   benchmarked shape is first checked against the float64 reference (the
   "pass" column).

How to run (on a CUDA machine with torch; build the library first)
------------------------------------------------------------------
    cmake -S . -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release
    cmake --build build-gpu -j
    python3 bench/peers/attention_sdpa.py --check --bench

With neither --check nor --bench both run. Useful flags: --lib PATH (default
$EXPHIL_LIB, else build-gpu/c_src/libexphil.so under the repository root),
--seed N, --repeat K (random cases per combination), --dtypes, --tol-scale X,
--reps N, --min-ms X, --json PATH, --quiet. The exit status is 0 only if every
check passed (including the bench's "pass" column) and every library call
succeeded.

Timing
------
Each op is warmed up, then captured in a CUDA graph (torch.cuda.CUDAGraph)
``copies`` times back to back (20, or fewer when one eager call takes over
100 us, so that a graph holds about 2 ms of work or a single call); the graph
is replayed n times between two CUDA events, n chosen so that one
measurement lasts >= --min-ms, and the median over --reps measurements,
divided by n * copies, is reported. If the capture fails the op is timed
eagerly (events around a loop of n calls) and the figure is marked "*",
with the reason listed under the tables. Eager figures (which include Python, ctypes and
dispatcher overhead) are also taken for every op and printed in a second
table. The library runs on torch's current stream (a non-default side stream
for the whole run, because a NULL stream would mean the library's own stream,
which is not ordered with torch's legacy default stream). The library's
forward always writes lse (as a training forward must); torch's forward runs
under no_grad. torch's forward + backward is sdpa followed by
torch.autograd.grad with a preallocated grad_out; the library's is one forward
call (o, lse) and one backward call. TF32 is disabled for torch matmuls, so
torch's math backend in f32 is true f32, as the library's f32 path is (its
f32x3 rows run the library's f32 with precision tf32x3; torch's rows are
the same as for f32).

Tolerances: element-wise |ours - ref| <= tol_scale * (atol * max|ref| +
rtol * |ref|), max|ref| over the compared tensor's finite entries; the
(rtol, atol) pairs per dtype are in TOLERANCES below (f32 1e-4 to 2e-4, f16
5e-3 to 1e-2, bf16 1e-2 to 2e-2; lse tighter). Each case prints, per tensor,
max|err| / max|ref| and, in parentheses, the worst err / tol (<= 1 passes). Reference lse entries of -inf (query rows that see no key) must be -inf
exactly, and such rows must have o == 0 and grad_q == 0 exactly.

Dependencies: Python 3.8+, torch with CUDA, and the shared ctypes binding
bench/peers/exphil_ctypes.py (beside this file). Nothing else.
"""

import argparse
import itertools
import json
import math
import os
import random
import sys
import time
import warnings
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - only on machines without torch
    sys.exit("attention_sdpa.py needs torch with CUDA (pip install torch)")

REPO_ROOT = Path(__file__).resolve().parents[2]
# CMake puts the shared library at <build dir>/c_src/libexphil.so
# (add_library(exphil SHARED ...) in c_src/CMakeLists.txt); the GPU build
# directory is build-gpu (see bench/RESULTS.md).
DEFAULT_LIB = REPO_ROOT / "build-gpu" / "c_src" / "libexphil.so"

# ---------------------------------------------------------------------------
# The C ABI (include/exphil/exphil.h), through the shared binding
# bench/peers/exphil_ctypes.py
# ---------------------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parent))
import exphil_ctypes as xc  # noqa: E402
from exphil_ctypes import (  # noqa: E402,F401  (re-exported for other scripts)
    EXPHIL_MAX_RANK, EXPHIL_OK, AttentionOptions, ExphilError, ExphilTensor,
)
import peer_util as pu  # noqa: E402
from peer_util import measure  # noqa: E402

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# f32x3: f32 tensors with precision tf32x3 (the f32 products on tensor cores).
DTYPES = {"f32": torch.float32, "f32x3": torch.float32, "bf16": torch.bfloat16,
          "f16": torch.float16}
PRECISION_CODE = {"f32x3": 1}  # others 0, exact
MASK_CODE = {"none": 0, "causal": 1, "window": 2}
LAYOUT_CODE = {"BHTD": 0, "BTHD": 1}

describe_tensor = xc.torch_desc  # an exphil_tensor over a contiguous CUDA torch tensor
current_stream_handle = xc.torch_current_stream  # torch's current stream; never 0


class Exphil(xc.Exphil):
    """The shared binding plus the attention helpers this script uses."""

    def bind_forward(self, q, k, v, options, o, lse):
        """A no-argument callable running the forward on torch's current
        stream (read at call time, so it can be captured in a CUDA graph).
        lse may be None."""
        return self.bind("attention_forward", q=q, k=k, v=v, options=options, o=o, lse=lse,
                         stream=current_stream_handle)

    def bind_backward(self, q, k, v, o, lse, grad_o, options, grad_q, grad_k, grad_v):
        """Like bind_forward, for the backward; grad_* may be None."""
        return self.bind("attention_backward", q=q, k=k, v=v, o=o, lse=lse, grad_o=grad_o,
                         options=options, grad_q=grad_q, grad_k=grad_k, grad_v=grad_v,
                         stream=current_stream_handle)


def make_options(mask, window, layout, scale, dtype_name):
    return AttentionOptions(MASK_CODE[mask], int(window), LAYOUT_CODE[layout], float(scale),
                            PRECISION_CODE.get(dtype_name, 0))


# ---------------------------------------------------------------------------
# float64 reference (torch autograd)
# ---------------------------------------------------------------------------
def visibility(T, S, mask, window, device):
    """[T, S] bool: query i sees key j. Causal is aligned to the bottom right:
    query i is at position i + S - T."""
    i = torch.arange(T, device=device).unsqueeze(1) + (S - T)
    j = torch.arange(S, device=device).unsqueeze(0)
    if mask == "none":
        return torch.ones(T, S, dtype=torch.bool, device=device)
    vis = j <= i
    if mask == "window":
        vis = vis & (j > i - window)
    return vis


def _reference_block(q, k, v, grad_o, vis, scale, rep):
    """q, grad_o [b, rep*h, T, d]; k, v [b, h, S, d] (BHTD, any float dtype).
    Returns float64 o, lse, grad_q, grad_k, grad_v."""
    with torch.enable_grad():
        q64 = q.detach().to(torch.float64, copy=True).requires_grad_(True)
        k64 = k.detach().to(torch.float64, copy=True).requires_grad_(True)
        v64 = v.detach().to(torch.float64, copy=True).requires_grad_(True)
        kr = k64.repeat_interleave(rep, dim=1)  # query head h uses kv head h // rep
        vr = v64.repeat_interleave(rep, dim=1)
        s = torch.matmul(q64, kr.transpose(-1, -2)) * scale
        s = s.masked_fill(~vis, float("-inf"))
        m = s.detach().amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows with no key
        e = torch.exp(s - m)  # exactly 0 where masked; no NaN anywhere
        z = e.sum(dim=-1, keepdim=True)
        p = e / torch.where(z > 0, z, torch.ones_like(z))  # empty rows: p = 0, o = 0
        o = torch.matmul(p, vr)
        gq, gk, gv = torch.autograd.grad(o, (q64, k64, v64), grad_o.detach().to(torch.float64))
    with torch.no_grad():
        lse = (m + torch.log(z.detach())).squeeze(-1)  # log(0) = -inf for empty rows
    return o.detach(), lse, gq, gk, gv


def to_bhtd(t, layout):
    return t.transpose(1, 2) if layout == "BTHD" else t


def reference(q, k, v, grad_o, layout, mask, window, scale, max_elems=1 << 25):
    """The float64 reference in BHTD, in blocks of (batch, kv heads) so that
    no score matrix exceeds max_elems elements."""
    q, k, v, grad_o = (to_bhtd(t, layout) for t in (q, k, v, grad_o))
    B, Hq, T, d = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    vis = visibility(T, S, mask, window, q.device)
    dev, f64 = q.device, torch.float64
    out = {
        "o": torch.empty(B, Hq, T, d, dtype=f64, device=dev),
        "lse": torch.empty(B, Hq, T, dtype=f64, device=dev),
        "grad_q": torch.empty(B, Hq, T, d, dtype=f64, device=dev),
        "grad_k": torch.empty(B, Hkv, S, d, dtype=f64, device=dev),
        "grad_v": torch.empty(B, Hkv, S, d, dtype=f64, device=dev),
    }
    per_kv_head = rep * T * S
    hc = max(1, min(Hkv, max_elems // per_kv_head))
    bc = max(1, min(B, max_elems // (per_kv_head * hc)))
    for b0 in range(0, B, bc):
        bs = slice(b0, b0 + bc)
        for h0 in range(0, Hkv, hc):
            ks = slice(h0, h0 + hc)
            qs = slice(h0 * rep, (h0 + hc) * rep)
            o, lse, gq, gk, gv = _reference_block(q[bs, qs], k[bs, ks], v[bs, ks], grad_o[bs, qs],
                                                  vis, scale, rep)
            out["o"][bs, qs] = o
            out["lse"][bs, qs] = lse
            out["grad_q"][bs, qs] = gq
            out["grad_k"][bs, ks] = gk
            out["grad_v"][bs, ks] = gv
    out["empty_rows"] = ~vis.any(dim=1)  # [T]
    return out


# ---------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------
# (rtol, atol relative to max|ref|) per dtype and tensor kind.
# Rounding o to bf16 alone costs up to 2^-9 of |o|; FlashAttention-style
# kernels (probabilities and dS rounded to the input dtype, D = rowsum(dO * O)
# from the rounded O) typically land at a few 1e-3 of max|ref| in bf16, about
# 8x less in f16. lse is f32 arithmetic on exactly representable products for
# every dtype. --tol-scale loosens or tightens everything at once.
TOLERANCES = {
    "f32": {"o": (1e-4, 1e-4), "lse": (1e-5, 1e-5), "grad": (2e-4, 2e-4)},
    # three TF32 products per f32 product: about 2^-21 of each, within f32's
    "f32x3": {"o": (1e-4, 1e-4), "lse": (1e-5, 1e-5), "grad": (2e-4, 2e-4)},
    "f16": {"o": (5e-3, 5e-3), "lse": (1e-3, 1e-3), "grad": (1e-2, 1e-2)},
    "bf16": {"o": (1e-2, 1e-2), "lse": (2e-3, 2e-3), "grad": (2e-2, 2e-2)},
}


def compare(ours, ref, rtol, atol_rel, tol_scale, mag_floor=0.0):
    """|ours - ref| <= tol_scale * (atol_rel * mag + rtol * |ref|), as
    peer_util.compare (mag = max(max|ref|, mag_floor); the reference's -inf
    lse must be matched exactly). mag_floor gives a gradient that cancels to
    exactly zero (every row sees one key: dS = P (dP - D) = 0) the scale of
    its terms, which is what its rounding error is relative to."""
    return pu.compare(ours, ref, tol_scale * rtol, tol_scale * atol_rel, mag_floor)


def fill_nan(shape, dtype, device):
    """Outputs start as NaN so that an element the library does not write fails."""
    return torch.full(shape, math.nan, dtype=dtype, device=device)


def run_ours(lib, q, k, v, grad_o, opts, backward=True):
    """Forward (o, lse) and backward (grad_q, grad_k, grad_v), NaN-prefilled."""
    dev = q.device
    layout_bthd = opts.layout == LAYOUT_CODE["BTHD"]
    B = q.shape[0]
    Hq, T = (q.shape[2], q.shape[1]) if layout_bthd else (q.shape[1], q.shape[2])
    o = fill_nan(q.shape, q.dtype, dev)
    lse = fill_nan((B, Hq, T), torch.float32, dev)
    lib.bind_forward(q, k, v, opts, o, lse)()
    res = {"o": o, "lse": lse}
    if backward:
        gq = fill_nan(q.shape, q.dtype, dev)
        gk = fill_nan(k.shape, k.dtype, dev)
        gv = fill_nan(v.shape, v.dtype, dev)
        lib.bind_backward(q, k, v, o, lse, grad_o, opts, gq, gk, gv)()
        res.update(grad_q=gq, grad_k=gk, grad_v=gv)
    return res


def check_tensors(lib, q, k, v, grad_o, dtype_name, mask, window, layout, scale, tol_scale,
                  determinism=True):
    """Runs the library on the given inputs and compares with the reference.
    Returns a result dict (ok, error, metrics per tensor)."""
    d = q.shape[-1]
    ref_scale = scale if scale != 0.0 else 1.0 / math.sqrt(d)
    opts = make_options(mask, window, layout, scale, dtype_name)
    result = {"ok": False, "error": None, "metrics": {}, "checks": {}}
    try:
        ours = run_ours(lib, q, k, v, grad_o, opts)
        torch.cuda.current_stream().synchronize()
    except ExphilError as e:
        result["error"] = str(e)
        return result
    ref = reference(q, k, v, grad_o, layout, mask, window, ref_scale)
    tol = TOLERANCES[dtype_name]
    # The size of a gradient's terms: |scale| max|dO| max|V| max(|Q|, |K|).
    amax = lambda t: float(t.detach().abs().max().item()) if t.numel() else 0.0
    grad_terms = abs(ref_scale) * amax(grad_o) * amax(v) * max(amax(q), amax(k))
    ok = True
    for name in ("o", "lse", "grad_q", "grad_k", "grad_v"):
        kind = "o" if name == "o" else ("lse" if name == "lse" else "grad")
        mine = ours[name] if name == "lse" else to_bhtd(ours[name], layout)
        m = compare(mine, ref[name], tol[kind][0], tol[kind][1], tol_scale,
                    grad_terms if kind == "grad" else 0.0)
        result["metrics"][name] = m
        ok &= m["ok"]
    # Rows that see no key: o and grad_q exactly zero (lse -inf is in compare).
    empty = ref["empty_rows"]
    n_empty = int(empty.sum().item())
    if n_empty:
        o_e = to_bhtd(ours["o"], layout)[:, :, empty]
        gq_e = to_bhtd(ours["grad_q"], layout)[:, :, empty]
        zero_ok = bool((o_e == 0).all().item()) and bool((gq_e == 0).all().item())
        result["checks"]["empty_rows_zero"] = zero_ok
        ok &= zero_ok
    result["empty_rows"] = n_empty
    if determinism:
        try:
            again = run_ours(lib, q, k, v, grad_o, opts)
            torch.cuda.current_stream().synchronize()
            det = all(torch.equal(ours[n], again[n]) for n in ours)
        except ExphilError as e:
            result["error"] = "rerun: " + str(e)
            det = False
        result["checks"]["bitwise_deterministic"] = det
        ok &= det
    result["ok"] = bool(ok)
    return result


# ---------------------------------------------------------------------------
# Correctness cases
# ---------------------------------------------------------------------------
HEAD_WIDTHS = (32, 64, 96, 128)
GQA_RATIOS = (1, 2, 4)
MASKS = ("none", "causal", "window")
LAYOUTS = ("BHTD", "BTHD")


def _draw_len(rng):
    bucket = rng.random()
    if bucket < 0.25:
        return rng.randint(1, 16)
    if bucket < 0.75:
        return rng.randint(17, 160)
    return rng.randint(161, 400)


def random_cases(rng, dtypes, repeat):
    cases = []
    for _ in range(repeat):
        for dt, mask, ratio, layout, d in itertools.product(dtypes, MASKS, GQA_RATIOS, LAYOUTS,
                                                           HEAD_WIDTHS):
            T = _draw_len(rng)
            S = T if rng.random() < 0.2 else _draw_len(rng)
            window = rng.randint(1, S + 8) if mask == "window" else 0
            scale = 0.0 if rng.random() < 0.75 else round(rng.uniform(0.02, 0.4), 4)
            cases.append(dict(dtype=dt, B=rng.randint(1, 3), Hkv=rng.randint(1, 3), ratio=ratio,
                              T=T, S=S, d=d, mask=mask, window=window, layout=layout,
                              scale=scale, kind="random"))
    return cases


def edge_cases(dtypes):
    base = [
        # B, Hkv, ratio, T, S, d, mask, window, scale
        (1, 1, 1, 1, 1, 32, "none", 0, 0.0),
        (1, 1, 1, 1, 1, 128, "causal", 0, 0.0),
        (1, 2, 4, 1, 517, 128, "causal", 0, 0.0),      # decode step
        (2, 4, 1, 77, 20, 64, "causal", 0, 0.0),       # T > S: 57 rows see no key
        (1, 1, 2, 40, 7, 96, "window", 3, 0.0),        # T > S with a window
        (1, 1, 2, 65, 65, 96, "window", 1, 0.0),       # each query sees one key
        (1, 1, 4, 33, 40, 64, "window", 100, 0.0),     # window wider than S
        (3, 3, 2, 128, 128, 128, "causal", 0, 0.0),    # tile multiples
        (1, 2, 1, 64, 192, 64, "none", 0, -0.125),     # negative explicit scale
        (2, 1, 1, 257, 255, 32, "causal", 0, 0.0),
    ]
    cases = []
    for n, (dt, row) in enumerate(itertools.product(dtypes, base)):
        B, Hkv, ratio, T, S, d, mask, window, scale = row
        cases.append(dict(dtype=dt, B=B, Hkv=Hkv, ratio=ratio, T=T, S=S, d=d, mask=mask,
                          window=window, layout=LAYOUTS[n % 2], scale=scale, kind="edge"))
    return cases


def case_label(c):
    m = c["mask"] + (f"(W={c['window']})" if c["mask"] == "window" else "")
    s = f" scale={c['scale']}" if c["scale"] else ""
    return (f"{c['dtype']:<4} {c['layout']} B{c['B']} Hq{c['Hkv'] * c['ratio']} Hkv{c['Hkv']} "
            f"T{c['T']} S{c['S']} d{c['d']} {m}{s}")


def make_inputs(B, Hq, Hkv, T, S, d, layout, dtype, device, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    if layout == "BHTD":
        return rnd(B, Hq, T, d), rnd(B, Hkv, S, d), rnd(B, Hkv, S, d), rnd(B, Hq, T, d)
    return rnd(B, T, Hq, d), rnd(B, S, Hkv, d), rnd(B, S, Hkv, d), rnd(B, T, Hq, d)


def fmt_metric(m):
    return f"{m['rel_err']:.1e}({m['worst']:.2f})"


def run_check(lib, args, seed, device):
    dtypes = args.dtypes
    rng = random.Random(seed)
    cases = edge_cases(dtypes) + random_cases(rng, dtypes, args.repeat)
    print(f"## Correctness: {len(cases)} cases, seed {seed}")
    print("Per tensor: max|err|/max|ref| (max err/tol; <= 1 passes). "
          "Tolerances (rtol, atol/max|ref|): " + json.dumps(TOLERANCES)
          + (f" x {args.tol_scale}" if args.tol_scale != 1.0 else ""))
    results, failures = [], 0
    gen = torch.Generator(device=device)
    t0 = time.time()
    for idx, c in enumerate(cases):
        gen.manual_seed((seed * 1000003 + idx) % (1 << 63))
        Hq = c["Hkv"] * c["ratio"]
        q, k, v, go = make_inputs(c["B"], Hq, c["Hkv"], c["T"], c["S"], c["d"], c["layout"],
                                  DTYPES[c["dtype"]], device, gen)
        try:
            r = check_tensors(lib, q, k, v, go, c["dtype"], c["mask"], c["window"], c["layout"],
                              c["scale"], args.tol_scale)
        except Exception:
            # A CUDA fault (e.g. an illegal address) poisons the context: say which case.
            print(f"CRASH {case_label(c)} (rerun with --seed {seed})", flush=True)
            raise
        r["case"] = c
        results.append(r)
        if not r["ok"]:
            failures += 1
        if r["ok"] and args.quiet:
            continue
        status = "PASS" if r["ok"] else "FAIL"
        line = f"{status} {case_label(c)}"
        if r["error"]:
            line += f"  ERROR {r['error']}"
        if r["metrics"]:
            line += "  " + " ".join(f"{n}={fmt_metric(m)}" for n, m in r["metrics"].items())
        for name, good in r["checks"].items():
            if not good:
                line += f"  {name}=FAILED"
        if not r["ok"]:
            for n, m in r["metrics"].items():
                if not m["ok"]:
                    line += (f"\n      {n}: {m['bad']}/{m['numel']} out of tolerance, "
                             f"max|err| {m['max_abs_err']:.3e}, max|ref| {m['max_ref']:.3e}, "
                             f"non-finite mismatches {m['nonfinite_mismatch']}")
        print(line, flush=True)
        del q, k, v, go
    print(f"{len(cases) - failures}/{len(cases)} passed in {time.time() - t0:.1f} s"
          + (f"; rerun with --seed {seed}" if failures else ""))
    print()
    return results, failures


# ---------------------------------------------------------------------------
# Benchmark
# ---------------------------------------------------------------------------
BENCH_SHAPES = [  # (B, H, T, d), T = S, Hq = Hkv, causal
    (1, 8, 32, 32),
    (1, 4, 64, 64),
    (32, 8, 256, 64),
    (8, 8, 1024, 64),
    (2, 8, 4096, 128),
]


def torch_backends():
    """[(name, backend or None)]: every SDPA backend of this torch build."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    except ImportError:
        return [("default", None)]
    out = []
    for name, attr in (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
                       ("cudnn", "CUDNN_ATTENTION"), ("math", "MATH")):
        if hasattr(SDPBackend, attr):
            out.append((name, getattr(SDPBackend, attr)))
    return out


def _backend_ctx(backend):
    if backend is None:
        import contextlib
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel([backend])


def torch_fwd_fn(backend, q, k, v):
    def fn():
        with _backend_ctx(backend), torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return fn


def torch_fwd_bwd_fn(backend, q, k, v, grad_o):
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def fn():
        with _backend_ctx(backend):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
            return torch.autograd.grad(out, (qg, kg, vg), grad_o)
    return fn


def run_bench(lib, args, seed, device):
    backends = torch_backends()
    rows = []
    failures = 0
    gen = torch.Generator(device=device)
    gen.manual_seed(seed ^ 0x5DEECE66D)
    print("## Benchmark: causal, T = S, Hq = Hkv, layout BHTD; median us per call")
    for (B, H, T, d), dt in itertools.product(BENCH_SHAPES, args.bench_dtypes):
        dtype = DTYPES[dt]
        shape = f"B{B} h{H} T{T} d{d}"
        q, k, v, go = make_inputs(B, H, H, T, T, d, "BHTD", dtype, device, gen)
        chk = check_tensors(lib, q, k, v, go, dt, "causal", 0, "BHTD", 0.0, args.tol_scale,
                            determinism=False)
        fwd_ok = chk["error"] is None and all(chk["metrics"][n]["ok"] for n in ("o", "lse"))
        all_ok = chk["ok"]
        if not all_ok:
            failures += 1
        detail = chk["error"] or " ".join(f"{n}={fmt_metric(m)}" for n, m in chk["metrics"].items())
        print(f"{'PASS' if all_ok else 'FAIL'} {shape} {dt}: {detail}", flush=True)
        check_summary = {"ok": chk["ok"], "error": chk["error"], "metrics": chk["metrics"]}
        del chk

        opts = make_options("causal", 0, "BHTD", 0.0, dt)
        o = torch.empty_like(q)
        lse = torch.empty(B, H, T, dtype=torch.float32, device=device)
        gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ours_f = lib.bind_forward(q, k, v, opts, o, lse)
        ours_b = lib.bind_backward(q, k, v, o, lse, go, opts, gq, gk, gv)

        def ours_fb():
            ours_f()
            ours_b()

        for mode, ours_fn in (("fwd", ours_f), ("fwd+bwd", ours_fb)):
            row = {"shape": shape, "B": B, "H": H, "T": T, "d": d, "dtype": dt, "mode": mode,
                   "pass": fwd_ok if mode == "fwd" else all_ok, "check": check_summary,
                   "ours": None, "torch": {}}
            try:
                row["ours"] = measure(ours_fn, args.reps, args.min_ms)
            except ExphilError as e:
                row["ours"] = {"error": str(e)}
                row["pass"] = False
                failures += 1
                print(f"FAIL {shape} {dt} {mode}: {e}", flush=True)
            for name, backend in backends:
                fn = (torch_fwd_fn(backend, q, k, v) if mode == "fwd"
                      else torch_fwd_bwd_fn(backend, q, k, v, go))
                try:
                    fn()  # probe: raises if this backend refuses the dtype or shape
                    torch.cuda.synchronize()
                except Exception as e:
                    row["torch"][name] = {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}
                    torch.cuda.empty_cache()
                    continue
                try:
                    row["torch"][name] = measure(fn, args.reps, args.min_ms)
                except Exception as e:
                    row["torch"][name] = {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}
                del fn
                torch.cuda.empty_cache()
            rows.append(row)
            print(f"  timed {shape} {dt} {mode}: ours {_fmt_us(row['ours'])}, "
                  + ", ".join(f"{n} {_fmt_us(r)}" for n, r in row["torch"].items()), flush=True)
        del q, k, v, go, o, lse, gq, gk, gv, ours_f, ours_b, ours_fb
        torch.cuda.empty_cache()
    print()
    print_tables(rows, [n for n, _ in backends])
    return rows, failures


def _fmt_us(r, key="us"):
    """A timing cell: "n/a" where the op refused to run (or was not timed)."""
    if r is None or "error" in r or r.get(key) is None:
        return "n/a"
    s = f"{r[key]:.1f}"
    if key == "us" and r.get("method") == "eager":
        s += "*"
    return s


def _best_torch(row, key):
    best = None
    for name, r in row["torch"].items():
        if "error" in r or r.get(key) is None:
            continue
        if best is None or r[key] < best[1]:
            best = (name, r[key])
    return best


def print_tables(rows, backend_names):
    for key, title in (("us", "Graph replay (device time per call; * = capture failed, eager)"),
                       ("eager_us", "Eager (events around a loop of Python calls)")):
        print(f"### {title}")
        print()
        head = ["shape", "dtype", "mode", "pass", "ours (us)"] + [f"{n} (us)" for n in backend_names]
        head.append("best torch / ours")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            cells = [row["shape"], row["dtype"], row["mode"], "PASS" if row["pass"] else "FAIL",
                     _fmt_us(row["ours"], key)]
            cells += [_fmt_us(row["torch"].get(n), key) for n in backend_names]
            best = _best_torch(row, key)
            ours = row["ours"]
            if best and ours and "error" not in ours and ours.get(key):
                cells.append(f"{best[1] / ours[key]:.2f}x ({best[0]})")
            else:
                cells.append("n/a")
            print("| " + " | ".join(cells) + " |")
        print()
    print("best torch / ours > 1 means the library is faster than torch's fastest backend.")
    notes = []
    for row in rows:
        for name, r in [("ours", row["ours"])] + list(row["torch"].items()):
            if r and r.get("graph_error"):
                notes.append(f"- {row['shape']} {row['dtype']} {row['mode']} {name}: "
                             f"graph capture failed ({r['graph_error']})")
    if notes:
        print("Graph capture failures (timed eagerly instead):")
        print("\n".join(notes))
    print()


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=os.environ.get("EXPHIL_LIB", str(DEFAULT_LIB)),
                   help="path to libexphil.so (default: $EXPHIL_LIB or %(default)s)")
    p.add_argument("--check", action="store_true", help="run the correctness check")
    p.add_argument("--bench", action="store_true", help="run the benchmark")
    p.add_argument("--seed", type=int, default=None, help="seed of the random cases (default: from time)")
    p.add_argument("--repeat", type=int, default=1,
                   help="random cases per (dtype, mask, ratio, layout, d) combination (default 1)")
    p.add_argument("--dtypes", default="f32,f32x3,bf16,f16",
                   help="dtypes of the check; f32x3 is f32 with precision tf32x3 "
                        "(default %(default)s)")
    p.add_argument("--bench-dtypes", default="f32,f32x3,bf16",
                   help="dtypes of the bench (default %(default)s)")
    p.add_argument("--tol-scale", type=float, default=1.0, help="multiply every tolerance (default 1)")
    p.add_argument("--reps", type=int, default=20, help="timed measurements per op; median (default 20)")
    p.add_argument("--min-ms", type=float, default=1.0, help="minimum length of one measurement in ms (default 1)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--json", default=None, help="write all results to this JSON file")
    p.add_argument("-q", "--quiet", action="store_true", help="print only failing check cases")
    args = p.parse_args(argv)
    if not args.check and not args.bench:
        args.check = args.bench = True
    for attr in ("dtypes", "bench_dtypes"):
        names = [s.strip() for s in getattr(args, attr).split(",") if s.strip()]
        bad = [s for s in names if s not in DTYPES]
        if bad or not names:
            p.error(f"--{attr.replace('_', '-')}: unknown dtype(s) {bad}; use f32, f32x3, bf16, f16")
        setattr(args, attr, names)
    if args.repeat < 1 or args.reps < 1 or args.min_ms <= 0 or args.tol_scale <= 0:
        p.error("--repeat, --reps, --min-ms and --tol-scale must be positive")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch")
    seed = args.seed if args.seed is not None else time.time_ns() % (1 << 31)
    torch.cuda.set_device(args.device)
    device = torch.device("cuda", args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        lib = Exphil(args.lib)
    except (OSError, ExphilError) as e:
        sys.exit(f"cannot use {args.lib}: {e}")

    props = torch.cuda.get_device_properties(device)
    env = {
        "library": args.lib, "library_version": lib.version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "device": props.name, "capability": f"sm_{props.major}{props.minor}",
        "sms": props.multi_processor_count, "seed": seed, "argv": sys.argv,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    print("# ExPhil.Native attention vs PyTorch SDPA")
    print(f"library {env['library']} (version {env['library_version']}); torch {env['torch']} "
          f"(CUDA {env['torch_cuda']}, cuDNN {env['cudnn']}); {env['device']} {env['capability']}, "
          f"{env['sms']} SMs; seed {seed}")
    print()

    out = {"env": env}
    failures = 0
    # Everything runs on one non-default stream: the library gets its handle.
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.check:
            res, f = run_check(lib, args, seed, device)
            out["check"] = [{"case": r["case"], "ok": r["ok"], "error": r["error"],
                             "metrics": r["metrics"], "checks": r["checks"],
                             "empty_rows": r.get("empty_rows", 0)} for r in res]
            failures += f
        if args.bench:
            rows, f = run_bench(lib, args, seed, device)
            out["bench"] = rows
            failures += f
    torch.cuda.synchronize()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(_jsonable(out), fh, indent=1)
        print(f"results written to {args.json}")
    print("FAILED: %d" % failures if failures else "ALL PASSED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
