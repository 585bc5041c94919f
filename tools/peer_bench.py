#!/usr/bin/env python3
"""Peer timings for ipfs-accelerate's benchmark runner (`bench --peer torch,ort`, `cargo xtask compare`).

  python3 peer_bench.py --engine torch --family bert --config CONFIG.json --batch 8 --seq 128 \
      --dtype f32,bf16 --threads 2 --device cpu --warmup 2 --iters 10 --cache-dir target/peers/onnx

Engines:
  torch        PyTorch eager (transformers' model class of the config), f32 / bf16 / f16.
  onnxruntime  ONNX Runtime on an ONNX export of the same model (torch.onnx.export, cached under --cache-dir),
               f32, and int8 through onnxruntime.quantization.quantize_dynamic (cached beside it).
Weights: the checkpoint in --model-dir when given (a local folder with config.json + weights), otherwise random
weights of --config (seeded; the shapes, not the values, matter for timing).
Families: bert (input_ids, attention_mask, token_type_ids of batch x seq), vit (pixel_values of
batch x 3 x seq x seq), clip (seq text tokens and one image per row) and whisper's encoder (input_features of
batch x mels x seq frames); with --new N (torch only), llama, qwen2, t5, whisper and llava generation: a prompt
of --seq token ids (the same ids ours uses; t5: the encoder's; whisper: --seq log-mel frames; llava: the first
id, one image's image_seq_length image tokens, the rest, and one image of the config's size), N new tokens,
greedy, no stop at end-of-sequence, `model.generate` with the KV cache;
its line then has ttft_ms (time to the first new token) and decode_ms (ms per new token after the first), one
per timed iteration.

Prints one JSON line per dtype on stdout: engine, version, dtype, status (ok | unavailable | failed |
interrupted), reason, timings_ms (every timed iteration), threads, device, peak_rss_bytes. A missing package or
device is reported as `unavailable` with the reason; nothing is ever estimated. Exit status 0 unless the
arguments are wrong.
"""
import argparse
import hashlib
import json
import os
import resource
import sys
import time
import traceback

FAMILIES = ("bert", "vit", "clip", "whisper", "wav2vec2", "detr")
# Families only the torch peer runs (no ONNX export here).
TORCH_ONLY = ("clip", "whisper", "detr")
GENERATING = ("llama", "qwen2", "t5", "whisper", "llava")
# torch-host: PyTorch eager from host inputs to host outputs (the inputs copied to the device and every
# output tensor back in each timed call), as ours runs; torch keeps both on the device.
ENGINES = ("torch", "torch-host", "onnxruntime")
INSTALL_HINT = "run `cargo xtask fetch-peers` (pip install torch transformers onnxruntime onnx from PyPI)"


def emit(args, dtype, status, reason=None, timings=None, version=None, threads=None, **extra):
    print(json.dumps(dict(engine=args.engine, version=version, dtype=dtype, status=status, reason=reason,
                          timings_ms=timings or [], threads=threads, device=args.device,
                          peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **extra)),
          flush=True)


def prompt_ids(length, vocab):
    """The benchmark prompt: the same ids as the Rust runner's `generation::prompt_ids`."""
    span = max(vocab - 3, 1)
    return [3 + (i * 7919 + 1000) % span for i in range(length)]


def run_torch_generation(args, dtypes, torch, tf, version):
    """Times --iters greedy generations of --new tokens after a --seq-token prompt with model.generate."""
    with open(args.config) as f:
        cfg = json.load(f)
    auto = {"t5": tf.AutoModelForSeq2SeqLM, "whisper": tf.WhisperForConditionalGeneration,
            "llava": tf.LlavaForConditionalGeneration}.get(args.family, tf.AutoModelForCausalLM)
    if args.model_dir:
        model = auto.from_pretrained(args.model_dir).eval()
    else:
        torch.manual_seed(0)
        config = tf.AutoConfig.for_model(**cfg)
        model = (auto(config) if args.family in ("whisper", "llava") else auto.from_config(config)).eval()
    names = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

    class FirstToken:
        """A streamer that notes when generate hands over its first new token."""
        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2 and self.first is None:  # the first call carries the prompt
                self.first = time.perf_counter()

        def end(self):
            pass

    for d in dtypes:
        if d not in names or (d == "f16" and args.device == "cpu"):
            emit(args, d, "unavailable", f"PyTorch eager generation has no `{d}` compute here", version=version)
            continue
        try:
            m = model.to(args.device, names[d])
            if args.family == "whisper":  # --seq log-mel frames, the decoder from its start token
                feats = torch.randn(1, cfg.get("num_mel_bins", 80), args.seq, device=args.device, dtype=names[d])
                inputs = dict(input_features=feats)
            elif args.family == "llava":  # ours: the first prompt id, one image's tokens, the rest
                vocab = cfg["text_config"]["vocab_size"]
                image = cfg.get("image_token_id", cfg.get("image_token_index"))
                text = prompt_ids(args.seq, vocab)
                row = [text[0]] + [image] * cfg["image_seq_length"] + [t - 1 if t == image else t for t in text[1:]]
                ids = torch.tensor([row], device=args.device)
                side = cfg["vision_config"]["image_size"]
                pixels = (torch.arange(3 * side * side, device=args.device) * 37 % 255) / 127.5 - 1.0
                inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                              pixel_values=pixels.reshape(1, 3, side, side).to(names[d]))
            else:
                # --batch rows: the prompt rotated by one id per row, as ours (decoder LMs)
                vocab = cfg.get("vocab_size", 32000)
                base = prompt_ids(args.seq, vocab)
                rows = [[3 + (t - 3 + r) % max(vocab - 3, 1) for t in base] for r in range(args.batch)]
                ids = torch.tensor(rows, device=args.device)
                inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
            ttft, decode = [], []
            for i in range(args.warmup + args.iters):
                streamer = FirstToken()
                start = time.perf_counter()
                with torch.inference_mode():
                    out = m.generate(**inputs, max_new_tokens=args.new, min_new_tokens=args.new,
                                     do_sample=False, streamer=streamer, eos_token_id=None, pad_token_id=0)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                end = time.perf_counter()
                new = args.new if args.family in ("t5", "whisper") else out.shape[1] - inputs["input_ids"].shape[1]
                if i >= args.warmup:
                    ttft.append((streamer.first - start) * 1e3)
                    decode.append((end - streamer.first) * 1e3 / max(new - 1, 1))
        except KeyboardInterrupt:
            emit(args, d, "interrupted", "interrupted by Ctrl-C", version=version)
            return
        except Exception as e:  # a failure of the peer is stored, not hidden
            emit(args, d, "failed", f"{type(e).__name__}: {e}", version=version, threads=torch.get_num_threads())
            continue
        emit(args, d, "ok", None, [], version, torch.get_num_threads(), ttft_ms=ttft, decode_ms=decode)


def time_calls(fn, warmup, iters):
    """Runs fn warmup times untimed, then iters times timed; returns (timings_ms, interrupted)."""
    timings = []
    try:
        for _ in range(warmup):
            fn()
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            timings.append((time.perf_counter() - start) * 1e3)
    except KeyboardInterrupt:
        return timings, True
    return timings, False


def build_torch_model(args, tf, torch):
    """The transformers model of the family: the checkpoint of --model-dir, or random weights of --config."""
    cls = {"bert": tf.BertModel, "vit": tf.ViTModel, "clip": tf.CLIPModel, "whisper": tf.WhisperModel,
           "wav2vec2": tf.Wav2Vec2ForCTC, "detr": tf.DetrForObjectDetection}[args.family]
    if args.model_dir:
        model = cls.from_pretrained(args.model_dir, attn_implementation="eager").eval()
    else:
        with open(args.config) as f:
            cfg = json.load(f)
        config = tf.AutoConfig.for_model(**cfg)
        torch.manual_seed(0)
        model = cls(config).eval()
    # Whisper: the encoder alone, as ours measures it (decoding is the generation benchmark's).
    return model.get_encoder() if args.family == "whisper" else model


def id_range(args):
    """Token ids to draw from: [low, high) inside the config's vocabulary."""
    with open(args.config) as f:
        cfg = json.load(f)
    vocab = cfg.get("text_config", cfg).get("vocab_size", 30522)
    return (min(1000, vocab // 2), max(min(20000, vocab), 2))


def torch_inputs(args, torch, device, dtype):
    if args.family == "whisper":  # --seq log-mel frames of the config's mel bins
        with open(args.config) as f:
            mels = json.load(f).get("num_mel_bins", 80)
        return dict(input_features=torch.randn(args.batch, mels, args.seq, device=device, dtype=dtype))
    if args.family == "wav2vec2":  # --seq raw samples per row
        return dict(input_values=torch.randn(args.batch, args.seq, device=device, dtype=dtype))
    if args.family == "vit":
        return dict(pixel_values=torch.randn(args.batch, 3, args.seq, args.seq, device=device, dtype=dtype))
    if args.family == "detr":  # --seq image side, every pixel real (as ours)
        return dict(pixel_values=torch.randn(args.batch, 3, args.seq, args.seq, device=device, dtype=dtype),
                    pixel_mask=torch.ones(args.batch, args.seq, args.seq, device=device, dtype=torch.long))
    g = torch.Generator().manual_seed(0)
    if args.family == "clip":  # --seq text tokens and one image of the config's size per row
        with open(args.config) as f:
            side = json.load(f).get("vision_config", {}).get("image_size", 224)
        ids = torch.randint(*id_range(args), (args.batch, args.seq), generator=g).to(device)
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                    pixel_values=torch.randn(args.batch, 3, side, side, device=device, dtype=dtype))
    ids = torch.randint(*id_range(args), (args.batch, args.seq), generator=g).to(device)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))


def run_torch(args, dtypes):
    try:
        import torch
        import transformers as tf
    except ImportError as e:
        for d in dtypes:
            emit(args, d, "unavailable", f"python package missing ({e.name}): {INSTALL_HINT}")
        return
    version = torch.__version__
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        for d in dtypes:
            emit(args, d, "unavailable", f"torch {version} sees no CUDA device", version=version)
        return
    if args.new:
        return run_torch_generation(args, dtypes, torch, tf, version)
    names = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    model = build_torch_model(args, tf, torch)
    for d in dtypes:
        if d not in names:
            emit(args, d, "unavailable", f"PyTorch eager has no `{d}` compute (f32, bf16, f16)", version=version)
            continue
        if d == "f16" and args.device == "cpu":
            emit(args, d, "unavailable", "f16 matmuls are not a CPU compute type of PyTorch eager", version=version)
            continue
        try:
            m = model.to(args.device, names[d])
            host_io = args.engine == "torch-host"
            # torch-host: the same values made on the host, copied up in each call.
            inputs = torch_inputs(args, torch, "cpu" if host_io else args.device, names[d])

            def to_host(x):
                if isinstance(x, torch.Tensor):
                    return x.cpu()
                if isinstance(x, (tuple, list)):
                    return [to_host(y) for y in x]
                return to_host(x.to_tuple()) if hasattr(x, "to_tuple") else x

            def call():
                with torch.inference_mode():
                    if host_io:
                        to_host(m(**{k: v.to(args.device) for k, v in inputs.items()}))
                    else:
                        m(**inputs)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()

            timings, stopped = time_calls(call, args.warmup, args.iters)
        except Exception as e:  # a failure of the peer is stored, not hidden
            emit(args, d, "failed", f"{type(e).__name__}: {e}", version=version, threads=torch.get_num_threads())
            continue
        emit(args, d, "interrupted" if stopped else "ok", "interrupted by Ctrl-C" if stopped else None,
             timings, version, torch.get_num_threads())
        if stopped:
            return


def export_onnx(args, cache_dir):
    """model.onnx of the family's model (fp32), exported once per config / checkpoint into cache_dir."""
    key_src = json.dumps(dict(family=args.family, model_dir=os.path.abspath(args.model_dir) if args.model_dir else None,
                              config=open(args.config).read() if not args.model_dir else None, v=1))
    out = os.path.join(cache_dir, hashlib.sha256(key_src.encode()).hexdigest()[:16])
    path = os.path.join(out, "model.onnx")
    if os.path.exists(path):
        return path
    import torch
    import transformers as tf
    os.makedirs(out, exist_ok=True)
    model = build_torch_model(args, tf, torch)
    if args.family == "wav2vec2":  # --seq raw samples per row
        return dict(input_values=torch.randn(args.batch, args.seq, device=device, dtype=dtype))
    if args.family == "vit":
        names, example = ["pixel_values"], (torch.randn(1, 3, args.seq, args.seq),)
        dyn = {"pixel_values": {0: "batch"}}

        class Wrapper(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, pixel_values):
                return self.m(pixel_values=pixel_values).last_hidden_state
    else:
        ids = torch.ones(2, 16, dtype=torch.int64)
        names, example = ["input_ids", "attention_mask", "token_type_ids"], (ids, torch.ones_like(ids),
                                                                            torch.zeros_like(ids))
        dyn = {n: {0: "batch", 1: "sequence"} for n in names}

        class Wrapper(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
    tmp = path + f".tmp{os.getpid()}"
    with torch.no_grad():
        torch.onnx.export(Wrapper(model).eval(), example, tmp, input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes=dict(dyn, last_hidden_state={0: "batch"}), opset_version=17, dynamo=False)
    os.replace(tmp, path)
    return path


def quantized(path, cache_dir):
    """The int8 (dynamic quantization of the MatMul weights) copy of an export, made once (beside a cached
    export, or in the cache for a checkpoint's own model.onnx)."""
    if os.path.dirname(os.path.abspath(path)).startswith(os.path.abspath(cache_dir)):
        out = path.replace(".onnx", ".int8.onnx")
    else:
        digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
        os.makedirs(os.path.join(cache_dir, digest), exist_ok=True)
        out = os.path.join(cache_dir, digest, "model.int8.onnx")
    if not os.path.exists(out):
        from onnxruntime.quantization import QuantType, quantize_dynamic
        tmp = out + f".tmp{os.getpid()}.onnx"
        quantize_dynamic(path, tmp, weight_type=QuantType.QInt8)
        os.replace(tmp, out)
    return out


def run_ort(args, dtypes):
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        for d in dtypes:
            emit(args, d, "unavailable", f"python package missing ({e.name}): {INSTALL_HINT}")
        return
    version = ort.__version__
    provider = "CPUExecutionProvider"
    if args.device.startswith("cuda"):
        provider = "CUDAExecutionProvider"
    if provider not in ort.get_available_providers():
        for d in dtypes:
            emit(args, d, "unavailable", f"onnxruntime {version} has no {provider} "
                 f"(has {', '.join(ort.get_available_providers())})", version=version)
        return
    given = os.path.join(args.model_dir, "model.onnx") if args.model_dir else None
    try:
        import onnx  # noqa: F401  (the quantizer needs it)
        if given and os.path.exists(given):
            fp32 = given  # the checkpoint's own export (the conformance fixtures have one)
        else:
            import torch  # noqa: F401  (exports the model)
            import transformers  # noqa: F401
            fp32 = export_onnx(args, args.cache_dir)
    except ImportError as e:
        for d in dtypes:
            emit(args, d, "unavailable", f"exporting / quantizing the model needs the python package {e.name}: "
                 f"{INSTALL_HINT}", version=version)
        return
    except Exception as e:
        for d in dtypes:
            emit(args, d, "failed", f"ONNX export failed: {type(e).__name__}: {e}", version=version)
        return
    if args.sentences:
        return run_ort_sentences(args, ort, np, provider, fp32, version)
    if args.family == "wav2vec2":  # --seq raw samples per row
        return dict(input_values=torch.randn(args.batch, args.seq, device=device, dtype=dtype))
    if args.family == "vit":
        rng = np.random.default_rng(0)
        feeds = dict(pixel_values=rng.standard_normal((args.batch, 3, args.seq, args.seq), dtype=np.float32))
    else:
        ids = np.random.default_rng(0).integers(*id_range(args), (args.batch, args.seq), dtype=np.int64)
        feeds = dict(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    for d in dtypes:
        if d not in ("f32", "int8"):
            emit(args, d, "unavailable", f"the ONNX Runtime peer runs f32 and int8, not `{d}`", version=version)
            continue
        try:
            path = fp32 if d == "f32" else quantized(fp32, args.cache_dir)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            opts.inter_op_num_threads = 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            session = ort.InferenceSession(path, opts, providers=[provider])
            wanted = [i.name for i in session.get_inputs()]
            missing = [n for n in wanted if n not in feeds]
            if missing:
                raise ValueError(f"the ONNX model takes inputs {wanted}; the peer makes {sorted(feeds)}")
            feeds = {n: feeds[n] for n in wanted}
            timings, stopped = time_calls(lambda: session.run(None, feeds), args.warmup, args.iters)
        except Exception as e:
            emit(args, d, "failed", f"{type(e).__name__}: {e}", version=version, threads=args.threads)
            continue
        emit(args, d, "interrupted" if stopped else "ok", "interrupted by Ctrl-C" if stopped else None,
             timings, version, args.threads)
        if stopped:
            return


def run_ort_sentences(args, ort, np, provider, fp32, version):
    """Embeds every line of --sentences in batches of --batch, as an application using ONNX Runtime in-process
    would: the checkpoint's tokenizer.json (padding to the longest of each batch, its max length), the f32
    export, mean pooling over the attention mask and L2 normalisation. One timed iteration = every sentence."""
    from tokenizers import Tokenizer
    sentences = [l.rstrip("\n") for l in open(args.sentences, encoding="utf-8") if l.strip()]
    tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
    tok.enable_padding()
    tok.enable_truncation(max_length=args.seq)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(fp32, opts, providers=[provider])

    def embed_all():
        out = []
        for i in range(0, len(sentences), args.batch):
            enc = tok.encode_batch(sentences[i:i + args.batch])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            hidden = session.run(None, dict(input_ids=ids, attention_mask=mask,
                                            token_type_ids=np.zeros_like(ids)))[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            out.append(pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12))
        return out

    timings, stopped = time_calls(embed_all, args.warmup, args.iters)
    emit(args, "f32", "interrupted" if stopped else "ok", "interrupted by Ctrl-C" if stopped else None,
         timings, version, args.threads)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", required=True, choices=ENGINES)
    ap.add_argument("--family", required=True)
    ap.add_argument("--config", required=True, help="config.json of the model (random weights)")
    ap.add_argument("--model-dir", help="a local checkpoint folder: its real weights instead of random ones")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--dtype", default="f32", help="comma separated: f32, bf16, f16, int8")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--new", type=int, help="llama, qwen2 (torch): time generations of this many new tokens "
                                           "after a prompt of --seq tokens")
    ap.add_argument("--cache-dir", default=os.path.join("target", "peers", "onnx"))
    ap.add_argument("--sentences", help="onnxruntime, bert: embed these lines (one per line) in batches of --batch "
                                        "with the checkpoint's tokenizer (--seq: its max length), f32; "
                                        "one timed iteration embeds them all")
    args = ap.parse_args()
    dtypes = [d for d in args.dtype.split(",") if d]
    torch_engine = args.engine in ("torch", "torch-host")
    if args.new and (args.engine != "torch" or args.family not in GENERATING):
        for d in dtypes:
            emit(args, d, "unavailable", f"generation peers: torch on {', '.join(GENERATING)}")
        return
    if not args.new and not torch_engine and args.family in TORCH_ONLY:
        for d in dtypes:
            emit(args, d, "unavailable", f"the {args.engine} peer has no export of {args.family}")
        return
    if not args.new and args.family not in FAMILIES:
        for d in dtypes:
            emit(args, d, "unavailable", f"the peer script runs the families {', '.join(FAMILIES)}, "
                 f"not {args.family}")
        return
    try:
        (run_torch if torch_engine else run_ort)(args, dtypes)
    except KeyboardInterrupt:
        for d in dtypes:
            emit(args, d, "interrupted", "interrupted by Ctrl-C before timing")
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        for d in dtypes:
            emit(args, d, "failed", f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
