#!/usr/bin/env bash
# A/B of two knn binaries on the seed-002 80 000-point Hellinger graph (d = 256, k = 100), in
# one call: each binary's `--repeat` median (alternating, ROUNDS times), its KNN_PROFILE phases,
# and whether the graphs are the same bytes.
# Usage (GPU machine, repository root): bash bench/gpu/hellinger_ab.sh OLD NEW [ROUNDS] [N]
set -euo pipefail
old=$1 new=$2 rounds=${3:-2} n=${4:-80000}
dir=$(mktemp -d)
python3 -c "import numpy as np; np.save('$dir/x.npy', np.random.default_rng($n).random(($n, 256), dtype=np.float32))"
run() { # binary tag
  "$1" graph -p "$dir/x.npy" -k 100 -m hellinger --device cuda --repeat 5 --timing-json "$dir/$2.json" \
    -o "$dir/$2.npy" --force --quiet
  python3 -c "import json; print('$2', json.load(open('$dir/$2.json'))['median_ms'], 'ms')"
}
for r in $(seq "$rounds"); do run "$old" old; run "$new" new; done
cmp "$dir/old.npy" "$dir/new.npy" && cmp "$dir/old.dist.npy" "$dir/new.dist.npy" && echo "same graph"
echo "--- profile (new)"
KNN_PROFILE=1 "$new" graph -p "$dir/x.npy" -k 100 -m hellinger --device cuda --repeat 2 -o "$dir/p.npy" --force --quiet
