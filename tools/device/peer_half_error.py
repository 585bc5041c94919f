#!/usr/bin/env python3
"""PyTorch's own fp16 error on T5 fixtures: peer_half_error.py DIR... loads each fixture's checkpoint in fp16 (on
the GPU when there is one) and prints the relative error of its encoder states and logits against the fixture's
float64 reference, the number `verify --precision f16` compares ours with."""
import sys
import torch
import transformers as tf
from safetensors.torch import load_file

dev = "cuda" if torch.cuda.is_available() else "cpu"
for d in sys.argv[1:]:
    ref = load_file(f"{d}/reference.safetensors")
    m = tf.T5ForConditionalGeneration.from_pretrained(d).to(dev).to(torch.float16).eval()
    with torch.no_grad():
        o = m(input_ids=ref["input_ids"].to(dev), attention_mask=ref["attention_mask"].to(dev),
              decoder_input_ids=ref["decoder_input_ids"].to(dev))
    rel = lambda a, b: ((a.double().cpu() - b).norm() / b.norm()).item()
    print(f"PyTorch fp16 ({dev}) {d}: encoder_last_hidden_state "
          f"{rel(o.encoder_last_hidden_state, ref['encoder_last_hidden_state']):.3e}, logits {rel(o.logits, ref['logits']):.3e}")
