"""Host<->device copy speeds on this machine (the floor of uploads and downloads): pinned and
pageable, 82 MB up (80 000 x 256 f32) and 64 MB down (80 000 x 100 ids + distances), and a host
memcpy of the same size. Usage: python3 bench/gpu/copy_bw.py"""
import time

import numpy as np
import torch


def ev_ms(f, reps=5):
    ts = []
    for _ in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts[1:])[len(ts) // 2]


for mb in (82, 64):
    n = mb * 10**6 // 4
    dev = torch.empty(n, device="cuda")
    pin = torch.empty(n, pin_memory=True)
    page = torch.from_numpy(np.ones(n, dtype=np.float32))
    up_pin = ev_ms(lambda: dev.copy_(pin, non_blocking=True))
    up_page = ev_ms(lambda: dev.copy_(page))
    down_pin = ev_ms(lambda: pin.copy_(dev, non_blocking=True))
    down_page = ev_ms(lambda: page.copy_(dev))
    a, b = np.ones(n, dtype=np.float32), np.empty(n, dtype=np.float32)
    t = time.perf_counter()
    for _ in range(5):
        np.copyto(b, a)
    cp = (time.perf_counter() - t) / 5 * 1e3
    print(f"{mb} MB: up pinned {up_pin:.2f} ms ({mb / up_pin:.1f} GB/s), pageable {up_page:.2f} ms; "
          f"down pinned {down_pin:.2f} ms ({mb / down_pin:.1f} GB/s), pageable {down_page:.2f} ms; "
          f"host memcpy (1 thread) {cp:.2f} ms", flush=True)
