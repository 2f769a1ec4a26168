#!/usr/bin/env bash
# Every test, Rust and Python, in one command (the README's test command; .ci/run calls it):
#   1. cargo test --workspace --release (GPU tests say SKIPPED without a GPU);
#   2. the Python package built from this tree with `pip install .` (maturin, the same target/,
#      so only the bindings compile again) into .venv, with NumPy, SciPy, scikit-learn, pandas,
#      pytest and maturin from PyPI; then pytest python/tests.
# PYTHON=python3.X picks the venv's interpreter (3.9 or later); KNN_TEST=python skips step 1,
# KNN_TEST=rust step 2.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${KNN_TEST:-all}

if [ "$what" != python ]; then
    echo "== Rust: cargo test --workspace --release"
    cargo test --workspace --release
fi

if [ "$what" != rust ]; then
    start=$SECONDS
    echo "== Python: the knn package into .venv"
    [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
    export PATH="$PWD/.venv/bin:$PATH" # (the build backend runs `maturin` from PATH)
    pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
    "${pip[@]}" install "maturin>=1.9.4,<2" numpy scipy scikit-learn pandas pytest dask distributed
    "${pip[@]}" install --no-build-isolation --no-deps --force-reinstall .
    echo "== Python: pytest python/tests"
    .venv/bin/python -m pytest -q -p no:cacheprovider python/tests
    echo "== Python part: $((SECONDS - start)) s"
fi
