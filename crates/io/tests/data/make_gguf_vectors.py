#!/usr/bin/env python3
"""Generates the GGUF test vectors of crates/io/tests (run from anywhere; writes next to this file).

Needs `pip install gguf numpy transformers tokenizers` (transformers 5.x for the tokenizer references).

- dequant_vectors.gguf: for every supported ggml type `<t>` a tensor `<t>.q` holding the raw block
  bytes (stored with that ggml type) and a float32 tensor `<t>.expected` with what the reference
  dequantisation in `gguf.quants` (numpy port of ggml-quants.c) gives for them. Types the package can
  quantize are quantized from random floats; the k-quants, IQ4 and Q8_K get random block bytes with
  sane fp16 / f32 scales. Q8_K has no numpy dequantizer, so its expectation is computed here from
  ggml's `y = d * q`.
- tokenizer_llama.gguf / tokenizer_llama.json: a tiny sentencepiece-style vocabulary
  (`tokenizer.ggml.model = llama`: byte fallback, scores, control / user-defined tokens) and the ids
  and decodings transformers' GGUF tokenizer conversion (AutoTokenizer with gguf_file) gives.
- tokenizer_<pre>.gguf / .json: a tiny byte-level BPE vocabulary trained here with `tokenizers`,
  written with `tokenizer.ggml.model = gpt2` and `tokenizer.ggml.pre = <pre>`, with the same kind of
  references.
"""

import json
import os
import shutil
import tempfile

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

# GGUF_VECTORS_OUT / GGUF_VECTORS_SEED write another set elsewhere (point the Rust tests at it with
# IPFS_ACCELERATE_GGUF_VECTORS=<dir>).
HERE = os.environ.get("GGUF_VECTORS_OUT") or os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(int(os.environ.get("GGUF_VECTORS_SEED", "20240603")))


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(len(values), 2)


def random_floats(rows, cols):
    """Rows of different magnitudes and signs, plus an all-zero and a constant row."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x *= (10.0 ** rng.uniform(-3, 1, size=(rows, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = 0.75
    x[2] = np.abs(x[2])
    return x


def random_blocks(qtype, n_blocks):
    """Random block bytes with every scale field overwritten by a sane positive or negative fp16."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scale = lambda: f16_bytes(rng.uniform(-2, 2, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks))
    if qtype in (T.Q4_K, T.Q5_K):  # d, dmin first
        b[:, 0:2] = scale()
        b[:, 2:4] = scale()
    elif qtype == T.Q2_K:  # scales[16], qs[64], d, dmin
        b[:, 80:82] = scale()
        b[:, 82:84] = scale()
    elif qtype == T.Q3_K:  # hmask[32], qs[64], scales[12], d
        b[:, 108:110] = scale()
    elif qtype == T.Q6_K:  # ql[128], qh[64], scales[16], d
        b[:, 208:210] = scale()
    elif qtype in (T.IQ4_NL, T.IQ4_XS):
        b[:, 0:2] = scale()
    elif qtype == T.Q8_K:  # f32 d, qs[256], bsums[16]
        d = (rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks)).astype(np.float32)
        b[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
        qs = b[:, 4:260].view(np.int8).astype(np.int16)
        b[:, 260:292] = qs.reshape(n_blocks, 16, 16).sum(axis=2).astype(np.int16).view(np.uint8)
    return b


def q8_k_reference(blocks):
    d = blocks[:, 0:4].copy().view(np.float32)
    q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return (d * q).astype(np.float32)


def dequant_vectors(path):
    w = gguf.GGUFWriter(path, arch="test")
    # Plain element types, with special values in the float ones.
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 6.0e-8, -1.0e-40, 65504.0], dtype=np.float32)
    x = np.concatenate([random_floats(3, 64), np.resize(specials, (1, 64))]).astype(np.float32)
    for qtype, name in [(T.F32, "f32"), (T.F16, "f16"), (T.BF16, "bf16")]:
        q = quantize(x, qtype)
        raw = q.view(np.uint8).reshape(x.shape[0], -1)
        expected = dequantize(raw, qtype).astype(np.float32).reshape(x.shape)
        w.add_tensor(f"{name}.q", raw, raw_shape=raw.shape, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", expected)
    # Types the package quantizes.
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        x = random_floats(8, 64)
        q = quantize(x, qtype)
        expected = dequantize(q, qtype).astype(np.float32)
        assert expected.shape == x.shape
        w.add_tensor(f"{qtype.name.lower()}.q", q, raw_shape=q.shape, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name.lower()}.expected", expected)
    # Random blocks with sane scales.
    for qtype, n_blocks in [(T.Q2_K, 4), (T.Q3_K, 4), (T.Q4_K, 4), (T.Q5_K, 4), (T.Q6_K, 4), (T.Q8_K, 4),
                            (T.IQ4_NL, 16), (T.IQ4_XS, 4)]:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        b = random_blocks(qtype, n_blocks)
        rows = 2
        raw = b.reshape(rows, -1)
        if qtype == T.Q8_K:
            expected = q8_k_reference(b).reshape(rows, -1)
        else:
            expected = dequantize(raw, qtype).astype(np.float32)
        assert expected.shape == (rows, n_blocks * block_size // rows)
        w.add_tensor(f"{qtype.name.lower()}.q", raw, raw_shape=raw.shape, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name.lower()}.expected", expected)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference_cases(gguf_path, texts):
    """Ids and decodings from transformers' own GGUF tokenizer conversion."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(gguf_path, os.path.join(d, "t.gguf"))
        tok = AutoTokenizer.from_pretrained(d, gguf_file="t.gguf")
    cases = []
    for text in texts:
        ids = tok(text).input_ids
        cases.append({
            "text": text,
            "ids": ids,
            "decoded": tok.decode(ids),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    return cases


def write_tokenizer(path, model, tokens, token_types, extra):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    for fn in extra:
        fn(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TEXTS = [
    "hello world",
    " hello",
    "hello  world",
    "héllo ☃",
    "<|user|>hello<think>world",
    "",
    "the\nworld",
    "I'm here: 12345 and 3.14!\n\n  ok",
    "Don'T stop   them\t\tnow",
    "日本語 text",
]


def llama_tokenizer():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "he", "ll", "llo", "▁hel", "▁hell",
              "▁hello", "▁w", "or", "▁wor", "▁world", "ld", "▁t", "▁th", "th", "▁the", "t", "é", "n", "s",
              "▁s", "▁st", "op", "▁o", "ok", "▁ok", "▁n", "▁no", "▁now", "no", "ow", "▁I", "I", "'", "m",
              "'m"]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0, 0.0]
    tokens += pieces + ["<|user|>", "<think>"]
    types += [1] * len(pieces) + [3, 4]
    path = os.path.join(HERE, "tokenizer_llama.gguf")
    write_tokenizer(path, "llama", tokens, types, [
        lambda w: w.add_token_scores(scores),
        lambda w: w.add_bos_token_id(1),
        lambda w: w.add_eos_token_id(2),
        lambda w: w.add_unk_token_id(0),
    ])
    return path


def bpe_vocab():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = [
        "Hello world! The quick brown fox jumps over the lazy dog.",
        "I'm here, you're there, they've gone and we'll see. It's 2024 and 3.14159 is pi.",
        "Numbers 0123456789 and more numbers 42, 1000, 65535.",
        "  Indented line\n\tTabbed line\n\nDouble newline end.",
        "héllo wörld, naïve café, 日本語のテキスト, ☃ snowman.",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|user|>", "<think>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    assert [i for _, i in vocab] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3, 3, 4] + [1] * (len(tokens) - 3)
    return tokens, types, merges


def bpe_tokenizer(pre):
    tokens, types, merges = bpe_vocab()
    path = os.path.join(HERE, f"tokenizer_{pre}.gguf")
    write_tokenizer(path, "gpt2", tokens, types, [
        lambda w: w.add_tokenizer_pre(pre),
        lambda w: w.add_token_merges(merges),
        lambda w: w.add_bos_token_id(0),
        lambda w: w.add_eos_token_id(0),
        lambda w: w.add_add_bos_token(True),
    ])
    return path


def main():
    dequant_vectors(os.path.join(HERE, "dequant_vectors.gguf"))
    path = llama_tokenizer()
    with open(os.path.join(HERE, "tokenizer_llama.json"), "w") as f:
        json.dump(reference_cases(path, TEXTS), f, ensure_ascii=False, indent=1)
    for pre in ("llama-bpe", "qwen2"):
        path = bpe_tokenizer(pre)
        with open(os.path.join(HERE, f"tokenizer_{pre}.json"), "w") as f:
            json.dump(reference_cases(path, TEXTS), f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
