#!/usr/bin/env python3
"""Writes a T5 conformance fixture (config.json, generation_config.json, model.safetensors, meta.json,
reference.safetensors with float64 HF outputs) of a chosen shape and initialisation:
make_t5_fixture.py DIR D_MODEL HEADS D_KV LAYERS D_FF GATED INIT_FACTOR BATCH SEQ DEC.
GATED 1 writes a gated-GELU FFN (FLAN-T5), 0 a ReLU one (T5). The vocabulary is 1000 tokens; the second of
BATCH encoder rows is padded (its last 4 tokens masked); DEC decoder tokens per row; 8 greedy tokens per row
from decoder_start_token_id (no EOS stop). INIT_FACTOR 1 is T5's own initialisation; the shipped fixtures use 4,
whose activations f16 holds poorly (PyTorch's fp16 forward misses their f16 bar too)."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out = sys.argv[1]
d_model, heads, d_kv, layers, d_ff, gated = map(int, sys.argv[2:8])
init = float(sys.argv[8])
batch, seq, dec = map(int, sys.argv[9:12])
os.makedirs(out, exist_ok=True)
torch.manual_seed(17)
cfg = tf.T5Config(vocab_size=1000, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers, num_decoder_layers=layers,
                  num_heads=heads, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                  feed_forward_proj="gated-gelu" if gated else "relu", initializer_factor=init, dropout_rate=0.0,
                  decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                  tie_word_embeddings=not gated)
model = tf.T5ForConditionalGeneration(cfg).eval()
model.save_pretrained(out)
ids = torch.randint(2, 1000, (batch, seq))
mask = torch.ones(batch, seq, dtype=torch.long)
if batch > 1:
    mask[1, seq - 4:] = 0
dec_ids = torch.randint(2, 1000, (batch, dec))
m = model.double()
with torch.no_grad():
    o = m(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids)
    enc = o.encoder_last_hidden_state
    seq_ids = torch.zeros(batch, 1, dtype=torch.long)
    for _ in range(8):
        logits = m(encoder_outputs=(enc,), attention_mask=mask, decoder_input_ids=seq_ids).logits
        seq_ids = torch.cat([seq_ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
refs = {"encoder_last_hidden_state": enc.contiguous(), "logits": o.logits.contiguous(),
        "greedy_tokens": seq_ids[:, 1:].contiguous()}
inputs = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_ids}
save_file({**inputs, **refs}, os.path.join(out, "reference.safetensors"))
json.dump({"inputs": list(inputs), "outputs": list(refs),
           "greedy": "decoder starts at decoder_start_token_id=0, 8 argmax steps, no EOS stop",
           "tolerance": {"encoder_last_hidden_state": 1e-4, "logits": 1e-4},
           "family": "t5", "variant": os.path.basename(out), "transformers": tf.__version__,
           "torch": torch.__version__},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
