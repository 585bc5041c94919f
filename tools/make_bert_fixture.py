#!/usr/bin/env python3
"""Writes a BERT conformance fixture (config.json, model.safetensors, meta.json, reference.safetensors with
float64 HF outputs) of a chosen shape: make_bert_fixture.py DIR HIDDEN HEADS INTERMEDIATE SEQ BATCH [HEAD LABELS].
HEAD is `base` (BertModel: last_hidden_state, pooler_output; the default), `sequence` (logits [batch, labels]),
`token` (logits [batch, seq, labels]) or `qa` (start_logits, end_logits). $HIDDEN_ACT picks the feed-forward
activation (any name transformers' ACT2FN knows; default gelu)."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out = sys.argv[1]
hidden, heads, inter, seq, batch = map(int, sys.argv[2:7])
head = sys.argv[7] if len(sys.argv) > 7 else "base"
labels = int(sys.argv[8]) if len(sys.argv) > 8 else 2
os.makedirs(out, exist_ok=True)
torch.manual_seed(7)
cfg = tf.BertConfig(vocab_size=120, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                    intermediate_size=inter, max_position_embeddings=max(512, seq), hidden_act=os.environ.get("HIDDEN_ACT", "gelu"),
                    initializer_range=0.1, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
                    num_labels=labels)
model = {"base": tf.BertModel, "sequence": tf.BertForSequenceClassification,
         "token": tf.BertForTokenClassification, "qa": tf.BertForQuestionAnswering}[head](cfg).eval()
model.save_pretrained(out)
ids = torch.randint(0, 120, (batch, seq))
mask = torch.ones(batch, seq, dtype=torch.long)
mask[1:, seq // 2:] = 0
types = torch.randint(0, 2, (batch, seq))
with torch.no_grad():
    o = model.double()(input_ids=ids, attention_mask=mask, token_type_ids=types)
names = {"base": ["last_hidden_state", "pooler_output"], "sequence": ["logits"], "token": ["logits"],
         "qa": ["start_logits", "end_logits"]}[head]
refs = {n: getattr(o, n).contiguous() for n in names}
save_file({"input_ids": ids, "attention_mask": mask, "token_type_ids": types, **refs},
          os.path.join(out, "reference.safetensors"))
json.dump({"inputs": ["input_ids", "attention_mask", "token_type_ids"], "outputs": names,
           "tolerance": {n: 1e-4 for n in names},
           "family": "bert", "variant": os.path.basename(out), "transformers": tf.__version__, "torch": torch.__version__},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
