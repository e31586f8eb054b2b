#!/usr/bin/env python3
"""Times builds of libexphil.so against each other: the library's attention
alone, causal, layout BHTD, forward and forward + backward, at a few shapes.

For trying a kernel change on the GPU machine in one call: build each
variant here, copy its libexphil.so to a folder of its own, carry those
folders, and pass them all; every library runs the same inputs in the same
process, so their figures compare directly. Each figure is the graph-replay
median of peer_util.measure (us per call); "err" is max|o - ref| / max|ref|
of the forward against a float64 torch reference, a guard against a variant
that is fast because it is wrong (the full check is attention_sdpa.py
--check); "same" says whether the library's O, log-sum-exp, dQ, dK and dV
are bitwise those of the first library on the same inputs (for a change
meant to leave the results as they were).

    python3 bench/peers/attention_variants.py [--dtype bf16|f32|f32x3]
           [--shape B,H,T,d ...] LIB [LIB ...]

The label of each row is the name of the library's folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import attention_sdpa as sdpa  # noqa: E402
import peer_util as pu  # noqa: E402

# f32x3: f32 tensors with precision tf32x3
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "f32x3": torch.float32}
DEFAULT_SHAPES = ["32,8,256,64", "8,8,1024,64", "1,8,32,32"]


def time_library(path, shape, dtype_name, reps):
    dtype = DTYPES[dtype_name]
    lib = sdpa.Exphil(path)
    B, H, T, d = shape
    torch.manual_seed(0)
    q, k, v, grad_o = (torch.randn(B, H, T, d, device="cuda", dtype=dtype) for _ in range(4))
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
    grad_q, grad_k, grad_v = (torch.empty_like(q) for _ in range(3))
    opts = sdpa.make_options("causal", 0, "BHTD", 0.0, dtype_name)
    forward = lib.bind_forward(q, k, v, opts, o, lse)
    backward = lib.bind_backward(q, k, v, o, lse, grad_o, opts, grad_q, grad_k, grad_v)
    fwd = pu.measure(forward, reps, 1.0)
    both = pu.measure(lambda: (forward(), backward()), reps, 1.0)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           is_causal=True)
    err = ((o.double() - ref).abs().max() / ref.abs().max()).item()
    torch.cuda.synchronize()
    outputs = [t.clone() for t in (o, lse, grad_q, grad_k, grad_v)]
    return fwd["us"], both["us"], err, outputs


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("libs", nargs="+", help="libexphil.so of each variant")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--shape", action="append", default=None, help="B,H,T,d (repeatable)")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or DEFAULT_SHAPES)]
    stream = torch.cuda.Stream()  # the bound calls run on torch's current, non-default stream
    torch.cuda.set_stream(stream)
    first = {}  # shape -> the first library's outputs
    for path in args.libs:
        label = Path(path).parent.name
        for shape in shapes:
            fwd, both, err, outputs = time_library(path, shape, args.dtype, args.reps)
            if shape not in first:
                first[shape] = outputs
            # Bitwise, NaN patterns included.
            same = all(torch.equal(bits(a), bits(b)) for a, b in zip(outputs, first[shape]))
            B, H, T, d = shape
            print(f"{label:10} B{B} h{H} T{T} d{d} {args.dtype}: fwd {fwd:8.1f} us  "
                  f"fwd+bwd {both:8.1f} us  err {err:.1e}  same {'yes' if same else 'no'}",
                  flush=True)


if __name__ == "__main__":
    main()
