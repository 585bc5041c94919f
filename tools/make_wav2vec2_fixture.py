#!/usr/bin/env python3
"""Writes a Wav2Vec2ForCTC conformance fixture (config.json, model.safetensors, meta.json, reference.safetensors
with float64 HF outputs) of a chosen layout:
make_wav2vec2_fixture.py DIR FEAT_EXTRACT_NORM STABLE [SAMPLES [HIDDEN HEADS]].

FEAT_EXTRACT_NORM is `group` (a GroupNorm per channel after the first convolution, base checkpoints) or `layer` (a
LayerNorm after every convolution, large-lv60 checkpoints); STABLE is 1 for `do_stable_layer_norm` (pre-norm
layers, the encoder's norm after the last) or 0 (post-norm layers after it). The model is small and random: hidden
32 (or HIDDEN), 2 layers of 4 heads (or HEADS), three convolutions of 32 channels (kernels 10, 3, 3; strides 5, 2, 2; with biases), an
odd positional kernel of 15 in 4 groups, stored with weight norm as `parametrizations.weight.original0/1`, and
exact-GELU convolutions with a tanh-GELU trunk. The reference holds the hidden states, the CTC logits and their
argmax of 2 random waveforms of SAMPLES samples (default 1200)."""
import json, os, sys
import torch
import transformers as tf
from safetensors.torch import save_file

out, norm, stable = sys.argv[1], sys.argv[2], bool(int(sys.argv[3]))
samples = int(sys.argv[4]) if len(sys.argv) > 4 else 1200
hidden, heads = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else (32, 4)
os.makedirs(out, exist_ok=True)
torch.manual_seed(29)
cfg = tf.Wav2Vec2Config(vocab_size=24, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                        intermediate_size=41, hidden_act="gelu_new", feat_extract_norm=norm,
                        feat_extract_activation="gelu", conv_dim=(32, 32, 32), conv_kernel=(10, 3, 3),
                        conv_stride=(5, 2, 2), conv_bias=True, num_conv_pos_embeddings=15,
                        num_conv_pos_embedding_groups=4, do_stable_layer_norm=stable, layer_norm_eps=1e-5,
                        hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
                        final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, pad_token_id=0,
                        architectures=["Wav2Vec2ForCTC"])
model = tf.Wav2Vec2ForCTC(cfg).eval()
with torch.no_grad():
    # Random norms and biases, so a skipped or misplaced one shows.
    for name, p in model.named_parameters():
        if "norm" in name or name.endswith(".bias"):
            p.add_(torch.randn_like(p) * 0.2)
model.save_pretrained(out)
values = torch.randn(2, samples)
m = model.double()
with torch.no_grad():
    o = m(input_values=values.double())
    hidden = m.wav2vec2(input_values=values.double()).last_hidden_state
refs = {"last_hidden_state": hidden.contiguous(), "logits": o.logits.contiguous(),
        "ctc_argmax": o.logits.argmax(-1).contiguous()}
save_file({"input_values": values, **refs}, os.path.join(out, "reference.safetensors"))
json.dump({"inputs": ["input_values"], "outputs": list(refs),
           "tolerance": {"last_hidden_state": 1e-4, "logits": 1e-4},
           "family": "wav2vec2", "variant": os.path.basename(out), "transformers": tf.__version__,
           "torch": torch.__version__,
           "note": f"Wav2Vec2ForCTC, feat_extract_norm={norm}, do_stable_layer_norm={stable}"},
          open(os.path.join(out, "meta.json"), "w"), indent=1)
