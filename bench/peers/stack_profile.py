#!/usr/bin/env python3
"""Where one synchronous call of issue 7's stack spends its time: JAX's
profiler (CUPTI on the device, XLA's annotations on the host), call by call.

stack_jax.py gives each variant's latency; this splits it. Every timed call
is wrapped in a host annotation `exphil_call/<dtype>/<variant>`; inside
that window the trace holds the device's activity (kernels and copies, on
the host's clock) and the host threads' events (JAX's dispatch, XLA's
thunks and command buffers, the driver calls CUPTI records). Per call:

    call          the annotation's length (the profiler adds some cost: the
                  untraced median of the same calls is printed beside it)
    to first      annotation start -> first device activity of the call:
                  host dispatch up to the first kernel's start
    span          first device activity -> last one's end
    busy          union of the device activities' intervals (span - busy is
                  the device idle between them: launch gaps)
    ours          the union of our kernels' intervals (names holding
                  "exphil")
    after last    last device activity's end -> annotation end: the host
                  noticing completion and returning the result

and, for the host, every event name's time inside the window (clipped to
it; nested events are listed separately, so the rows overlap), median over
calls, the largest first.

Run (GPU machine with jax + the CUDA plugin; the FFI library built):

    python3 bench/peers/stack_profile.py [--lib ...] [--calls 200]
           [--dtypes f32,bf16] [--variants ffi,ffi-c,noscan,cell-c,floor,floor-c]
           [--json out.json]

XLA_FLAGS is read as JAX starts, so run the script once per flag set to
compare XLA configurations (it prints the flags it ran under).

Exit status 0 if the trace was taken and every variant's calls were found in
it with device activity; 1 otherwise.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import jax  # noqa: E402

import exphil_jax  # noqa: E402
import stack_jax as sj  # noqa: E402

CALL_PREFIX = "exphil_call/"
OUR_KERNEL_MARK = "exphil"


def build_candidates(dn, args):
    """{variant: (jitted fn, args)} for one dtype, as stack_jax builds them."""
    dtype = sj.DTYPES[dn]
    params = sj.init_params(args.seed, args.embed, args.hidden, args.layers, dtype)
    x, _ = sj.make_inputs(args.seed, args.batch, args.seq, args.embed, args.hidden, dtype)
    return sj.candidate_inferences(params, x, args.variants)


def traced_calls(cands, dn, calls, rounds=10):
    """Synchronous calls, each in its own annotation, variants interleaved
    in rounds as stack_jax times them."""
    per_round = max(1, calls // rounds)
    with sj.NoGC():
        for _ in range(rounds):
            for v, (fn, a) in cands.items():
                name = f"{CALL_PREFIX}{dn}/{v}"
                for _ in range(per_round):
                    with jax.profiler.TraceAnnotation(name):
                        sj.block_ready(fn(*a))


# ---------------------------------------------------------------------------
# Reading the trace
# ---------------------------------------------------------------------------
def read_trace(trace_dir):
    """(calls, device, host, device line names): calls = [(name, start,
    end)], device = sorted [(start, end, name)], host = [(start, end, name,
    thread)], times in ns on the host's clock."""
    files = sorted(Path(trace_dir).glob("**/*.xplane.pb"))
    if not files:
        raise RuntimeError(f"no .xplane.pb under {trace_dir}: the profiler wrote no trace")
    pd = jax.profiler.ProfileData.from_file(str(files[-1]))
    calls, device, host, device_lines = [], [], [], set()
    for plane in pd.planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                device_lines.add(line.name)
                for ev in line.events:
                    device.append((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name, line.name))
        elif plane.name.startswith("/host:"):
            for line in plane.lines:
                for ev in line.events:
                    span = (ev.start_ns, ev.start_ns + ev.duration_ns)
                    if ev.name.startswith(CALL_PREFIX):
                        calls.append((ev.name[len(CALL_PREFIX):],) + span)
                    else:
                        host.append(span + (ev.name, f"{plane.name}:{line.name}"))
    return calls, device, host, device_lines


def pick_stream_lines(device_lines):
    """The device lines that hold activities: XLA's trace has one line per
    stream ("Stream #..."), beside derived lines (modules, ops) that would
    count the same time twice."""
    streams = {n for n in device_lines if n.lower().startswith("stream")}
    return streams or set(device_lines)


def union_length(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def analyse(calls, device, host, stream_lines):
    device = sorted(d for d in device if d[3] in stream_lines)
    starts = [d[0] for d in device]
    host = sorted(host)
    host_starts = [h[0] for h in host]
    per_variant = {}
    for name, s, e in calls:
        lo, hi = bisect.bisect_left(starts, s), bisect.bisect_right(starts, e)
        acts = device[lo:hi]
        row = {"call": e - s, "n_device": len(acts)}
        if acts:
            first, last = acts[0][0], max(a[1] for a in acts)
            row.update({"to_first": first - s, "span": last - first, "after_last": e - last,
                        "busy": union_length([(a[0], a[1]) for a in acts]),
                        "ours": union_length([(a[0], a[1]) for a in acts if OUR_KERNEL_MARK in a[2]]),
                        "kernels": [a[2] for a in acts],
                        "durations": [a[1] - a[0] for a in acts]})
        # Host events overlapping the window; a long event that began before
        # it is found by scanning back a bounded distance.
        times = {}
        j = bisect.bisect_left(host_starts, s - 50_000_000)
        k = bisect.bisect_right(host_starts, e)
        for hs, he, hn, _ in host[j:k]:
            clipped = min(he, e) - max(hs, s)
            if clipped > 0:
                times[hn] = times.get(hn, 0) + clipped
        row["host"] = times
        per_variant.setdefault(name, []).append(row)
    return per_variant


def median_us(rows, key):
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) / 1e3 if vals else float("nan")


def summarize(per_variant, untraced, top):
    out = {}
    for name, rows in per_variant.items():
        host_names = {n for r in rows for n in r["host"]}
        host_med = {n: statistics.median([r["host"].get(n, 0) for r in rows]) / 1e3 for n in host_names}
        kernel_sets = {}
        for r in rows:
            key = tuple(r.get("kernels", ()))
            kernel_sets[key] = kernel_sets.get(key, 0) + 1
        common = max(kernel_sets.items(), key=lambda kv: kv[1])[0] if kernel_sets else ()
        # Each activity's median length, over the calls that ran that sequence.
        same = [r["durations"] for r in rows if tuple(r.get("kernels", ())) == common]
        lengths = [statistics.median(d[i] for d in same) / 1e3 for i in range(len(common))] if same else []
        out[name] = {
            "calls": len(rows), "untraced_median_us": untraced.get(name),
            **{f"{k}_us": median_us(rows, k)
               for k in ("call", "to_first", "span", "busy", "ours", "after_last")},
            "device_activities": statistics.median([r["n_device"] for r in rows]),
            "calls_without_device_activity": sum(1 for r in rows if not r["n_device"]),
            "host_top_us": sorted(host_med.items(), key=lambda kv: -kv[1])[:top],
            "common_kernel_sequence": [{"name": n, "median_us": t} for n, t in zip(common, lengths)],
            "calls_with_that_sequence": kernel_sets.get(common, 0),
        }
    return out


def print_summary(summary):
    cols = ("untraced", "call", "to_first", "span", "busy", "ours", "after_last")
    print(f"\n{'dtype/variant':16} " + " ".join(f"{c:>10}" for c in cols) + "  activities")
    for name, s in summary.items():
        vals = [s["untraced_median_us"]] + [s[f"{c}_us"] for c in cols[1:]]
        print(f"{name:16} " + " ".join(f"{v:10.1f}" if v is not None else f"{'-':>10}" for v in vals)
              + f"  {s['device_activities']:g}")
    for name, s in summary.items():
        print(f"\n-- {name}: host events inside the call (median us per call; nested rows overlap)")
        for hn, t in s["host_top_us"]:
            print(f"   {t:8.1f}  {hn[:150]}")
        print(f"   device activities ({s['calls_with_that_sequence']} of {s['calls']} calls in this order):")
        for k in s["common_kernel_sequence"]:
            print(f"      {k['median_us']:6.2f} us  {k['name'][:140]}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=None)
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--variants", default="ffi,ffi-c,noscan,cell-c,floor,floor-c")
    p.add_argument("--calls", type=int, default=200, help="traced calls per variant")
    p.add_argument("--warmup-s", type=float, default=0.3)
    p.add_argument("--top", type=int, default=25, help="host event names listed per variant")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--precision", choices=sorted(sj.PRECISIONS), default="highest")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [d for d in a.dtypes if d not in sj.DTYPES] + [v for v in a.variants if v not in sj.CANDIDATE_NAMES]
    if bad:
        p.error(f"unknown dtypes or variants {bad} (dtypes {list(sj.DTYPES)}, variants {sj.CANDIDATE_NAMES})")
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "little") % 1_000_000
    return a


def main(argv=None):
    args = parse_args(argv)
    sj.DENSE_PRECISION, sj.TOL["f32"] = sj.PRECISIONS[args.precision]
    dev = jax.devices()[0]
    print(f"stack_profile: jax {jax.__version__}, device {dev.platform}:{dev.device_kind}, python "
          f"{platform.python_version()}, seed {args.seed}, dense precision {args.precision}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    exphil_jax.load(args.lib)
    cands, untraced = {}, {}
    for dn in args.dtypes:
        c = build_candidates(dn, args)
        lat = sj.time_latency(c, args.calls, 3.0, args.warmup_s)
        for v in c:
            untraced[f"{dn}/{v}"] = sj.us(lat[v]["median_s"])
        cands[dn] = c
    trace_dir = tempfile.mkdtemp(prefix="exphil_stack_trace_")
    jax.profiler.start_trace(trace_dir)
    try:
        for dn, c in cands.items():
            traced_calls(c, dn, args.calls)
    finally:
        jax.profiler.stop_trace()
    t0 = time.perf_counter()
    calls, device, host, device_lines = read_trace(trace_dir)
    stream_lines = pick_stream_lines(device_lines)
    print(f"trace {trace_dir}: {len(calls)} calls, {len(device)} device activities, {len(host)} host "
          f"events, read in {time.perf_counter() - t0:.1f} s; device lines {sorted(device_lines)}, "
          f"counted {sorted(stream_lines)}")
    summary = summarize(analyse(calls, device, host, stream_lines), untraced, args.top)
    print_summary(summary)
    failures = [f"{n}: {s['calls_without_device_activity']} of {s['calls']} calls had no device activity"
                for n, s in summary.items() if s["calls_without_device_activity"]]
    expected = {f"{dn}/{v}" for dn in args.dtypes for v in args.variants}
    failures += [f"{n}: no traced calls found" for n in sorted(expected - summary.keys())]
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"jax": jax.__version__, "device": dev.device_kind, "seed": args.seed,
             "xla_flags": os.environ.get("XLA_FLAGS", ""), "precision": args.precision,
             "summary": summary, "failures": failures}, indent=1))
    print(f"\n{len(failures)} failure(s)" + "".join(f"\n  - {f}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
