#!/usr/bin/env python3
"""cuDNN's GRU and LSTM through PyTorch: issue 30's peer, timed on the device.

What
----
For each cell (GRU, LSTM), dtype (f32, bf16), shape (B1 T32 H256, B1 T1 H256,
B32 T64 H256, B64 T256 H512) and depth (1 and 2 layers), with input size =
hidden size (so cuDNN's time includes the input projection, which ours
leaves to the caller):

  fwd_us       the median of CUDA events around one eager forward call
               (no_grad), PyTorch's own host work between the events
               included: what a PyTorch user pays
  fwd_graph    the median per replay of a CUDA graph of that forward: cuDNN's
               kernels alone, comparable with our graph-replayed figures
  fwdbwd_us    the median of CUDA events around one eager forward + backward

f32 runs with PyTorch's default cudnn.allow_tf32 (printed). The weights are
flattened first (un-flattened bf16 weights are copied every call).

How to run (on a CUDA machine with torch)
-----------------------------------------
    python3 bench/peers/cudnn_rnn.py [--small]

--small: batch 1 only. Ours come from the same machine in the same job:
`exphil_gpu_tests "gated RNN: timing"` (test/gpu/test_gated_rnn.cpp).
"""
import sys

import torch

torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
      "allow_tf32 (cudnn)", torch.backends.cudnn.allow_tf32, torch.cuda.get_device_name())
shapes = [(1, 32, 256), (1, 1, 256), (32, 64, 256), (64, 256, 512)]
if "--small" in sys.argv:
    shapes = [s for s in shapes if s[0] == 1]


def median_us(fn, reps):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    times.sort()
    return times[len(times) // 2]


def graph_us(fn, reps):
    """Median per replay of a CUDA graph of fn, or None where capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:
        print(f"  (capture failed: {str(e).splitlines()[0]})")
        return None
    return median_us(graph.replay, reps)


print(f"{'cell':5} {'dtype':5} {'shape':16} {'layers':6} {'fwd_us':>9} {'fwd_graph':>10} {'fwdbwd_us':>10}")
for cell in ("GRU", "LSTM"):
    for dtype in (torch.float32, torch.bfloat16):
        for (B, T, H) in shapes:
            for layers in (1, 2):
                m = getattr(torch.nn, cell)(H, H, num_layers=layers, batch_first=True).to(dev, dtype)
                m.flatten_parameters()
                x = torch.randn(B, T, H, device=dev, dtype=dtype)
                reps = 30 if B * T * H > 1_000_000 else 200

                def fwd():
                    with torch.no_grad():
                        m(x)

                xg = x.clone().requires_grad_(True)
                gy = torch.randn(B, T, H, device=dev, dtype=dtype)

                def fwd_bwd():
                    y, _ = m(xg)
                    y.backward(gy)

                f = median_us(fwd, reps)
                g = graph_us(fwd, reps)
                fb = median_us(fwd_bwd, reps)
                graphed = f"{g:10.1f}" if g is not None else f"{'n/a':>10}"
                print(f"{cell:5} {str(dtype)[6:]:5} {f'B{B} T{T} H{H}':16} {layers:6} {f:9.1f} {graphed} {fb:10.1f}",
                      flush=True)
