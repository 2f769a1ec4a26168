#!/usr/bin/env bash
# GPU-machine measurements for the grid (issue 5), multi-GPU graphs, streaming and symmetric
# graphs (issue 6).
# Runs the packed `knn` binary (../shared/tools/gpu-pack puts it in .gpu/) on generated data in
# a scratch folder; every timing is `knn --repeat R`'s median of the library call (files are
# read once), and results of compared runs are checked byte for byte with cmp.
#
#   bash bench/gpu/bars.sh grid      # 2^23 uniform / clustered points, k = 1 and 16, GPU grid
#   bash bench/gpu/bars.sh multi     # graph n = 1e6, d = 256, k = 100 and search 1e7 x 1e5, d = 128,
#                                    # k = 100, L2: 1 GPU vs all (issue 23); multi_graph and
#                                    # multi_search run one of the two
#   bash bench/gpu/bars.sh stream    # graph n = 4e6 (STREAM_N), d = 128, k = 10: no cap vs --gpu-memory 2GiB
#   bash bench/gpu/bars.sh sym       # graphs n = 80 000: symmetric (collect form / fold) vs one-sided
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

# Median ms of the library call (`--timing-json`), and every run's when there were several (the
# first opens the GPUs and builds the index).
ms() {
    python3 -c "import json; t = json.load(open('$1')); r = [round(x, 1) for x in t['times_ms']]
print(round(t['median_ms'], 1), end='' if len(r) < 2 else ' (runs %s)' % ', '.join(map(str, r)))"
}

# REPEAT (default 1) runs per process. One run opens the GPUs, as a one-off `knn graph` does
# (KNN_PROFILE of a run says how long that took: 0.26 s on 2 H200s, 0.5-0.8 s on 4, in both
# columns); the median of several is that of graphs on an open index, each computed anew (an
# engine keeps nothing of an earlier graph since 2a1be41).
multi_graph() {
    gen p256.npy -n 1000000 -d 256 --seed 4
    for sym in auto off; do
        for dev in 0 all; do
            "$KNN" graph -p p256.npy -k 100 --devices "$dev" --symmetric "$sym" --quiet --repeat "${REPEAT:-1}" \
                --timing-json "g-$sym-$dev.json" -o "g-$sym-$dev.npy" --force
        done
        cmp "g-$sym-0.npy" "g-$sym-all.npy" && cmp "g-$sym-0.dist.npy" "g-$sym-all.dist.npy"
        echo "multi graph n=1e6 d=256 k=100 symmetric=$sym: 1 GPU $(ms "g-$sym-0.json") ms," \
            "all GPUs $(ms "g-$sym-all.json") ms; identical graphs"
    done
    cmp g-auto-0.npy g-off-0.npy && echo "multi graph: symmetric auto and off identical"
}

# The base (5.12 GB) split among all GPUs against one GPU holding it whole. REPEAT (default
# 1) runs per call: the median of several needs the base's copy warm in the page cache only.
multi_search() {
    gen b1e7.npy -n 10000000 -d 128 --seed 8
    gen q1e5.npy -n 100000 -d 128 --seed 9
    for dev in 0 all; do
        "$KNN" search -b b1e7.npy -q q1e5.npy -k 100 --devices "$dev" --quiet --repeat "${REPEAT:-1}" \
            --timing-json "s-$dev.json" -o "s-$dev.npy" --force
    done
    cmp s-0.npy s-all.npy && cmp s-0.dist.npy s-all.dist.npy
    echo "multi search 1e7 x 1e5 d=128 k=100: 1 GPU $(ms s-0.json) ms, all GPUs $(ms s-all.json) ms;" \
        "identical results"
}

multi() {
    multi_graph
    multi_search
}

stream() {
    local n=${STREAM_N:-4000000}
    gen "p128-$n.npy" -n "$n" -d 128 --seed 5
    "$KNN" graph -p "p128-$n.npy" -k 10 --device cuda -o free.npy --force
    "$KNN" graph -p "p128-$n.npy" -k 10 --device cuda --gpu-memory 2GiB -o capped.npy --force
    cmp free.npy capped.npy && cmp free.dist.npy capped.dist.npy && echo "stream: identical graphs"
}

# Median ms of `knn graph` (the rest of the arguments), from --timing-json.
graph_ms() {
    "$KNN" graph --device cuda --repeat 5 --quiet --timing-json t.json --force "$@" >/dev/null
    python3 -c "import json; print(round(json.load(open('t.json'))['median_ms'], 1))"
}

# Symmetric graphs on one GPU: the collect form (TF32 metrics; the fold it replaced is gone,
# its figures are in crates/knn-cuda/NOTES.md, stop 15; L1 still folds) and the one-sided
# path, same graphs required. KNN_PROFILE=1 in the environment shows the collect form's parts
# (thresholds, pairs, sort).
sym() {
    gen u128.npy -n 80000 -d 128 --seed 7 --distribution gaussian
    gen u256.npy -n 80000 -d 256 --seed 3 --distribution gaussian
    for c in "u128 l2 10" "u128 l2 30" "u256 l2 100" "u256 cosine 100" "u128 l1 10"; do
        set -- $c
        local on off
        on=$(graph_ms -p "$1.npy" --metric "$2" -k "$3" --symmetric on -o on.npy)
        off=$(graph_ms -p "$1.npy" --metric "$2" -k "$3" --symmetric off -o off.npy)
        cmp on.npy off.npy && cmp on.dist.npy off.dist.npy
        echo "$1 $2 k=$3: symmetric $on ms, one-sided $off ms; same graphs"
    done
}

for what in "${@:-grid}"; do "$what"; done
