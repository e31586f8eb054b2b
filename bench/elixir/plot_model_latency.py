#!/usr/bin/env python3
"""Plots predict latency against T, native and pure, from the CSV that
bench/elixir/model_latency.exs --csv writes (T,path,median_ns,p10_ns,p90_ns).

    python3 bench/elixir/plot_model_latency.py model_latency.csv out.png [title]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    src, out = argv[1], argv[2]
    title = argv[3] if len(argv) > 3 else "2-layer MinGRU (256), B1: predict, all-in from Elixir"
    series = {}
    with open(src) as f:
        for row in csv.DictReader(f):
            s = series.setdefault(row["path"], ([], [], [], []))
            for column, key in zip(s, ("T", "median_ns", "p10_ns", "p90_ns")):
                column.append(float(row[key]) / (1 if key == "T" else 1e6))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (t, med, lo, hi) in sorted(series.items()):
        ax.plot(t, med, marker="o", label=f"{name} (median)")
        ax.fill_between(t, lo, hi, alpha=0.2)
    ax.axhline(16.67, color="grey", linestyle="--", linewidth=1, label="60 FPS frame (16.67 ms)")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="target at T = 32 (1 ms)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (frames of context)")
    ax.set_ylabel("latency per predict (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv)
