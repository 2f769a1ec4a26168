#!/usr/bin/env python3
"""Side-by-side CPU benchmark: our `knn` binary against FAISS (faiss-cpu from PyPI).

Same machine, same data files, same thread count, median of repeated runs after a warm-up.
Cases are the CPU-engine bars of issue 2:

  a  16384 base x 4096 queries, d=128, k=16, L2   bar: ours >= 1.5x faster than IndexFlatL2
  b  100000 base x 1000 queries, d=128, k=10, L2  bar: ours >= 1.2x faster than IndexFlatL2
  c  case a with L1                               bar: ours >= 2x faster than IndexFlat(METRIC_L1)
  d  (--memory) peak RSS of our binary on 1e6 base x 1e4 queries, d=128, k=100:
     at most inputs + output + 256 MiB

The script bootstraps its own virtualenv (bench/.venv) with pinned faiss-cpu, numpy,
scikit-learn and threadpoolctl, then re-executes itself inside it with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE removed from the environment (both slow current numpy/OpenBLAS when set).
See bench/README.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENV = HERE / ".venv"
OUT_DIR = HERE / "out"

# Versions that install and were measured on the 2-core Zen 4 development machine (Python 3.11).
PINS = [
    "faiss-cpu==1.15.1",
    "numpy==2.4.6",
    "scikit-learn==1.9.1",
    "threadpoolctl==3.8.0",
]
# Environment variables that change which OpenBLAS kernel is used or how it blocks; removed for
# the peer runs so the comparison is against FAISS/numpy as they behave by default.
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
REEXEC_MARK = "KNN_BENCH_IN_VENV"
UNSET_NOTE = "KNN_BENCH_UNSET"


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def _bootstrap() -> None:
    """Create bench/.venv, install the pins if missing, re-exec inside it with a clean env."""
    py = _venv_python()
    if os.environ.get(REEXEC_MARK) == "1" and Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not py.exists():
        print(f"[bench] creating virtualenv {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    check = subprocess.run(
        [str(py), "-c", "import faiss, numpy, sklearn, threadpoolctl"],
        capture_output=True,
    )
    if check.returncode != 0:
        print(f"[bench] installing {' '.join(PINS)} into {VENV}", file=sys.stderr)
        subprocess.run(
            [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS],
            check=True,
        )
    env = dict(os.environ)
    removed = [f"{v}={env.pop(v)}" for v in OPENBLAS_VARS if v in env]
    env[REEXEC_MARK] = "1"
    env[UNSET_NOTE] = ";".join(removed)
    os.execve(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]], env)


if __name__ == "__main__":
    _bootstrap()
    # Also when run directly with the venv's python: OpenBLAS reads these at load time, so they
    # must go before numpy/faiss are imported (os.environ changes reach getenv via putenv).
    _removed = [f"{v}={os.environ.pop(v)}" for v in OPENBLAS_VARS if v in os.environ]
    if _removed:
        os.environ[UNSET_NOTE] = ";".join(
            [s for s in (os.environ.get(UNSET_NOTE, ""),) if s] + _removed
        )

# ---- everything below runs inside bench/.venv --------------------------------------------------

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

THREADS = 2  # set from --threads in main(); this machine has 2 cores
MIB = 1 << 20


class Case:
    def __init__(self, name, nb, nq, d, k, metric, bar, seed, what):
        self.name, self.nb, self.nq, self.d, self.k = name, nb, nq, d, k
        self.metric, self.bar, self.seed, self.what = metric, bar, seed, what


def make_cases(quick: bool) -> dict[str, Case]:
    if quick:
        return {
            "a": Case("a", 2048, 512, 128, 16, "l2", 1.5, 1, "quick a: 2048x512 d128 k16 L2"),
            "b": Case("b", 10000, 100, 128, 10, "l2", 1.2, 2, "quick b: 10000x100 d128 k10 L2"),
            "c": Case("c", 2048, 512, 128, 16, "l1", 2.0, 1, "quick c: 2048x512 d128 k16 L1"),
            "d": Case("d", 100000, 1000, 128, 100, "l2", None, 4, "quick d: 1e5x1e3 d128 k100"),
        }
    return {
        "a": Case("a", 16384, 4096, 128, 16, "l2", 1.5, 1, "16384x4096 d128 k16 L2"),
        "b": Case("b", 100000, 1000, 128, 10, "l2", 1.2, 2, "100000x1000 d128 k10 L2"),
        "c": Case("c", 16384, 4096, 128, 16, "l1", 2.0, 1, "16384x4096 d128 k16 L1"),
        "d": Case("d", 1000000, 10000, 128, 100, "l2", None, 4, "1e6x1e4 d128 k100 memory"),
    }


# ---- environment report ------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def blas_report() -> list[str]:
    from threadpoolctl import threadpool_info

    lines = []
    for info in threadpool_info():
        if info.get("internal_api") != "openblas":
            continue
        path = info.get("filepath", "")
        owner = "faiss" if "faiss" in path else ("numpy" if "numpy" in path else path)
        lines.append(
            f"OpenBLAS used by {owner}: version {info.get('version')}, kernel "
            f"'{info.get('architecture')}', threading {info.get('threading_layer')}, "
            f"{info.get('num_threads')} threads"
        )
    return lines or ["no OpenBLAS found by threadpoolctl"]


# ---- hardware peak -----------------------------------------------------------------------------

CLOCK_PROBE_C = r"""
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(void){
  double best=0;
  for(int rep=0;rep<5;rep++){
    unsigned long x=0, n=50000000UL; double t0=now();
    for(unsigned long i=0;i<n;i++){
      __asm__ volatile(
        "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
        "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
        "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
        "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t" : "+r"(x));
    }
    double ghz=20.0*n/(now()-t0)/1e9; if(ghz>best)best=ghz;
  }
  printf("%.3f\n",best); return 0;
}
"""


def measure_clock_ghz() -> float | None:
    """Core clock from a chain of dependent integer adds (1 cycle each); needs gcc."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc or platform.machine() not in ("x86_64", "AMD64"):
        return None
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    src, exe = OUT_DIR / "clockprobe.c", OUT_DIR / "clockprobe"
    src.write_text(CLOCK_PROBE_C)
    try:
        subprocess.run([cc, "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        return float(out.strip())
    except (subprocess.CalledProcessError, ValueError, OSError):
        return None


def fp32_flops_per_cycle_per_core() -> tuple[int, str]:
    flags = ""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        pass
    vendor_amd = "AuthenticAMD" in flags
    avx512 = " avx512f " in flags
    if vendor_amd and avx512:
        # Zen 4: two 256-bit FMA pipes (AVX-512 is double-pumped): 2 x 8 lanes x 2 flops.
        return 32, "Zen 4: 2 FMA pipes x 256 bit (AVX-512 double-pumped) = 32 FP32 flop/cycle/core"
    if avx512:
        return 64, "AVX-512 with 2 x 512-bit FMA = 64 FP32 flop/cycle/core (assumed)"
    if " fma " in flags:
        return 32, "AVX2: 2 x 256-bit FMA = 32 FP32 flop/cycle/core"
    return 8, "SSE (assumed)"


def measure_gemm_peak(np) -> float:
    """numpy/OpenBLAS sgemm 4096^3, 2 threads, one warm-up then best of 3: GFLOP/s."""
    from threadpoolctl import threadpool_limits

    n = 4096
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    best = float("inf")
    with threadpool_limits(limits=THREADS, user_api="blas"):
        np.matmul(a, b, out=c)  # warm-up
        for _ in range(3):
            t0 = time.perf_counter()
            np.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


# ---- data --------------------------------------------------------------------------------------


def case_files(np, case: Case) -> tuple[Path, Path]:
    """Uniform [0,1) float32 base and queries from a fixed seed, written as .npy (cached)."""
    d = OUT_DIR / f"data-{case.nb}x{case.nq}x{case.d}-s{case.seed}"
    d.mkdir(parents=True, exist_ok=True)
    base, queries, meta = d / "base.npy", d / "queries.npy", d / "meta.json"
    want = {"nb": case.nb, "nq": case.nq, "d": case.d, "seed": case.seed, "gen": "uniform01-f32-v1"}
    if meta.exists() and base.exists() and queries.exists():
        try:
            if json.loads(meta.read_text()) == want:
                return base, queries
        except ValueError:
            pass
    rng = np.random.default_rng(case.seed)
    xb = rng.random((case.nb, case.d), dtype=np.float32)
    xq = rng.random((case.nq, case.d), dtype=np.float32)
    np.save(base, xb)
    np.save(queries, xq)
    meta.write_text(json.dumps(want))
    return base, queries


# ---- FAISS -------------------------------------------------------------------------------------


def run_faiss(faiss, np, xb, xq, k, metric, repeat):
    d = xb.shape[1]
    index = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlat(d, faiss.METRIC_L1)
    index.add(xb)
    from threadpoolctl import threadpool_limits

    times = []
    with threadpool_limits(limits=THREADS):  # FAISS's own OpenBLAS and OpenMP
        index.search(xq, k)  # warm-up
        for _ in range(repeat):
            t0 = time.perf_counter()
            dist, ids = index.search(xq, k)
            times.append((time.perf_counter() - t0) * 1e3)
    return times, dist, ids


def run_sklearn(np, xb, xq, k, metric, repeat):
    from sklearn.neighbors import NearestNeighbors
    from threadpoolctl import threadpool_limits

    nn = NearestNeighbors(
        n_neighbors=k,
        algorithm="brute",
        metric="euclidean" if metric == "l2" else "manhattan",
        n_jobs=THREADS,
    ).fit(xb)
    times = []
    with threadpool_limits(limits=THREADS, user_api="blas"):
        nn.kneighbors(xq)
        for _ in range(repeat):
            t0 = time.perf_counter()
            nn.kneighbors(xq)
            times.append((time.perf_counter() - t0) * 1e3)
    return times


# ---- our binary --------------------------------------------------------------------------------


def ensure_binary(args) -> tuple[Path | None, str]:
    knn = Path(args.knn)
    if not knn.is_absolute():
        knn = (REPO / knn).resolve()
    if knn.exists():
        return knn, f"using {knn}"
    if args.no_build or Path(args.knn) != Path("target/release/knn"):
        return None, f"OUR SIDE NOT RUN: binary {knn} not found"
    cmd = ["cargo", "build", "--release", "-p", args.cli_package]
    print(f"[bench] {knn} missing; running: {' '.join(cmd)}", file=sys.stderr)
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0 or not knn.exists():
        tail = (r.stderr or "").strip().splitlines()[-3:]
        return None, (
            f"OUR SIDE NOT RUN: `{' '.join(cmd)}` failed or made no {knn} "
            f"({' | '.join(tail)})"
        )
    return knn, f"built {knn}"


def find_outputs(out: Path) -> tuple[Path | None, Path | None]:
    """Ids and distances written for `-o OUT.npy` (OUT.npy + OUT.dist.npy expected)."""
    stem = out.with_suffix("")
    ids_c = [out, Path(f"{stem}.ids.npy"), Path(f"{stem}_ids.npy"), Path(f"{stem}.idx.npy")]
    dist_c = [
        Path(f"{stem}.dist.npy"),
        Path(f"{stem}.distances.npy"),
        Path(f"{stem}.dists.npy"),
        Path(f"{stem}_dist.npy"),
        Path(f"{stem}_distances.npy"),
    ]
    ids = next((p for p in ids_c if p.exists()), None)
    dist = next((p for p in dist_c if p.exists()), None)
    return ids, dist


def run_ours(knn: Path, base, queries, case: Case, repeat: int, tag: str, timeout: int):
    work = OUT_DIR / f"run-{tag}"
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out.npy"
    timing = work / "timing.json"
    for p in work.iterdir():
        p.unlink()
    cmd = [
        str(knn), "search", "--base", str(base), "--queries", str(queries),
        "-k", str(case.k), "--metric", case.metric, "--device", "cpu",
        "--threads", str(THREADS), "--repeat", str(repeat), "--timing-json", str(timing),
        "-o", str(out), "--quiet",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-800:]}")
    t = json.loads(timing.read_text())
    ids_p, dist_p = find_outputs(out)
    return t, ids_p, dist_p, cmd


# ---- correctness -------------------------------------------------------------------------------


def exact_rows(np, xb64, q64, ids, metric):
    diff = xb64[ids] - q64
    if metric == "l2":
        return np.sqrt((diff * diff).sum(-1))
    return np.abs(diff).sum(-1)


def check_against_faiss(np, xb, xq, k, metric, our_ids, our_dist, faiss_ids, tol=1e-5):
    """Ids equal to FAISS's as sets, or (where not) a true k-nearest set by an f64 scan of that
    query; reported distances within tol (relative to the row's k-th) of the f64 value; rows
    ordered by (distance, id). Mirrors knn_core::oracle::check, with FAISS doing the bulk."""
    rep = {"rows": int(xq.shape[0]), "same_as_faiss": 0, "tie_equivalent": 0, "bad_rows": 0,
           "max_rel_dist_err": None, "distance_kind": None, "first_problem": None}
    if our_ids.shape != faiss_ids.shape:
        rep["bad_rows"] = rep["rows"]
        rep["first_problem"] = f"ids shape {our_ids.shape}, expected {faiss_ids.shape}"
        return rep
    our_ids = our_ids.astype(np.int64)
    xb64 = xb.astype(np.float64)
    xq64 = xq.astype(np.float64)
    nq = xq.shape[0]
    # exact f64 distances of our returned ids (n_q x k, cheap)
    ex = np.empty(our_ids.shape, dtype=np.float64)
    for i in range(nq):
        ex[i] = exact_rows(np, xb64, xq64[i], our_ids[i], metric)
    kind = metric
    if our_dist is not None:
        if metric == "l2":
            e_l2 = np.abs(our_dist - ex).max()
            e_sq = np.abs(our_dist - ex * ex).max()
            kind = "l2 (Euclidean)" if e_l2 <= e_sq else "squared l2"
            ref = ex if e_l2 <= e_sq else ex * ex
        else:
            ref = ex
        scale = np.maximum(np.abs(ref[:, -1:]), np.finfo(np.float64).tiny)
        rep["max_rel_dist_err"] = float((np.abs(our_dist - ref) / scale).max())
    rep["distance_kind"] = kind
    same = np.array([set(a) == set(b) for a, b in zip(our_ids.tolist(), faiss_ids.tolist())])
    rep["same_as_faiss"] = int(same.sum())
    problem = None
    bad = 0
    for i in range(nq):
        row_problem = None
        if len(set(our_ids[i].tolist())) != k or our_ids[i].min() < 0 or our_ids[i].max() >= xb.shape[0]:
            row_problem = f"row {i}: ids repeated or out of range"
        elif not same[i]:
            diff = xb64 - xq64[i]
            full = np.sqrt((diff * diff).sum(1)) if metric == "l2" else np.abs(diff).sum(1)
            kth = np.partition(full, k - 1)[k - 1]
            if (ex[i] > kth + tol * max(kth, 1e-300)).any():
                j = int(np.argmax(ex[i]))
                row_problem = f"row {i}: id {our_ids[i][j]} at {ex[i][j]:.9g} is beyond the k-th {kth:.9g}"
            else:
                rep["tie_equivalent"] += 1
        if row_problem is None and our_dist is not None:
            dd = our_dist[i]
            order_ok = all(
                dd[j - 1] < dd[j] or (dd[j - 1] == dd[j] and our_ids[i][j - 1] < our_ids[i][j])
                for j in range(1, k)
            )
            if not order_ok:
                row_problem = f"row {i}: not ordered by (distance, id)"
        if row_problem is not None:
            bad += 1
            problem = problem or row_problem
    if rep["max_rel_dist_err"] is not None and rep["max_rel_dist_err"] > tol:
        problem = problem or f"distance error {rep['max_rel_dist_err']:.3g} > {tol}"
        bad = max(bad, 1)
    rep["bad_rows"] = bad
    rep["first_problem"] = problem
    return rep


# ---- memory case -------------------------------------------------------------------------------


def ensure_gnu_time() -> str | None:
    if Path("/usr/bin/time").exists():
        return "/usr/bin/time"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("[bench] installing GNU time with apt-get", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "time"], capture_output=True)
    return "/usr/bin/time" if Path("/usr/bin/time").exists() else None


def run_memory(np, knn: Path, case: Case, timeout: int) -> dict:
    gtime = ensure_gnu_time()
    if gtime is None:
        return {"error": "GNU time (/usr/bin/time) not available; apt-get install time"}
    base, queries = case_files(np, case)
    work = OUT_DIR / "run-d-memory"
    work.mkdir(parents=True, exist_ok=True)
    for p in work.iterdir():
        p.unlink()
    out, timing = work / "out.npy", work / "timing.json"
    cmd = [
        gtime, "-v", str(knn), "search", "--base", str(base), "--queries", str(queries),
        "-k", str(case.k), "--metric", case.metric, "--device", "cpu", "--threads", str(THREADS),
        "--repeat", "1",
        "--timing-json", str(timing), "-o", str(out), "--quiet",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    m = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", r.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \([^)]*\):\s*(\S+)", r.stderr)
    inputs = 4 * (case.nb + case.nq) * case.d
    output = case.nq * case.k * (4 + 4)
    budget = inputs + output + 256 * MIB
    res = {
        "cmd": " ".join(cmd), "rc": r.returncode, "inputs_bytes": inputs,
        "output_bytes": output, "budget_bytes": budget,
        "max_rss_bytes": int(m.group(1)) * 1024 if m else None,
        "wall": wall.group(1) if wall else None,
    }
    if timing.exists():
        res["search_ms"] = json.loads(timing.read_text()).get("median_ms")
    if r.returncode != 0:
        res["error"] = r.stderr.strip()[-800:]
    return res


# ---- main --------------------------------------------------------------------------------------


def fmt(x, spec=".1f", none="—"):
    return none if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="a,b,c",
                    help="comma list from a,b,c,d (default a,b,c; d = --memory)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per side, median (default 5)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not the bars")
    ap.add_argument("--memory", action="store_true", help="also case d: peak RSS on 1e6 x 1e4, k=100")
    ap.add_argument("--knn", default="target/release/knn", help="our binary (default target/release/knn)")
    ap.add_argument("--cli-package", default="knn-cli", help="cargo package to build if the binary is missing")
    ap.add_argument("--no-build", action="store_true", help="never run cargo build")
    ap.add_argument("--faiss-only", action="store_true", help="skip our binary")
    ap.add_argument("--sklearn", action="store_true", help="also time scikit-learn brute force")
    ap.add_argument("--no-peak", action="store_true", help="skip the GEMM peak measurement")
    ap.add_argument("--threads", type=int, default=2, help="threads for FAISS, OpenBLAS and ours (default 2)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run of our binary")
    ap.add_argument("--json", default=None, help="write results here (default bench/out/results-<time>.json)")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads

    import faiss
    import numpy as np

    faiss.omp_set_num_threads(THREADS)
    cases_all = make_cases(args.quick)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "d" in names:
        args.memory = True
        names.remove("d")
    for n in names:
        if n not in ("a", "b", "c"):
            ap.error(f"unknown case {n!r} (a, b, c, d)")
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    unset = os.environ.get(UNSET_NOTE, "")
    print(f"# knn CPU vs FAISS — {stamp}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {platform.machine()}; "
          f"load average at start {loadavg()}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, faiss {faiss.__version__}, "
          f"threads {THREADS} (faiss.omp_set_num_threads, OpenBLAS limited by threadpoolctl)")
    print("environment: " + (f"removed {unset} for the peer runs" if unset else
                             "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE not set (peers run with OpenBLAS defaults)"))
    for line in blas_report():
        print(line)
    print("note: FAISS brings its own OpenBLAS (used by IndexFlatL2 for the BLAS path); the GEMM peak "
          "below is numpy's OpenBLAS. Both are reported so the comparison is fair.")

    results = {"date": stamp, "machine": cpu_model(), "blas": blas_report(), "unset": unset,
               "args": vars(args), "cases": {}}

    peak = None
    if not args.no_peak:
        peak = measure_gemm_peak(np)
        ghz = measure_clock_ghz()
        fpc, fpc_note = fp32_flops_per_cycle_per_core()
        results["gemm_peak_gflops"] = peak
        print(f"\nmeasured FP32 GEMM peak: {peak:.1f} GFLOP/s (numpy/OpenBLAS sgemm 4096^3, "
              f"{THREADS} threads, best of 3 after warm-up)")
        if ghz:
            theo = ghz * fpc * THREADS
            results["clock_ghz"] = ghz
            results["theoretical_gflops"] = theo
            print(f"theoretical: {theo:.0f} GFLOP/s = {THREADS} cores x {fpc} flop/cycle x {ghz:.2f} GHz "
                  f"(clock from a dependent-add loop on one core; {fpc_note}); "
                  f"GEMM reaches {100 * peak / theo:.0f}% of it")

    knn, knn_note = (None, "OUR SIDE NOT RUN: --faiss-only")
    if not args.faiss_only:
        knn, knn_note = ensure_binary(args)
    print(f"\nour binary: {knn_note}")

    rows = []
    for n in names:
        case = cases_all[n]
        base, queries = case_files(np, case)
        xb, xq = np.load(base), np.load(queries)
        ft, fdist, fids = run_faiss(faiss, np, xb, xq, case.k, case.metric, args.repeat)
        fmed = statistics.median(ft)
        r = {"case": n, "what": case.what, "faiss_ms": fmed, "faiss_times_ms": ft,
             "faiss_spread": max(ft) / min(ft), "bar": case.bar}
        if args.sklearn:
            st = run_sklearn(np, xb, xq, case.k, case.metric, args.repeat)
            r["sklearn_ms"] = statistics.median(st)
            r["sklearn_times_ms"] = st
        if knn is not None:
            try:
                t, ids_p, dist_p, cmd = run_ours(knn, base, queries, case, args.repeat, n, args.timeout)
                r["ours_ms"] = float(t["median_ms"])
                r["ours_times_ms"] = t.get("times_ms")
                r["ours_cmd"] = " ".join(cmd)
                if ids_p is None:
                    r["check"] = {"first_problem": "no ids file found next to -o OUT.npy"}
                else:
                    our_ids = np.load(ids_p)
                    our_dist = np.load(dist_p) if dist_p is not None else None
                    r["check"] = check_against_faiss(np, xb, xq, case.k, case.metric, our_ids,
                                                     our_dist, fids)
                    r["check"]["ids_file"] = ids_p.name
                    r["check"]["dist_file"] = dist_p.name if dist_p else None
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
                r["ours_error"] = str(e)
        # work: GEMM form 2*nq*nb*d flops for L2; L1 counted as 3 ops per element (sub, abs, add)
        ops = (2 if case.metric == "l2" else 3) * case.nq * case.nb * case.d
        r["ops"] = ops
        rows.append(r)
        results["cases"][n] = r

    # ---- table
    print(f"\nmedian of {args.repeat} runs after one warm-up, same .npy files; ratio = FAISS/ours "
          f"(>1: ours faster). GFLOP/s counts 2·nq·nb·d for L2, 3·nq·nb·d for L1 (sub, abs, add);"
          f" '% peak' is of the measured GEMM peak.")
    hdr = ["case", "size", "FAISS ms", "ours ms", "ratio", "bar", "met",
           "FAISS GF/s", "ours GF/s", "FAISS %pk", "ours %pk", "check"]
    if args.sklearn:
        hdr.insert(4, "sklearn ms")
    table = []
    for r in rows:
        ours = r.get("ours_ms")
        ratio = r["faiss_ms"] / ours if ours else None
        r["ratio"] = ratio
        met = None if ratio is None else ratio >= r["bar"]
        r["bar_met"] = met
        fg = r["ops"] / (r["faiss_ms"] * 1e6)
        og = r["ops"] / (ours * 1e6) if ours else None
        chk = r.get("check")
        if "ours_error" in r:
            chk_s = "ERROR"
        elif chk is None:
            chk_s = "—"
        elif chk.get("bad_rows", 1) == 0 and chk.get("first_problem") is None:
            chk_s = f"ok ({chk['same_as_faiss']}/{chk['rows']} same, {chk['tie_equivalent']} ties)"
        else:
            chk_s = "FAIL"
        line = [r["case"], r["what"], fmt(r["faiss_ms"]), fmt(ours) if ours else "NOT RUN",
                fmt(ratio, ".2f") + ("x" if ratio else ""), f"{r['bar']}x",
                {None: "—", True: "MET", False: "not met"}[met],
                fmt(fg), fmt(og), (fmt(100 * fg / peak, ".0f") + "%") if peak else "—",
                (fmt(100 * og / peak, ".0f") + "%") if (og and peak) else "—", chk_s]
        if args.sklearn:
            line.insert(4, fmt(r.get("sklearn_ms")))
        table.append(line)
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *table)]
    print(" | ".join(h.ljust(w) for h, w in zip(hdr, widths)))
    print("-+-".join("-" * w for w in widths))
    for line in table:
        print(" | ".join(str(x).ljust(w) for x, w in zip(line, widths)))
    for r in rows:
        spread = r["faiss_spread"]
        if spread > 1.25:
            print(f"warning: case {r['case']} FAISS runs spread {spread:.2f}x (min {min(r['faiss_times_ms']):.1f} ms):"
                  " noisy machine, rerun")
        ot = r.get("ours_times_ms") or []
        if len(ot) > 1 and min(ot) > 0 and max(ot) / min(ot) > 1.25:
            print(f"warning: case {r['case']} our runs spread {max(ot) / min(ot):.2f}x (min {min(ot):.1f} ms):"
                  " noisy machine, rerun")
        if "ours_error" in r:
            print(f"case {r['case']} ours: {r['ours_error']}")
        chk = r.get("check") or {}
        if chk.get("first_problem"):
            print(f"case {r['case']} check: {chk['first_problem']}")
        if chk.get("max_rel_dist_err") is not None:
            print(f"case {r['case']}: distances read from {chk.get('dist_file')} as {chk['distance_kind']}, "
                  f"max error {chk['max_rel_dist_err']:.2g} of the k-th distance")
    if peak and any(r.get("ours_ms") and r["ops"] / (r["ours_ms"] * 1e6) > peak for r in rows):
        print("note: ours above 100% of the FP32 GEMM peak: the CPU engine's bf16 path (AMX "
              "tiles where the CPU has them, else vdpbf16ps; candidates re-ranked exactly) does "
              "these dot products, so the FP32 peak is not its floor. The engine alone FP32-only "
              "(CpuEngine::f32_only): cargo run --release -p knn-cpu --example small_d_bench.")
    if knn is None:
        print(f"\n{knn_note}")

    if args.memory:
        case = cases_all["d"]
        print(f"\ncase d (peak memory): {case.what}")
        if knn is None:
            print(f"  {knn_note}")
        else:
            m = run_memory(np, knn, case, args.timeout)
            results["memory"] = m
            if m.get("max_rss_bytes") is not None:
                ok = m["max_rss_bytes"] <= m["budget_bytes"]
                print(f"  max RSS {m['max_rss_bytes'] / MIB:.0f} MiB vs budget {m['budget_bytes'] / MIB:.0f} MiB "
                      f"(inputs {m['inputs_bytes'] / MIB:.0f} + output {m['output_bytes'] / MIB:.1f} + 256 MiB): "
                      f"{'MET' if ok else 'not met'}; wall {m.get('wall')}, search {fmt(m.get('search_ms'))} ms")
                m["bar_met"] = ok
            if m.get("error"):
                print(f"  error: {m['error']}")

    print(f"\nload average at end {loadavg()}")
    jpath = Path(args.json) if args.json else OUT_DIR / (
        "results-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
    jpath.write_text(json.dumps(results, indent=1, default=str))
    print(f"results written to {jpath}")
    failed = any((r.get("check") or {}).get("bad_rows") for r in rows) or any("ours_error" in r for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
