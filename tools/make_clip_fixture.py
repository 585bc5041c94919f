#!/usr/bin/env python3
"""Writes a CLIP conformance fixture (config.json, model.safetensors, meta.json, reference.safetensors with
float64 HF outputs) of a chosen shape: make_clip_fixture.py DIR HIDDEN HEADS INTERMEDIATE SEQ IMAGE PATCH BATCH.
Both towers get the same width and heads; the texts end in the eos token, rows >= 1 padded after it."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out = sys.argv[1]
hidden, heads, inter, seq, image, patch, batch = map(int, sys.argv[2:9])
os.makedirs(out, exist_ok=True)
torch.manual_seed(13)
tower = dict(hidden_size=hidden, num_attention_heads=heads, intermediate_size=inter, num_hidden_layers=2,
             hidden_act="quick_gelu", initializer_range=0.1, attention_dropout=0.0)
cfg = tf.CLIPConfig(text_config=dict(vocab_size=99, max_position_embeddings=max(seq, 32), bos_token_id=97,
                                     eos_token_id=98, pad_token_id=1, **tower),
                    vision_config=dict(image_size=image, patch_size=patch, **tower), projection_dim=16)
model = tf.CLIPModel(cfg).eval()
model.save_pretrained(out)
ids = torch.randint(2, 97, (batch, seq))
mask = torch.ones(batch, seq, dtype=torch.long)
ids[0, -1] = 98
for b in range(1, batch):
    end = seq // 2 + b
    ids[b, end] = 98
    ids[b, end + 1:] = 1
    mask[b, end + 1:] = 0
pixels = torch.randn(batch, 3, image, image)
with torch.no_grad():
    o = model.double()(input_ids=ids, attention_mask=mask, pixel_values=pixels.double())
names = ["text_embeds", "image_embeds", "logits_per_image"]
refs = {n: getattr(o, n).contiguous() for n in names}
save_file({"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, **refs},
          os.path.join(out, "reference.safetensors"))
json.dump({"inputs": ["input_ids", "attention_mask", "pixel_values"], "outputs": names,
           "tolerance": {n: 1e-4 for n in names}, "family": "clip", "variant": os.path.basename(out),
           "transformers": tf.__version__, "torch": torch.__version__,
           "note": "CLIP dual encoder; text pooled at first eos_token_id"},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
