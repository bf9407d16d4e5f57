#!/usr/bin/env bash
# The 1M-passage resumption check of `infembed embed` (docs/benchmarks.md): an uninterrupted run,
# then a run killed with SIGKILL once half of its shards are on disk and started again; the two
# index files must be the same bytes. Uses the tiny BERT fixture so that a run takes minutes.
#
#   cargo build --release -p infembed --bin infembed
#   python3 scripts/bench/corpus_20k.py --out /tmp/corpus1m.jsonl --repeat 50 --limit 1000000
#   bash scripts/bench/resume_1m.sh /tmp/corpus1m.jsonl /tmp/r1m
set -euo pipefail
cd "$(dirname "$0")/../.."
IN=${1:?input JSONL}
OUT=${2:?output prefix}
B=target/release/infembed
M=crates/infembed-encoder/tests/fixtures/tiny-bert
rm -rf "$OUT"-ref.safetensors "$OUT".safetensors "$OUT".safetensors.parts
/usr/bin/time -v $B embed --model $M --input "$IN" --output "$OUT"-ref.safetensors 2>"$OUT"-ref.err
grep -E "^embedded|Maximum resident|Elapsed" "$OUT"-ref.err
shards=$(python3 -c "import sys; n=sum(1 for l in open(sys.argv[1]) if l.strip()); print(-(-n // 8192))" "$IN")
start=$(date +%s.%N)
$B embed --model $M --input "$IN" --output "$OUT".safetensors 2>"$OUT"-a.err &
pid=$!
while [ "$(ls "$OUT".safetensors.parts 2>/dev/null | grep -c '\.f32$')" -lt $(( (shards + 1) / 2 )) ]; do
  sleep 0.05
done
kill -9 $pid
wait $pid 2>/dev/null || true
echo "killed after $(echo "$(date +%s.%N) - $start" | bc) s with $(ls "$OUT".safetensors.parts | grep -c '\.f32$') of $shards shards"
/usr/bin/time -v $B embed --model $M --input "$IN" --output "$OUT".safetensors 2>"$OUT"-b.err
grep -E "^embedded|Maximum resident|Elapsed" "$OUT"-b.err
cmp "$OUT"-ref.safetensors "$OUT".safetensors
echo "identical: $(sha256sum "$OUT".safetensors | cut -c1-16), $(stat -c %s "$OUT".safetensors) bytes"
