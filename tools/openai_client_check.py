#!/usr/bin/env python3
"""The official `openai` Python client against `ipfs-accelerate serve` (used by crates/cli/tests/serve.rs).

  python3 openai_client_check.py --base-url http://127.0.0.1:8080/v1 --embed-model embedded \
      --sentences refs/minilm_public_sentences.txt [--chat-model smol]

Prints one JSON object on stdout: the client's version, the embeddings of every sentence (the client asks for
base64 and decodes it itself), and, with --chat-model, one sampled chat completion made twice with the same seed,
non-streamed and streamed (the deltas joined), plus a transcript of what was sent and received on stderr.
"""
import argparse
import json
import sys

import openai


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--embed-model", required=True)
    ap.add_argument("--sentences", required=True)
    ap.add_argument("--chat-model")
    ap.add_argument("--api-key", default="unused")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)
    sentences = [l.rstrip("\n") for l in open(args.sentences, encoding="utf-8") if l.strip()]
    out = dict(openai_version=openai.__version__)

    emb = client.embeddings.create(model=args.embed_model, input=sentences)
    out["embeddings"] = [d.embedding for d in emb.data]
    print(f">>> client.embeddings.create(model={args.embed_model!r}, input=<{len(sentences)} sentences>)",
          file=sys.stderr)
    print(f"<<< {len(emb.data)} embeddings of {len(emb.data[0].embedding)} floats; usage {emb.usage}; "
          f"first values {emb.data[0].embedding[:3]}", file=sys.stderr)

    if args.chat_model:
        request = dict(model=args.chat_model, max_tokens=16, temperature=0.7, top_p=0.9, seed=11,
                       messages=[dict(role="user", content="Write one short sentence about the sea.")])
        whole = client.chat.completions.create(**request)
        out["chat"] = whole.choices[0].message.content
        out["chat_finish"] = whole.choices[0].finish_reason
        print(f">>> client.chat.completions.create({json.dumps(request)})", file=sys.stderr)
        print(f"<<< {out['chat']!r} (finish_reason {out['chat_finish']}, usage {whole.usage})", file=sys.stderr)
        pieces = []
        for chunk in client.chat.completions.create(stream=True, **request):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        out["chat_stream"] = "".join(pieces)
        print(f">>> the same with stream=True", file=sys.stderr)
        print(f"<<< {len(pieces)} deltas: {pieces!r}", file=sys.stderr)
        try:
            client.chat.completions.create(**dict(request, model="no-such-model"))
            out["unknown_model_error"] = None
        except openai.NotFoundError as e:
            out["unknown_model_error"] = e.status_code
            print(f">>> model='no-such-model'\n<<< openai.NotFoundError {e.status_code}: {e.message}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
