#!/usr/bin/env bash
# BERT forward on the CPU, ipfs-accelerate (criterion, release) vs PyTorch eager fp32 (peer_bench_torch.py),
# same shapes, same thread count, one run. Prints items/s of each and the ratio.
#   benches/compare_torch.sh [SHARED_DIR]      (needs: pip install torch transformers)
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${1:-${IPFS_ACCELERATE_SHARED:-../shared}}"
threads="${THREADS:-$(nproc)}"
export RAYON_NUM_THREADS="$threads"
cargo bench -q -p ipfs-accelerate-benches --bench bert_forward -- --noplot >/dev/null
printf '%-10s %-10s %12s %12s %8s\n' model shape ours_items/s torch_items/s ratio
for model in minilm-l6 bert-base; do
  for batch in 1 8; do
    ours=$(python3 - "$model" "$batch" <<'PY'
import json, sys
m, b = sys.argv[1], sys.argv[2]
est = json.load(open(f"target/criterion/bert_forward_cpu/{m}/b{b}xs128/new/estimates.json"))
print(int(b) / (est["median"]["point_estimate"] / 1e9))
PY
)
    torch=$(python3 "$shared/tools/peer_bench_torch.py" --model "$model" --batch "$batch" --seq 128 --threads "$threads" \
            --iters 10 --warmup 2 | python3 -c 'import json,sys; print(json.load(sys.stdin)["items_per_s"])')
    python3 -c "import sys; o,t=float(sys.argv[3]),float(sys.argv[4]); print(f'{sys.argv[1]:<10} b{sys.argv[2]}xs128   {o:12.2f} {t:12.2f} {o/t:8.2f}')" \
      "$model" "$batch" "$ours" "$torch"
  done
done
