#!/usr/bin/env python3
"""Grid engine vs scikit-learn's KDTree (and kiddo), same data, same machine, side by side.

Runs scikit-learn's KDTree (build + query, queries split over `--threads` threads: its query
releases the GIL) on the data `grid_vs_kiddo` generates (uniform [0,1]^3 from knn's SplitMix64
generator, reproduced bit-exactly here), then runs that example for our and kiddo's times and
prints the ratios. Median of `--runs` runs each.

    bench/.venv/bin/python bench/grid/sklearn_kdtree.py --log2n 20 --runs 3
"""

import argparse
import re
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from sklearn.neighbors import KDTree

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix_uniform(seed: int, count: int) -> np.ndarray:
    """knn_core::synth::Rng::uniform, `count` draws from `seed`, as f64."""
    s0 = np.uint64((seed ^ GOLDEN) & MASK)
    with np.errstate(over="ignore"):
        z = s0 + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def median_ms(runs, f):
    f()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2n", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--example", default="target/release/examples/grid_vs_kiddo")
    a = ap.parse_args()
    n = 1 << a.log2n
    allv = splitmix_uniform(1, 2 * n * 3).astype(np.float32).reshape(2 * n, 3)
    base, queries = allv[:n], allv[n:]
    parts = np.array_split(queries, a.threads)

    sk = {}
    for k in (1, 16):
        def run():
            tree = KDTree(base, leaf_size=40)
            with ThreadPoolExecutor(a.threads) as ex:
                list(ex.map(lambda q: tree.query(q, k=k), parts))
        sk[k] = median_ms(a.runs, run)

    out = subprocess.run(
        [a.example, str(a.log2n), str(a.runs), str(a.threads)],
        check=True, capture_output=True, text=True,
    ).stdout
    print(out)
    print(f"| uniform [0,1]^3, n = {n} | k | scikit-learn KDTree (build+query, {a.threads} threads) | grid search | ratio | grid raw | ratio |")
    print("|---|---|---|---|---|---|---|")
    for line in out.splitlines():
        m = re.match(r"\| uniform \[0,1\]\^3 \| (\d+) \| (\d+) \| (\d+) \| [^|]+\| (\d+) \|", line)
        if m:
            k, _kiddo, ours, raw = (int(x) for x in m.groups())
            print(f"| | {k} | {sk[k]:.0f} | {ours} | {sk[k] / ours:.2f}x | {raw} | {sk[k] / raw:.2f}x |")


if __name__ == "__main__":
    main()
