#!/usr/bin/env bash
# GPU-machine measurements for the grid (issue 5), multi-GPU graphs and streaming (issue 6).
# Runs the packed `knn` binary (../shared/tools/gpu-pack puts it in .gpu/) on generated data in
# a scratch folder; every timing is `knn --repeat R`'s median of the library call (files are
# read once), and results of compared runs are checked byte for byte with cmp.
#
#   bash bench/gpu/bars.sh grid      # 2^23 uniform / clustered points, k = 1 and 16, GPU grid
#   bash bench/gpu/bars.sh multi     # kNN graph n = 1e6, d = 256, k = 100, L2: 1 GPU vs all
#   bash bench/gpu/bars.sh stream    # graph n = 4e6 (STREAM_N), d = 128, k = 10: no cap vs --gpu-memory 2GiB
#
# KNN (default .gpu/knn) and SCRATCH (default /tmp/knn-bars) may be set.
set -euo pipefail
KNN=${KNN:-$PWD/.gpu/knn}
SCRATCH=${SCRATCH:-/tmp/knn-bars}
mkdir -p "$SCRATCH"
cd "$SCRATCH"
gen() { [ -f "$1" ] || "$KNN" generate --quiet -o "$@"; }

grid() {
    gen b.npy -n 8388608 -d 3 --seed 1
    gen q.npy -n 8388608 -d 3 --seed 2
    gen cb.npy -n 8388608 -d 3 --seed 3 --distribution clustered
    for k in 1 16; do
        "$KNN" search -b b.npy -q q.npy -k "$k" --device cuda --method grid --repeat 5 -o "grid$k.npy" --force
        "$KNN" search -b cb.npy -q cb.npy -k "$k" --device cuda --method grid --repeat 3 -o "cgrid$k.npy" --force
    done
    "$KNN" search -b b.npy -q q.npy -k 1 --device cpu --method grid -o cpu1.npy --force
    cmp grid1.npy cpu1.npy && echo "grid k=1: GPU ids = CPU ids"
}

multi() {
    gen p256.npy -n 1000000 -d 256 --seed 4
    "$KNN" graph -p p256.npy -k 100 --devices 0 -o one.npy --force
    "$KNN" graph -p p256.npy -k 100 --devices all -o all.npy --force
    cmp one.npy all.npy && cmp one.dist.npy all.dist.npy && echo "multi: identical graphs"
}

stream() {
    local n=${STREAM_N:-4000000}
    gen "p128-$n.npy" -n "$n" -d 128 --seed 5
    "$KNN" graph -p "p128-$n.npy" -k 10 --device cuda -o free.npy --force
    "$KNN" graph -p "p128-$n.npy" -k 10 --device cuda --gpu-memory 2GiB -o capped.npy --force
    cmp free.npy capped.npy && cmp free.dist.npy capped.dist.npy && echo "stream: identical graphs"
}

for what in "${@:-grid}"; do "$what"; done
