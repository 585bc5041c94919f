#!/usr/bin/env python3
"""The peer of examples/embed_throughput.rs: every line of a file embedded with sentence-transformers
(length-sorted batches, mean pooling, normalisation, embeddings copied to the host), timed over rounds, one
JSON line on stdout in the same shape.

  embed_peer_bench.py --make-model ASSETS_DIR --model-dir OUT   # random weights of ASSETS_DIR's config.json
  embed_peer_bench.py --write-sentences 1024 --sentences FILE     # seeded short sentences
  embed_peer_bench.py --model-dir OUT --sentences FILE --device cuda --dtype f16 --rounds 10
"""
import argparse, json, os, random, shutil, statistics, sys, time


def make_model(assets, out):
    import torch
    import transformers as tf
    torch.manual_seed(0)
    config = tf.BertConfig.from_json_file(os.path.join(assets, "config.json"))
    tf.BertModel(config).eval().save_pretrained(out)
    shutil.copy(os.path.join(assets, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizerFast", "do_lower_case": True, "model_max_length": 256}, f)


def write_sentences(n, path):
    words = ("the a man woman child dog cat plays reads eats walks runs guitar book apple park street music "
             "quickly slowly today yesterday market fell rose sharply quietly under over near big small red "
             "green old new city river mountain train car").split()
    rng = random.Random(7)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))).capitalize() + ".\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-model")
    ap.add_argument("--model-dir")
    ap.add_argument("--write-sentences", type=int)
    ap.add_argument("--sentences")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--raw", action="store_true",
                    help="time only the model's forward and mean pooling on the device, over batches tokenized "
                         "(length-sorted, padded per batch) before timing")
    args = ap.parse_args()
    if args.make_model:
        return make_model(args.make_model, args.model_dir)
    if args.write_sentences:
        return write_sentences(args.write_sentences, args.sentences)
    import torch
    from sentence_transformers import SentenceTransformer, models
    sentences = [l.rstrip("\n") for l in open(args.sentences, encoding="utf-8") if l.strip()]
    clock = time.perf_counter()
    word = models.Transformer(args.model_dir, max_seq_length=256)
    model = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean"),
                                         models.Normalize()], device=args.device)
    if args.dtype != "f32":
        model = model.to({"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype])
    load_ms = (time.perf_counter() - clock) * 1e3

    if args.raw:
        ordered = sorted(sentences, key=len)
        batches = [word.tokenize(ordered[i:i + args.batch]) for i in range(0, len(ordered), args.batch)]
        names = ("input_ids", "attention_mask", "token_type_ids")
        batches = [{k: v.to(args.device) for k, v in b.items() if k in names} for b in batches]
        bert = word.auto_model

    def once():
        clock = time.perf_counter()
        if args.raw:
            with torch.inference_mode():
                for b in batches:
                    hidden = bert(**b).last_hidden_state
                    mask = b["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
        else:
            model.encode(sentences, batch_size=args.batch)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - clock) * 1e3

    first = once()
    times = sorted(once() for _ in range(args.rounds))
    median = statistics.median(times)
    engine = f"torch {torch.__version__} forward only" if args.raw else f"sentence-transformers (torch {torch.__version__})"
    print(json.dumps({"engine": engine, "backend": args.device,
                      "precision": args.dtype, "sentences": len(sentences), "load_ms": load_ms,
                      "first_call_ms": first, "median_ms": median, "min_ms": times[0], "max_ms": times[-1],
                      "sentences_per_s": len(sentences) / median * 1e3}))


if __name__ == "__main__":
    sys.exit(main())
