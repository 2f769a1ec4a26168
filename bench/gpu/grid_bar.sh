#!/usr/bin/env bash
# Issue 5's GPU bar and the GPU grid suite in one device call:
# `knn search --method grid --device cuda --repeat R` on 2^23 uniform points and queries
# (k = 1, 16) and on 100 gaussian blobs (queries = base, as bars.sh does), each timed plain and
# once more with KNN_PROFILE=1 for the breakdown, and GPU ids/distances compared byte for byte
# with the CPU grid's; then the grid test suite (GPU required).
#
#   bash bench/gpu/grid_bar.sh DIR    # DIR holds knn and tests/ (stripped release binaries)
#
# R16 (runs at k = 16, default 3), CPU_C16=1 (also compare the blobs at k = 16 with the CPU),
# SUITE_S (time limit of the grid suite, default 150 s), ENGINE_SUITE=1 (also run the packed
# engine_suite) may be set.
# Logs go to $OUT (summary.txt, log.txt; default /tmp/grid-bar-out); data to $SCRATCH
# (default /tmp/grid-bar).
set -u
DIR=$(cd "${1:-.gpu-gridgpu}" && pwd)
KNN=$DIR/knn
OUT=${OUT:-/tmp/grid-bar-out}
SCRATCH=${SCRATCH:-/tmp/grid-bar}
mkdir -p "$OUT" "$SCRATCH"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/knn-cache}
S=$OUT/summary.txt
note() { echo "$*" | tee -a "$S"; }
L=$OUT/log.txt
step() { # name, timeout, command...: runs it, its output appended to $L; notes rc and time
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s%N)
    echo "=== $name: $*" >> "$L"
    timeout "$limit" "$@" > "$OUT/step.txt" 2>&1
    local rc=$?
    cat "$OUT/step.txt" >> "$L"
    note "$name: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms wall"
    grep -h "ms (median\|ms, " "$OUT/step.txt" >> "$S"
    rm -f "$OUT/step.txt"
    return $rc
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$S" 2>&1

export KNN_REQUIRE_GPU=1
cd "$SCRATCH"
gen() { [ -f "$1" ] || "$KNN" generate --quiet -o "$@"; }
gen b.npy -n 8388608 -d 3 --seed 1
gen q.npy -n 8388608 -d 3 --seed 2
gen cb.npy -n 8388608 -d 3 --seed 3 --distribution clustered

G="$KNN search --device cuda --method grid"
# Warm-up: compiles the kernels once (NVRTC, cached on disk) and loads them.
gen w.npy -n 100000 -d 3 --seed 9
step warmup 150 $G -b w.npy -q w.npy -k 4
P="env KNN_PROFILE=1 $G"
step gpu_k1 40 $G -b b.npy -q q.npy -k 1 --repeat 5 -o g1.npy --force
step prof_k1 40 $P -b b.npy -q q.npy -k 1 --repeat 2
step gpu_k16 40 $G -b b.npy -q q.npy -k 16 --repeat ${R16:-3} -o g16.npy --force
step prof_k16 40 $P -b b.npy -q q.npy -k 16 --repeat 1
step gpu_c1 40 $G -b cb.npy -q cb.npy -k 1 --repeat 3 -o c1.npy --force
step gpu_c16 60 $G -b cb.npy -q cb.npy -k 16 --repeat ${R16:-3} -o c16.npy --force
step prof_c16 40 $P -b cb.npy -q cb.npy -k 16 --repeat 1

C="$KNN search --device cpu --method grid"
same() { # a b: GPU and CPU files identical (ids and distances)
    if cmp -s "$1.npy" "$2.npy" && cmp -s "$1.dist.npy" "$2.dist.npy"; then note "$1 = $2: identical"
    else note "$1 vs $2: DIFFER"; "$KNN" verify -r "$1.npy" -t "$2.npy" >> "$S" 2>&1; fi
}
step cpu_k1 60 $C -b b.npy -q q.npy -k 1 -o cpu1.npy --force && same g1 cpu1
step cpu_c1 90 $C -b cb.npy -q cb.npy -k 1 -o cpuc1.npy --force && same c1 cpuc1
step cpu_k16 90 $C -b b.npy -q q.npy -k 16 -o cpu16.npy --force && same g16 cpu16
[ -n "${CPU_C16:-}" ] && step cpu_c16 120 $C -b cb.npy -q cb.npy -k 16 -o cpuc16.npy --force && same c16 cpuc16

for t in "$DIR"/tests/grid_suite*; do step "test_$(basename "$t")" ${SUITE_S:-150} "$t" --test-threads=1; done
grep -h "test result" "$L" >> "$S"

if [ -n "${ENGINE_SUITE:-}" ]; then
    for t in "$DIR"/tests/engine_suite*; do step "test_$(basename "$t")" 150 "$t" --test-threads=1; done
fi
cat "$S"
