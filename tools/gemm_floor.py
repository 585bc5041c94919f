"""The GEMM floor of an encoder on the GPU: its layers' products alone, in PyTorch f16 (cuBLAS), next to the
whole PyTorch model's kernels (torch.profiler). Run on the device machine: python3 tools/gemm_floor.py."""
import statistics, torch, torch.nn.functional as F, transformers as tf

def timed(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)

SHAPES = {  # name: (tokens, hidden, intermediate, layers)
    "bert-base b128x128": (128 * 128, 768, 3072, 12),
    "bert-base b32x128": (32 * 128, 768, 3072, 12),
    "vit-base b32": (32 * 197, 768, 3072, 12),
    "whisper-tiny b8": (8 * 1500, 384, 1536, 4),
}
dev = torch.device("cuda")
for name, (m, h, i, layers) in SHAPES.items():
    x = torch.randn(m, h, device=dev, dtype=torch.half)
    f = torch.randn(m, i, device=dev, dtype=torch.half)
    w = {k: torch.randn(*s, device=dev, dtype=torch.half) * 0.02 for k, s in
         dict(qkv=(3 * h, h), o=(h, h), up=(i, h), down=(h, i)).items()}
    b = {k: torch.zeros(v.shape[0], device=dev, dtype=torch.half) for k, v in w.items()}
    def gemms(bias):
        for _ in range(layers):
            F.linear(x, w["qkv"], b["qkv"] if bias else None)
            F.linear(x, w["o"], b["o"] if bias else None)
            F.linear(x, w["up"], b["up"] if bias else None)
            F.linear(f, w["down"], b["down"] if bias else None)
    flops = 2 * m * layers * (3 * h * h + h * h + 2 * h * i)
    for bias in (False, True):
        med, lo, hi = timed(lambda: gemms(bias))
        print(f"{name}: GEMMs {'with' if bias else 'without'} bias {med:.3f} ms [{lo:.3f}-{hi:.3f}] "
              f"= {flops / med / 1e9:.0f} TFLOP/s")

def profile(name, model, inputs):
    model = model.to(dev, torch.half).eval()
    with torch.no_grad():
        for _ in range(3):
            model(**inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                model(**inputs)
            torch.cuda.synchronize()
    print(f"== PyTorch {name}: CUDA kernels over 5 calls")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))

torch.manual_seed(0)
vit = tf.ViTModel(tf.ViTConfig(), add_pooling_layer=False)
profile("ViT-base b32", vit, dict(pixel_values=torch.randn(32, 3, 224, 224, device=dev, dtype=torch.half)))
bert = tf.BertModel(tf.BertConfig(), add_pooling_layer=False)
ids = torch.randint(0, 30000, (128, 128), device=dev)
profile("BERT-base b128x128", bert, dict(input_ids=ids, attention_mask=torch.ones_like(ids)))
