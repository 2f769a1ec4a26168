#!/usr/bin/env bash
# The symmetric kNN graph (each unordered pair once) against the one-sided path on the CPU,
# side by side in one process per configuration (graph_bench alternates the two after a
# warm-up, checks that the graphs are identical, prints medians, CPU times and pair keys).
# Usage: bench/graph/run.sh [repeat] [threads]   (defaults: 7, all cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
repeat=${1:-7}
threads=${2:-all}
cargo build --release -p knn-cpu --example graph_bench >&2
for cfg in "20000 128 10 l2" "20000 16 10 l1" "50000 128 10 l2" "50000 16 10 l1"; do
    # shellcheck disable=SC2086
    ./target/release/examples/graph_bench $cfg "$repeat" "$threads"
done
