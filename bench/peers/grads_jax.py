#!/usr/bin/env python3
"""Independent gradients: ExPhil.Native's forward and backward, called through
ctypes on JAX's GPU buffers, against jax.vjp of the straightforward JAX
implementation (bench/peers/jax_reference.py) evaluated in float64 on the
same rounded inputs.

Cases (shapes and options drawn fresh each run from a printed seed; --seed
repeats a run), each run in every dtype (f32, bf16, f16) on the same shape:

* scans: linear_scan, min_gru, min_lstm, liquid. Random B, T (1 to 4096), H
  (odd widths too); h0 absent / f32 / sequence dtype; h_final asked or not,
  f32 or sequence dtype; a random grad_h_final (f32 or sequence dtype) or
  none; grad_h0 (f32 or sequence dtype) whenever h0 is given. Compared: y,
  h_final, the gradient of every input, grad_h0.
* selective_scan: random B, T, D, N (1 to 256) with every option on and off
  over the cases: dt_bias, D, z, h0, softplus, clamp (some deltas clamped),
  grad_h_final. Compared: y, h_final, grad x, dt, A, B, C, dt_bias, D, z, h0.
* attention: every mask (none, causal, window) x layout (BHTD, BTHD) x GQA
  ratio (1, 2, 4), random head width d, B, Hkv, T, S and sometimes an
  explicit scale; plus edge cases (T > S causal: rows with no key; window 1;
  one query over many keys). Compared: o, lse, grad_q, grad_k, grad_v; rows
  with no key must have o = 0, lse = -inf and grad_q = 0 exactly.

Inputs are drawn in f32, rounded to the case's dtype, and that rounded value
(converted exactly to f64) is what the reference sees. Library calls use the
library's stream (stream NULL) and exphil_synchronize before JAX reads.

Tolerance, element-wise: |ours - ref| <= atol * max|ref| + rtol * |ref|,
max|ref| over the compared tensor (for attention gradients at least
scale * max|dO| * max|V| * max(|Q|, |K|), the size of their terms):

    scans and selective_scan  (rtol, atol)
        f32   (1e-4, 1e-4)    f32 arithmetic in both; only the order differs
        f16   (5e-3, 5e-3)    outputs rounded to f16 (2^-11), the backward
                              rebuilds states from the rounded y
        bf16  (2e-2, 2e-2)    the same with bf16's 2^-8
    attention: as bench/peers/attention_sdpa.py
        f32   o 1e-4, lse 1e-5, gradients 2e-4
        f16   o 5e-3, lse 1e-3, gradients 1e-2
        bf16  o 1e-2, lse 2e-3, gradients 2e-2
    --tol-scale multiplies all of them.

The scans keep their state in f32 whatever the dtype, so long T in bf16
does not accumulate more than the output rounding.

Run (GPU machine with jax + CUDA plugin; library built):
    python3 bench/peers/grads_jax.py [--lib PATH] [--seed N] [--dtypes f32,bf16,f16]
        [--scan-cases N] [--ss-cases N] [--att-repeat N] [--ops ...] [--json PATH] [-q]
One line per case, a summary per op and dtype; exit status 1 on any failure.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import exphil_ctypes as xc  # noqa: E402
import jax_reference as ref  # noqa: E402
import lib_on_jax as LJ  # noqa: E402
import peer_util as pu  # noqa: E402

JDT = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
F64 = jnp.float64
TOL = {"f32": (1e-4, 1e-4), "f16": (5e-3, 5e-3), "bf16": (2e-2, 2e-2)}
ATT_TOL = {
    "f32": {"o": (1e-4, 1e-4), "lse": (1e-5, 1e-5), "grad": (2e-4, 2e-4)},
    "f16": {"o": (5e-3, 5e-3), "lse": (1e-3, 1e-3), "grad": (1e-2, 1e-2)},
    "bf16": {"o": (1e-2, 1e-2), "lse": (2e-3, 2e-3), "grad": (2e-2, 2e-2)},
}
ALL_OPS = ("linear_scan", "min_gru", "min_lstm", "liquid", "selective_scan", "attention")


def to_dev(a, dtype):
    """numpy f32 -> JAX GPU array rounded to dtype."""
    return jnp.asarray(np.asarray(a, np.float32)).astype(dtype)


def f64(a):
    return None if a is None else a.astype(F64)


def state_dtype(choice, seq_dtype):
    return {None: None, "f32": jnp.float32, "seq": seq_dtype}[choice]


# ---------------------------------------------------------------------------
# scans
# ---------------------------------------------------------------------------
def draw_len(rng, lo_hi=((1, 16), (17, 512), (513, 4096)), p=(0.25, 0.5, 0.25)):
    r = rng.random()
    acc = 0.0
    for (lo, hi), pi in zip(lo_hi, p):
        acc += pi
        if r < acc:
            return rng.randint(lo, hi)
    return rng.randint(*lo_hi[-1])


def scan_cases(rng, ops, n):
    cases = []
    edge = [("linear_scan", 1, 1, 1), ("min_gru", 1, 4096, 8), ("liquid", 3, 7, 5),
            ("min_lstm", 2, 1000, 130), ("min_gru", 2, 33, 3), ("linear_scan", 1, 2048, 257)]
    for op, B, T, H in edge:
        if op in ops:
            cases.append(dict(op=op, B=B, T=T, H=H, h0="f32", hT="f32", ghf="f32", gh0="f32",
                              kind="edge"))
    for op in ops:
        for _ in range(n):
            T = draw_len(rng)
            H = rng.choice([rng.randint(1, 300), 4 * rng.randint(1, 128)])
            B = rng.randint(1, 4)
            while B * T * H > 3_000_000 and B > 1:
                B -= 1
            h0 = rng.choice([None, "f32", "seq"])
            cases.append(dict(op=op, B=B, T=T, H=H, h0=h0, hT=rng.choice([None, "f32", "seq"]),
                              ghf=rng.choice([None, "f32", "seq"]),
                              gh0=rng.choice(["f32", "seq"]) if h0 else None, kind="random"))
    return cases


def scan_values(op, nrng, shape):
    nrm = lambda s=1.0: s * nrng.standard_normal(shape)
    if op == "linear_scan":
        return [nrng.uniform(-1.0, 1.0, shape), nrm()]
    if op == "min_gru":
        return [nrm(2.0), nrm()]
    if op == "min_lstm":
        return [nrm(2.0), nrm(2.0), nrm()]
    if op == "liquid":
        return [nrng.uniform(0.5, 4.0, shape), nrm()]
    raise ValueError(op)


@functools.lru_cache(maxsize=None)
def scan_ref_fn(op):
    def f(xs, h0, gy, ghf):
        (y, hT), pull = jax.vjp(lambda xs_, h0_: ref.scan_ref(op, xs_, h0_), xs, h0)
        gxs, gh0 = pull((gy, ghf))
        return y, hT, gxs, gh0
    return jax.jit(f)


def run_scan_case(lib, c, dt, seed, tol_scale):
    op, B, T, H = c["op"], c["B"], c["T"], c["H"]
    dtype = JDT[dt]
    nrng = np.random.default_rng(seed)
    xs = [to_dev(v, dtype) for v in scan_values(op, nrng, (B, T, H))]
    h0_dt = state_dtype(c["h0"], dtype)
    hT_dt = state_dtype(c["hT"], dtype)
    ghf_dt = state_dtype(c["ghf"], dtype)
    gh0_dt = state_dtype(c["gh0"], dtype)
    h0 = to_dev(nrng.standard_normal((B, H)), h0_dt) if h0_dt is not None else None
    gy = to_dev(nrng.standard_normal((B, T, H)), dtype)
    ghf = to_dev(nrng.standard_normal((B, H)), ghf_dt) if ghf_dt is not None else None

    y, hT = LJ.scan_forward(lib, op, xs, h0=h0, h_final_dtype=hT_dt)
    grads, gh0 = LJ.scan_backward(lib, op, xs, y, gy, h0=h0, grad_h_final=ghf,
                                  grad_h0_dtype=gh0_dt)

    zeros_state = jnp.zeros((B, H), F64)
    ry, rhT, rg, rgh0 = scan_ref_fn(op)([f64(x) for x in xs],
                                        f64(h0) if h0 is not None else zeros_state,
                                        f64(gy), f64(ghf) if ghf is not None else zeros_state)
    rtol, atol = (t * tol_scale for t in TOL[dt])
    m = {"y": pu.compare(y, ry, rtol, atol)}
    if hT is not None:
        m["h_final"] = pu.compare(hT, rhT, rtol, atol)
    for n, g, r in zip(xc.SCAN_INPUTS[op], grads, rg):
        m["grad_" + n] = pu.compare(g, r, rtol, atol)
    if gh0 is not None:
        m["grad_h0"] = pu.compare(gh0, rgh0, rtol, atol)
    return m


def scan_label(c, dt):
    nm = lambda v: {None: "-", "f32": "f32", "seq": dt}[v]
    return (f"{c['op']:<14} {dt:<4} B{c['B']} T{c['T']} H{c['H']} h0={nm(c['h0'])} "
            f"h_final={nm(c['hT'])} grad_h_final={nm(c['ghf'])} grad_h0={nm(c['gh0'])}")


# ---------------------------------------------------------------------------
# selective scan
# ---------------------------------------------------------------------------
SS_OPTIONS = ("dt_bias", "D", "z", "h0", "softplus", "clamp", "ghf")


def ss_cases(rng, n):
    # every option on in half of the random cases and off in the other half
    cols = {}
    for o in SS_OPTIONS:
        col = [i % 2 == 0 for i in range(n)]
        rng.shuffle(col)
        cols[o] = col
    cases = []
    Ns = (1, 2, 4, 8, 16, 17, 32, 64, 128, 256)
    for i in range(n):
        N = rng.choice(Ns)
        D = rng.choice([rng.randint(1, 160), 32 * rng.randint(1, 5)])
        B = rng.randint(1, 3)
        T = draw_len(rng, ((1, 16), (17, 300), (301, 1200)), (0.25, 0.5, 0.25))
        while B * T * D * N > 8_000_000 and T > 1:  # the f64 reference stores every state
            T = max(1, T // 2)
        cases.append(dict(B=B, T=T, Dn=D, N=N, kind="random",
                          **{o: cols[o][i] for o in SS_OPTIONS}))
    allon = {o: True for o in SS_OPTIONS}
    alloff = {o: False for o in SS_OPTIONS}
    cases += [dict(B=1, T=1, Dn=1, N=1, kind="edge", **allon),
              dict(B=2, T=40, Dn=33, N=256, kind="edge", **allon),
              dict(B=1, T=700, Dn=64, N=16, kind="edge", **allon),
              dict(B=3, T=5, Dn=7, N=3, kind="edge", **alloff)]
    return cases


@functools.lru_cache(maxsize=None)
def ss_ref_fn(softplus, clamp):
    def f(ins, gy, ghf):
        def fn(d):
            return ref.selective_scan_ref(d["x"], d["dt"], d["A"], d["B"], d["C"],
                                          dt_bias=d["dt_bias"], D=d["D"], z=d["z"], h0=d["h0"],
                                          softplus=softplus, clamp=clamp)
        (y, hT), pull = jax.vjp(fn, ins)
        (g,) = pull((gy, ghf))
        return y, hT, g
    return jax.jit(f)


def run_ss_case(lib, c, dt, seed, tol_scale):
    B, T, Dn, N = c["B"], c["T"], c["Dn"], c["N"]
    dtype = JDT[dt]
    f32 = jnp.float32
    r = np.random.default_rng(seed)
    sp = c["softplus"]
    x = to_dev(r.standard_normal((B, T, Dn)), dtype)
    dt_v = to_dev(r.normal(-1.5, 1.0, (B, T, Dn)) if sp else r.uniform(0.01, 0.3, (B, T, Dn)), dtype)
    A = to_dev(-r.uniform(0.2, 3.0, (Dn, N)), f32)
    Bm = to_dev(r.standard_normal((B, T, N)), dtype)
    Cm = to_dev(r.standard_normal((B, T, N)), dtype)
    dt_bias = to_dev(r.normal(0.0, 0.3, Dn) if sp else r.uniform(0.0, 0.1, Dn), f32) \
        if c["dt_bias"] else None
    Dv = to_dev(r.standard_normal(Dn), f32) if c["D"] else None
    z = to_dev(r.standard_normal((B, T, Dn)), dtype) if c["z"] else None
    h0 = to_dev(r.standard_normal((B, Dn, N)), f32) if c["h0"] else None
    clamp = None
    if c["clamp"]:
        lo, hi = (0.1, 0.8) if sp else (0.03, 0.25)
        clamp = (float(np.float32(lo)), float(np.float32(hi)))
    gy = to_dev(r.standard_normal((B, T, Dn)), dtype)
    ghf = to_dev(r.standard_normal((B, Dn, N)), f32) if c["ghf"] else None

    kw = dict(dt_bias=dt_bias, D=Dv, z=z, h0=h0, softplus=sp, clamp=clamp)
    y, hT = LJ.selective_scan_forward(lib, x, dt_v, A, Bm, Cm, **kw)
    g = LJ.selective_scan_backward(lib, x, dt_v, A, Bm, Cm, gy, grad_h_final=ghf, **kw)

    ins = dict(x=f64(x), dt=f64(dt_v), A=f64(A), B=f64(Bm), C=f64(Cm), dt_bias=f64(dt_bias),
               D=f64(Dv), z=f64(z), h0=f64(h0))
    ghf64 = f64(ghf) if ghf is not None else jnp.zeros((B, Dn, N), F64)
    ry, rhT, rg = ss_ref_fn(bool(sp), clamp)(ins, f64(gy), ghf64)
    rtol, atol = (t * tol_scale for t in TOL[dt])
    m = {"y": pu.compare(y, ry, rtol, atol), "h_final": pu.compare(hT, rhT, rtol, atol)}
    for n in LJ.SELECTIVE_GRADS:
        if g[n] is not None:
            m["grad_" + n] = pu.compare(g[n], rg[n], rtol, atol)
    extra = {}
    if clamp is not None:  # how many deltas the clamp caught (so the case means something)
        u = ins["dt"] + (ins["dt_bias"] if ins["dt_bias"] is not None else 0.0)
        if sp:
            u = jax.nn.softplus(u)
        extra["clamped"] = float(jnp.mean((u < clamp[0]) | (u > clamp[1])))
    return m, extra


def ss_label(c, dt):
    on = [o for o in SS_OPTIONS if c[o]]
    return (f"selective_scan {dt:<4} B{c['B']} T{c['T']} D{c['Dn']} N{c['N']} "
            f"[{','.join(on) if on else 'no options'}]")


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------
def att_cases(rng, repeat):
    cases = []
    for _ in range(repeat):
        for mask, layout, ratio in itertools.product(("none", "causal", "window"), ("BHTD", "BTHD"),
                                                     (1, 2, 4)):
            T = draw_len(rng, ((1, 16), (17, 200), (201, 320)), (0.25, 0.55, 0.2))
            S = T if rng.random() < 0.25 else draw_len(rng, ((1, 16), (17, 200), (201, 320)),
                                                       (0.25, 0.55, 0.2))
            cases.append(dict(B=rng.randint(1, 2), Hkv=rng.randint(1, 2), ratio=ratio, T=T, S=S,
                              d=rng.choice((32, 64, 96, 128)), mask=mask,
                              window=rng.randint(1, S + 4) if mask == "window" else 0,
                              layout=layout,
                              scale=0.0 if rng.random() < 0.75 else round(rng.uniform(0.02, 0.4), 4),
                              kind="random"))
    cases += [
        dict(B=2, Hkv=2, ratio=2, T=77, S=20, d=64, mask="causal", window=0, layout="BHTD",
             scale=0.0, kind="edge"),
        dict(B=1, Hkv=1, ratio=4, T=40, S=7, d=96, mask="window", window=3, layout="BTHD",
             scale=0.0, kind="edge"),
        dict(B=1, Hkv=1, ratio=2, T=65, S=65, d=128, mask="window", window=1, layout="BHTD",
             scale=0.0, kind="edge"),
        dict(B=1, Hkv=2, ratio=4, T=1, S=300, d=128, mask="causal", window=0, layout="BTHD",
             scale=0.0, kind="edge"),
        dict(B=1, Hkv=1, ratio=1, T=64, S=192, d=32, mask="none", window=0, layout="BHTD",
             scale=-0.125, kind="edge"),
    ]
    return cases


@functools.lru_cache(maxsize=None)
def att_ref_fn(mask, window, layout, scale):
    def f(q, k, v, go):
        fn = lambda a, b, c: ref.attention_ref(a, b, c, mask=mask, window=window, layout=layout,
                                               scale=scale or None)
        (o, lse), pull = jax.vjp(fn, q, k, v)
        gq, gk, gv = pull((go, jnp.zeros_like(lse)))
        return o, lse, gq, gk, gv
    return jax.jit(f)


def run_att_case(lib, c, dt, seed, tol_scale):
    dtype = JDT[dt]
    r = np.random.default_rng(seed)
    B, Hkv, T, S, d, layout = c["B"], c["Hkv"], c["T"], c["S"], c["d"], c["layout"]
    Hq = Hkv * c["ratio"]
    if layout == "BHTD":
        qs, ks = (B, Hq, T, d), (B, Hkv, S, d)
    else:
        qs, ks = (B, T, Hq, d), (B, S, Hkv, d)
    q, k, v, go = (to_dev(r.standard_normal(s), dtype) for s in (qs, ks, ks, qs))
    kw = dict(mask=c["mask"], window=c["window"], layout=layout, scale=c["scale"])
    o, lse = LJ.attention_forward(lib, q, k, v, **kw)
    gq, gk, gv = LJ.attention_backward(lib, q, k, v, o, lse, go, **kw)
    ro, rlse, rgq, rgk, rgv = att_ref_fn(c["mask"], c["window"], layout.lower(), c["scale"])(
        f64(q), f64(k), f64(v), f64(go))
    t = {kk: (a * tol_scale, b * tol_scale) for kk, (a, b) in ATT_TOL[dt].items()}
    sc = abs(c["scale"]) if c["scale"] else 1.0 / math.sqrt(d)
    amax = lambda a: float(jnp.max(jnp.abs(a.astype(jnp.float32))))
    terms = sc * amax(go) * amax(v) * max(amax(q), amax(k))
    m = {"o": pu.compare(o, ro, *t["o"]), "lse": pu.compare(lse, rlse, *t["lse"]),
         "grad_q": pu.compare(gq, rgq, *t["grad"], mag_floor=terms),
         "grad_k": pu.compare(gk, rgk, *t["grad"], mag_floor=terms),
         "grad_v": pu.compare(gv, rgv, *t["grad"], mag_floor=terms)}
    empty = np.asarray(~ref.attention_visibility(T, S, c["mask"], c["window"]).any(axis=1))
    extra = {"empty_rows": int(empty.sum())}
    if empty.any():
        ax = 2 if layout == "BHTD" else 1
        oe = np.take(pu.to_f64(o), np.nonzero(empty)[0], axis=ax)
        ge = np.take(pu.to_f64(gq), np.nonzero(empty)[0], axis=ax)
        le = pu.to_f64(lse)[:, :, empty]
        extra["empty_rows_exact"] = bool((oe == 0).all() and (ge == 0).all()
                                         and np.isneginf(le).all())
    return m, extra


def att_label(c, dt):
    m = c["mask"] + (f"(W={c['window']})" if c["mask"] == "window" else "")
    s = f" scale={c['scale']}" if c["scale"] else ""
    return (f"attention      {dt:<4} {c['layout']} B{c['B']} Hq{c['Hkv'] * c['ratio']} "
            f"Hkv{c['Hkv']} T{c['T']} S{c['S']} d{c['d']} {m}{s}")


# ---------------------------------------------------------------------------
def run_all_cases(lib, args, seed):
    rng = random.Random(seed)
    jobs = []  # (op, label_fn, run_fn, case)
    scan_ops = [o for o in args.ops if o in xc.SCAN_INPUTS]
    for c in scan_cases(rng, scan_ops, args.scan_cases):
        jobs.append((c["op"], scan_label, run_scan_case, c))
    if "selective_scan" in args.ops:
        for c in ss_cases(rng, args.ss_cases):
            jobs.append(("selective_scan", ss_label, run_ss_case, c))
    if "attention" in args.ops:
        for c in att_cases(rng, args.att_repeat):
            jobs.append(("attention", att_label, run_att_case, c))
    n_total = len(jobs) * len(args.dtypes)
    print(f"{len(jobs)} shapes x {len(args.dtypes)} dtypes = {n_total} cases; seed {seed}")
    print("Per tensor: max|err|/max|ref| (worst err/tol; <= 1 passes)", flush=True)
    results = []
    summary = {}
    t0 = time.time()
    for idx, (op, label_fn, run_fn, c) in enumerate(jobs):
        for dt in args.dtypes:
            case_seed = (seed * 1000003 + idx * 7 + list(JDT).index(dt)) % (1 << 63)
            label = label_fn(c, dt)
            rec = {"op": op, "dtype": dt, "case": c, "label": label}
            try:
                out = run_fn(lib, c, dt, case_seed, args.tol_scale)
                m, extra = out if isinstance(out, tuple) else (out, {})
                ok = all(v["ok"] for v in m.values()) and extra.get("empty_rows_exact", True)
                rec.update(ok=ok, metrics=m, extra=extra, error=None)
            except xc.ExphilError as e:
                ok = False
                rec.update(ok=False, metrics={}, extra={}, error=str(e))
            except Exception as e:  # report, keep going
                ok = False
                rec.update(ok=False, metrics={}, extra={}, error=f"{type(e).__name__}: {e}")
            results.append(rec)
            s = summary.setdefault((op, dt), [0, 0])
            s[0] += ok
            s[1] += 1
            if ok and args.quiet:
                continue
            line = f"{'PASS' if ok else 'FAIL'} {label}"
            if rec["error"]:
                line += f"  ERROR {rec['error']}"
            line += "  " + " ".join(f"{n}={pu.fmt_metric(v)}" for n, v in rec["metrics"].items())
            for k2, v2 in rec["extra"].items():
                line += f"  {k2}={v2:.2f}" if isinstance(v2, float) else f"  {k2}={v2}"
            if not ok and rec["metrics"]:
                fl = pu.fmt_failures(rec["metrics"])
                if fl:
                    line += "\n" + fl
            print(line, flush=True)
    dt_s = time.time() - t0
    print(f"\n## Summary (seed {seed}, {dt_s:.1f} s)")
    print("| op | " + " | ".join(args.dtypes) + " |")
    print("|---|" + "---|" * len(args.dtypes))
    for op in ALL_OPS:
        if not any(k[0] == op for k in summary):
            continue
        cells = []
        for dt in args.dtypes:
            p, n = summary.get((op, dt), [0, 0])
            cells.append(f"{p}/{n}" + ("" if p == n else " FAIL"))
        print(f"| {op} | " + " | ".join(cells) + " |")
    fails = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(fails)}/{len(results)} passed"
          + (f"; rerun with --seed {seed}" if fails else ""))
    return results, fails


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=xc.default_lib_path())
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtypes", default="f32,bf16,f16")
    p.add_argument("--ops", default=",".join(ALL_OPS))
    p.add_argument("--scan-cases", type=int, default=5, help="random shapes per scan op")
    p.add_argument("--ss-cases", type=int, default=10, help="random selective_scan shapes")
    p.add_argument("--att-repeat", type=int, default=1,
                   help="random attention shapes per (mask, layout, ratio)")
    p.add_argument("--tol-scale", type=float, default=1.0)
    p.add_argument("--json", default=None)
    p.add_argument("-q", "--quiet", action="store_true", help="print failing cases only")
    a = p.parse_args(argv)
    a.dtypes = [s for s in a.dtypes.split(",") if s]
    a.ops = [s for s in a.ops.split(",") if s]
    bad = [d for d in a.dtypes if d not in JDT] + [o for o in a.ops if o not in ALL_OPS]
    if bad:
        p.error(f"unknown dtype/op {bad}")
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    seed = args.seed if args.seed is not None else time.time_ns() % (1 << 31)
    print("# ExPhil.Native gradients vs jax.vjp in float64")
    try:
        lib = xc.Exphil(args.lib)
    except (OSError, xc.ExphilError) as e:
        print(f"cannot load {args.lib}: {e}")
        return 2
    dev = jax.devices()[0]
    print(f"library {args.lib} (version {lib.version()}); jax {jax.__version__} on {dev.platform} "
          f"{getattr(dev, 'device_kind', '')}; x64 {jnp.zeros(1, F64).dtype == F64}; seed {seed}")
    print("Tolerances (rtol, atol/max|ref|): scans " + json.dumps(TOL) + "; attention "
          + json.dumps(ATT_TOL) + (f" x {args.tol_scale}" if args.tol_scale != 1 else ""),
          flush=True)
    if dev.platform != "gpu":
        print("JAX has no GPU backend")
        return 2
    results, fails = run_all_cases(lib, args, seed)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(pu.jsonable({"seed": seed, "results": results}),
                                              indent=1))
        print(f"results written to {args.json}")
    print("ALL PASSED" if not fails else f"FAILED: {len(fails)}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
