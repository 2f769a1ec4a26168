#!/usr/bin/env python3
"""knn-classify against scikit-learn's KNeighborsClassifier(algorithm="brute"), side by side on
the CPU, same data, same machine (issue 4's bars).

    bench/.venv/bin/python bench/classify/vs_sklearn.py                 # 200k x 20k, d=16, k=15
    bench/.venv/bin/python bench/classify/vs_sklearn.py --n 1000000 --m 100000 --no-sklearn \
        --modes batch,sequential                                         # the 1M x 100k bar

Data: labelled and new points uniform in [-100, 100] (float32, as the seed-003 generator), 10
classes uniform, numpy seed 0; written once to bench/out/classify-<n>-<m>-<d>/ as .npy. Ours:
the `classify_bench` example of crates/knn-classify (built here if missing), which reads the
files once and times `Classifier::classify` (median of --repeat runs). scikit-learn: fit +
predict on the same float32 arrays, timed once per repeat (median), all cores. Predictions are
compared point by point. Prints a table and writes bench/out/classify-results-<time>.json.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release" / "examples" / "classify_bench"


def data(n, m, d, classes, seed=0):
    out = ROOT / "bench" / "out" / f"classify-{n}-{m}-{d}-{classes}"
    files = [out / "train.npy", out / "labels.npy", out / "queries.npy"]
    if not all(f.exists() for f in files):
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        np.save(files[0], rng.uniform(-100, 100, size=(n, d)).astype(np.float32))
        np.save(files[1], rng.integers(0, classes, size=n).astype(np.int64))
        np.save(files[2], rng.uniform(-100, 100, size=(m, d)).astype(np.float32))
    return out, files


def ours(files, out, k, weights, mode, repeat, threads):
    pred, tj = out / f"ours-{k}-{weights}-{mode}.npy", out / f"ours-{k}-{weights}-{mode}.json"
    cmd = [str(BIN), "--train", str(files[0]), "--labels", str(files[1]), "--queries", str(files[2]),
           "-k", str(k), "--weights", weights, "--mode", mode, "--repeat", str(repeat),
           "--out", str(pred), "--timing-json", str(tj)]
    if threads:
        cmd += ["--threads", str(threads)]
    subprocess.run(cmd, check=True)
    t = json.loads(tj.read_text())
    return t["median_ms"] / 1e3, np.load(pred).ravel(), t.get("waves")


def sklearn_run(files, k, weights, repeat):
    from sklearn.neighbors import KNeighborsClassifier
    X, y, Q = (np.load(f) for f in files)
    times, pred = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        clf = KNeighborsClassifier(n_neighbors=k, weights=weights, algorithm="brute").fit(X, y)
        pred = clf.predict(Q)
        times.append(time.perf_counter() - t)
    return float(np.median(times)), pred


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="labelled points")
    ap.add_argument("--m", type=int, default=20_000, help="points to classify")
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--weights", default="uniform", help="uniform,distance (comma list)")
    ap.add_argument("--modes", default="batch", help="batch,sequential (ours; sklearn has batch only)")
    ap.add_argument("--repeat", type=int, default=3, help="our runs (median)")
    ap.add_argument("--sklearn-repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="our CPU threads (default: all)")
    ap.add_argument("--no-sklearn", action="store_true")
    a = ap.parse_args()
    if not BIN.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "knn-classify", "--example", "classify_bench"],
                       cwd=ROOT, check=True)
    out, files = data(a.n, a.m, a.d, a.classes)
    rows, ok = [], True
    print(f"{a.m} new x {a.n} labelled, d={a.d}, k={a.k}, {a.classes} classes; {os.cpu_count()} CPUs")
    for w in a.weights.split(","):
        sk_t, sk_pred = (None, None) if a.no_sklearn else sklearn_run(files, a.k, w, a.sklearn_repeat)
        for mode in a.modes.split(","):
            t, pred, waves = ours(files, out, a.k, w, mode, a.repeat, a.threads)
            same = None
            if sk_pred is not None and mode == "batch":
                same = int(np.sum(pred == sk_pred))
                ok &= same == len(pred)
            rows.append(dict(weights=w, mode=mode, ours_s=t, sklearn_s=sk_t if mode == "batch" else None,
                             ratio=(sk_t / t) if (sk_t and mode == "batch") else None,
                             identical=same, points=len(pred), waves=waves))
    print(f"{'weights':9} {'mode':11} {'sklearn s':>10} {'ours s':>8} {'ratio':>7} {'identical':>16} {'waves':>6}")
    for r in rows:
        sk = f"{r['sklearn_s']:.2f}" if r["sklearn_s"] else "-"
        ra = f"{r['ratio']:.1f}x" if r["ratio"] else "-"
        ident = f"{r['identical']}/{r['points']}" if r["identical"] is not None else "-"
        print(f"{r['weights']:9} {r['mode']:11} {sk:>10} {r['ours_s']:8.3f} {ra:>7} {ident:>16} {r['waves'] or '-':>6}")
    res = ROOT / "bench" / "out" / f"classify-results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    res.write_text(json.dumps(dict(args=vars(a), rows=rows), indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
