#!/usr/bin/env python3
"""Writes a ViT conformance fixture (config.json, model.safetensors, meta.json, reference.safetensors with
float64 HF outputs) of a chosen shape: make_vit_fixture.py DIR HIDDEN HEADS INTERMEDIATE IMAGE PATCH BATCH LABELS.
LABELS 0 writes a ViTModel (outputs last_hidden_state, pooler_output), LABELS > 0 a ViTForImageClassification
(output logits). $POOLER_ACT and $POOLER_SIZE set the pooler's activation and width (defaults tanh and
HIDDEN)."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out = sys.argv[1]
hidden, heads, inter, image, patch, batch, labels = map(int, sys.argv[2:9])
os.makedirs(out, exist_ok=True)
torch.manual_seed(11)
cfg = tf.ViTConfig(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads, intermediate_size=inter,
                   image_size=image, patch_size=patch, hidden_act="gelu", initializer_range=0.1,
                   pooler_act=os.environ.get("POOLER_ACT", "tanh"),
                   pooler_output_size=int(os.environ.get("POOLER_SIZE", hidden)),
                   attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, num_labels=max(labels, 2))
model = (tf.ViTForImageClassification(cfg) if labels else tf.ViTModel(cfg)).eval()
model.save_pretrained(out)
pixels = torch.randn(batch, 3, image, image)
with torch.no_grad():
    o = model.double()(pixel_values=pixels.double())
if labels:
    refs, outputs = {"logits": o.logits.contiguous()}, ["logits"]
else:
    refs = {"last_hidden_state": o.last_hidden_state.contiguous(), "pooler_output": o.pooler_output.contiguous()}
    outputs = ["last_hidden_state", "pooler_output"]
save_file({"pixel_values": pixels, **refs}, os.path.join(out, "reference.safetensors"))
json.dump({"inputs": ["pixel_values"], "outputs": outputs, "tolerance": {k: 1e-4 for k in outputs},
           "family": "vit", "variant": os.path.basename(out), "transformers": tf.__version__, "torch": torch.__version__},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
