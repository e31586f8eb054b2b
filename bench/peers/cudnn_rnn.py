#!/usr/bin/env python3
"""cuDNN's GRU and LSTM through PyTorch: issue 30's peer, in the rows of
exphil_bench's gated_rnn section (bench/bench_gated_rnn.cpp), to be run in
the same job on the same GPU (bench/run_gated_rnn.sh runs both and compares).

What
----
For each cell (GRU, LSTM), dtype (f32, bf16), shape (B1 T32 H256, B1 T1 H256,
B4 T32 H256, B32 T64 H256, B64 T256 H512) and stack:

  L 1 and 2, proj yes   torch.nn.GRU/LSTM(H, H, num_layers=L): input size =
                        hidden size, so cuDNN's time includes every layer's
                        input projection, as exphil_bench's "proj yes" rows
                        include ours (x W by cuBLAS before each layer, grad_W
                        and grad_x after each layer's backward)
  L 1, proj in1         torch.nn.GRU/LSTM(1, H): input size 1, its projection
                        a [B*T, 1] x [1, G*H] product: the nearest cuDNN gets
                        to exphil_bench's "proj no" rows (the kernels alone on
                        a given wx)

and direction

  fwd       eval() under no_grad (inference): y and the final states
  fwd+bwd   train(), y.backward(grad_y) with x requiring grad: grad_x and
            every weight's and bias's gradient; the gradients are set to None
            before each call, as optimizer.zero_grad() does

it prints the median time per call (and for f32 the forward's normwise
error against the same module in f64, "cuDNN accuracy"):

  eager_us  CUDA events around one call: PyTorch's host work included, as a
            PyTorch user runs it (exphil_bench's events_us)
  graph_us  replays of a CUDA graph of 20 calls back to back (1 call at the
            two larger shapes: exphil_bench's rule), per call: cuDNN's
            kernels alone (exphil_bench's graph_us)

Calls rotate over copies of the module and its inputs (weights included)
that exceed twice the L2 cache, as exphil_bench's input sets do. Weights are
PyTorch's init (U(-1/sqrt(H), 1/sqrt(H)), as exphil_bench's) and flattened
(un-flattened bf16 weights are copied on every call); f32 runs with PyTorch's
default cudnn.allow_tf32 (printed), as exphil_bench's projections use TF32.
With it cuDNN may run an f32 RNN's products, the recurrent ones included, as
TF32 on tensor cores, where exphil's recurrent products are f32 FMAs:
--exact-f32 turns it off (cuDNN's FMA math), the like-for-like f32 peer.
Each measurement gets about 0.2 s of device time (0.05 with --quick): at
least 5 repetitions, at most 200 (30).

How to run (on a CUDA machine with torch)
-----------------------------------------
    python3 bench/peers/cudnn_rnn.py [--small] [--quick] [--seed N] [--dtypes f32,bf16]
                                     [--exact-f32]

--small: the batch-1 shapes only (as exphil_bench --small). About 45 s on an
H100 (25 s with --quick). --dtypes f32,bf16: those dtypes only (default
both). --exact-f32: cudnn.allow_tf32 False.
"""
import argparse
import copy
import math
import statistics
import sys
import time

import torch

SHAPES = [(1, 32, 256), (1, 1, 256), (4, 32, 256), (32, 64, 256), (64, 256, 512)]
# (layers, proj): proj "yes" = input size H, "in1" = input size 1.
STACKS = [(1, "in1"), (1, "yes"), (2, "yes")]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def small_call(B, T, H):
    """exphil_bench's rule: calls this small are timed 20 to a graph."""
    return B * T * H <= 65536


class Budget:
    def __init__(self, quick):
        self.us = 5e4 if quick else 2e5
        self.cap = 30 if quick else 200

    def reps(self, call_us):
        return max(5, min(self.cap, int(self.us / max(call_us, 1.0))))


def event_median_us(call, warmup, reps):
    """Median of CUDA events around call(i), after `warmup` untimed calls."""
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(reps):
        a.record()
        call(warmup + i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def graph_median_us(call, n_sets, per_graph, budget, call_us):
    """Median per call of replays of graphs of `per_graph` calls (indices
    run on across graphs, so the graphs together cover the input sets), or
    None where capture fails."""
    graphs = max(1, math.ceil(n_sets / per_graph))
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(min(n_sets, 3)):
                call(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        captured, pool, index = [], None, 0
        for _ in range(graphs):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                for _ in range(per_graph):
                    call(index)
                    index += 1
            pool = g.pool()
            captured.append(g)
    except Exception as e:  # noqa: BLE001 - reported, the row goes on
        print(f"  (capture failed: {str(e).splitlines()[0][:160]})", flush=True)
        torch.cuda.synchronize()
        return None
    for g in captured:
        g.replay()
    torch.cuda.synchronize()
    replays = max(budget.reps(call_us * per_graph), 2 * graphs)
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(replays):
        a.record()
        captured[r % graphs].replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / per_graph)
    del captured
    return statistics.median(times)


def make_sets(cell, dtype, B, T, H, layers, in_size, l2_bytes, dev):
    """Copies of (module, x, grad_y) exceeding twice the L2 cache, 2 to 64."""
    elem = torch.finfo(dtype).bits // 8
    sets = []
    while True:
        m = getattr(torch.nn, cell)(in_size, H, num_layers=layers, batch_first=True).to(dev, dtype)
        m.flatten_parameters()
        x = torch.rand(B, T, in_size, device=dev, dtype=dtype) * 2 - 1
        x.requires_grad_(True)
        gy = torch.rand(B, T, H, device=dev, dtype=dtype) * 2 - 1
        sets.append((m, x, gy))
        if len(sets) == 1:
            weights = sum(p.numel() for p in m.parameters())
            # weights and their gradients; x, grad_x; y, grad_y
            set_bytes = elem * (2 * weights + 2 * B * T * in_size + 2 * B * T * H)
            count = max(2, min(64, math.ceil(2 * l2_bytes / set_bytes)))
        if len(sets) >= count:
            return sets


def f32_accuracy(sets):
    """cuDNN's f32 forward y against the same module in f64 (cuDNN too), on
    the first input set: the normwise |y - y64| / |y64|. Measured on an
    H200 (bench/RESULTS.md, issue 30 run CS): with cudnn.allow_tf32, from B4
    6e-5 to 8e-5 at input size 1 (the recurrent products alone) and 2e-4 to
    4e-4 with the projections, TF32's (at B1 1e-7 to 3e-4: cuDNN chose
    by shape); without, 7e-8 to 5e-7 everywhere, f32's, as exphil's
    recurrent kernels compute."""
    m, x, _ = sets[0]
    m64 = copy.deepcopy(m).double()
    m.eval()
    m64.eval()
    with torch.no_grad():
        y = m(x)[0].double()
        y64 = m64(x.double())[0]
    del m64
    return ((y - y64).norm() / y64.norm()).item()


def run_config(cell, dname, B, T, H, layers, proj, budget, l2_bytes, dev):
    dtype = DTYPES[dname]
    in_size = H if proj == "yes" else 1
    sets = make_sets(cell, dtype, B, T, H, layers, in_size, l2_bytes, dev)
    n = len(sets)

    def fwd(i):
        m, x, _ = sets[i % n]
        with torch.no_grad():
            m(x)

    def fwd_bwd(i):
        m, x, gy = sets[i % n]
        for p in m.parameters():
            p.grad = None
        x.grad = None
        y, _ = m(x)
        y.backward(gy)

    per_graph = 20 if small_call(B, T, H) else 1
    rows = []
    for direction, call, train in (("fwd", fwd, False), ("fwd+bwd", fwd_bwd, True)):
        for m, _, _ in sets:
            m.train(train)
        estimate = event_median_us(call, 2, 3)
        reps = budget.reps(estimate)
        eager = event_median_us(call, min(10, reps // 4 + 1), reps)
        graph = graph_median_us(call, n, per_graph, budget, estimate)
        rows.append((direction, eager, graph))
    accuracy = f32_accuracy(sets) if dtype == torch.float32 else None
    return rows, n, accuracy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="batch-1 shapes only")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help="comma-separated, of " + ", ".join(DTYPES))
    ap.add_argument("--exact-f32", action="store_true",
                    help="cudnn.allow_tf32 False: f32 products as f32 FMAs")
    args = ap.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        ap.error(f"--dtypes: expected a comma-separated list of {', '.join(DTYPES)}, "
                 f"got {args.dtypes!r}")
    if not torch.cuda.is_available():
        print("cudnn_rnn.py: no CUDA device visible to torch; nothing was measured.")
        return 0
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    if args.exact_f32:
        torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    print(f"cudnn_rnn.py: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()} ({props.multi_processor_count} SMs, "
          f"{l2_bytes / 1e6:.0f} MB L2), cudnn.allow_tf32 {torch.backends.cudnn.allow_tf32}")
    print("proj yes: torch.nn.GRU/LSTM(H, H, L) (every layer's input projection included); "
          "in1: input size 1. eager_us: events around one call; graph_us: graph replay, per call")
    budget = Budget(args.quick)
    start = time.time()
    print(f"{'cell':5} {'dtype':5} {'shape':14} {'L':>2} {'proj':4} {'dir':8} {'eager_us':>10} "
          f"{'graph_us':>10} {'sets':>5}")
    for cell in ("GRU", "LSTM"):
        for dname in dtypes:
            for (B, T, H) in SHAPES:
                if args.small and B > 1:
                    continue
                for layers, proj in STACKS:
                    rows, n, accuracy = run_config(cell, dname, B, T, H, layers, proj, budget,
                                                   l2_bytes, dev)
                    for direction, eager, graph in rows:
                        g = f"{graph:10.2f}" if graph is not None else f"{'n/a':>10}"
                        print(f"{cell.lower():5} {dname:5} {f'B{B} T{T} H{H}':14} {layers:2d} {proj:4} "
                              f"{direction:8} {eager:10.2f} {g} {n:5d}", flush=True)
                    if accuracy is not None:
                        print(f"cuDNN accuracy: {cell.lower()} {dname} B{B} T{T} H{H} L{layers} proj {proj}, "
                              f"cudnn.allow_tf32 {torch.backends.cudnn.allow_tf32}: forward y "
                              f"|err|/|ref| {accuracy:.1e} against cuDNN in f64", flush=True)
                    torch.cuda.empty_cache()
    print(f"cudnn_rnn.py: done in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
