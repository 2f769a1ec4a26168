"""PyTorch peer for the CUDA engine's bench: ‖q‖²+‖r‖²−2qrᵀ via torch.addmm then topk (TF32
off), and torch.cdist(p=1)+topk for L1; CUDA events, median after warm-up.
Usage: python3 bench/torch_peer.py [nb nq d k] [--data DIR]
(--data: base and queries from DIR/base.npy and DIR/queries.npy, as bench_cuda --data reads
them; their shapes replace nb, nq and d.)"""
import sys
import torch

argv = sys.argv[1:]
data = None
if "--data" in argv:
    i = argv.index("--data")
    data = argv[i + 1]
    argv = argv[:i] + argv[i + 2:]
nb, nq, d, k = (int(x) for x in (argv[0:4] if len(argv) >= 4 else (16384, 4096, 128, 16)))
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if data:
    import numpy as np
    r = torch.from_numpy(np.load(f"{data}/base.npy")).float().cuda()
    q = torch.from_numpy(np.load(f"{data}/queries.npy")).float().cuda()
    (nb, d), nq = r.shape, q.shape[0]
else:
    g = torch.Generator(device="cuda").manual_seed(0)
    r = torch.rand(nb, d, device="cuda", generator=g)
    q = torch.rand(nq, d, device="cuda", generator=g)


CHUNK = nq if nq * nb <= (1 << 31) else 1000  # queries per addmm (chunked for large cases)


def l2():
    rn = (r * r).sum(1)
    out = []
    for s in range(0, nq, CHUNK):
        qq = q[s:s + CHUNK]
        qn = (qq * qq).sum(1, keepdim=True)
        dist = torch.addmm(qn + rn, qq, r.t(), beta=1.0, alpha=-2.0)
        out.append(torch.topk(dist, k, dim=1, largest=False))
    return out


def l1():
    return torch.topk(torch.cdist(q, r, p=1), k, dim=1, largest=False)


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


floor = 2.0 * nq * nb * d / 51e12 * 1e3
print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: nb={nb} nq={nq} d={d} k={k}")
t = timed(l2, reps=20 if CHUNK == nq else 3, warm=3 if CHUNK == nq else 1)
print(f"torch L2 addmm+topk: {t:.3f} ms ({100 * floor / t:.1f}% of FP32 floor {floor:.3f} ms)")
if CHUNK == nq:
    t = timed(l1, reps=5, warm=1)
    print(f"torch L1 cdist+topk: {t:.3f} ms")
