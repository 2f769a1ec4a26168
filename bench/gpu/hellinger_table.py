"""Seed 002's table on one GPU: kNN graph, Hellinger distance, random data, d = 256, k = 100,
n = 10 000 .. 80 000, side by side with PyTorch and with the seed's 2×GTX280 figures.

PyTorch (the issue's peer): data already on the GPU, sqrt transform, then for chunks of rows
‖a‖² + ‖b‖² − 2abᵀ (`torch.addmm`, TF32 off), the row's own point masked, `topk`; CUDA events,
median after warm-up; and "h2h": the same from the host array to host arrays (upload and download
timed too, as ours is). "ours GPU": the points as a PyTorch CUDA tensor, `knn.Index` of it built
once, `index.graph(k)` timed between CUDA events, the graph left in GPU memory: like for like
with the peer (see `ours_gpu_ms`). Ours: `knn graph --metric hellinger` end to end (host arrays in, host
results out, the exact f64 re-rank included), median of `--repeat` runs after the same two
warm-up runs PyTorch gets (the first run of a process loads modules and grows memory pools;
each run computes its whole graph: before 2a1be41 later runs reused the first run's lists),
same .npy file; with
`--metric-expr` too when the binary has it (same graph required, checked with cmp). Ours runs
with `--symmetric on` (each unordered pair computed once) and `--symmetric off` (every row
against every point), whose graphs must be the same bytes; the ratios are taken on the faster.

Usage (GPU machine, from the repository root):
    python3 bench/gpu/hellinger_table.py [--knn .gpu/knn] [--sizes 10000,20000,40000,80000]
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
import torch

SEED_2X_GTX280_S = {10000: 1.8, 20000: 5.7, 40000: 17.7, 80000: 68.6}
D, K = 256, 100


def torch_graph_ms(x_host, chunk=10000, reps=5, host=False):
    """Median ms of PyTorch's graph: data already on the GPU and results left there, or with
    `host`, from the host array to host arrays (upload and download timed too, as ours is)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    x_dev = torch.from_numpy(x_host).cuda()
    n = x_host.shape[0]

    def run():
        x = torch.from_numpy(x_host).cuda() if host else x_dev
        r = x.sqrt()
        rn = (r * r).sum(1)
        out = []
        for s in range(0, n, chunk):
            q = r[s:s + chunk]
            dist = torch.addmm(rn[s:s + chunk, None] + rn[None, :], q, r.t(), beta=1.0, alpha=-2.0)
            rows = torch.arange(q.shape[0], device=x.device)
            dist[rows, rows + s] = float("inf")
            out.append(torch.topk(dist, K, dim=1, largest=False))
        if host:
            return [(v.cpu().numpy(), i.cpu().numpy()) for v, i in out]
        return out

    for _ in range(2):
        run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


WARMUP = 2  # runs before the timed ones, for both (PyTorch's loop above does the same)


def ours_gpu_ms(x_host, reps, want):
    """Ours as the PyTorch peer runs: the points already on the GPU (a PyTorch tensor) and the
    graph left there. `knn.Index` of the tensor built once, outside the timing (it checks and
    prepares the points, the square roots included, and keeps them on the GPU); then
    `index.graph(K)` between CUDA events on the current stream, median of `reps` after WARMUP
    calls, each computing its whole graph anew. Also the one-off `knn.graph` of the tensor
    (the index's build timed too). Returns (graph ms, one-off ms, same graph as the CLI's
    files `want`)."""
    import knn

    x_dev = torch.from_numpy(x_host).cuda()
    index = knn.Index(x_dev, "hellinger", device="cuda")

    def timed(f):
        for _ in range(WARMUP):
            f()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = f()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return sorted(ts)[len(ts) // 2], out

    t_graph, (d, i) = timed(lambda: index.graph(K))
    t_once, _ = timed(lambda: knn.graph(x_dev, K, "hellinger", device="cuda"))
    assert d.is_cuda and i.is_cuda
    same = (np.array_equal(i.cpu().numpy(), np.load(want))
            and np.array_equal(d.cpu().numpy(), np.load(want[:-4] + ".dist.npy")))
    return t_graph, t_once, same


def ours_ms(knn, path, out, extra, reps):
    """Median ms of `reps` runs of ours after WARMUP runs in the same process (`--repeat`)."""
    timing = out + ".json"
    cmd = [knn, "graph", "-p", path, "-k", str(K), "--device", "cuda", "--repeat",
           str(reps + WARMUP),
           "--timing-json", timing, "-o", out, "--force", "--quiet"] + extra
    subprocess.run(cmd, check=True)
    with open(timing) as f:
        t = json.load(f)
    times = t["times_ms"]
    print(f"  ours {' '.join(extra)}: every run " + ", ".join(f"{x:.1f}" for x in times)
          + f" ms (the first {WARMUP} are warm-up)", flush=True)
    timed = sorted(times[WARMUP:])
    return timed[len(timed) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--knn", default=".gpu/knn")
    ap.add_argument("--sizes", default="10000,20000,40000,80000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-expr", action="store_true", help="skip the --metric-expr run")
    ap.add_argument("--symmetric", default="both", choices=["both", "on", "off", "auto"],
                    help="symmetric mode(s) of ours (both: on and off, same graph required)")
    ap.add_argument("--no-gpu-index", action="store_true",
                    help="skip ours on a PyTorch CUDA tensor (needs the knn package)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hellinger-")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; d={D}, k={K}, Hellinger")
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        x = np.random.default_rng(n).random((n, D), dtype=np.float32)
        path = os.path.join(tmp, f"x{n}.npy")
        np.save(path, x)
        t_torch = torch_graph_ms(x)
        t_torch_host = torch_graph_ms(x, host=True)
        modes = ["on", "off"] if args.symmetric == "both" else [args.symmetric]
        t_modes = {}
        for m in modes:
            mout = os.path.join(tmp, f"g{n}-{m}.npy")
            t_modes[m] = ours_ms(args.knn, path, mout, ["--metric", "hellinger", "--symmetric", m],
                                 args.repeat)
        out = os.path.join(tmp, f"g{n}-{modes[0]}.npy")
        if len(modes) == 2:
            other = os.path.join(tmp, f"g{n}-{modes[1]}.npy")
            sym_same = all(open(a, "rb").read() == open(b, "rb").read() for a, b in
                           [(out, other), (out[:-4] + ".dist.npy", other[:-4] + ".dist.npy")])
            print(f"n={n}: symmetric on {t_modes['on']:.1f} ms, off {t_modes['off']:.1f} ms "
                  f"(off/on {t_modes['off'] / t_modes['on']:.2f}x), same graph: {sym_same}",
                  flush=True)
        t_ours = min(t_modes.values())
        t_expr, same = None, None
        if not args.no_expr:
            eout = os.path.join(tmp, f"e{n}.npy")
            try:
                t_expr = ours_ms(args.knn, path, eout,
                                 ["--metric-expr", "acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)"],
                                 args.repeat)
                same = all(open(a, "rb").read() == open(b, "rb").read() for a, b in
                           [(out, eout), (out[:-4] + ".dist.npy", eout[:-4] + ".dist.npy")])
            except subprocess.CalledProcessError as e:
                print(f"--metric-expr run failed: {e}")
        t_gpu = None
        if not args.no_gpu_index:
            t_gpu, t_once, gpu_same = ours_gpu_ms(x, args.repeat, out)
            print(f"n={n}: ours on a CUDA tensor, index built once: graph {t_gpu:.2f} ms "
                  f"(PyTorch {t_torch:.2f} ms: {t_torch / t_gpu:.2f}x); one-off knn.graph "
                  f"(index built in the call) {t_once:.2f} ms ({t_torch / t_once:.2f}x); "
                  f"same graph as the CLI's: {gpu_same}", flush=True)
        rows.append((n, SEED_2X_GTX280_S[n] * 1e3 if n in SEED_2X_GTX280_S else None,
                     t_torch, t_torch_host, t_ours, t_expr, same, t_gpu))
    print(f"{'n':>6} | {'seed 2xGTX280':>13} | {'PyTorch':>9} | {'PyTorch h2h':>11} | {'ours':>9} |"
          f" {'PyTorch/ours':>12} | {'h2h/ours':>8} | {'ours GPU':>9} | {'PyTorch/GPU':>11} |"
          f" {'expr':>9} | {'expr/builtin':>12} | same graph")
    for n, seed, tt, th, to, te, same, tg in rows:
        tg_s = f"{tg:6.2f} ms" if tg else "-"
        ratio_g = f"{tt / tg:10.2f}x" if tg else "-"
        seed_s = f"{seed:10.0f} ms" if seed else "-"
        te_s = f"{te:6.1f} ms" if te else "-"
        ratio_e = f"{te / to:11.2f}x" if te else "-"
        print(f"{n:>6} | {seed_s:>13} | {tt:6.1f} ms | {th:8.1f} ms | {to:6.1f} ms | {tt / to:11.2f}x |"
              f" {th / to:7.2f}x | {tg_s:>9} | {ratio_g:>11} |"
              f" {te_s:>9} | {ratio_e:>12} | {same}")


if __name__ == "__main__":
    main()
