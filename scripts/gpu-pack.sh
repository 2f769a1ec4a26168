#!/usr/bin/env bash
# Packs what a call on the GPU machine needs into .gpu/ (git-ignored), within its 64 MiB:
#   - the release and test binaries of the GPU crates (../shared/tools/gpu-pack), and the
#     `index_bench` example, in one .gpu/bin.tar.xz;
#   - the kernels compiled here for sm_90 by NVRTC (no GPU needed; see the README's "GPU tests"),
#     gzipped in .gpu/cubin/: the GPU machine then compiles nothing for the main and symmetric
#     modules (70-100 s per fresh machine otherwise). Expression modules are still compiled there;
#   - the Python wheel of this tree in .gpu/whl/;
#   - .gpu/setup.sh (source it first: unpacks, fills the kernel cache, KNN_REQUIRE_GPU=1) and
#     .gpu/run-tests.sh (every test binary, one at a time; ONLY / SKIP: grep -E patterns on the
#     binary's name; ARGS: passed to each binary, e.g. "--skip expressions").
# Usage (repository root): scripts/gpu-pack.sh   (NVRTC=DIR: a folder holding libnvrtc.so.13;
# without one the kernels are compiled on the GPU machine at first use)
# On the GPU machine: source .gpu/setup.sh; bash .gpu/run-tests.sh > $OUT/tests.txt 2>&1
# (write outputs under $OUT, not through `tail`: a call killed at its limit returns nothing of a
# pipe). `kernels_compile_with_nvrtc` compiles every module again there, into its own folder
# (100-150 s): with the kernels compiled here by the same NVRTC version, pass
# ARGS="--skip kernels_compile_with_nvrtc".
set -euo pipefail
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/gpu-pack.log
../shared/tools/gpu-pack -p knn -p knn-cuda -p knn-core -p knn-cli -p knn-cpu > "$log" 2>&1
cargo build --release -p knn --example index_bench >> "$log" 2>&1
strip -o .gpu/index_bench target/release/examples/index_bench

cubins=target/release/deps/nvrtc-cubin/knn
if [ -n "${NVRTC:-}" ]; then
    rm -rf "$cubins"
    LD_LIBRARY_PATH="$NVRTC${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        cargo test --release -p knn-cuda --lib kernels_compile_with_nvrtc >> "$log" 2>&1
fi
tmp=$(mktemp -d)
# (Not gpu-pack's own run-tests.sh: unpacked over the one written below, it would run every
# binary whatever ONLY and SKIP say.)
tar cJf "$tmp/bin.tar.xz" -C .gpu --exclude=./run-tests.sh .
rm -rf .gpu && mkdir .gpu && mv "$tmp/bin.tar.xz" .gpu/ && rmdir "$tmp"
mkdir -p .gpu/cubin .gpu/whl
for f in "$cubins"/*.cubin; do
    [ -e "$f" ] && gzip -c "$f" > ".gpu/cubin/$(basename "$f").gz"
done
if [ -x .venv/bin/pip ]; then
    .venv/bin/pip wheel . --no-deps -w .gpu/whl -q >> "$log" 2>&1
fi

cat > .gpu/setup.sh <<'S'
# source .gpu/setup.sh: the binaries unpacked, the packed kernels in the cache, a GPU required.
( cd .gpu && tar xJf bin.tar.xz )
export XDG_CACHE_HOME=$PWD/.gpu/xdg KNN_REQUIRE_GPU=1
mkdir -p "$XDG_CACHE_HOME/knn"
for f in .gpu/cubin/*.gz; do [ -e "$f" ] && gunzip -c "$f" > "$XDG_CACHE_HOME/knn/$(basename "$f" .gz)"; done
if ls .gpu/whl/*.whl > /dev/null 2>&1; then
    pip install -q --no-deps --target /tmp/site .gpu/whl/*.whl > /dev/null 2>&1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
S

cat > .gpu/run-tests.sh <<'S'
#!/usr/bin/env bash
# Every test binary in .gpu/tests, one at a time: PASS/FAIL and its summary line each.
# ONLY / SKIP: grep -E patterns on the binary's name; ARGS: passed to each binary.
pass=0; fail=0; failed=""
for t in .gpu/tests/*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    if [ -n "${SKIP:-}" ] && echo "$n" | grep -qE "$SKIP"; then echo "skip $n"; continue; fi
    if [ -n "${ONLY:-}" ] && ! echo "$n" | grep -qE "$ONLY"; then continue; fi
    s=$(date +%s)
    # shellcheck disable=SC2086
    if out=$("$t" --test-threads=1 ${ARGS:-} 2>&1); then
        pass=$((pass + 1))
        echo "PASS $n ($(($(date +%s) - s)) s): $(echo "$out" | grep -E '^test result' | tail -1)"
    else
        fail=$((fail + 1)); failed="$failed $n"
        echo "FAIL $n"; echo "$out" | grep -vE '^test .* ok$' | tail -40
    fi
done
echo "passed $pass failed $fail:$failed"
[ "$fail" -eq 0 ]
S
chmod +x .gpu/run-tests.sh
du -sh .gpu
ls .gpu .gpu/cubin .gpu/whl
