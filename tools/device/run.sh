#!/bin/bash
# The GPU session script (the `device` tool's machine: no cargo, no internet). Prepare here:
#   cargo build --release -p xtask --features cuda
#   strip -o /tmp/xtask target/release/xtask && xz -T2 -6 -c /tmp/xtask > .devcarry/xtask.xz
#   xz -6 -c ~/.cache/ipfs-accelerate/duckdb/libduckdb.so > .devcarry/libduckdb.so.xz   (xtask fetch-duckdb)
#   cp -r ../shared/fixtures/{llama,qwen2,bert,vit,clip,t5,whisper/base} .devcarry/fixtures/ (without the
#   ONNX exports; whisper/base under fixtures/whisper/)
#   tools/make_{bert,vit,clip}_fixture.py into .devcarry/fused/ (part 9: heads of 64 and 32), and
#   tools/make_whisper_fixture.py .devcarry/fused/whisper/heads64 128 2 2 400 2 7 (parts 12-15)
#   cp tools/device/run.sh .devcarry/
# then run `bash .devcarry/run.sh PART` with `carry: [".devcarry"]`; rows land in $OUT/gpu.duckdb,
# and everything printed also goes to $OUT/log.txt (a call that runs out of time still returns it).
# Session 21: part 1 (a fresh machine) times the first generate of SmolLM2 f16 from a checkpoint
# folder (safetensors written by transformers' save_pretrained, random weights of the real config)
# with the split kernel modules, Whisper-tiny's encoder (30 s, batch 8) against PyTorch, and
# conformance in f32 and f16 (Whisper's encoder now on the engine); part 2, after the attention's
# keys were padded to a multiple of 8, per-stage profiles and Whisper-tiny / ViT-base against
# PyTorch, greedy picks on the device against on the host (Llama-3.2-1B batch 1 and 8,
# alternating) and conformance in f16 (which ran out of time: CubeCL compiling Whisper's f16
# decoder kernels on a fresh machine); part 3 conformance with the padded attention; part 4, after
# the softmax moved to 16-byte packs, profiles and encoders against PyTorch; part 5 conformance,
# Qwen2.5 and SmolLM2 with greedy picks on the device; part 6 Whisper-tiny's transcription; part 7
# Whisper with the engine's encoder and a decoder-only burn model; part 8 conformance after the review.
# Session 22: part 9 (a fresh machine) the fused attention kernel: conformance in f16 (fused) and f32
# (unfused), per-stage profiles, fused against unfused (alternating) and the encoders against PyTorch;
# part 10 the same after the fused kernel's copies became asynchronous (no load waited on in the
# loop), with chunked against one-piece copies; part 11 conformance of the final code (after the
# review), fused (f16) and unfused (f32, and f16 with the switch off).
# Session 23: part 12 Whisper's decoder on the engine (cross-attention, LayerNorm, learned positions):
# conformance in f32 and f16 (the shipped fixture, heads of 8; fused/whisper by tools/make_whisper_fixture.py,
# heads of 64, batch 2 with a padded prompt), LLaMA / Qwen2 after the decoder's kernels changed, a decoding
# step's profile, transcription of 30 s + 100 tokens against PyTorch generate, and SmolLM2 against PyTorch;
# part 13 the same for Whisper after the cross-attention split its keys across blocks (flash-decoding);
# part 14 T5 wholly on the decoder engine (the encoder as a non-causal stack, relative position bias):
# conformance in f32 and f16 of T5, Whisper, LLaMA and Qwen2, T5-small 32 + 64 tokens against PyTorch;
# part 15 the final code (after the review): conformance, and Whisper-tiny, T5-small and SmolLM2 against
# PyTorch f16; part 16 T5 fixtures with T5's own initialisation and heads of 64 (tools/make_t5_fixture.py, made
# on the device), verified in f32 and f16 next to PyTorch's own fp16 error on them and on the shipped ones;
# part 17 the code after the second review (one rope_split launcher): conformance, then the three decoders
# against PyTorch f16 again.
# Session 24: part 18 sampling on the device (the penalty and each row's 64 most likely tokens there, the CPU
# sampler's choice from them): seeded sampled tokens with the picks on the device and on the host
# (IPFS_ACCELERATE_CUDA_DEVICE_PICKS=1 / 0) must be the same, then their decode times alternating; the
# facade's cuda_generation test binary (continuous batching on the engine, device picks through the public API);
# conformance of LLaMA / Qwen2; part 19 the cuda_generation tests again after continuous batching picked on the
# device too (three runs).
# Session 25: part 20 LLaVA / LLaVA-NeXT on the cuBLAS engines (the tower with the projector on the encoder
# engine, the image features in place of the image tokens' embeddings at the decoder's prefill): conformance
# in f32 and f16, then a LLaVA-1.5 checkpoint (CLIP ViT-L/14-336 + a Llama-3.2-1B-shaped LM) against PyTorch f16;
# part 21 where its first token's time goes; part 22 the prefill's causal attention on tensor cores (the
# encoder's flash kernel over the KV cache), a decoding step's self-attention split across blocks, and the
# image features gathered once in the tower's dtype: conformance, the profile, flash against the per-query
# kernel at prompts of 128 and 1024, decode at a 1024-token context, PyTorch f16; part 23 the final code: a fresh
# machine's first SmolLM2 generate, conformance, cuda_generation, Llama-3.2-1B at 1024 tokens and SmolLM2 against
# PyTorch f16.
# Session 26: part 24 (a fresh H200) kernels compiled in parts on every host thread, straight to machine code (CUBIN,
# `compile.rs`): first processes with empty kernel caches (the driver's cache off), the code before (xtask_old:
# one PTX program per set, the driver translating it) alternating with the new at all threads and at one thread,
# for SmolLM2's first generate and MiniLM's first embedding; then conformance and decode speed next to the old binary;
# part 25 (another fresh H200) NVRTC's parts compiling while the context opens and the weights go up (xtask) against
# part 24's binary (xtask_v1: compiled first, then the upload), alternating, then conformance; part 26 the public
# SmolLM2-135M-Instruct Q4_1 GGUF (carried in three calls to one warm machine: .devcarry/g1, g2, g3 hold its xz in
# parts) on the cuBLAS decoder through the facade's cuda_generation tests.
# Session 27: part 27 Whisper's language detection going on with its decoder (nn::generate::Resumed): the
# cuda_generation tests (detected and given languages on the engines against the CPU), then conformance;
# part 28 (no cuda_generation binary this time) conformance with Wav2Vec2 on the cuBLAS encoder, then Wav2Vec2-base on
# 10 s of audio, batch 1 and 8, against PyTorch f16 (rounds alternating), and its per-stage profile.
# Session 28: part 29 the facade's speech tests on the engines (Whisper's language detection; Wav2Vec2 through
# `Transcriber` on the cuBLAS encoder), conformance with every call split into chunks of 8 tokens
# (IPFS_ACCELERATE_CUDA_CHUNK_TOKENS=8: the outputs of one chunk copied on the second stream while the next computes),
# then chunks of 0 (never split), 2048, 4096 and 8192 tokens alternating on BERT-base b128, ViT-base b32 and
# Whisper-tiny b8 (slower at every size: the splitting was taken out again); part 30 the encoders against PyTorch f16.
# Session 29: part 31 CLAP's text tower, X-CLIP's vision tower and RoBERTa-family checkpoints on the cuBLAS encoder
# (the facade's tests, one of them on a random X-CLIP with heads of 64 made there, and
# `verify` of tests/fixtures/bert/roberta_* copied into fixtures/bert/), every family again, CLAP's whole fixture
# (HTSAT on CubeCL, compiling on the fresh machine); part 32 BERT-base and generation against
# PyTorch eager f16 (SmolLM2, Qwen2.5-0.5B, Whisper-tiny, T5-small), ours and PyTorch's rows in $OUT/gpu.duckdb;
# part 33 CLAP's text tower in f16 too (the test now loads the engine alone per precision), and CLAP's and X-CLIP's
# whole fixtures in f32 (their burn halves on CubeCL, compiling on the machine), which part 31 ran out of time for.
# Session 30: part 34 where the encoders' time goes: per-stage device time of BERT-base b128 / b32, ViT-base b32 and
# Whisper-tiny b8, next to PyTorch's GEMMs alone (tools/gemm_floor.py) and its whole models' kernels (torch.profiler);
# part 35 after the transfers in pieces, the warp-per-row norms and the attention's skipped steps: conformance
# (fixtures with heads of 64 and 32 made on the device by tools/make_*_fixture.py, then every shipped one), the
# profiles and Nsight Compute's view of the attention and row kernels (where the machine has ncu); part 36 new
# against old (switches, alternating) and the encoders against PyTorch f16 (rows in the database); part 37 the
# checks of part 35 and then part 36, after the f16 stores were paired and bias + activation split per activation;
# part 38 the transfers in pieces of 4 MiB (was 1): f16 conformance, pieces against one piece, PyTorch f16.
# Copy tools/make_{bert,vit,clip,whisper}_fixture.py into .devcarry for it.
# Session 33: part 45 Wav2Vec2's layer-norm layouts (tools/make_wav2vec2_fixture.py, also copied into .devcarry),
# every shipped fixture, and X-CLIP's whole fixture, after the three encoders were described once.
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
PART=${1:-1}
# A SmolLM2-135M checkpoint in /tmp/smollm2 (parts 1, 23).
save_smollm2() {
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
}
# A LLaVA-1.5 checkpoint in /tmp/llava (parts 20, 21).
save_llava() {
echo "== a LLaVA-1.5 checkpoint: CLIP ViT-L/14-336 tower + a Llama-3.2-1B-shaped LM, random weights, f16 safetensors"
cat > /tmp/save_llava.py <<'PY'
import torch, transformers as tf
vision = dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
              num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu")
text = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
            rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=8192))
config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_id=128000, image_seq_length=576,
                        vision_feature_layer=-2, vision_feature_select_strategy="default")
torch.manual_seed(0)
with torch.device("cuda"):
    m = tf.LlavaForConditionalGeneration(config).to(torch.float16)
m.save_pretrained("/tmp/llava")
print("saved", sum(p.numel() for p in m.parameters()), "parameters, transformers", tf.__version__)
PY
timeout 200 python3 /tmp/save_llava.py 2>&1 | tail -2
}
if [ "$PART" = 1 ]; then
save_smollm2
echo "== fresh machine: whole process, SmolLM2-135M f16 from the checkpoint folder, load + first 8 tokens"
t0=$(now)
timeout 60 ./xtask bench --dev --backend cuda --no-db --config /tmp/smollm2 --prompt 128 --new 8 --dtype f16 --iters 1 --warmup 0 2>&1 | grep -E "prefill|decode|rror|cuBLAS engine"
t1=$(now); python3 -c "print('process wall s', round($t1 - $t0, 2))"
echo "== Whisper-tiny encoder, 30 s (3000 frames), batch 1 and 8, f16, against PyTorch f16"
timeout 200 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --batch 1,8 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror"
echo "== per-stage device times: Whisper-tiny encoder batch 8, ViT-base batch 32 (f16)"
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --batch 8 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "cublas encoder|rror" | tail -1
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config vit-base --batch 32 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "cublas encoder|rror" | tail -1
echo "== verify f32 and f16 (fixtures; Whisper: encoder on the engine, decoder on CubeCL)"
timeout 200 ./xtask verify --fixtures fixtures --family whisper,llama,qwen2,bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -34
timeout 120 ./xtask verify --fixtures fixtures --family whisper,llama,qwen2,bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -34
fi
if [ "$PART" = 2 ]; then
echo "== per-stage device times (padded attention): Whisper-tiny encoder batch 8, ViT-base batch 32 (f16)"
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --batch 8 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config vit-base --batch 32 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
echo "== Whisper-tiny encoder (30 s) and ViT-base batch 32 against PyTorch f16"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --batch 1,8 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror"
timeout 120 ./xtask compare --dev --backend cuda --db $DB --config vit-base --batch 32 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror"
echo "== greedy picks on the device (1) or the host (0), alternating: Llama-3.2-1B f16 batch 1 and 8"
for i in 1 2; do for g in 1 0; do
  echo "-- IPFS_ACCELERATE_CUDA_DEVICE_GREEDY=$g"
  IPFS_ACCELERATE_CUDA_DEVICE_GREEDY=$g timeout 90 ./xtask bench --dev --backend cuda --db $DB --config llama-1b --prompt 128 --new 128 --batch 1,8 --dtype f16 --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
done; done
echo "== verify f16 (Whisper's decoder on CubeCL compiles its kernels first)"
timeout 200 ./xtask verify --fixtures fixtures --family whisper,llama,qwen2,bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -34
fi
if [ "$PART" = 3 ]; then
echo "== verify with the padded attention: f16 (without Whisper), f32 (all), then Whisper in f16"
timeout 100 ./xtask verify --fixtures fixtures --family llama,qwen2,bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -26
timeout 150 ./xtask verify --fixtures fixtures --family whisper,bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -20
timeout 230 ./xtask verify --fixtures fixtures --family whisper --backend cuda --precision f16 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -6
fi
if [ "$PART" = 4 ]; then
echo "== per-stage device times (softmax in packs): Whisper-tiny encoder batch 8, ViT-base batch 32, BERT-base 128 x 128 (f16)"
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --batch 8 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config vit-base --batch 32 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config bert-base --batch 128 --seq 128 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
echo "== Whisper-tiny encoder (30 s), ViT-base batch 32, BERT-base batch 1 / 32 / 128 against PyTorch f16"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --batch 1,8 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror"
timeout 120 ./xtask compare --dev --backend cuda --db $DB --config vit-base --batch 32 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config bert-base --batch 1,32,128 --seq 128 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A10 "median ms|rror"
fi
if [ "$PART" = 5 ]; then
echo "== verify with the packed softmax: f32 and f16, then Whisper in f16"
timeout 150 ./xtask verify --fixtures fixtures --family whisper,llama,qwen2,bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -28
timeout 100 ./xtask verify --fixtures fixtures --family llama,qwen2,bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -18
echo "== Qwen2.5-0.5B f16, int8, q4_k with greedy picks on the device, and SmolLM2 against PyTorch f16"
timeout 90 ./xtask bench --dev --backend cuda --db $DB --config qwen2-0.5b --prompt 128 --new 128 --dtype f16,int8,q4_k --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config llama-135m --prompt 128 --new 128 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|$G"
timeout 200 ./xtask verify --fixtures fixtures --family whisper --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -6
fi
if [ "$PART" = 6 ]; then
echo "== Whisper-tiny transcription of 30 s: the encoder on the engine, greedy decoding on CubeCL (f16), against PyTorch generate f16"
timeout 400 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --new 32 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|rror"
fi
if [ "$PART" = 7 ]; then
echo "== Whisper with the engine's encoder and a decoder-only burn model: verify f32, transcription bench, verify f16"
timeout 150 ./xtask verify --fixtures fixtures --family whisper --backend cuda 2>&1 | grep -v "^ *$" | tail -5
timeout 120 ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --new 32 --dtype f16 --iters 3 --warmup 1 2>&1 | grep -E "prefill|decode|rror"
timeout 250 ./xtask verify --fixtures fixtures --family whisper --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -5
fi
if [ "$PART" = 8 ]; then
echo "== after the review: verify f32 (Whisper's front end and padded attention on the engine)"
timeout 200 ./xtask verify --fixtures fixtures --family whisper,bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -17
fi
# Session 22's encoder measurements (parts 9 and 10): per-stage profiles, whole calls with an engine switch
# alternating, and the encoders against PyTorch f16.
ENCODERS=("whisper-tiny --batch 8" "vit-base --batch 32" "bert-base --batch 128 --seq 128")
profiles() {
  echo "== per-stage device times: Whisper-tiny encoder batch 8, ViT-base batch 32, BERT-base 128 x 128 (f16)"
  for cfg in "${ENCODERS[@]}"; do
    IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config $cfg --dtype f16 --iters "$1" --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
  done
}
alternate() {
  echo "== alternating, bench p50 of 10: $*"
  for v in "$@"; do
    echo "-- IPFS_ACCELERATE_CUDA_$v"
    for cfg in "${ENCODERS[@]}"; do
      env IPFS_ACCELERATE_CUDA_$v timeout 60 ./xtask bench --dev --backend cuda --no-db --config $cfg --dtype f16 --iters 10 --warmup 2 2>&1 | grep -E "p50|rror" | tail -1
    done
  done
}
against_torch() {
  echo "== Whisper-tiny encoder (30 s), ViT-base b32, CLIP ViT-B/32 b32, BERT-base b1 / 32 / 128 against PyTorch f16"
  local c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2"
  timeout 120 ./xtask compare $c --config whisper-tiny --batch 1,8 2>&1 | grep -E -A8 "median ms|rror"
  timeout 100 ./xtask compare $c --config vit-base --batch 32 2>&1 | grep -E -A8 "median ms|rror"
  timeout 100 ./xtask compare $c --config clip-vit-b32 --batch 32 2>&1 | grep -E -A8 "median ms|rror"
  timeout 130 ./xtask compare $c --config bert-base --batch 1,32,128 --seq 128 2>&1 | grep -E -A10 "median ms|rror"
}
if [ "$PART" = 9 ]; then
echo "== verify f16 with the fused attention, then f32 (unfused): fixtures with heads of 64 and 32 (fused/, made by"
echo "   tools/make_{bert,vit,clip}_fixture.py) and the shipped ones (heads of 8: unfused in both)"
timeout 100 ./xtask verify --fixtures fused --family bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -10
timeout 100 ./xtask verify --fixtures fused --family bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -10
timeout 100 ./xtask verify --fixtures fixtures --family bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -1
profiles 1
alternate FUSED_ATTENTION=1 FUSED_ATTENTION=0 FUSED_ATTENTION=1 FUSED_ATTENTION=0
against_torch
fi
if [ "$PART" = 10 ]; then
echo "== verify f16 with the fused attention (heads of 64 and 32), the shipped fixtures in f16 (heads of 8: unfused)"
timeout 100 ./xtask verify --fixtures fused --family bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -10
timeout 100 ./xtask verify --fixtures fixtures --family bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -1
profiles 3
# IPFS_ACCELERATE_CUDA_CHUNKED_COPIES existed in commit e5555fa only (chunked copies were taken out after this).
alternate FUSED_ATTENTION=1 FUSED_ATTENTION=0 CHUNKED_COPIES=1 CHUNKED_COPIES=0 CHUNKED_COPIES=1 CHUNKED_COPIES=0
against_torch
fi
if [ "$PART" = 11 ]; then
echo "== final code: verify fused (f16), unfused (f32; f16 with IPFS_ACCELERATE_CUDA_FUSED_ATTENTION=0)"
timeout 40 ./xtask verify --fixtures fused --family bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -10
timeout 40 ./xtask verify --fixtures fused --family bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -1
IPFS_ACCELERATE_CUDA_FUSED_ATTENTION=0 timeout 40 ./xtask verify --fixtures fused --family bert,vit,clip --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -1
timeout 40 ./xtask verify --fixtures fixtures --family bert,vit,clip --backend cuda 2>&1 | grep -v "^ *$" | tail -1
fi
if [ "$PART" = 12 ]; then
echo "== verify f32 and f16: Whisper wholly on the engine (shipped fixture, heads of 8), LLaMA / Qwen2"
timeout 60 ./xtask verify --fixtures fixtures --family whisper,llama,qwen2 --backend cuda 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -12
timeout 60 ./xtask verify --fixtures fixtures --family whisper,llama,qwen2 --backend cuda --precision f16 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -12
echo "== verify Whisper with heads of 64, batch 2, a padded prompt (fused/whisper), f32 and f16"
timeout 60 ./xtask verify --fixtures fused --family whisper --backend cuda 2>&1 | grep -v "^ *$" | tail -5
timeout 60 ./xtask verify --fixtures fused --family whisper --backend cuda --precision f16 2>&1 | grep -v "^ *$" | tail -5
echo "== a decoding step's device times (uncaptured: IPFS_ACCELERATE_CUDA_GRAPHS=0), Whisper-tiny f16"
IPFS_ACCELERATE_CUDA_GRAPHS=0 IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --new 4 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas decoder|rror" | tail -2
echo "== Whisper-tiny transcription, 30 s + 100 tokens, against PyTorch generate (f16, then f32)"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --new 100 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --new 100 --dtype f32 --peer torch:f32 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|rror|$G"
echo "== SmolLM2-135M f16 128 + 128 against PyTorch (the decoder's GEMVs and attention after the change)"
timeout 120 ./xtask compare --dev --backend cuda --db $DB --config llama-135m --prompt 128 --new 128 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|$G"
fi
# Conformance of the decoder engine's families (parts 13-17): the shipped fixtures of `$1` and the
# heads-of-64 Whisper fixture, in f32 then f16.
verify_decoders() {
  for p in f32 f16; do
    timeout 60 ./xtask verify --fixtures fixtures --family "$1" --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -18
    timeout 60 ./xtask verify --fixtures fused --family whisper --backend cuda --precision $p 2>&1 | grep -v "^ *$" | tail -4
  done
}
if [ "$PART" = 13 ]; then
echo "== verify f32 and f16: Whisper (shipped, heads of 8; fused/whisper, heads of 64, batch 2), LLaMA / Qwen2"
verify_decoders whisper,llama,qwen2
echo "== a decoding step's device times (uncaptured: IPFS_ACCELERATE_CUDA_GRAPHS=0), Whisper-tiny f16"
IPFS_ACCELERATE_CUDA_GRAPHS=0 IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --new 4 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas decoder|rror" | tail -2
echo "== Whisper-tiny transcription, 30 s + 100 tokens, against PyTorch generate f16"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config whisper-tiny --new 100 --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|rror|$G"
fi
if [ "$PART" = 14 ]; then
echo "== verify f32 and f16: T5 (ReLU and gated-GELU), Whisper, LLaMA, Qwen2 on the engine"
verify_decoders t5,whisper,llama,qwen2
echo "== a T5-small decoding step's device times (uncaptured), f16"
IPFS_ACCELERATE_CUDA_GRAPHS=0 IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config t5-small --prompt 32 --new 4 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas decoder|rror" | tail -3
echo "== T5-small, 32 input tokens + 64 new, against PyTorch generate (f16, then f32)"
for p in f16 f32; do
  timeout 150 ./xtask compare --dev --backend cuda --db $DB --config t5-small --prompt 32 --new 64 --dtype $p --peer torch:$p --rounds 3 --iters 3 --warmup 1 2>&1 | grep -E -A6 "median ms|rror|$G"
done
fi
if [ "$PART" = 15 ]; then
echo "== final code: verify f32 and f16 of T5, Whisper (shipped and heads of 64), LLaMA, Qwen2"
verify_decoders t5,whisper,llama,qwen2
echo "== against PyTorch f16: Whisper-tiny 30 s + 100 tokens, T5-small 32 + 64, SmolLM2-135M 128 + 128"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1"
timeout 120 ./xtask compare $c --config whisper-tiny --new 100 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 100 ./xtask compare $c --config t5-small --prompt 32 --new 64 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 100 ./xtask compare $c --config llama-135m --prompt 128 --new 128 2>&1 | grep -E -A6 "median ms|rror|$G"
fi
if [ "$PART" = 16 ]; then
echo "== T5 fixtures of T5's own initialisation, heads of 64, a padded batch of 2 (ReLU tied; gated GELU untied)"
T=/tmp/t5fix/t5
python3 ../tools/make_t5_fixture.py $T/relu64 256 4 64 2 512 0 1 2 20 7 > /dev/null 2>&1
python3 ../tools/make_t5_fixture.py $T/gated64 256 4 64 2 512 1 1 2 20 7 > /dev/null 2>&1
ls $T
for p in f32 f16; do
  timeout 60 ./xtask verify --fixtures /tmp/t5fix --family t5 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | tail -7
done
python3 ../tools/device/peer_half_error.py $T/relu64 $T/gated64 fixtures/t5/t5 fixtures/t5/flan 2>&1 | grep PyTorch
fi
if [ "$PART" = 17 ]; then
echo "== after the second review: verify f32 and f16 of T5, Whisper, LLaMA, Qwen2"
verify_decoders t5,whisper,llama,qwen2
echo "== against PyTorch f16: Whisper-tiny 30 s + 100 tokens, T5-small 32 + 64"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1"
timeout 120 ./xtask compare $c --config whisper-tiny --new 100 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 100 ./xtask compare $c --config t5-small --prompt 32 --new 64 2>&1 | grep -E -A6 "median ms|rror|$G"
fi
if [ "$PART" = 18 ]; then
echo "== seeded sampling: the same tokens with the picks on the device (1) and on the host (0)"
same_samples() {  # config dtype batch flags...
  local config=$1 dtype=$2 batch=$3; shift 3
  for d in 1 0; do
    IPFS_ACCELERATE_CUDA_DEVICE_PICKS=$d timeout 90 ./xtask bench --dev --backend cuda --no-db --config $config --prompt 32 --new 40 --dtype $dtype --batch $batch --iters 2 --warmup 0 --show-tokens "$@" 2>&1 | grep -E "^tokens:|rror" > /tmp/tok$d
  done
  if cmp -s /tmp/tok1 /tmp/tok0 && grep -q "^tokens:" /tmp/tok1; then
    echo "same ($(grep -c '^tokens:' /tmp/tok1) generations): $config $dtype b$batch $*"
  else
    echo "DIFFERENT: $config $dtype b$batch $*"; head -c 600 /tmp/tok1; echo; head -c 600 /tmp/tok0; echo
  fi
}
same_samples llama-135m f16 1 --temperature 0.8 --top-k 50 --repetition-penalty 1.1 --seed 1
same_samples llama-135m f32 1 --temperature 0.7 --top-p 0.9 --seed 2
same_samples llama-135m f16 1 --temperature 0.05 --top-p 0.9 --seed 3
same_samples llama-135m f16 1 --repetition-penalty 1.3
same_samples llama-1b f16 8 --temperature 1.0 --top-k 40 --top-p 0.95 --seed 4
same_samples qwen2-0.5b q4_k 1 --temperature 0.6 --top-k 100 --top-p 0.8 --repetition-penalty 1.05 --seed 5
echo "== decode with sampling (top-k 50, penalty 1.1), picks on the device against the host, alternating"
for round in 1 2; do
  for d in 1 0; do
    for cfg in "llama-1b 1" "llama-1b 8" "llama-135m 1"; do
      set -- $cfg
      echo "-- round $round, device picks $d, $1 b$2"
      IPFS_ACCELERATE_CUDA_DEVICE_PICKS=$d timeout 90 ./xtask bench --dev --backend cuda --no-db --config $1 --prompt 128 --new 128 --dtype f16 --batch $2 --iters 5 --warmup 1 --temperature 0.8 --top-k 50 --repetition-penalty 1.1 2>&1 | grep -E "decode|rror|$G"
    done
  done
done
echo "== the facade's cuda_generation tests (continuous batching on the engine, device picks)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_SHARED=$PWD timeout 200 ./cuda_generation --test-threads 1 --nocapture 2>&1 | tail -12
echo "== verify f32 and f16: LLaMA, Qwen2"
for p in f32 f16; do
  timeout 60 ./xtask verify --fixtures fixtures --family llama,qwen2 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -6
done
fi
if [ "$PART" = 19 ]; then
echo "== the facade's cuda_generation tests, continuous batching picking on the device (three runs)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
for run in 1 2 3; do
  IPFS_ACCELERATE_SHARED=$PWD timeout 100 ./cuda_generation --test-threads 1 2>&1 | grep -E "^test |test result|panicked|left|right"
done
fi
if [ "$PART" = 20 ]; then
echo "== verify f32 and f16: LLaVA and LLaVA-NeXT on the cuBLAS engines; LLaMA and Qwen2 (the decoder's prefill changed)"
for p in f32 f16; do
  timeout 150 ./xtask verify --fixtures fixtures --family llava,llava_next,llama,qwen2 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -12
done
save_llava
python3 -c "import json; c=json.load(open('/tmp/llava/config.json')); print({k: c.get(k) for k in ('image_token_id', 'image_token_index', 'image_seq_length')})"
echo "== against PyTorch f16 (LlavaForConditionalGeneration.generate): one 336-pixel image + 32 text tokens, 64 new"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 5 --warmup 1"
timeout 400 ./xtask compare $c --config /tmp/llava --prompt 32 --new 64 2>&1 | grep -E -A8 "median ms|rror|$G"
fi
if [ "$PART" = 21 ]; then
save_llava
echo "== where the first token's time goes: wall times, then per-stage device times (graphs off)"
IPFS_ACCELERATE_CUDA_GRAPHS=0 IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 90 ./xtask bench --dev --backend cuda --no-db --config /tmp/llava --prompt 32 --new 2 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas|rror" | tail -4 | cut -c1-900
echo "== against PyTorch f16 (LlavaForConditionalGeneration.generate): one 336-pixel image + 32 text tokens, 64 new"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 5 --warmup 1"
timeout 300 ./xtask compare $c --config /tmp/llava --prompt 32 --new 64 2>&1 | grep -E -A8 "median ms|rror|$G"
fi
if [ "$PART" = 22 ]; then
echo "== verify f32 and f16 after the prefill's attention moved to tensor cores (f16, 16+ new columns)"
for p in f32 f16; do
  timeout 150 ./xtask verify --fixtures fixtures --family llava,llava_next,llama,qwen2,whisper,t5 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -24
done
save_llava
echo "== LLaVA: where the first token's time goes (graphs off)"
IPFS_ACCELERATE_CUDA_GRAPHS=0 IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 90 ./xtask bench --dev --backend cuda --no-db --config /tmp/llava --prompt 32 --new 2 --dtype f16 --iters 1 --warmup 1 2>&1 | grep -E "^cublas|rror" | tail -4 | cut -c1-900
echo "== prefill attention: tensor cores (1) against the per-query kernel (0), alternating; Llama-3.2-1B f16 b1, bench p50 of 5"
for round in 1 2; do
  for f in 1 0; do
    for p in 128 1024; do
      echo "-- round $round, flash $f, prompt $p"
      IPFS_ACCELERATE_CUDA_FUSED_ATTENTION=$f timeout 90 ./xtask bench --dev --backend cuda --no-db --config llama-1b --prompt $p --new 16 --dtype f16 --iters 5 --warmup 1 2>&1 | grep -E "prefill|rror|$G"
    done
  done
done
echo "== decode with the cache's keys split across blocks: SmolLM2 and Llama-3.2-1B b1, prompt 1024 + 128, p50 of 5"
for cfg in llama-135m llama-1b; do
  timeout 90 ./xtask bench --dev --backend cuda --no-db --config $cfg --prompt 1024 --new 128 --dtype f16 --iters 5 --warmup 1 2>&1 | grep -E "decode|rror|$G"
done
echo "== against PyTorch f16: LLaVA (one 336-pixel image + 32 text tokens, 64 new), Llama-3.2-1B prompt 1024 + 64"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 5 --warmup 1"
timeout 200 ./xtask compare $c --config /tmp/llava --prompt 32 --new 64 2>&1 | grep -E -A8 "median ms|rror|$G"
timeout 150 ./xtask compare $c --config llama-1b --prompt 1024 --new 64 2>&1 | grep -E -A8 "median ms|rror|$G"
fi
if [ "$PART" = 23 ]; then
echo "== fresh machine (empty kernel cache): whole process, SmolLM2-135M f16 from a checkpoint folder, load + first 8 tokens"
save_smollm2
t0=$(now)
timeout 60 ./xtask bench --dev --backend cuda --no-db --config /tmp/smollm2 --prompt 128 --new 8 --dtype f16 --iters 1 --warmup 0 2>&1 | grep -E "prefill|decode|rror|cuBLAS engine"
t1=$(now); python3 -c "print('process wall s', round($t1 - $t0, 2))"
echo "== the final code: verify f32 and f16 of LLaVA, LLaVA-NeXT, LLaMA, Qwen2, Whisper"
for p in f32 f16; do
  timeout 100 ./xtask verify --fixtures fixtures --family llava,llava_next,llama,qwen2,whisper --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -3
done
echo "== the facade's cuda_generation tests (continuous batching, device picks, on the split and flash attention)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_SHARED=$PWD timeout 100 ./cuda_generation --test-threads 1 2>&1 | grep -E "^test |test result|panicked|left|right"
echo "== against PyTorch f16: Llama-3.2-1B prompt 1024 + 64, SmolLM2-135M 128 + 128"
c="--dev --backend cuda --no-db --dtype f16 --peer torch:f16 --rounds 3 --iters 5 --warmup 1"  # no DuckDB: the carry is full
timeout 120 ./xtask compare $c --config llama-1b --prompt 1024 --new 64 2>&1 | grep -E -A8 "median ms|rror|$G"
timeout 100 ./xtask compare $c --config llama-135m --prompt 128 --new 128 2>&1 | grep -E -A8 "median ms|rror|$G"
fi
cold() {  # label binary threads cache args...
  local label=$1 bin=$2 threads=$3 cache=$4; shift 4
  local t0=$(now)
  CUDA_CACHE_DISABLE=1 IPFS_ACCELERATE_KERNEL_CACHE=$cache IPFS_ACCELERATE_CUDA_COMPILE_THREADS=$threads timeout 60 $bin bench --dev --backend cuda --no-db "$@" --iters 1 --warmup 0 > /tmp/cold.txt 2>&1
  local t1=$(now)
  python3 -c "print('$label', 'wall s', round($t1 - $t0, 2))"
  grep -E "cuBLAS engine|rror" /tmp/cold.txt | sed 's/^/    /'
}
# verify in f32 and f16 of every family on the cuBLAS engines, the last N lines of each (parts 24, 25).
verify_engines() {
  for p in f32 f16; do
    timeout 150 ./xtask verify --fixtures fixtures --family bert,vit,clip,llama,qwen2,t5,whisper,llava,llava_next,wav2vec2 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -$1
  done
}
# The two first processes of parts 24 and 25: SmolLM2's first generate from /tmp/smollm2, MiniLM's first embedding.
cold_args() {
  if [ "$1" = smollm2 ]; then echo "--config /tmp/smollm2 --prompt 128 --new 8 --dtype f16"; else echo "--config minilm-l6 --batch 1 --seq 128 --dtype f32"; fi
}
if [ "$PART" = 24 ]; then
nproc
xz -dc xtask_old.xz > xtask_old && chmod +x xtask_old
save_smollm2; cat /tmp/smollm2/* > /dev/null
for what in smollm2 minilm; do
  args=$(cold_args $what)
  echo "== first process with empty caches: $what ($args); old = one PTX program per set, new = CUBIN in parts"
  for round in 1 2 3; do
    cold "old      r$round" ./xtask_old 0 /tmp/kc-old-$what-$round $args
    cold "new all  r$round" ./xtask 0 /tmp/kc-new-$what-$round $args
    cold "new 1thr r$round" ./xtask 1 /tmp/kc-one-$what-$round $args
  done
  echo "== the same processes with the caches the first round left (warm)"
  cold "old warm" ./xtask_old 0 /tmp/kc-old-$what-1 $args
  cold "new warm" ./xtask 0 /tmp/kc-new-$what-1 $args
done
echo "== verify f32 and f16, every family on the cuBLAS engines, kernels from the parts"
verify_engines 30
echo "== decode speed, old and new machine code alternating: SmolLM2 f16 128 + 128, p50 of 10"
for round in 1 2 3; do
  for bin in xtask_old xtask; do
    echo "-- $bin round $round"
    timeout 60 ./$bin bench --dev --backend cuda --no-db --config llama-135m --prompt 128 --new 128 --dtype f16 --iters 10 --warmup 2 2>&1 | grep -E "prefill|decode|rror|$G"
  done
done
fi
if [ "$PART" = 25 ]; then
xz -dc xtask_v1.xz > xtask_v1 && chmod +x xtask_v1
save_smollm2; cat /tmp/smollm2/* > /dev/null
for what in smollm2 minilm; do
  args=$(cold_args $what)
  echo "== first process with empty caches: $what ($args); v1 = compile, then upload; now = both at once"
  for round in 1 2 3 4; do
    cold "v1  r$round" ./xtask_v1 0 /tmp/kc-v1-$what-$round $args
    cold "now r$round" ./xtask 0 /tmp/kc-now-$what-$round $args
  done
  cold "now warm" ./xtask 0 /tmp/kc-now-$what-1 $args
done
echo "== verify f32 and f16, every family on the cuBLAS engines"
verify_engines 3
fi
if [ "$PART" = 26 ]; then
echo "== the public SmolLM2 GGUF, joined from the three calls' parts"
mkdir -p shared/models/SmolLM2-135M-Instruct-GGUF
cat g1/gpart00 g2/gpart01 g3/gpart02 | xz -dc > shared/models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum shared/models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== the facade's cuda_generation tests (continuous batching, device picks, the public SmolLM2 GGUF)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_SHARED=$PWD/shared timeout 300 ./cuda_generation --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|left|right|SmolLM2|skipped"
fi
if [ "$PART" = 27 ]; then
echo "== the facade's cuda_generation tests (Whisper's language detection on the engines, batching, picks)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_SHARED=$PWD/shared timeout 240 ./cuda_generation --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|left|right|whisper on cuda|skipped"
echo "== verify f32 and f16, every family on the cuBLAS engines"
verify_engines 3
fi
if [ "$PART" = 28 ]; then
echo "== verify f32 and f16, every family on the cuBLAS engines (Wav2Vec2 now among them)"
verify_engines 3
echo "== Wav2Vec2 on the cuBLAS encoder: its fixture in f32 and f16"
for p in f32 f16; do
  timeout 60 ./xtask verify --fixtures fixtures --family wav2vec2 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | tail -5
done
echo "== Wav2Vec2-base, 10 s of audio (160,000 samples), batch 1 and 8, f16, against PyTorch f16"
timeout 240 ./xtask compare --dev --backend cuda --no-db --config wav2vec2-base --batch 1,8 --seq 160000 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror|$G"
echo "== per-stage device times, batch 8"
IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 60 ./xtask bench --dev --backend cuda --no-db --config wav2vec2-base --batch 8 --seq 160000 --dtype f16 --iters 3 --warmup 1 2>&1 | grep -E "^cublas encoder|p50|rror" | tail -3
fi
if [ "$PART" = 29 ]; then
echo "== the facade's speech tests on the engines (Whisper's language detection, Wav2Vec2's Transcriber)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_SHARED=$PWD/shared timeout 200 ./cuda_generation whisper wav2vec2 --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|left|right|on cuda|skipped"
echo "== verify f32 and f16, every family on the cuBLAS engines, every encoder call split into chunks of 8 tokens"
IPFS_ACCELERATE_CUDA_CHUNK_TOKENS=8 verify_engines 3
echo "== chunks of 0 (never split), 2048, 4096, 8192 tokens, alternating (bench p50 of 20, f16)"
for round in 1 2; do
  for cfg in "bert-base --batch 128 --seq 128" "vit-base --batch 32" "whisper-tiny --batch 8"; do
    for c in 0 2048 4096 8192; do
      r=$(IPFS_ACCELERATE_CUDA_CHUNK_TOKENS=$c timeout 60 ./xtask bench --dev --backend cuda --no-db --config $cfg --dtype f16 --iters 20 --warmup 3 2>&1 | grep -E "p50|rror" | tail -1)
      echo "r$round $cfg chunk=$c: $r"
    done
  done
done
fi
if [ "$PART" = 30 ]; then
echo "== encoders against PyTorch f16 (calls not split: part 29 measured the chunks slower), rounds alternating"
export IPFS_ACCELERATE_CUDA_CHUNK_TOKENS=0
for cfg in "bert-base --batch 1,32,128 --seq 128" "vit-base --batch 32" "whisper-tiny --batch 1,8" "clip-vit-b32 --batch 32" "wav2vec2-base --batch 8 --seq 160000"; do
  timeout 150 ./xtask compare --dev --backend cuda --no-db --config $cfg --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror|$G"
done
fi
if [ "$PART" = 31 ]; then
echo "== CLAP's whole fixture on cuda f32, in the background: text on the engine, HTSAT on CubeCL (compiling)"
(timeout 400 ./xtask verify --fixtures fixtures --family clap --backend cuda 2>&1 | grep -v "^ *$" | tail -6 > /tmp/clap_verify.txt) &
(timeout 400 ./xtask verify --fixtures fixtures --family xclip --backend cuda 2>&1 | grep -v "^ *$" | tail -6 > /tmp/xclip_verify.txt) &
echo "== an X-CLIP checkpoint with heads of 64 (transformers' random weights: 2 layers of 128, 64-pixel frames, 8 per video)"
cat > /tmp/save_xclip.py <<'PY'
import torch, transformers as tf
text = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, vocab_size=1000,
            max_position_embeddings=32)
vision = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, image_size=64,
              patch_size=16, num_frames=8, mit_hidden_size=64, mit_intermediate_size=128, mit_num_hidden_layers=1,
              mit_num_attention_heads=2)
torch.manual_seed(0)
m = tf.XCLIPModel(tf.XCLIPConfig(text_config=text, vision_config=vision, projection_dim=64, prompt_layers=1,
                                 prompt_num_attention_heads=2))
m.save_pretrained("/tmp/xclip64")
print("saved", sum(p.numel() for p in m.parameters()), "parameters, transformers", tf.__version__)
PY
timeout 120 python3 /tmp/save_xclip.py 2>&1 | tail -1
echo "== CLAP's text tower and X-CLIP's vision tower on the cuBLAS encoder (the facade's tests), f32 and f16"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_XCLIP_EXTRA=/tmp/xclip64 IPFS_ACCELERATE_SHARED=$PWD/shared timeout 150 ./cuda_generation clap xclip --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|left|right|clap|xclip|skipped"
echo "== RoBERTa-family fixtures on the engine, f32 and f16"
for p in f32 f16; do
  timeout 90 ./xtask verify --fixtures fixtures --family bert --backend cuda --precision $p 2>&1 | grep -E "roberta|checks|rror" | tail -14
done
echo "== verify f32 and f16, every family on the cuBLAS engines"
verify_engines 3
wait
echo "== CLAP's and X-CLIP's whole fixtures on cuda f32"
cat /tmp/clap_verify.txt /tmp/xclip_verify.txt
fi
if [ "$PART" = 32 ]; then
echo "== generation against PyTorch eager f16, rounds alternating; ours and PyTorch's rows in $DB"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 3 --warmup 1"
timeout 100 ./xtask compare $c --config llama-135m --prompt 128 --new 128 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 140 ./xtask compare $c --config qwen2-0.5b --prompt 128 --new 128 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 120 ./xtask compare $c --config whisper-tiny --new 100 2>&1 | grep -E -A6 "median ms|rror|$G"
timeout 100 ./xtask compare $c --config t5-small --prompt 32 --new 64 2>&1 | grep -E -A6 "median ms|rror|$G"
echo "== BERT-base against PyTorch f16 (positions now uploaded with the ids), rounds alternating"
timeout 150 ./xtask compare --dev --backend cuda --db $DB --config bert-base --batch 1,32,128 --seq 128 --dtype f16 --peer torch:f16 --rounds 3 --iters 10 --warmup 2 2>&1 | grep -E -A8 "median ms|rror|$G"
echo "== the rows stored"
./xtask compare-backends --db $DB --family llama 2>&1 | tail -8
fi
if [ "$PART" = 33 ]; then
echo "== CLAP's and X-CLIP's whole fixtures on cuda f32, in the background (their burn halves on CubeCL, compiling)"
for fam in clap xclip; do
  (timeout 400 ./xtask verify --fixtures fixtures --family $fam --backend cuda 2>&1 | grep -v "^ *$" | tail -6 > /tmp/verify_$fam.txt) &
done
echo "== CLAP's text tower on the cuBLAS encoder in f32 and f16, and through the facade (the facade's test)"
xz -dc cuda_generation.xz > cuda_generation && chmod +x cuda_generation
IPFS_ACCELERATE_SHARED=$PWD/shared timeout 90 ./cuda_generation clap --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|left|right|clap|skipped"
wait
echo "== CLAP's and X-CLIP's whole fixtures on cuda f32"
cat /tmp/verify_clap.txt /tmp/verify_xclip.txt
fi
if [ "$PART" = 34 ]; then
echo "== where the encoders' time goes: our per-stage device time (f16), then PyTorch's GEMM floor and kernels"
for a in "bert-base --batch 128 --seq 128" "bert-base --batch 32 --seq 128" "vit-base --batch 32" "whisper-tiny --batch 8"; do
  IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 90 ./xtask bench --dev --backend cuda --no-db --config $a --dtype f16 --iters 3 --warmup 1 2>&1 | grep -E "^cublas encoder|p50|rror" | tail -2
done
timeout 200 python3 gemm_floor.py 2>&1 | grep -v -i warn
fi
# Parts 35 and 37: fixtures with heads of 64 and 32 made here, verified in f16 and f32; every shipped fixture; the
# per-stage profiles of the four encoder shapes.
session30_checks() {
echo "== fixtures with heads of 64 and 32 (the fused attention), HF float64 on this machine: sequences ending inside a tile"
F=/tmp/fused
python3 make_bert_fixture.py $F/bert/h64 128 2 256 77 3 > /dev/null 2>&1
python3 make_bert_fixture.py $F/bert/h32 128 4 256 130 2 > /dev/null 2>&1
python3 make_vit_fixture.py $F/vit/h64 128 2 256 64 8 2 3 > /dev/null 2>&1
python3 make_clip_fixture.py $F/clip/h64 128 2 256 20 64 8 2 > /dev/null 2>&1
python3 make_whisper_fixture.py $F/whisper/h64 128 2 2 400 2 7 > /dev/null 2>&1
ls $F/*
for p in f16 f32; do
  timeout 100 ./xtask verify --fixtures $F --family bert,vit,clip,whisper --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -12
done
echo "== verify f32 and f16, every family's shipped fixtures on the cuBLAS engines"
verify_engines 3
echo "== per-stage device times, f16"
for a in "bert-base --batch 128 --seq 128" "bert-base --batch 32 --seq 128" "vit-base --batch 32" "whisper-tiny --batch 8"; do
  IPFS_ACCELERATE_CUBLAS_PROFILE=1 timeout 90 ./xtask bench --dev --backend cuda --no-db --config $a --dtype f16 --iters 3 --warmup 1 2>&1 | grep -E "^cublas encoder|rror" | tail -1
done
}
if [ "$PART" = 35 ]; then
session30_checks
echo "== Nsight Compute, where the machine has it: the fused attention (Whisper-tiny b8, BERT-base b128) and the row kernels"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  for a in "whisper-tiny --batch 8" "bert-base --batch 128 --seq 128"; do
    for k in flash_attention_64 bias_act_vec add_norm_sum_warp bias_residual_norm_warp; do
      f=$OUT/ncu_${a%% *}_$k.txt
      timeout 120 $NCU --target-processes all -k regex:$k -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        ./xtask bench --dev --backend cuda --no-db --config $a --dtype f16 --iters 1 --warmup 0 > $f 2>&1
      grep -E "^  [a-z]|Duration|Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|ERR" $f | head -16
    done
  done
else
  echo "no ncu"
fi
fi
if [ "$PART" = 37 ]; then
session30_checks
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for k in flash_attention_64 bias_act_vec; do
  f=$OUT/ncu_whisper_$k.txt
  timeout 60 $NCU --target-processes all -k regex:$k -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    ./xtask bench --dev --backend cuda --no-db --config whisper-tiny --batch 8 --dtype f16 --iters 1 --warmup 0 > $f 2>&1
  grep -E "^  [a-z]|Duration|Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|ERR" $f | head -12
done
fi
if [ "$PART" = 38 ]; then
echo "== the fixtures with heads of 64 and 32 in f16 (transfers now in pieces of 4 MiB)"
F=/tmp/fused
python3 make_bert_fixture.py $F/bert/h64 128 2 256 77 3 > /dev/null 2>&1
python3 make_vit_fixture.py $F/vit/h64 128 2 256 64 8 2 3 > /dev/null 2>&1
python3 make_whisper_fixture.py $F/whisper/h64 128 2 2 400 2 7 > /dev/null 2>&1
timeout 100 ./xtask verify --fixtures $F --family bert,vit,whisper --backend cuda --precision f16 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -8
SWITCHES=("X=1" "PIPELINED_TRANSFERS=0")
fi
if [ "$PART" = 36 ] || [ "$PART" = 37 ] || [ "$PART" = 38 ]; then
[ "$PART" = 38 ] || SWITCHES=("X=1" "PIPELINED_TRANSFERS=0 IPFS_ACCELERATE_CUDA_WARP_NORM=0")
echo "== new against old, alternating, bench p50 of 20: ${SWITCHES[*]}"
for round in 1 2; do
  for v in "${SWITCHES[@]}"; do
    echo "-- round $round: IPFS_ACCELERATE_CUDA_$v"
    for a in "bert-base --batch 128 --seq 128" "bert-base --batch 32 --seq 128" "vit-base --batch 32" "whisper-tiny --batch 8"; do
      env IPFS_ACCELERATE_CUDA_$v timeout 60 ./xtask bench --dev --backend cuda --no-db --config $a --dtype f16 --iters 20 --warmup 3 2>&1 | grep -E "p50|rror" | tail -1
    done
  done
done
echo "== the encoders against PyTorch f16, rounds alternating; rows in $DB"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16 --rounds 3 --iters 20 --warmup 3"
for a in "bert-base --batch 1,32,128 --seq 128" "vit-base --batch 32" "whisper-tiny --batch 1,8" "clip-vit-b32 --batch 32" "wav2vec2-base --batch 8 --seq 160000"; do
  timeout 150 ./xtask compare $c --config $a 2>&1 | grep -E -A8 "median ms|rror|$G"
done
fi
if [ "$PART" = 39 ]; then
# Session 31: the fused attention with fewer instructions per key tile (shared addresses, straight
# staging, scale folded into one FMA, rescale skipped when no maximum grew).
session30_checks
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for a in "whisper-tiny --batch 8" "bert-base --batch 128 --seq 128"; do
  f=$OUT/ncu_${a%% *}_flash_attention_64.txt
  timeout 60 $NCU --target-processes all -k regex:flash_attention_64 -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    ./xtask bench --dev --backend cuda --no-db --config $a --dtype f16 --iters 1 --warmup 0 > $f 2>&1
  grep -E "^  [a-z]|Duration|Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|ERR" $f | head -12
done
fi
if [ "$PART" = 40 ] || [ "$PART" = 41 ]; then
echo "== the encoders against PyTorch f16 kept on the device (torch) and from host to host as ours (torch-host), rounds alternating; rows in $DB"
c="--dev --backend cuda --db $DB --dtype f16 --peer torch:f16,torch-host:f16 --rounds 3 --iters 20 --warmup 3"
if [ "$PART" = 40 ]; then SHAPES=("bert-base --batch 1,32,128 --seq 128" "vit-base --batch 32"); T=330
else SHAPES=("whisper-tiny --batch 1,8" "clip-vit-b32 --batch 32" "wav2vec2-base --batch 8 --seq 160000"); T=200; fi
for a in "${SHAPES[@]}"; do
  timeout $T ./xtask compare $c --config $a 2>&1 | grep -E -A12 "median ms|rror|$G"
done
fi
if [ "$PART" = 42 ]; then
# Session 31: a fresh machine's first MiniLM embedding and SmolLM2 generation with this build's kernels.
save_smollm2; cat /tmp/smollm2/* > /dev/null
for what in minilm smollm2; do
  args=$(cold_args $what)
  echo "== first process with empty caches: $what ($args)"
  for round in 1 2 3; do cold "r$round" ./xtask 0 /tmp/kc-$what-$round $args; done
  cold "warm" ./xtask 0 /tmp/kc-$what-1 $args
done
fi
if [ "$PART" = 44 ]; then
# Session 32: every activation HF configs name, and ViT poolers of another width and activation, on the
# cuBLAS encoder (the spec names them all now); fixtures made here by transformers in float64, then every
# shipped fixture in f32 and f16.
F=/tmp/acts
for a in silu mish relu6 sigmoid tanh linear quick_gelu gelu_new; do
  HIDDEN_ACT=$a python3 make_bert_fixture.py $F/bert/$a 64 2 128 21 2 > /dev/null 2>&1
done
POOLER_ACT=relu POOLER_SIZE=48 python3 make_vit_fixture.py $F/vit/pooler_relu_48 64 2 128 32 8 2 0 > /dev/null 2>&1
POOLER_ACT=gelu POOLER_SIZE=96 python3 make_vit_fixture.py $F/vit/pooler_gelu_96 64 2 128 32 8 2 0 > /dev/null 2>&1
ls $F/*
for p in f32 f16; do
  timeout 100 ./xtask verify --fixtures $F --family bert,vit --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -22
done
echo "== verify f32 and f16, every family's shipped fixtures on the cuBLAS engines"
verify_engines 3
fi
if [ "$PART" = 45 ]; then
# Session 33: Whisper's encoder, Wav2Vec2 and X-CLIP's vision tower described once (the engines read the same
# description as burn). Wav2Vec2 in the layouts the shipped fixture lacks (a LayerNorm after every convolution,
# post- and pre-norm layers: fixtures/wav2vec2/layer_*, and heads of 64 made here), then every shipped fixture,
# then X-CLIP's whole fixture (the MIT and prompt generator on CubeCL, compiling on the machine).
F=/tmp/w2v
python3 make_wav2vec2_fixture.py $F/wav2vec2/h64_layer_stable layer 1 16000 128 2 > /dev/null 2>&1
python3 make_wav2vec2_fixture.py $F/wav2vec2/h64_layer_post layer 0 16000 128 2 > /dev/null 2>&1
python3 make_wav2vec2_fixture.py $F/wav2vec2/h64_group_post group 0 16000 128 2 > /dev/null 2>&1
ls $F/*
for p in f32 f16; do
  timeout 100 ./xtask verify --fixtures $F --family wav2vec2 --backend cuda --precision $p 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -10
done
echo "== verify f32 and f16, every family's shipped fixtures (and wav2vec2/layer_*) on the cuBLAS engines"
verify_engines 40
echo "== X-CLIP's whole fixture on cuda, f32 (vision tower on the engine; MIT and prompt generator on CubeCL)"
timeout 240 ./xtask verify --fixtures fixtures --family xclip --backend cuda --precision f32 2>&1 | grep -v "^ *$" | tail -5
fi
if [ "$PART" = 46 ]; then
# Session 34: the CPU's convolutions moved onto the kernels, with burn's convolutions kept on the channels-first
# view elsewhere, and DETR's frozen batch norms folded into their convolutions at load. On cuda, DETR and CLAP
# run on CubeCL (burn), so they check that fallback and the folded norms; then every engine family, as before.
# On a fresh machine CubeCL's compiles took the whole 300 s the first call gave this step (it printed nothing);
# a second call on the warm machine passed in 105 s (docs/data/h200-session34.log).
echo "== DETR and CLAP on cuda (CubeCL, compiling on the machine), f32"
timeout 540 ./xtask verify --fixtures fixtures --family detr,clap --backend cuda --precision f32 2>&1 | grep -v "^ *$" | grep -v blocks- | tail -10
echo "== verify f32 and f16, every family's shipped fixtures (and wav2vec2/layer_*) on the cuBLAS engines"
verify_engines 40
fi
ls -la $OUT
