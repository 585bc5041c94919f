#!/usr/bin/env python3
"""A GGUF file of random weights at a real Qwen2 / LLaMA shape (default: Qwen2.5-0.5B), in F16, with a
byte-level BPE vocabulary borrowed from another GGUF file and padded to the config's vocab size. Quantize it
with llama.cpp's `llama-quantize` (e.g. Q4_K_M) to benchmark a real block mix without downloading a model:

  pip install gguf numpy
  python3 tools/make_random_gguf.py --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf --out qwen2.5-0.5b-f16.gguf
  llama-quantize qwen2.5-0.5b-f16.gguf qwen2.5-0.5b-Q4_K_M.gguf Q4_K_M

The weights are N(0, 0.02) (norms 1, biases 0), seeded; their values do not matter for speed or memory. Q and K
are written as HF stores them (qwen2 GGUF files are not permuted; llama ones are, as convert_hf_to_gguf does).
"""
import argparse

import numpy as np
import gguf

QWEN25_05B = dict(arch="qwen2", vocab=151936, hidden=896, ffn=4864, layers=24, heads=14, kv_heads=2,
                  context=32768, rope_theta=1e6, eps=1e-6, qkv_bias=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF file with a gpt2 (byte-level BPE) vocabulary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    c = QWEN25_05B
    rng = np.random.default_rng(args.seed)
    src = gguf.GGUFReader(args.tokenizer_from)

    def field(name):
        f = src.fields[name]
        return f

    def strings(name):
        f = field(name)
        return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
    assert len(tokens) <= c["vocab"], "the borrowed vocabulary is larger than the config's"
    pad = c["vocab"] - len(tokens)
    tokens += [f"<|extra_{i}|>" for i in range(pad)]
    types += [gguf.TokenType.NORMAL] * pad  # plain entries (a real vocabulary has a few dozen added tokens)

    w = gguf.GGUFWriter(args.out, c["arch"])
    w.add_name("random Qwen2.5-0.5B shape")
    w.add_context_length(c["context"])
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id").parts[-1][0]))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id").parts[-1][0]))

    def tensor(name, shape, kind="weight"):
        if kind == "norm":
            data = np.ones(shape, dtype=np.float32)
        elif kind == "bias":
            data = np.zeros(shape, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        w.add_tensor(name, data)

    h, f, hd = c["hidden"], c["ffn"], c["hidden"] // c["heads"]
    kv = c["kv_heads"] * hd
    tensor("token_embd.weight", (c["vocab"], h))
    for i in range(c["layers"]):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", (h,), "norm")
        tensor(p + "attn_q.weight", (h, h))
        tensor(p + "attn_k.weight", (kv, h))
        tensor(p + "attn_v.weight", (kv, h))
        if c["qkv_bias"]:
            tensor(p + "attn_q.bias", (h,), "bias")
            tensor(p + "attn_k.bias", (kv,), "bias")
            tensor(p + "attn_v.bias", (kv,), "bias")
        tensor(p + "attn_output.weight", (h, h))
        tensor(p + "ffn_norm.weight", (h,), "norm")
        tensor(p + "ffn_gate.weight", (f, h))
        tensor(p + "ffn_up.weight", (f, h))
        tensor(p + "ffn_down.weight", (h, f))
    tensor("output_norm.weight", (h,), "norm")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: {c['arch']}, {c['layers']} layers, vocab {c['vocab']} (tied head)")


if __name__ == "__main__":
    main()
