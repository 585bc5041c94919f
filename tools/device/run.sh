#!/bin/bash
# The GPU session script (the `device` tool's machine: no cargo, no internet). Prepare here:
#   cargo build --release -p xtask --features cuda
#   strip -o /tmp/xtask target/release/xtask && xz -T2 -6 -c /tmp/xtask > .devcarry/xtask.xz
#   xz -6 -c ~/.cache/ipfs-accelerate/duckdb/libduckdb.so > .devcarry/libduckdb.so.xz   (xtask fetch-duckdb)
#   cp -r ../shared/fixtures/{llama,qwen2,bert,vit,clip} .devcarry/fixtures/ (without the ONNX exports)
#   cp tools/device/run.sh .devcarry/
# then run `bash .devcarry/run.sh` with `carry: [".devcarry"]`; rows land in $OUT/gpu.duckdb.
# Session 19's last call: a fresh machine's first generate (SmolLM2 f16) and first embedding
# (MiniLM f32), conformance (fixtures of the decoders, BERT, ViT, CLIP, and every ggml block
# format) in f32 and f16, then speed: CLIP ViT-B/32, SmolLM2 and Llama-3.2-1B (batch 1 and 8) vs
# PyTorch, Qwen2.5-0.5B f16 / int8 / q4_k / q8_0 with memory, per-stage profiles. Rows go to
# $OUT/gpu.duckdb.
set -u
cd "$(dirname "$0")"
lib() { dirname "$(find / -name "$1" 2>/dev/null | grep -v -e '/proc/' | head -1)"; }
export LD_LIBRARY_PATH="$(lib 'libcublas.so.*'):$(lib 'libnvrtc.so.*'):${LD_LIBRARY_PATH:-}"
xz -dc xtask.xz > xtask && chmod +x xtask
xz -dc libduckdb.so.xz > libduckdb.so && export IPFS_ACCELERATE_DUCKDB=$PWD/libduckdb.so
DB=$OUT/gpu.duckdb
now() { python3 -c 'import time; print(time.time())'; }
echo "== fresh machine: whole process, SmolLM2-135M f16, load + first 8 tokens"
t0=$(now)
timeout 120 ./xtask bench --dev --backend cuda --no-db --config llama-135m --prompt 128 --new 8 --dtype f16 --iters 1 --warmup 0 2>&1 | grep -E "prefill|decode|rror|cuBLAS engine"
t1=$(now); python3 -c "print('process wall s', round($t1 - $t0, 2))"
echo "== first MiniLM embedding in f32 (its kernels not compiled yet), whole process"
t0=$(now)
timeout 120 ./xtask bench --dev --backend cuda --no-db --config minilm-l6 --batch 1 --seq 128 --dtype f32 --iters 1 --warmup 0 2>&1 | grep -E "ms|rror|cuBLAS engine" | tail -3
t1=$(now); python3 -c "print('process wall s', round($t1 - $t0, 2))"
echo "== verify f32 and f16 (fixtures, then the block formats)"
timeout 200 ./xtask verify --fixtures fixtures --family llama,qwen2,bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -26
timeout 200 ./xtask verify --fixtures fixtures --family llama,qwen2,bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -26
echo "== CLIP ViT-B/32 image + text, batch 32, vs torch f16"
timeout 200 ./xtask compare --dev --backend cuda --db $DB --config clip-vit-b32 --batch 32 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -A4 "median ms"
echo "== SmolLM2-135M and Llama-3.2-1B shapes vs torch f16"
timeout 200 ./xtask compare --dev --backend cuda --db $DB --config llama-135m --prompt 128 --new 128 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -A6 "median ms"
timeout 240 ./xtask compare --dev --backend cuda --db $DB --config llama-1b --prompt 128 --new 128 --batch 1,8 --dtype f16 --peer torch:f16 --rounds 2 --iters 3 --warmup 1 2>&1 | grep -A10 "median ms"
echo "== Qwen2.5-0.5B: f16, int8 (Q8_0 blocks), q4_k (Q5_0 where rows are not whole super-blocks), q8_0"
for d in f16 int8 q4_k q8_0; do
  timeout 150 ./xtask bench --dev --backend cuda --db $DB --config qwen2-0.5b --prompt 128 --new 128 --dtype $d --iters 5 --warmup 1 2>&1 | grep -E "prefill|decode|rror" | tail -2
done
echo "== profile of one decoding step (graphs off): Qwen2.5 f16, Llama-3.2-1B f16 batch 8"
IPFS_ACCELERATE_CUBLAS_PROFILE=1 IPFS_ACCELERATE_CUDA_GRAPHS=0 timeout 100 ./xtask bench --dev --backend cuda --no-db --config qwen2-0.5b --prompt 16 --new 3 --dtype f16 --iters 1 --warmup 0 2>&1 | grep "cublas decoder" | tail -1
IPFS_ACCELERATE_CUBLAS_PROFILE=1 IPFS_ACCELERATE_CUDA_GRAPHS=0 timeout 100 ./xtask bench --dev --backend cuda --no-db --config llama-1b --prompt 16 --new 3 --batch 8 --dtype f16 --iters 1 --warmup 0 2>&1 | grep "cublas decoder" | tail -1
ls -la $OUT
