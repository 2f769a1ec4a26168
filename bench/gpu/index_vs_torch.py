"""Issue 20's index bars on one GPU: `knn::Index` built once and searched from host queries to
host results, against PyTorch holding the base on the GPU, same sizes, same call.

Ours: the `index_bench` example (`cargo build --release -p knn --example index_bench`, packed
next to the binaries as .gpu/index_bench): the index built once, then `search` timed from host
queries to host results (median after warm-up), and the one-off `Knn::search` beside it (the
answers must be equal).
PyTorch (TF32 off), uniform [0, 1) float32 data:
- resident: base and queries on the GPU, ‖q‖² + ‖r‖² − 2 q rᵀ by addmm, then topk (CUDA events);
- h2h: base on the GPU, queries uploaded per call, addmm + topk, ids and distances downloaded
  (wall time, synchronised): the queries in page-locked memory (PyTorch's best, the bar's
  peer), and again in pageable memory, as ours are in `index ms`. Ours from page-locked
  queries too (`pinned`), so that each form is compared like for like.
Small cases take 200 runs a side, larger ones 7 (medians after 3 warm-up calls).

Usage (GPU machine, repository root): python3 bench/gpu/index_vs_torch.py [--bench .gpu/index_bench] [--cases 1,2,3,4,5]
"""
import argparse
import re
import subprocess
import sys
import time

import torch

# name: (nb, nq, d, k, peer the bar is against, bar)
CASES = {
    "1": (16384, 4096, 128, 16, "h2h", 3.0),
    "2": (1_000_000, 10_000, 128, 100, "resident", 4.0),
    "3": (1_000_000, 10_000, 128, 1024, "resident", 3.0),
    "4": (1_000_000, 1, 128, 10, "h2h", 2.0),
    "5": (1_000_000, 100, 128, 10, "h2h", 3.0),
}


def torch_times(nb, nq, d, k, reps):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    r = torch.rand(nb, d, device="cuda", generator=g)
    q_host = torch.rand(nq, d, generator=torch.Generator().manual_seed(1)).pin_memory()
    rn = (r * r).sum(1)
    chunk = nq if nq * nb <= (1 << 31) else 1000

    def search(q):
        outs = []
        for s in range(0, nq, chunk):
            qq = q[s:s + chunk]
            qn = (qq * qq).sum(1, keepdim=True)
            dist = torch.addmm(qn + rn, qq, r.t(), beta=1.0, alpha=-2.0)
            outs.append(torch.topk(dist, k, dim=1, largest=False))
        return outs

    q_dev = q_host.cuda()
    for _ in range(3):
        search(q_dev)
    torch.cuda.synchronize()
    resident = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        search(q_dev)
        b.record()
        b.synchronize()
        resident.append(a.elapsed_time(b))

    med = lambda v: sorted(v)[len(v) // 2]

    def h2h_ms(q_from):
        def h2h():
            outs = search(q_from.cuda(non_blocking=True))
            return [(v.cpu(), i.cpu()) for v, i in outs]

        for _ in range(3):
            h2h()
        torch.cuda.synchronize()
        host = []
        for _ in range(reps):
            t = time.perf_counter()
            h2h()
            host.append((time.perf_counter() - t) * 1e3)
        return med(host)

    # Queries in page-locked memory (PyTorch's best), and in pageable memory as ours are.
    return med(resident), h2h_ms(q_host), h2h_ms(q_host.clone())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=".gpu/index_bench")
    ap.add_argument("--cases", default="1,2,3,4,5")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    rows = []
    for name in args.cases.split(","):
        nb, nq, d, k, peer, bar = CASES[name]
        # Small cases (under a millisecond a call): 200 runs a side, as 20 read 10-20 % high
        # on either side with the machine's early calls.
        reps = 200 if nq * nb <= (1 << 31) else 7
        cmd = [args.bench, str(nb), str(nq), str(d), str(k), str(reps), "--device", args.device]
        print("$ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(p.stdout + p.stderr)
        m = re.search(r"search median ([0-9.]+) ms.*one-off Knn::search ([0-9.]+) ms", p.stdout)
        if p.returncode != 0 or not m:
            raise SystemExit(f"index_bench failed ({p.returncode})")
        ours, one_off = float(m.group(1)), float(m.group(2))
        m = re.search(r"search_device median ([0-9.]+) ms", p.stdout)
        on_device = float(m.group(1)) if m else float("nan")
        m = re.search(r"pinned: search median ([0-9.]+) ms", p.stdout)
        pinned = float(m.group(1)) if m else float("nan")
        resident, h2h, h2h_pageable = torch_times(nb, nq, d, k, reps)
        print(f"torch: resident {resident:.3f} ms, h2h {h2h:.3f} ms (page-locked queries), "
              f"{h2h_pageable:.3f} ms (pageable queries)", flush=True)
        rows.append((name, nb, nq, d, k, ours, one_off, on_device, pinned, resident, h2h,
                     h2h_pageable, peer, bar))
    print()
    print(f"{'case':<34} {'index ms':>9} {'one-off':>9} {'device':>8} {'pinned':>8} "
          f"{'torch res':>10} {'torch h2h':>10} {'h2h pg':>8} {'ratio':>7} {'bar':>9}  verdict   "
          f"{'like':>7} {'pinned':>7} {'dev/res':>7}")
    for (name, nb, nq, d, k, ours, one_off, on_device, pinned, resident, h2h, h2h_pageable,
         peer, bar) in rows:
        ratio = (h2h if peer == "h2h" else resident) / ours
        print(f"{name}: {nb}x{nq} d={d} k={k:<5} {ours:9.3f} {one_off:9.3f} {on_device:8.3f} "
              f"{pinned:8.3f} {resident:10.3f} {h2h:10.3f} {h2h_pageable:8.3f} {ratio:6.2f}x "
              f"{bar:3.0f}x {peer:<4}  {'met' if ratio >= bar else 'NOT met':<8}  "
              f"{h2h_pageable / ours:6.2f}x {h2h / pinned:6.2f}x {resident / on_device:6.2f}x")
    print("(index: our index search, host queries (pageable) to host results; one-off: "
          "Knn::search of the same data; device: Index::search_device, queries and results in "
          "GPU memory; pinned: our index search of the queries in page-locked host memory; torch "
          "res: data on the GPU; torch h2h: base on the GPU, queries up (from page-locked memory) "
          "and results down per call; h2h pg: the same from pageable memory; ratio: the bar's, "
          "torch h2h (or res) / index; like: both sides' queries pageable (h2h pg / index); "
          "pinned: both page-locked (torch h2h / pinned); dev/res: torch res / device, case 1's "
          "bar is 4x)")


if __name__ == "__main__":
    main()
