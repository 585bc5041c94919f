#!/usr/bin/env python3
"""Writes a BERT conformance fixture (config.json, model.safetensors, meta.json, reference.safetensors with
float64 HF outputs) of a chosen shape: make_bert_fixture.py DIR HIDDEN HEADS INTERMEDIATE SEQ BATCH."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out = sys.argv[1]
hidden, heads, inter, seq, batch = map(int, sys.argv[2:7])
os.makedirs(out, exist_ok=True)
torch.manual_seed(7)
cfg = tf.BertConfig(vocab_size=120, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                    intermediate_size=inter, max_position_embeddings=max(512, seq), hidden_act="gelu",
                    initializer_range=0.1, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
model = tf.BertModel(cfg).eval()
model.save_pretrained(out)
ids = torch.randint(0, 120, (batch, seq))
mask = torch.ones(batch, seq, dtype=torch.long)
mask[1:, seq // 2:] = 0
types = torch.randint(0, 2, (batch, seq))
with torch.no_grad():
    o = model.double()(input_ids=ids, attention_mask=mask, token_type_ids=types)
save_file({"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
           "last_hidden_state": o.last_hidden_state.contiguous(), "pooler_output": o.pooler_output.contiguous()},
          os.path.join(out, "reference.safetensors"))
json.dump({"inputs": ["input_ids", "attention_mask", "token_type_ids"],
           "outputs": ["last_hidden_state", "pooler_output"],
           "tolerance": {"last_hidden_state": 1e-4, "pooler_output": 1e-4},
           "family": "bert", "variant": os.path.basename(out), "transformers": tf.__version__, "torch": torch.__version__},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
