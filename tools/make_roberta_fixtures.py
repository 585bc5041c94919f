#!/usr/bin/env python3
"""Writes tiny RoBERTa-family conformance fixtures (config.json, model.safetensors, meta.json,
reference.safetensors with float64 HF outputs) under DIR/bert/<variant>/: the bare RobertaModel,
RobertaForSequenceClassification and XLMRobertaForTokenClassification, each with right padding
(pad_token_id 1) on the second row. make_roberta_fixtures.py DIR (crates/ipfs-accelerate/tests/fixtures)"""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

root = os.path.join(sys.argv[1], "bert")
torch.manual_seed(11)
batch, seq, vocab = 2, 7, 99


def config(cls, **extra):
    return cls(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=48, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
               bos_token_id=0, eos_token_id=2, hidden_act="gelu", layer_norm_eps=1e-5,
               initializer_range=0.1, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, **extra)


variants = [
    ("roberta_base", tf.RobertaModel, config(tf.RobertaConfig), ["last_hidden_state", "pooler_output"]),
    ("roberta_sequence_classification", tf.RobertaForSequenceClassification,
     config(tf.RobertaConfig, num_labels=3), ["logits"]),
    ("xlm_roberta_token_classification", tf.XLMRobertaForTokenClassification,
     config(tf.XLMRobertaConfig, num_labels=4), ["logits"]),
]
for name, cls, cfg, outputs in variants:
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    model = cls(cfg).eval()
    model.save_pretrained(out)
    ids = torch.randint(3, vocab, (batch, seq))
    ids[:, 0] = 0
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, 4:] = 0
    ids[1, 4:] = 1  # <pad>: RoBERTa numbers positions over the non-padding tokens
    types = torch.zeros(batch, seq, dtype=torch.long)
    with torch.no_grad():
        o = model.double()(input_ids=ids, attention_mask=mask, token_type_ids=types)
    tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    tensors.update({k: getattr(o, k).contiguous() for k in outputs})
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    json.dump({"inputs": ["input_ids", "attention_mask", "token_type_ids"], "outputs": outputs,
               "tolerance": {k: 1e-4 for k in outputs}, "family": "bert", "variant": name,
               "note": f"{cls.__name__}: positions from pad_token_id + 1, right padding on row 1",
               "transformers": tf.__version__, "torch": torch.__version__},
              open(os.path.join(out, "meta.json"), "w"), indent=1)
    print(out)
