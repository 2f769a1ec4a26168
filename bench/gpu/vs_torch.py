"""Issue 3's bars on one GPU: the CUDA engine's fused kernels against PyTorch, same data.

For each case the script writes uniform [0, 1) float32 base and queries (numpy, fixed seed) to
SCRATCH/<case>/{base,queries}.npy, then runs, on those same values:
- PyTorch (crates/knn-cuda/bench/torch_peer.py --data): ‖q‖²+‖r‖²−2qrᵀ by torch.addmm, then
  topk, TF32 off, chunks of 1000 queries when the matrix exceeds 2³¹ entries; cdist(p=1)+topk
  for L1; CUDA events, median after warm-up;
- ours (the bench_cuda example, --data): CUDA events around all kernels of one `candidates`
  call of the fused method (its first-try width, as `search` uses), median after warm-up; the
  exact `search` wall time (upload, host floors, f64 re-rank) is printed beside it;
and prints ours, PyTorch, the ratio, the bar and the fraction of the FP32 floor
(2·nq·nb·d / 51 TFLOP/s).

Usage (GPU machine, repository root; bench_cuda from
`cargo build --release -p knn-cuda --example bench_cuda`, copied next to the packed binaries):
    python3 bench/gpu/vs_torch.py [--bench .gpu/bench_cuda] [--cases 1,2,3] [--scratch DIR]
"""
import argparse
import os
import re
import subprocess
import sys

import numpy as np

# name: (nb, nq, d, k, bar on L2, bar on L1 or None)
CASES = {
    "1": (16384, 4096, 128, 16, 4.0, 30.0),
    "2": (1_000_000, 10_000, 128, 100, 4.0, None),
    "3": (1_000_000, 10_000, 128, 1024, 3.0, None),
}
PEER = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "knn-cuda", "bench",
                    "torch_peer.py")


def write_data(dirname, nb, nq, d, seed):
    os.makedirs(dirname, exist_ok=True)
    for name, n, s in (("base", nb, seed), ("queries", nq, seed + 1)):
        path = os.path.join(dirname, f"{name}.npy")
        if not os.path.exists(path) or np.load(path, mmap_mode="r").shape != (n, d):
            rng = np.random.default_rng(s)
            np.save(path, rng.random((n, d), dtype=np.float32))


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stdout.write(p.stderr)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def number(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        raise SystemExit(f"no {what} in the output above")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=".gpu/bench_cuda")
    ap.add_argument("--cases", default="1,2,3")
    ap.add_argument("--scratch", default="/tmp/knn-vs-torch")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    rows = []
    for name in args.cases.split(","):
        nb, nq, d, k, bar, bar_l1 = CASES[name]
        data = os.path.join(args.scratch, f"{nb}x{nq}x{d}")
        write_data(data, nb, nq, d, seed=int(name) * 10)
        floor = 2.0 * nq * nb * d / 51e12 * 1e3
        peer = run([sys.executable, PEER, str(nb), str(nq), str(d), str(k), "--data", data])
        reps = args.repeat if nb * nq <= 1 << 31 else 5
        ours = run([args.bench, str(nb), str(nq), str(d), str(k), str(reps), "fused"]
                   + ([] if bar_l1 else ["l2"]) + ["--data", data])
        t_l2 = number(r"torch L2 addmm\+topk: ([0-9.]+) ms", peer, "PyTorch L2 time")
        o_l2 = number(r"sqeuclidean\s+fused: kernels\s+([0-9.]+) ms", ours, "our L2 kernel time")
        s_l2 = number(r"sqeuclidean\s+fused: kernels.*search\s+([0-9.]+) ms", ours, "our search")
        rows.append((f"{name}: {nb}x{nq}, d={d}, k={k}, L2", o_l2, s_l2, t_l2, bar, floor))
        if bar_l1:
            t_l1 = number(r"torch L1 cdist\+topk: ([0-9.]+) ms", peer, "PyTorch L1 time")
            o_l1 = number(r"l1\s+fused: kernels\s+([0-9.]+) ms", ours, "our L1 kernel time")
            s_l1 = number(r"l1\s+fused: kernels.*search\s+([0-9.]+) ms", ours, "our L1 search")
            rows.append((f"{name}: same, L1", o_l1, s_l1, t_l1, bar_l1, floor))
    print()
    print(f"{'case':<36} {'ours ms':>9} {'search ms':>10} {'torch ms':>9} {'ratio':>7} "
          f"{'bar':>5} {'% FP32 floor':>13}  verdict")
    failed = False
    for case, ours, search, torch_ms, bar, floor in rows:
        ratio = torch_ms / ours
        met = ratio >= bar
        failed |= not met
        print(f"{case:<36} {ours:9.3f} {search:10.3f} {torch_ms:9.3f} {ratio:6.2f}x {bar:4.0f}x "
              f"{100 * floor / ours:12.1f}%  {'met' if met else 'NOT met'}")
    print("(ours: kernels of one candidates call, CUDA events; search: the exact search's wall "
          "time; torch: addmm/cdist + topk on device-resident data)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
