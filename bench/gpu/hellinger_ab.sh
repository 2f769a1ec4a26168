#!/usr/bin/env bash
# A/B of two knn binaries on the seed-002 80 000-point Hellinger graph (d = 256, k = 100), in
# one call: each binary's runs (`--repeat`, alternating ROUNDS times; the first 2 runs of each
# process are warm-up, as in hellinger_table.py), the median of all timed runs per binary, its
# KNN_PROFILE phases, and whether the graphs are the same bytes.
# Usage (GPU machine, repository root): bash bench/gpu/hellinger_ab.sh OLD NEW [ROUNDS] [N] [REPEAT]
set -euo pipefail
old=$1 new=$2 rounds=${3:-2} n=${4:-80000} repeat=${5:-9}
dir=$(mktemp -d)
python3 -c "import numpy as np; np.save('$dir/x.npy', np.random.default_rng($n).random(($n, 256), dtype=np.float32))"
run() { # binary tag
  "$1" graph -p "$dir/x.npy" -k 100 -m hellinger --device cuda --repeat "$repeat" --timing-json "$dir/$2.json" \
    -o "$dir/$2.npy" --force --quiet
  python3 - "$dir/$2.json" "$dir/$2.all" "$2" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["times_ms"][2:]
open(sys.argv[2], "a").write("".join(f"{x}\n" for x in t))
print(sys.argv[3], "runs:", " ".join(f"{x:.1f}" for x in t), f"(median {sorted(t)[len(t) // 2]:.1f} ms)")
PY
}
for r in $(seq "$rounds"); do run "$old" old; run "$new" new; done
for tag in old new; do
  python3 -c "t = sorted(float(x) for x in open('$dir/$tag.all')); print('$tag: median of', len(t), 'timed runs', round(t[len(t) // 2], 1), 'ms; quartiles', round(t[len(t) // 4], 1), round(t[3 * len(t) // 4], 1))"
done
cmp "$dir/old.npy" "$dir/new.npy" && cmp "$dir/old.dist.npy" "$dir/new.dist.npy" && echo "same graph"
echo "--- profile (new)"
KNN_PROFILE=1 "$new" graph -p "$dir/x.npy" -k 100 -m hellinger --device cuda --repeat 2 -o "$dir/p.npy" --force --quiet
