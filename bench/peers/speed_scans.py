#!/usr/bin/env python3
"""Speed of the ExPhil.Native scans side by side with what JAX and PyTorch users
write instead.

Per op (linear_scan, min_gru, min_lstm, liquid, selective_scan), shape,
dtype (f32, bf16) and mode (fwd, fwd+bwd), one table row with:

  lib graph      the library through ctypes on torch tensors, on torch's
                 current (side) stream, captured in a CUDA graph and
                 replayed (device time per call; as attention_sdpa.py)
  lib eager      the same ctypes calls from Python, timed between CUDA events
  lax.scan       jax_reference.scan_ref / selective_scan_ref, jitted
  assoc          jax_reference.scan_assoc / selective_scan_assoc, jitted
                 (lax.associative_scan over the (a, b) pairs)
  torch loop     a PyTorch loop over time (coefficients computed vectorised
                 in f32, one addcmul per step, torch.stack), eager
  loop graph     the same loop captured in a CUDA graph and replayed
  cuDNN          torch.nn.GRU / torch.nn.LSTM (input = hidden = H,
                 batch_first) for the min_gru / min_lstm rows: what users pick
                 instead (it does more work: the input and recurrent matmuls)

JAX figures are wall clock: n back-to-back calls of the jitted function,
block_until_ready on the last, median over --reps measurements (dispatch
included where it dominates). fwd+bwd: the library's forward then backward
(all input gradients, grad_y given); JAX: jax.vjp of the forward inside one
jit; torch: torch.autograd.grad of the loop's output (and, for cuDNN, of
every parameter too). The library's forward writes y (no h_final); h0 is
absent everywhere. selective_scan runs with dt_bias, D, z and softplus (the
Mamba block's configuration), no clamp.

Shapes: inference B1 T32 H256 and training B32 T256 H256 (selective scan:
B1 T32 D512 N16 and B32 T256 D512 N16). Each benchmarked configuration is
first checked against lax.scan in f32 (the "pass" column: y and every
gradient, tolerance 1e-4 relative to max|ref| in f32, 2e-2 in bf16).

Then a latency sweep: min_gru forward, B1 H256, T in {1, 4, 16, 32, 64,
128, 256, 1024, 4096}, for the library (graph), lax.scan, associative_scan,
the torch loop (graph) and cuDNN GRU (graph, or eager where capture fails),
written to --json and plotted (log-log, us vs T) to --plot.

TF32 is off for torch and JAX matmuls (precision "highest"), so f32 means
f32 everywhere.

Run (GPU machine with torch + jax; library built):
    python3 bench/peers/speed_scans.py [--lib PATH] [--ops min_gru,...]
        [--dtypes f32,bf16] [--modes fwd,fwd+bwd] [--no-sweep] [--json PATH]
        [--plot PATH] [--reps N] [--min-ms X] [--quick]
Exit status nonzero if a check failed or a section raised.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import exphil_ctypes as xc  # noqa: E402
import jax_reference as ref  # noqa: E402
import peer_util as pu  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

SCAN_OPS = ("linear_scan", "min_gru", "min_lstm", "liquid")
ALL_OPS = SCAN_OPS + ("selective_scan",)
TDT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
JDT = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
CHECK_TOL = {"f32": (1e-4, 1e-4), "bf16": (2e-2, 2e-2), "f16": (5e-3, 5e-3)}
SCAN_SHAPES = [("inference", 1, 32, 256), ("training", 32, 256, 256)]
SS_SHAPES = [("inference", 1, 32, 512, 16), ("training", 32, 256, 512, 16)]
SWEEP_T = (1, 4, 16, 32, 64, 128, 256, 1024, 4096)
COLUMNS = ("lib graph", "lib eager", "lax.scan", "assoc", "torch loop", "loop graph", "cuDNN")


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------
def scan_inputs(op, shape, dtype, gen, dev):
    def nrm(s=1.0):
        return (s * torch.randn(*shape, generator=gen, device=dev)).to(dtype)

    def uni(lo, hi):
        return (lo + (hi - lo) * torch.rand(*shape, generator=gen, device=dev)).to(dtype)

    if op == "linear_scan":
        return [uni(-1.0, 1.0), nrm()]
    if op == "min_gru":
        return [nrm(2.0), nrm()]
    if op == "min_lstm":
        return [nrm(2.0), nrm(2.0), nrm()]
    if op == "liquid":
        return [uni(0.5, 4.0), nrm()]
    raise ValueError(op)


SS_NAMES = ("x", "dt", "A", "B", "C", "dt_bias", "D", "z")


def ss_inputs(shape, dtype, gen, dev):
    Bsz, T, D, N = shape
    r = lambda *s: torch.randn(*s, generator=gen, device=dev)
    return {
        "x": r(Bsz, T, D).to(dtype), "dt": (r(Bsz, T, D) - 1.5).to(dtype),
        "A": -(0.2 + 2.8 * torch.rand(D, N, generator=gen, device=dev)),
        "B": r(Bsz, T, N).to(dtype), "C": r(Bsz, T, N).to(dtype),
        "dt_bias": 0.3 * r(D), "D": r(D), "z": r(Bsz, T, D).to(dtype),
    }


def to_jax(t):
    """A torch tensor -> a JAX array of the same dtype (through host f32; exact
    for f32/bf16/f16)."""
    name = str(t.dtype).replace("torch.", "")
    return jnp.asarray(t.detach().float().cpu().numpy()).astype(
        {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[name])


# ---------------------------------------------------------------------------
# PyTorch loops over time (state in f32, outputs in the input dtype)
# ---------------------------------------------------------------------------
def torch_coeffs(op, xs):
    xs = [x.float() for x in xs]
    if op == "linear_scan":
        return xs[0], xs[1]
    if op == "min_gru":
        z = torch.sigmoid(xs[0])
        return 1.0 - z, z * xs[1]
    if op == "min_lstm":
        f, i = torch.sigmoid(xs[0]), torch.sigmoid(xs[1])
        s = f + i + 1e-6
        return f / s, (i / s) * xs[2]
    if op == "liquid":
        e = torch.exp(-1.0 / xs[0])
        return e, (1.0 - e) * xs[1]
    raise ValueError(op)


def torch_loop(op, xs):
    a, b = torch_coeffs(op, xs)
    B, T, H = a.shape
    h = torch.zeros(B, H, device=a.device, dtype=torch.float32)
    ys = []
    for t in range(T):
        h = torch.addcmul(b[:, t], a[:, t], h)
        ys.append(h)
    return torch.stack(ys, 1).to(xs[0].dtype)


def torch_selective_loop(d):
    f = {k: v.float() for k, v in d.items()}
    delta = F.softplus(f["dt"] + f["dt_bias"])                       # [B, T, D]
    dA = torch.exp(delta.unsqueeze(-1) * f["A"])                      # [B, T, D, N]
    dBx = (delta * f["x"]).unsqueeze(-1) * f["B"].unsqueeze(2)        # [B, T, D, N]
    Bsz, T, D, N = dA.shape
    h = torch.zeros(Bsz, D, N, device=dA.device, dtype=torch.float32)
    ys = []
    for t in range(T):
        h = torch.addcmul(dBx[:, t], dA[:, t], h)
        ys.append((h * f["C"][:, t].unsqueeze(1)).sum(-1))
    y = torch.stack(ys, 1) + f["D"] * f["x"]
    y = y * F.silu(f["z"])
    return y.to(d["x"].dtype)


# ---------------------------------------------------------------------------
# one benchmark row
# ---------------------------------------------------------------------------
def time_torch(fn, args):
    """measure() of a torch callable, or an error dict if it refuses."""
    try:
        fn()
        torch.cuda.synchronize()
    except Exception as e:
        torch.cuda.empty_cache()
        return {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}
    try:
        return pu.measure(fn, args.reps, args.min_ms)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}


def time_jax_safe(fn, jargs, args):
    try:
        return pu.time_jax(fn, jargs, reps=args.reps, min_ms=args.min_ms)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e).strip()[:200]}"}


def lib_scan_fns(lib, op, xs, y, gy, grads):
    names = xc.SCAN_INPUTS[op]
    fwd = lib.bind(op + "_forward", **dict(zip(names, xs)), y=y, stream=xc.torch_current_stream)
    bwd = lib.bind(op + "_backward", **dict(zip(names, xs)), y=y, grad_y=gy,
                   **{"grad_" + n: g for n, g in zip(names, grads)},
                   stream=xc.torch_current_stream)
    return fwd, bwd


def lib_ss_fns(lib, d, y, gy, grads, opts):
    fwd = lib.bind("selective_scan_forward", **d, options=opts, y=y,
                   stream=xc.torch_current_stream)
    bwd = lib.bind("selective_scan_backward", **d, options=opts, grad_y=gy,
                   **{"grad_" + n: grads[n] for n in SS_NAMES}, stream=xc.torch_current_stream)
    return fwd, bwd


def check_row(ours, refs, dt):
    rtol, atol = CHECK_TOL[dt]
    ms = {n: pu.compare(ours[n], refs[n], rtol, atol) for n in refs}
    return all(m["ok"] for m in ms.values()), ms


def bench_scan(lib, args, op, shape_name, B, T, H, dt, gen, dev):
    dtype = TDT[dt]
    xs = scan_inputs(op, (B, T, H), dtype, gen, dev)
    gy = torch.randn(B, T, H, generator=gen, device=dev).to(dtype)
    y = torch.empty(B, T, H, device=dev, dtype=dtype)
    grads = [torch.empty_like(x) for x in xs]
    fwd, bwd = lib_scan_fns(lib, op, xs, y, gy, grads)

    # check against lax.scan (f32 arithmetic on the same rounded inputs)
    fwd()
    bwd()
    torch.cuda.current_stream().synchronize()
    jxs = [to_jax(x) for x in xs]
    jgy = to_jax(gy)
    x32 = [x.astype(jnp.float32) for x in jxs]
    ry, pull = jax.vjp(lambda *a: ref.scan_ref(op, a)[0], *x32)
    rg = pull(jgy.astype(jnp.float32))
    names = xc.SCAN_INPUTS[op]
    ours = {"y": y, **{"grad_" + n: g for n, g in zip(names, grads)}}
    refs = {"y": ry, **{"grad_" + n: g for n, g in zip(names, rg)}}
    ok, metrics = check_row(ours, refs, dt)

    jf = jax.jit(lambda *a: ref.scan_ref(op, a)[0])
    ja = jax.jit(lambda *a: ref.scan_assoc(op, a)[0])
    jfb = jax.jit(lambda xs_, g: jax.vjp(lambda *a: ref.scan_ref(op, a)[0], *xs_)[1](g))
    jab = jax.jit(lambda xs_, g: jax.vjp(lambda *a: ref.scan_assoc(op, a)[0], *xs_)[1](g))

    xg = [x.detach().clone().requires_grad_(True) for x in xs]

    def loop_f():
        with torch.no_grad():
            return torch_loop(op, xs)

    def loop_fb():
        out = torch_loop(op, xg)
        return torch.autograd.grad(out, xg, gy)

    rnn = None
    if op in ("min_gru", "min_lstm") and not args.no_cudnn:
        cls = torch.nn.GRU if op == "min_gru" else torch.nn.LSTM
        rnn = cls(H, H, batch_first=True).to(device=dev, dtype=dtype)
        rnn.flatten_parameters()
        rx = xs[0].detach().clone()
        rxg = rx.clone().requires_grad_(True)
        params = list(rnn.parameters())

        def rnn_f():
            with torch.no_grad():
                return rnn(rx)[0]

        def rnn_fb():
            out = rnn(rxg)[0]
            return torch.autograd.grad(out, [rxg] + params, gy)

    rows = []
    for mode in args.modes:
        row = {"op": op, "shape": f"B{B} T{T} H{H}", "shape_name": shape_name, "dtype": dt,
               "mode": mode, "pass": ok, "check": metrics, "t": {}}
        if mode == "fwd":
            row["t"]["lib"] = time_torch(fwd, args)
            row["t"]["lax.scan"] = time_jax_safe(jf, jxs, args)
            row["t"]["assoc"] = time_jax_safe(ja, jxs, args)
            row["t"]["torch loop"] = time_torch(loop_f, args)
            if rnn is not None:
                row["t"]["cuDNN"] = time_torch(rnn_f, args)
        else:
            def lib_fb():
                fwd()
                bwd()
            row["t"]["lib"] = time_torch(lib_fb, args)
            row["t"]["lax.scan"] = time_jax_safe(jfb, (jxs, jgy), args)
            row["t"]["assoc"] = time_jax_safe(jab, (jxs, jgy), args)
            row["t"]["torch loop"] = time_torch(loop_fb, args)
            if rnn is not None:
                row["t"]["cuDNN"] = time_torch(rnn_fb, args)
        rows.append(row)
        print_row_progress(row)
    del xs, gy, y, grads, xg, rnn
    torch.cuda.empty_cache()
    return rows


def bench_ss(lib, args, shape_name, Bsz, T, D, N, dt, gen, dev):
    dtype = TDT[dt]
    d = ss_inputs((Bsz, T, D, N), dtype, gen, dev)
    gy = torch.randn(Bsz, T, D, generator=gen, device=dev).to(dtype)
    y = torch.empty(Bsz, T, D, device=dev, dtype=dtype)
    grads = {n: torch.empty_like(d[n]) for n in SS_NAMES}
    opts = xc.selective_scan_options(softplus=True)
    fwd, bwd = lib_ss_fns(lib, d, y, gy, grads, opts)
    fwd()
    bwd()
    torch.cuda.current_stream().synchronize()

    jd = {n: to_jax(d[n]) for n in SS_NAMES}
    jgy = to_jax(gy)

    def jfwd(dd, assoc=False):
        f = ref.selective_scan_assoc if assoc else ref.selective_scan_ref
        return f(dd["x"], dd["dt"], dd["A"], dd["B"], dd["C"], dt_bias=dd["dt_bias"], D=dd["D"],
                 z=dd["z"], softplus=True)[0]

    d32 = {n: v.astype(jnp.float32) for n, v in jd.items()}
    ry, pull = jax.vjp(lambda dd: jfwd(dd), d32)
    (rg,) = pull(jgy.astype(jnp.float32))
    ours = {"y": y, **{"grad_" + n: grads[n] for n in SS_NAMES}}
    refs = {"y": ry, **{"grad_" + n: rg[n] for n in SS_NAMES}}
    ok, metrics = check_row(ours, refs, dt)

    jf = jax.jit(lambda dd: jfwd(dd))
    ja = jax.jit(lambda dd: jfwd(dd, True))
    jfb = jax.jit(lambda dd, g: jax.vjp(lambda e: jfwd(e), dd)[1](g))
    jab = jax.jit(lambda dd, g: jax.vjp(lambda e: jfwd(e, True), dd)[1](g))
    dg = {n: v.detach().clone().requires_grad_(True) for n, v in d.items()}

    def loop_f():
        with torch.no_grad():
            return torch_selective_loop(d)

    def loop_fb():
        out = torch_selective_loop(dg)
        return torch.autograd.grad(out, list(dg.values()), gy)

    rows = []
    for mode in args.modes:
        row = {"op": "selective_scan", "shape": f"B{Bsz} T{T} D{D} N{N}", "shape_name": shape_name,
               "dtype": dt, "mode": mode, "pass": ok, "check": metrics, "t": {}}
        if mode == "fwd":
            row["t"]["lib"] = time_torch(fwd, args)
            row["t"]["lax.scan"] = time_jax_safe(jf, (jd,), args)
            row["t"]["assoc"] = time_jax_safe(ja, (jd,), args)
            row["t"]["torch loop"] = time_torch(loop_f, args)
        else:
            def lib_fb():
                fwd()
                bwd()
            row["t"]["lib"] = time_torch(lib_fb, args)
            row["t"]["lax.scan"] = time_jax_safe(jfb, (jd, jgy), args)
            row["t"]["assoc"] = time_jax_safe(jab, (jd, jgy), args)
            row["t"]["torch loop"] = time_torch(loop_fb, args)
        rows.append(row)
        print_row_progress(row)
    del d, gy, y, grads, dg
    torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------
# presentation
# ---------------------------------------------------------------------------
def cells_of(row):
    """{column: microseconds or None, column + ' note': ...}."""
    t = row["t"]
    out = {}

    def get(r, key):
        if r is None or "error" in r:
            return None
        return r.get(key)

    lib = t.get("lib")
    out["lib graph"] = get(lib, "graph_us")
    out["lib eager"] = get(lib, "eager_us")
    out["lax.scan"] = get(t.get("lax.scan"), "us")
    out["assoc"] = get(t.get("assoc"), "us")
    loop = t.get("torch loop")
    out["torch loop"] = get(loop, "eager_us")
    out["loop graph"] = get(loop, "graph_us")
    rnn = t.get("cuDNN")
    if rnn is not None and "error" not in rnn:
        out["cuDNN"] = rnn.get("us")
        out["cuDNN_eager"] = rnn.get("method") == "eager"
    else:
        out["cuDNN"] = None
    return out


def fmt_us(v, star=False):
    if v is None:
        return "n/a"
    return (f"{v:.1f}" if v < 1000 else f"{v:.0f}") + ("*" if star else "")


def print_row_progress(row):
    c = cells_of(row)
    print(f"  {row['op']} {row['shape']} {row['dtype']} {row['mode']}: "
          + ", ".join(f"{k} {fmt_us(c.get(k))}" for k in COLUMNS), flush=True)


def print_tables(rows):
    print("\n## Results: median us per call (lib graph = CUDA-graph replay, device time; "
          "JAX = wall clock per call, pipelined; cuDNN * = eager, capture failed)")
    for op in ALL_OPS:
        rs = [r for r in rows if r["op"] == op]
        if not rs:
            continue
        print(f"\n### {op}\n")
        head = ["shape", "dtype", "mode", "pass"] + list(COLUMNS) + ["best other / lib graph"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rs:
            c = cells_of(r)
            cells = [f"{r['shape_name']} {r['shape']}", r["dtype"], r["mode"],
                     "PASS" if r["pass"] else "FAIL"]
            for k in COLUMNS:
                cells.append(fmt_us(c.get(k), star=(k == "cuDNN" and c.get("cuDNN_eager"))))
            others = [(k, c[k]) for k in ("lax.scan", "assoc", "torch loop", "loop graph", "cuDNN")
                      if c.get(k) is not None]
            if others and c.get("lib graph"):
                k, v = min(others, key=lambda kv: kv[1])
                cells.append(f"{v / c['lib graph']:.1f}x ({k})")
            else:
                cells.append("n/a")
            print("| " + " | ".join(cells) + " |")
    errs = []
    for r in rows:
        for k, v in r["t"].items():
            if v and "error" in v:
                errs.append(f"- {r['op']} {r['shape']} {r['dtype']} {r['mode']} {k}: {v['error']}")
            elif v and v.get("graph_error"):
                errs.append(f"- {r['op']} {r['shape']} {r['dtype']} {r['mode']} {k}: graph capture "
                            f"failed ({v['graph_error']}); eager figure used")
    if errs:
        print("\nNotes:")
        print("\n".join(errs))
    print("\nbest other / lib graph > 1: the library is that many times faster than the fastest "
          "alternative in the row.")


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------
def run_sweep(lib, args, gen, dev):
    dt = args.sweep_dtype
    dtype = TDT[dt]
    H, B = 256, 1
    pts = []
    print(f"\n## Sweep: min_gru forward, B{B} H{H} {dt}, latency (us) vs T")
    print("| T | library (graph) | lax.scan | associative_scan | torch loop (graph) | cuDNN GRU |")
    print("|---|---|---|---|---|---|")
    rnn = None
    if not args.no_cudnn:
        rnn = torch.nn.GRU(H, H, batch_first=True).to(device=dev, dtype=dtype)
        rnn.flatten_parameters()
    jf = jax.jit(lambda *a: ref.scan_ref("min_gru", a)[0])
    ja = jax.jit(lambda *a: ref.scan_assoc("min_gru", a)[0])
    for T in args.sweep_t:
        xs = scan_inputs("min_gru", (B, T, H), dtype, gen, dev)
        y = torch.empty(B, T, H, device=dev, dtype=dtype)
        fwd = lib.bind("min_gru_forward", gate=xs[0], candidate=xs[1], y=y,
                       stream=xc.torch_current_stream)
        jxs = [to_jax(x) for x in xs]

        def loop_f():
            with torch.no_grad():
                return torch_loop("min_gru", xs)

        p = {"T": T}
        r = time_torch(fwd, args)
        p["library"] = None if "error" in r else r["us"]
        p["lax.scan"] = time_jax_safe(jf, jxs, args).get("us")
        p["associative_scan"] = time_jax_safe(ja, jxs, args).get("us")
        r = time_torch(loop_f, args)
        p["torch loop (graph)"] = None if "error" in r else r["us"]
        p["torch loop method"] = r.get("method")
        if rnn is not None:
            rx = xs[0]

            def rnn_f():
                with torch.no_grad():
                    return rnn(rx)[0]

            r = time_torch(rnn_f, args)
            p["cuDNN GRU"] = None if "error" in r else r["us"]
            p["cuDNN method"] = r.get("method")
        pts.append(p)
        print(f"| {T} | {fmt_us(p['library'])} | {fmt_us(p['lax.scan'])} | "
              f"{fmt_us(p['associative_scan'])} | {fmt_us(p['torch loop (graph)'])} | "
              f"{fmt_us(p.get('cuDNN GRU'))} |", flush=True)
        del xs, y, fwd
        torch.cuda.empty_cache()
    return {"dtype": dt, "B": B, "H": H, "points": pts}


def plot_sweep(sweep, path, device_name):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = ("library", "lax.scan", "associative_scan", "torch loop (graph)", "cuDNN GRU")
    markers = dict(zip(series, "osd^v"))
    for s in series:
        pts = [(p["T"], p[s]) for p in sweep["points"] if p.get(s)]
        if pts:
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker=markers[s], label=s)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (sequence length)")
    ax.set_ylabel("latency per call (us)")
    ax.set_title(f"min_gru forward, B{sweep['B']} H{sweep['H']} {sweep['dtype']} ({device_name})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=xc.default_lib_path())
    p.add_argument("--ops", default=",".join(ALL_OPS))
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--shapes", default="inference,training")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--min-ms", type=float, default=1.0)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--sweep-only", action="store_true")
    p.add_argument("--sweep-t", default=",".join(map(str, SWEEP_T)))
    p.add_argument("--sweep-dtype", default="f32")
    p.add_argument("--no-cudnn", action="store_true")
    p.add_argument("--quick", action="store_true", help="reps 5, min-ms 0.5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="PNG of the sweep")
    a = p.parse_args(argv)
    a.ops = [s for s in a.ops.split(",") if s]
    a.dtypes = [s for s in a.dtypes.split(",") if s]
    a.modes = [s for s in a.modes.split(",") if s]
    a.shapes = [s for s in a.shapes.split(",") if s]
    a.sweep_t = [int(s) for s in a.sweep_t.split(",") if s]
    bad = ([o for o in a.ops if o not in ALL_OPS] + [d for d in a.dtypes if d not in TDT]
           + [m for m in a.modes if m not in ("fwd", "fwd+bwd")])
    if bad:
        p.error(f"unknown {bad}")
    if a.quick:
        a.reps, a.min_ms = 5, 0.5
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch")
        return 2
    torch.cuda.set_device(args.device)
    dev = torch.device("cuda", args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        lib = xc.Exphil(args.lib)
    except (OSError, xc.ExphilError) as e:
        print(f"cannot load {args.lib}: {e}")
        return 2
    props = torch.cuda.get_device_properties(dev)
    env = {"library": args.lib, "library_version": lib.version(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "jax": jax.__version__,
           "device": props.name, "capability": f"sm_{props.major}{props.minor}",
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv,
           "reps": args.reps, "min_ms": args.min_ms}
    print("# ExPhil.Native scans vs JAX and PyTorch")
    print(f"library {args.lib} ({lib.version()}); torch {torch.__version__} (cuDNN "
          f"{env['cudnn']}); jax {jax.__version__}; {props.name} {env['capability']}", flush=True)

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    sec = pu.Sections()
    out = {"env": env, "rows": [], "sweep": None}
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not args.sweep_only:
            for op in args.ops:
                def run_op(op=op):
                    rows = []
                    for dt in args.dtypes:
                        if op == "selective_scan":
                            for name, B, T, D, N in SS_SHAPES:
                                if name in args.shapes:
                                    rows += bench_ss(lib, args, name, B, T, D, N, dt, gen, dev)
                        else:
                            for name, B, T, H in SCAN_SHAPES:
                                if name in args.shapes:
                                    rows += bench_scan(lib, args, op, name, B, T, H, dt, gen, dev)
                    out["rows"] += rows
                    bad = [r for r in rows if not r["pass"]]
                    for r in bad:
                        print(f"CHECK FAILED {r['op']} {r['shape']} {r['dtype']}: "
                              + " ".join(f"{n}={pu.fmt_metric(m)}" for n, m in r["check"].items()))
                    return not bad, f"{len(rows) - len(bad)}/{len(rows)} rows checked"
                sec.run(f"speed {op}", run_op)
            print_tables(out["rows"])
        if not args.no_sweep:
            def sweep():
                out["sweep"] = run_sweep(lib, args, gen, dev)
                if args.plot:
                    plot_sweep(out["sweep"], args.plot, props.name)
                    print(f"plot written to {args.plot}")
            sec.run("sweep min_gru fwd", sweep)
    torch.cuda.synchronize()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(pu.jsonable(out), indent=1))
        print(f"results written to {args.json}")
    return sec.summary("speed_scans summary")


if __name__ == "__main__":
    sys.exit(main())
