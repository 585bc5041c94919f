#!/bin/bash
# The GPU session script (the `device` tool's machine: no cargo, no internet). Prepare here:
#   cargo build --release -p xtask --features cuda
#   strip -o /tmp/xtask target/release/xtask && xz -T2 -6 -c /tmp/xtask > .devcarry/xtask.xz
#   xz -6 -c ~/.cache/ipfs-accelerate/duckdb/libduckdb.so > .devcarry/libduckdb.so.xz   (xtask fetch-duckdb)
#   cp -r ../shared/fixtures/{llama,qwen2,bert,vit,clip} .devcarry/fixtures/ (without the ONNX exports)
#   cp tools/device/run.sh .devcarry/
# then run `bash .devcarry/run.sh` with `carry: [".devcarry"]`; rows land in $OUT/gpu.duckdb, and
# everything printed also goes to $OUT/log.txt (a call that runs out of time still returns it).
# Session 20's last call: a fresh machine's first generate of SmolLM2 f16 from a checkpoint
# folder (safetensors written by transformers' save_pretrained, random weights of the real
# config); conformance in f32 and f16; overlapped launches on / off (alternating); Qwen2.5-0.5B
# in every weight format; Llama-3.2-1B batch 1 and 8; per-stage profiles; SmolLM2 against
# PyTorch. (The session's first call measured the GEMV / cuBLAS crossover for dense weights with
# IPFS_ACCELERATE_CUDA_GEMV=8 and =1 at batch 2, 4 and 8; the second, Llama-3.2-1B against
# PyTorch at batch 1 and 8.)
set -u
cd "$(dirname "$0")"
exec > >(tee -a "$OUT/log.txt") 2>&1
lib() { dirname "$(find / -name "$1" 2>/dev/null | grep -v -e '/proc/' | head -1)"; }
export LD_LIBRARY_PATH="$(lib 'libcublas.so.*'):$(lib 'libnvrtc.so.*'):${LD_LIBRARY_PATH:-}"
xz -dc xtask.xz > xtask && chmod +x xtask
xz -dc libduckdb.so.xz > libduckdb.so && export IPFS_ACCELERATE_DUCKDB=$PWD/libduckdb.so
DB=$OUT/gpu.duckdb
G="could not run as a CUDA graph"
now() { python3 -c 'import time; print(time.time())'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== a SmolLM2-135M checkpoint folder (f16 safetensors, random weights of the real config)"
cat > /tmp/save.py <<'PY'
import json, torch, transformers
cfg = json.loads("""{"vocab_size":49152,"hidden_size":576,"intermediate_size":1536,
 "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"tie_word_embeddings":true,
 "max_position_embeddings":8192,"rope_theta":100000.0,"rms_norm_eps":1e-5,"hidden_act":"silu"}""")
torch.manual_seed(0)
m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).to(torch.float16)
m.save_pretrained("/tmp/smollm2")
print("saved", sum(p.numel() for p in m.parameters()), "parameters")
PY
python3 /tmp/save.py 2>&1 | grep -v -e Warning -e Writing
echo "== fresh machine: whole process, SmolLM2-135M f16 from the checkpoint folder, load + first 8 tokens"
t0=$(now)
timeout 60 ./xtask bench --dev --backend cuda --no-db --config /tmp/smollm2 --prompt 128 --new 8 --dtype f16 --iters 1 --warmup 0 2>&1 | grep -E "prefill|decode|rror|cuBLAS engine"
t1=$(now); python3 -c "print('process wall s', round($t1 - $t0, 2))"
echo "== verify f32 and f16 (fixtures, then the block formats)"
timeout 150 ./xtask verify --fixtures fixtures --family llama,qwen2,bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -26
timeout 150 ./xtask verify --fixtures fixtures --family llama,qwen2,bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -26
echo "== overlapped launches on / off, alternating: SmolLM2 f16, Qwen2.5 f16 and q4_k"
for i in 1 2; do for o in 1 0; do
  echo "-- IPFS_ACCELERATE_CUDA_OVERLAP=$o"
  IPFS_ACCELERATE_CUDA_OVERLAP=$o timeout 60 ./xtask bench --dev --backend cuda --no-db --config llama-135m --prompt 128 --new 128 --dtype f16 --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
  IPFS_ACCELERATE_CUDA_OVERLAP=$o timeout 60 ./xtask bench --dev --backend cuda --no-db --config qwen2-0.5b --prompt 128 --new 128 --dtype f16,q4_k --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
done; done
echo "== Qwen2.5-0.5B int8 (Q8_0 blocks) and q8_0, with memory"
timeout 90 ./xtask bench --dev --backend cuda --db $DB --config qwen2-0.5b --prompt 128 --new 128 --dtype int8,q8_0 --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
echo "== Llama-3.2-1B f16, batch 1 and 8"
timeout 90 ./xtask bench --dev --backend cuda --db $DB --config llama-1b --prompt 128 --new 128 --batch 1,8 --dtype f16 --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
echo "== profile of one decoding step (graphs off): Llama-3.2-1B f16 batch 8 and 1"
for b in 8 1; do
  IPFS_ACCELERATE_CUBLAS_PROFILE=1 IPFS_ACCELERATE_CUDA_GRAPHS=0 timeout 60 ./xtask bench --dev --backend cuda --no-db --config llama-1b --prompt 16 --new 3 --batch $b --dtype f16 --iters 1 --warmup 0 2>&1 | grep "cublas decoder" | tail -1
done
echo "== SmolLM2-135M vs torch f16"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config llama-135m --prompt 128 --new 128 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|$G"
ls -la $OUT
