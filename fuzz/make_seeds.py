#!/usr/bin/env python3
"""Writes the binary seed corpora of the fuzz targets (small valid inputs, a few KB each):
safetensors files, GGUF files (every dequantised ggml type, gpt2 and llama tokenizers, LLaMA /
Qwen2 metadata), WAVs and PNGs. Standard library only; deterministic.

    python3 fuzz/make_seeds.py fuzz/seeds

The config and chat-template seeds are text files kept in the repository as they are."""

import json
import math
import os
import struct
import sys
import wave
import zlib

QK_K = 256


def noise(n, seed):
    """Deterministic pseudo-random bytes (xorshift64)."""
    x = ((seed * 0x9E3779B97F4A7C15) | 1) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out.append((x >> 24) & 0xFF)
    return bytes(out)


def write(directory, name, data):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)
    print(f"{directory}/{name}: {len(data)} bytes")


# ---------------------------------------------------------------- safetensors

def safetensors(tensors):
    header = {"__metadata__": {"format": "pt", "note": "fuzz seed"}}
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def f32s(values):
    return struct.pack(f"<{len(values)}f", *values)


def f16s(values):
    return struct.pack(f"<{len(values)}e", *values)


def bf16s(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def safetensors_seeds(d):
    write(d, "floats.safetensors", safetensors([
        ("embeddings.weight", "F32", [3, 4], f32s([i * 0.25 - 1.0 for i in range(12)])),
        ("layer.0.bias", "F16", [8], f16s([i / 3.0 for i in range(8)])),
        ("layer.0.weight", "BF16", [2, 2, 2], bf16s([-i / 7.0 for i in range(8)])),
        ("scalar", "F32", [], f32s([3.5])),
        ("empty", "F32", [0, 4], b""),
    ]))
    # The compact int8 form: W as I8 [rows, cols] plus `W#scale` [rows, blocks] (or [rows]).
    q = bytes((i * 7) & 0xFF for i in range(32))
    write(d, "int8_blocks.safetensors", safetensors([
        ("dense.weight", "I8", [4, 8], q),
        ("dense.weight#scale", "F32", [4, 2], f32s([0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08])),
        ("per_row", "I8", [4, 8], noise(32, 1)),
        ("per_row#scale", "F16", [4], f16s([0.5, 0.25, 0.125, 1.0])),
    ]))
    write(d, "ints.safetensors", safetensors([
        ("input_ids", "I64", [1, 3], struct.pack("<3q", 101, 2023, 102)),
        ("mask", "I32", [3], struct.pack("<3i", 1, 1, 0)),
        ("ref", "F64", [2], struct.pack("<2d", 0.5, -2.0)),
        ("bytes", "U8", [4], bytes([0, 1, 254, 255])),
        ("flags", "BOOL", [2], bytes([0, 1])),
    ]))


# ---------------------------------------------------------------- GGUF

# id: (name, block size, bytes per block), for the types the reader dequantises
GGML = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 9: ("q8_1", 32, 36),
    10: ("q2_k", QK_K, 84), 11: ("q3_k", QK_K, 110), 12: ("q4_k", QK_K, 144),
    13: ("q5_k", QK_K, 176), 14: ("q6_k", QK_K, 210), 15: ("q8_k", QK_K, 292),
    20: ("iq4_nl", 32, 18), 23: ("iq4_xs", QK_K, 136), 30: ("bf16", 1, 2),
}
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f",
          T_BOOL: "?", T_U64: "Q", T_I64: "q", T_F64: "d"}


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gvalue(ty, v):
    if ty == T_STR:
        return gstr(v)
    if ty == T_ARR:
        elem, items = v
        out = struct.pack("<IQ", elem, len(items))
        return out + b"".join(gvalue(elem, i) for i in items)
    return struct.pack("<" + SCALAR[ty], v)


class Gguf:
    def __init__(self, version=3, alignment=32):
        self.version, self.alignment = version, alignment
        self.kv, self.tensors = [], []

    def meta(self, key, ty, value):
        self.kv.append((key, ty, value))
        return self

    def tensor(self, name, shape, type_id, data=None, seed=1):
        _, block, size = GGML[type_id]
        n = math.prod(shape)
        assert shape[-1] % block == 0
        nbytes = n // block * size
        self.tensors.append((name, shape, type_id, data if data is not None else noise(nbytes, seed)))
        assert len(self.tensors[-1][3]) == nbytes
        return self

    def bytes(self):
        out = b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kv))
        for key, ty, value in self.kv:
            out += gstr(key) + struct.pack("<I", ty) + gvalue(ty, value)
        offset = 0
        pad = lambda n: -n % self.alignment
        for name, shape, ty, data in self.tensors:
            out += gstr(name) + struct.pack("<I", len(shape))
            out += b"".join(struct.pack("<Q", d) for d in reversed(shape))
            out += struct.pack("<IQ", ty, offset)
            offset += len(data) + pad(len(data))
        out += b"\0" * pad(len(out))
        for _, _, _, data in self.tensors:
            out += data + b"\0" * pad(len(data))
        return out


def byte_level_alphabet():
    """GPT-2's byte-to-unicode table."""
    out, n = [], 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            out.append(chr(b))
        else:
            n += 1
            out.append(chr(255 + n))
    return out


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def gpt2_tokenizer(g, pre):
    merges = ["Ġ t", "h e", "Ġt he", "e r", "Ġ a", "i n", "o n", "Ġ w"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + byte_level_alphabet()
    tokens += [m.replace(" ", "") for m in merges] + ["<tool>"]
    types = [3, 3, 3] + [1] * (len(tokens) - 4) + [4]
    g.meta("tokenizer.ggml.model", T_STR, "gpt2").meta("tokenizer.ggml.pre", T_STR, pre)
    g.meta("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens))
    g.meta("tokenizer.ggml.token_type", T_ARR, (T_I32, types))
    g.meta("tokenizer.ggml.merges", T_ARR, (T_STR, merges))
    g.meta("tokenizer.ggml.bos_token_id", T_U32, 1).meta("tokenizer.ggml.eos_token_id", T_U32, 2)
    g.meta("tokenizer.ggml.padding_token_id", T_U32, 0)
    g.meta("tokenizer.chat_template", T_STR, CHATML)
    return len(tokens)


def llama_tokenizer(g):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += ["▁", "e", "t", "a", "o", "h", "l", "▁t", "he", "▁the", "ll", "▁he", "llo", "▁hello"]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    g.meta("tokenizer.ggml.model", T_STR, "llama")
    g.meta("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens))
    g.meta("tokenizer.ggml.token_type", T_ARR, (T_I32, types))
    g.meta("tokenizer.ggml.scores", T_ARR, (T_F32, [-float(i) for i in range(len(tokens))]))
    g.meta("tokenizer.ggml.bos_token_id", T_U32, 1).meta("tokenizer.ggml.eos_token_id", T_U32, 2)
    g.meta("tokenizer.ggml.unknown_token_id", T_U32, 0).meta("tokenizer.ggml.add_bos_token", T_BOOL, True)
    g.meta("tokenizer.chat_template", T_STR,
           "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] | trim }} [/INST]{% endfor %}")
    return len(tokens)


def llama_config(g, arch):
    """A 1-block decoder of width 32: 4 heads of 8, 2 KV heads."""
    g.meta("general.architecture", T_STR, arch)
    for key, value in [("embedding_length", 32), ("block_count", 1), ("attention.head_count", 4),
                       ("attention.head_count_kv", 2), ("feed_forward_length", 64), ("context_length", 128)]:
        g.meta(f"{arch}.{key}", T_U32, value)
    g.meta(f"{arch}.rope.freq_base", T_F32, 10000.0)
    g.meta(f"{arch}.attention.layer_norm_rms_epsilon", T_F32, 1e-5)


def gguf_seeds(d):
    g = Gguf()
    g.meta("general.name", T_STR, "every dequantised ggml type")
    gpt2_tokenizer(g, "smollm")
    for type_id, (name, block, _) in GGML.items():
        if type_id == 0:
            g.tensor("f32", [2, 4], 0, f32s([float(i) for i in range(8)]))
        else:
            g.tensor(f"t.{name}", [1, max(block, 32)], type_id, seed=type_id + 7)
    write(d, "all_types.gguf", g.bytes())

    g = Gguf(version=2, alignment=64)
    g.meta("general.alignment", T_U32, 64)
    llama_config(g, "llama")
    vocab = llama_tokenizer(g)
    g.tensor("token_embd.weight", [vocab, 32], 8, seed=1)
    for name in ["output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"]:
        g.tensor(name, [32], 0, f32s([1.0] * 32))
    g.tensor("blk.0.attn_q.weight", [32, 32], 2, seed=2)
    g.tensor("blk.0.attn_k.weight", [16, 32], 3, seed=3)
    g.tensor("blk.0.attn_v.weight", [16, 32], 6, seed=4)
    g.tensor("blk.0.attn_output.weight", [32, 32], 7, seed=5)
    g.tensor("blk.0.ffn_gate.weight", [64, 32], 8, seed=6)
    g.tensor("blk.0.ffn_up.weight", [64, 32], 20, seed=7)
    g.tensor("blk.0.ffn_down.weight", [32, 64], 1, f16s([((i * 37) % 100) / 100.0 - 0.5 for i in range(2048)]))
    write(d, "llama_spm.gguf", g.bytes())

    g = Gguf()
    llama_config(g, "qwen2")
    vocab = gpt2_tokenizer(g, "qwen2")
    g.tensor("token_embd.weight", [vocab, 32], 2, seed=11)
    g.tensor("output.weight", [4, 256], 14, seed=12)
    g.tensor("blk.0.attn_q.bias", [32], 0, f32s([0.5] * 32))
    g.tensor("blk.0.attn_q.weight", [32, 32], 8, seed=13)
    g.tensor("blk.0.attn_k.weight", [16, 256], 12, seed=14)
    write(d, "qwen2_bpe.gguf", g.bytes())

    g = Gguf()
    g.meta("u8", T_U8, 7).meta("i16", T_I16, -3).meta("u64", T_U64, 2**64 - 1).meta("i64", T_I64, -2**63)
    g.meta("f64", T_F64, 2.5).meta("bool", T_BOOL, True).meta("strings", T_ARR, (T_STR, ["a", "bc", ""]))
    g.meta("nested", T_ARR, (T_ARR, [(T_U32, [1, 2]), (T_U32, [3])]))
    write(d, "metadata_only.gguf", g.bytes())


# ---------------------------------------------------------------- WAV, PNG

def wav_int(channels, rate, width, frames):
    out = bytearray()
    for i in range(frames * channels):
        v = math.sin(i * 0.07) * 0.6
        if width == 1:
            out.append(int(v * 127) + 128)
        else:
            out += int(v * (2 ** (8 * width - 1) - 1)).to_bytes(width, "little", signed=True)
    import io
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(bytes(out))
    return buf.getvalue()


def wav_float(channels, rate, frames):
    data = f32s([math.sin(i * 0.05) * 0.5 for i in range(frames * channels)])
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def png(width, height, color_type, bit_depth, pixel):
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color_type]
    raw = bytearray()
    for y in range(height):
        raw.append(y % 5)  # every filter type
        for x in range(width):
            for c in range(channels):
                v = pixel(x, y, c)
                raw += v.to_bytes(2, "big") if bit_depth == 16 else bytes([v & 0xFF])

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b"")


def media_seeds(d):
    write(d, "pcm16_mono_16k.wav", wav_int(1, 16000, 2, 800))
    write(d, "pcm8_stereo_8k.wav", wav_int(2, 8000, 1, 400))
    write(d, "pcm24_mono_44k.wav", wav_int(1, 44100, 3, 600))
    write(d, "pcm32_mono_22k.wav", wav_int(1, 22050, 4, 300))
    write(d, "float_3ch_48k.wav", wav_float(3, 48000, 300))
    write(d, "rgb.png", png(24, 16, 2, 8, lambda x, y, c: (x * 10, y * 15, (x + y) * 5)[c]))
    write(d, "gray_alpha.png", png(9, 21, 4, 8, lambda x, y, c: (x * y * 3, 200)[c]))
    write(d, "rgba16.png", png(7, 5, 6, 16, lambda x, y, c: (x * 9000 + y * 100 + c * 7) & 0xFFFF))
    write(d, "gray.png", png(3, 40, 0, 8, lambda x, y, c: y * 6))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/seeds"
    safetensors_seeds(os.path.join(out, "safetensors_header"))
    gguf_seeds(os.path.join(out, "gguf"))
    media_seeds(os.path.join(out, "media"))
