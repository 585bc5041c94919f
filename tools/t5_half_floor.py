#!/usr/bin/env python3
"""The f16 floor of a T5 fixture: t5_half_floor.py DIR... prints, for each fixture, the relative error of its
encoder states and logits against its float64 reference when

  1. the weights are rounded to f16 and everything is computed in float64 (no f16 arithmetic at all);
  2. PyTorch autocast runs the matrix products on f16 inputs, everything else in f32;
  3. PyTorch runs the whole model in fp16 (`.half()`, what `verify --precision f16` is compared with);
  4. transformers loads it with `dtype=torch.float16`, which keeps the `wo` projections in f32
     (`_keep_in_fp32_modules`) and so carries the residual stream in f32.

Any f16 model has at least error 1 (its weights are f16); an executor with f16 GEMM inputs at least about 2.
CPU only is fine: pip install torch transformers safetensors."""
import sys
import torch
import transformers as tf
from safetensors.torch import load_file


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def run(model, ref):
    with torch.no_grad():
        return model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                     decoder_input_ids=ref["decoder_input_ids"])


for d in sys.argv[1:]:
    ref = load_file(f"{d}/reference.safetensors")
    rows = []
    m = tf.T5ForConditionalGeneration.from_pretrained(d).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().double())
    rows.append(("f16 weights, float64 compute", run(m, ref)))
    m = tf.T5ForConditionalGeneration.from_pretrained(d).float().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().float())
        with torch.autocast("cpu", dtype=torch.float16):
            rows.append(("autocast: f16 GEMM inputs, f32 elsewhere", run(m, ref)))
    rows.append(("PyTorch fp16 (.half())", run(tf.T5ForConditionalGeneration.from_pretrained(d).half().eval(), ref)))
    rows.append(("from_pretrained(dtype=f16), wo kept f32",
                 run(tf.T5ForConditionalGeneration.from_pretrained(d, dtype=torch.float16).eval(), ref)))
    for name, o in rows:
        print(f"{d}: {name}: encoder_last_hidden_state {rel(o.encoder_last_hidden_state, ref['encoder_last_hidden_state']):.3e}, "
              f"logits {rel(o.logits, ref['logits']):.3e}")
