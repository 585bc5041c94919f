# PyTorch fp16 on the device against the fixtures' float64 references: how many CTC argmax frames differ, and the
# logits' relative error (the same measure as `xtask verify`).
import sys, glob, torch, transformers as tf
from safetensors.torch import load_file
for d in sorted(glob.glob(sys.argv[1] + "/wav2vec2/*")):
    ref = load_file(d + "/reference.safetensors")
    m = tf.Wav2Vec2ForCTC.from_pretrained(d).to("cuda", torch.float16).eval()
    with torch.no_grad():
        logits = m(input_values=ref["input_values"].to("cuda", torch.float16)).logits.double().cpu()
    want = ref["logits"]
    rel = ((logits - want).norm() / want.norm()).item()
    diff = (logits.argmax(-1) != ref["ctc_argmax"]).sum().item()
    print(f"{d.split('/')[-1]:20s} torch f16: logits rel {rel:.3e}, ctc_argmax frames differing {diff} of {want.shape[0]*want.shape[1]}")
