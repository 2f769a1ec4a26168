#!/usr/bin/env bash
# CPU side-by-side benchmark of our `knn` binary against FAISS (see bench/README.md).
# Runs bench/cpu_vs_faiss.py with the system python3: it bootstraps bench/.venv (pinned faiss-cpu,
# numpy, scikit-learn, threadpoolctl), builds target/release/knn with
# `cargo build --release -p knn-cli` if it is missing, and removes OPENBLAS_CORETYPE /
# OPENBLAS_L2_SIZE for the peer runs itself (saying so in its output).
#   bench/run_cpu.sh                    # cases a,b,c, median of 5
#   bench/run_cpu.sh --memory           # plus the 1e6 x 1e4 peak-memory case d
#   bench/run_cpu.sh --quick            # smoke test on small sizes
#   bench/run_cpu.sh --faiss-only       # peer side and GEMM peak only
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" bench/cpu_vs_faiss.py "$@"
