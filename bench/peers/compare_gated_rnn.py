#!/usr/bin/env python3
"""Issue 30's table: exphil_bench's gated_rnn rows against cudnn_rnn.py's, from
one run on one GPU (bench/run_gated_rnn.sh makes both files).

    python3 bench/peers/compare_gated_rnn.py OURS.txt CUDNN.txt

Pairs (same cell, dtype, shape, layers and direction):
  ours "proj yes"  with cuDNN "yes"  (both include every layer's input projection)
  ours "proj no"   with cuDNN "in1"  (1 layer: the kernels alone against cuDNN
                                      with input size 1, its projection negligible)
  ours "proj stk"  with cuDNN "yes"  (2 layers at B <= 4: the stacked ops,
                                      the forward's layers in one launch,
                                      then the stacked backward)
and prints, like for like, eager against eager (events around one call, host
work included) and graph against graph (graph replay, device work alone):
x = cuDNN's time / ours (above 1: ours is faster).

Issue 30's targets (judged on the "proj yes" pairs, and on "stk" where it ran):
  B1 T32 H256, 2 layers: forward >= 10x cuDNN, forward + backward >= 5x
  B32 T64 H256 and B64 T256 H512, 1 and 2 layers, both directions: >= 1x
Each is judged on both pairings: MET (both), EAGER or GRAPH (only that
pairing meets it), MISSED (neither).
"""
import re
import sys

ROW = re.compile(r"^(\w+)\s+(f32|bf16)\s+(B\d+ T\d+ H\d+)\s+(\d)\s+(yes|no|in1|stk)\s+(fwd\+bwd|fwd)\s+(.*)$")


def number(s):
    try:
        return float(s)
    except ValueError:
        return None


def parse(path, ours):
    rows, header, notes = {}, [], []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = ROW.match(line)
            if not m:
                if line.startswith(("exphil_bench", "copy bandwidth", "cudnn_rnn.py", "f32 FMA rate",
                                    "cuDNN accuracy")):
                    header.append(line)
                if "validation" in line and ("FAIL" in line or "validation pass" in line):
                    notes.append(line)
                continue
            cell, dtype, shape, layers, proj, direction, rest = m.groups()
            f_ = rest.split()
            if ours:  # layout events graph floor bound x_floor host stepwise speedup
                rec = {"eager": number(f_[1]), "graph": number(f_[2]), "floor": number(f_[3]),
                       "bound": f_[4], "stepwise": number(f_[7]) if len(f_) > 7 else None}
            else:  # eager graph sets
                rec = {"eager": number(f_[0]), "graph": number(f_[1])}
            rows[(cell, dtype, shape, int(layers), proj, direction)] = rec
    return rows, header, notes


def ratio(peer, ours):
    return peer / ours if peer and ours else None


def fmt_x(x):
    return f"{x:7.2f}x" if x is not None else f"{'n/a':>8}"


def fmt_us(v):
    return f"{v:10.1f}" if v is not None else f"{'n/a':>10}"


def target(key):
    """Issue 30's ratio for this 'proj yes' pair, or None."""
    cell, dtype, shape, layers, proj, direction = key
    if proj not in ("yes", "stk"):
        return None
    if shape == "B1 T32 H256" and layers == 2:
        return 10.0 if direction == "fwd" else 5.0
    if shape in ("B32 T64 H256", "B64 T256 H512"):
        return 1.0
    return None


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    ours, ours_header, notes = parse(argv[1], True)
    peer, peer_header, _ = parse(argv[2], False)
    print("\n== issue 30: exphil (ours) against cuDNN through PyTorch, one run ==")
    for line in ours_header + peer_header:
        print(line)
    failed = [n for n in notes if "FAIL" in n]
    print(f"our validation: {len(notes) - len(failed)} shapes pass, {len(failed)} fail")
    for n in failed:
        print("  " + n)
    print("x = cuDNN / ours (> 1: ours faster); target: issue 30's ratio, judged eager/eager and graph/graph")
    print(f"{'cell':5} {'dtype':5} {'shape':14} {'L':>2} {'proj':7} {'dir':8} {'ours_eager':>10} "
          f"{'cudnn_eager':>11} {'x_eager':>8} {'ours_graph':>10} {'cudnn_graph':>11} {'x_graph':>8} "
          f"{'floor':>8} {'target':>7}")
    verdicts = []
    for key, o in ours.items():
        cell, dtype, shape, layers, proj, direction = key
        peer_proj = "in1" if proj == "no" else "yes"
        p = peer.get((cell, dtype, shape, layers, peer_proj, direction))
        if p is None:
            continue  # ours without a cuDNN pair (2 layers without projection)
        xe, xg = ratio(p["eager"], o["eager"]), ratio(p["graph"], o["graph"])
        want = target(key)
        mark = ""
        if want is not None:
            ok_e = xe is not None and xe >= want
            ok_g = xg is not None and xg >= want
            status = "MET" if ok_e and ok_g else "EAGER" if ok_e else "GRAPH" if ok_g else "MISSED"
            mark = f">={want:g}x"
            how = " (stacked, 1 launch)" if proj == "stk" else ""
            verdicts.append((status, f"{cell} {dtype} {shape} L{layers} {direction}{how} >= {want:g}x cuDNN: "
                                     f"eager {fmt_x(xe).strip()}, graph {fmt_x(xg).strip()}"))
        print(f"{cell:5} {dtype:5} {shape:14} {layers:2d} {proj + '/' + peer_proj:7} {direction:8} "
              f"{fmt_us(o['eager'])} {fmt_us(p['eager']):>11} {fmt_x(xe)} {fmt_us(o['graph'])} "
              f"{fmt_us(p['graph']):>11} {fmt_x(xg)} {o['floor'] or 0:8.1f} {mark:>7}")
    print("\n== issue 30's targets (MET: eager/eager and graph/graph; EAGER / GRAPH: that pairing only) ==")
    for status, text in verdicts:
        print(f"{status:7} {text}")
    counts = {s: sum(1 for v, _ in verdicts if v == s) for s in ("MET", "EAGER", "GRAPH", "MISSED")}
    print("summary: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
