#!/usr/bin/env python3
"""Writes a Whisper conformance fixture (config.json, generation_config.json, model.safetensors, meta.json,
reference.safetensors with float64 HF outputs) of a chosen shape:
make_whisper_fixture.py DIR D_MODEL HEADS LAYERS FRAMES BATCH PROMPT.
The model is a WhisperForConditionalGeneration of random weights (80 mel bins, FFN 4 x D_MODEL, a vocabulary
of 1000); the reference holds the encoder's states, the logits of BATCH random decoder prompts of PROMPT
tokens (the second row padded at its end when BATCH > 1), and 8 greedy tokens per row from
decoder_start_token_id (no EOS stop, no suppression)."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out = sys.argv[1]
d_model, heads, layers, frames, batch, prompt = map(int, sys.argv[2:8])
os.makedirs(out, exist_ok=True)
torch.manual_seed(13)
cfg = tf.WhisperConfig(vocab_size=1000, num_mel_bins=80, d_model=d_model, encoder_layers=layers,
                       decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                       encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model, max_source_positions=frames // 2,
                       max_target_positions=64, decoder_start_token_id=1, eos_token_id=2, pad_token_id=2,
                       bos_token_id=2, init_std=0.1, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                       suppress_tokens=None, begin_suppress_tokens=None)
model = tf.WhisperForConditionalGeneration(cfg).eval()
model.save_pretrained(out)
features = torch.randn(batch, 80, frames)
ids = torch.randint(3, 1000, (batch, prompt))
mask = torch.ones(batch, prompt, dtype=torch.long)
if batch > 1:
    mask[1, prompt - 2:] = 0
m = model.double()
with torch.no_grad():
    o = m(input_features=features.double(), decoder_input_ids=ids, decoder_attention_mask=mask)
    enc = o.encoder_last_hidden_state
    # Greedy by hand (no logits processors): 8 argmax steps from decoder_start_token_id.
    seq = torch.full((batch, 1), cfg.decoder_start_token_id)
    for _ in range(8):
        logits = m.model.decoder(input_ids=seq, encoder_hidden_states=enc).last_hidden_state
        nxt = m.proj_out(logits)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
refs = {"encoder_last_hidden_state": enc.contiguous(), "logits": o.logits.contiguous(), "greedy_tokens": seq[:, 1:].contiguous()}
inputs = {"input_features": features, "decoder_input_ids": ids, "decoder_attention_mask": mask}
save_file({**inputs, **refs}, os.path.join(out, "reference.safetensors"))
outputs = list(refs)
json.dump({"inputs": list(inputs), "outputs": outputs,
           "greedy": "decoder starts at decoder_start_token_id, 8 argmax steps, no EOS stop, no forced tokens",
           "tolerance": {"encoder_last_hidden_state": 1e-4, "logits": 1e-4},
           "family": "whisper", "variant": os.path.basename(out), "transformers": tf.__version__,
           "torch": torch.__version__},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
