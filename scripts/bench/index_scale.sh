#!/usr/bin/env bash
# Issue 15's index benchmark (docs/benchmarks.md, "An index at MS MARCO's size"): a synthetic
# index of N random unit vectors of dimension 384 written as f32 and as f16, opened (mapped) and
# searched exactly for Q queries (top-K) by infembed, and the same vectors and queries searched
# by faiss's exact IndexFlatIP, back to back on this machine; then the runs compared.
#
#   scripts/bench/index_scale.sh [N] [Q] [K]        defaults: 8800000 1000 100
#
# Environment: PYTHON (a Python with faiss-cpu and numpy; default python3), DIR (where the files
# go; default /tmp/index-scale: 8.8M rows take 20 GB of disk).
set -euo pipefail
N=${1:-8800000}
Q=${2:-1000}
K=${3:-100}
DIR=${DIR:-/tmp/index-scale}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/../.."
cargo build --release --locked -p infembed-benches --example index_scale
B=target/release/examples/index_scale
mkdir -p "$DIR"
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs;" \
    "flags: $(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
"$PY" -c 'import faiss, numpy; print("# faiss", faiss.__version__, "numpy", numpy.__version__)'
$B write "$DIR/f32.safetensors" "$N" 384 f32
$B write "$DIR/f16.safetensors" "$N" 384 f16
$B queries "$DIR/queries.npy" "$Q" 384
# Each search reads its file from the page cache (faiss's read evicts much of the f16 file).
cat "$DIR/f32.safetensors" > /dev/null
$B search "$DIR/f32.safetensors" "$DIR/queries.npy" "$K" "$DIR/infembed-f32.tsv"
"$PY" scripts/bench/faiss_flat.py "$DIR/f32.safetensors" "$DIR/queries.npy" "$K" "$DIR/faiss.tsv"
cat "$DIR/f16.safetensors" > /dev/null
$B search "$DIR/f16.safetensors" "$DIR/queries.npy" "$K" "$DIR/infembed-f16.tsv"
"$PY" scripts/bench/compare_runs.py "$DIR/faiss.tsv" "$DIR/infembed-f32.tsv" "$DIR/infembed-f16.tsv"
