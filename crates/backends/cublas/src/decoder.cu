// The decoder kernels of the cuBLAS engine (LLaMA-style causal LMs, and Whisper-style decoders
// with LayerNorm, learned positions and cross-attention), compiled after kernels.cu
// (`T`, `ld`, `st`, `block_reduce`, `shared_floats`, `Pack`, `activate`, `gather_rows`). Every
// kernel reads the number of columns already in the KV cache from device memory (`past[0]`), so
// one decoding step is the same launches every time (and can be replayed as a CUDA graph).
//
// Rounding follows HF in half precision: values a framework keeps in `T` between operations are
// rounded to `T` here too (the residual stream, the normalised activations, cos / sin tables).

__device__ __forceinline__ float round_t(float x) { return ld(st(x)); }

// HF's RMSNorm of one value: x / rms, rounded to T, times the scale, rounded (`inv` is
// 1 / rms = rsqrt(mean of squares + eps), from rms_inv).
__device__ __forceinline__ float rms_inv(float sum_of_squares, int n, float eps) {
    return rsqrtf(sum_of_squares / n + eps);
}
__device__ __forceinline__ float rms_value(float x, float inv, float gamma) {
    return round_t(gamma * round_t(x * inv));
}
// HF's LayerNorm of one value: computed in f32 and rounded once (`inv` = 1 / std).
__device__ __forceinline__ float ln_value(float x, float mean, float inv, float gamma, float beta) {
    return round_t((x - mean) * inv * gamma + beta);
}

// Programmatic dependent launch (compute capability 9.0 and later; no-ops before and on the
// host). A kernel the engine launches overlapped with the one before it (`launch_raw` in decoder.rs
// with `overlap`) may start while that one finishes: it calls wait_for_previous() before it reads
// anything the kernel before wrote, or writes anything. allow_next() lets the kernel after this
// one start early (once every block of this one has called it or exited).
__device__ __forceinline__ void wait_for_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// Fetches the first `bytes` of p into L2: 128-byte lines `first`, `first + stride`, ... (nothing
// waits for them).
__device__ __forceinline__ void prefetch_l2(const unsigned char* p, long long bytes, int first,
                                            int stride) {
#if defined(__CUDA_ARCH__)
    for (long long b = (long long)first * 128; b < bytes; b += (long long)stride * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + b));
#endif
}

#if IN_GROUP(7)
// mask[b, past + j] = fresh[b, j] for the call's new columns; grid (batch), block (any).
extern "C" __global__ void append_mask(const int* fresh, const int* past, int n_new, int cap,
                                       int* mask) {
    int b = blockIdx.x;
    for (int j = threadIdx.x; j < n_new; j += blockDim.x)
        mask[(long long)b * cap + past[0] + j] = fresh[b * n_new + j];
}
#endif

#if IN_GROUP(7)
// One block per row: when `y` is not null, x = x + y (+ bias) rounded to T (the residual
// stream); then out = the norm of x: with `beta`, HF's LayerNorm ((x - mean) / std * gamma +
// beta); without, HF's RMSNorm (gamma * (x / rms(x)), normalised in f32, rounded to T, then
// scaled). Shared memory: (hidden + 32) floats.
extern "C" __global__ void residual_norm(const T* y, const T* bias, T* x, const T* gamma,
                                         const T* beta, float eps, int hidden, T* out) {
    float* row = shared_floats();
    float* red = row + hidden;
    size_t base = (size_t)blockIdx.x * hidden;
    float s = 0.f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        float v = ld(x[base + c]);
        if (y) {
            v += ld(y[base + c]);
            if (bias) v += ld(bias[c]);
            v = round_t(v);
            x[base + c] = st(v);
        }
        row[c] = v;
        s += beta ? v : v * v;
    }
    float total = block_reduce(s, red, BLOCK_SUM);
    if (beta) {
        float mean = total / hidden, var = 0.f;
        for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
            float d = row[c] - mean;
            var += d * d;
        }
        float inv = rsqrtf(block_reduce(var, red, BLOCK_SUM) / hidden + eps);
        for (int c = threadIdx.x; c < hidden; c += blockDim.x)
            out[base + c] = st(ln_value(row[c], mean, inv, ld(gamma[c]), ld(beta[c])));
        return;
    }
    float inv = rms_inv(total, hidden, eps);
    for (int c = threadIdx.x; c < hidden; c += blockDim.x)
        out[base + c] = st(rms_value(row[c], inv, ld(gamma[c])));
}
#endif

#if IN_GROUP(7)
// Learned positions: x[r, :] = x[r, :] + table[positions[r], :], rounded to T (HF adds the two
// embeddings in the model's dtype). Grid (rows, blocks of ROW_THREADS).
extern "C" __global__ void add_positions(const int* positions, const T* table, int hidden, T* x) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    size_t r = blockIdx.x;
    x[r * hidden + c] = st(ld(x[r * hidden + c]) + ld(table[(size_t)positions[r] * hidden + c]));
}
#endif

// Greedy decoding on the device: one block of ARGMAX_THREADS per row of `logits` `[rows, vocab]`
// writes the index of the row's largest value, the lowest such index on ties (0 when every value
// is -inf), as the host's argmax picks it; -1 when the row holds NaN.
#define ARGMAX_THREADS 256
#if IN_GROUP(7)
extern "C" __global__ void argmax_rows(const T* logits, int vocab, int* out) {
    __shared__ float best[ARGMAX_THREADS];
    __shared__ int index[ARGMAX_THREADS];
    __shared__ int nan[ARGMAX_THREADS];
    const T* row = logits + (size_t)blockIdx.x * vocab;
    int t = threadIdx.x;
    float v = NEG_INF;
    int at = 0x7fffffff, seen_nan = 0;
    for (int i = t; i < vocab; i += ARGMAX_THREADS) {
        float x = ld(row[i]);
        if (x != x) seen_nan = 1;
        else if (x > v) v = x, at = i;
    }
    best[t] = v, index[t] = at, nan[t] = seen_nan;
    __syncthreads();
    for (int half = ARGMAX_THREADS / 2; half > 0; half /= 2) {
        if (t < half) {
            float o = best[t + half];
            int oi = index[t + half];
            if (o > best[t] || (o == best[t] && oi < index[t])) best[t] = o, index[t] = oi;
            nan[t] |= nan[t + half];
        }
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = nan[0] ? -1 : (index[0] == 0x7fffffff ? 0 : index[0]);
}
#endif

// Sampling on the device: each row's SAMPLE_TOP most likely tokens (and, when asked, the sum of
// its softmax's numerators), so the host chooses a token from a few values instead of the row.
// A value's key orders rows as the host's sampler does (`total_cmp`, largest first, then the
// lower index): sorting keys ascending puts the most likely first.
#define SAMPLE_THREADS 512
#define SAMPLE_CHUNK 4096
#define SAMPLE_TOP 64
__device__ __forceinline__ unsigned long long sample_key(float v, int i) {
    unsigned b = __float_as_uint(v);
    unsigned u = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // ascending total order
    return ((unsigned long long)(~u) << 32) | (unsigned)i;
}
__device__ __forceinline__ float sample_value(unsigned long long key) {
    unsigned u = ~(unsigned)(key >> 32);
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}
// Bitonic sort of n (a power of two) keys in shared memory, ascending, by the whole block.
__device__ void sort_keys(unsigned long long* keys, int n) {
    for (int size = 2; size <= n; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                unsigned long long a = keys[lo], b = keys[hi];
                if ((a > b) == ((lo & size) == 0)) keys[lo] = b, keys[hi] = a;
            }
        }
    __syncthreads();
}

#if IN_GROUP(8)
// Grid (chunks, rows), SAMPLE_THREADS threads: block (c, r) takes columns [c, c + 1) ×
// SAMPLE_CHUNK of row r of `logits` [rows, vocab] in f32, applies the row's repetition penalty
// (`penalties[r]`, to the distinct tokens `tokens[offsets[r] .. offsets[r + 1]]`: divided when
// positive, multiplied when negative, in f32 as the host does), writes the values to `scores`
// [rows, vocab], and its SAMPLE_TOP largest keys to `top` [rows, chunks, SAMPLE_TOP] (the keys
// past the row's end sort last); `nan[r * chunks + c]` says whether the chunk held NaN.
extern "C" __global__ void sample_chunks(const T* logits, int vocab, const int* offsets,
                                         const int* tokens, const float* penalties,
                                         float* scores, unsigned long long* top, int* nan) {
    __shared__ unsigned long long keys[SAMPLE_CHUNK];
    __shared__ int seen_nan;
    int row = blockIdx.y, chunks = gridDim.x, base = blockIdx.x * SAMPLE_CHUNK;
    size_t at = (size_t)row * vocab;
    if (threadIdx.x == 0) seen_nan = 0;
    for (int i = threadIdx.x; i < SAMPLE_CHUNK; i += blockDim.x)
        keys[i] = base + i < vocab ? __float_as_uint(ld(logits[at + base + i])) : 0u;
    __syncthreads();
    float p = penalties[row];
    if (p != 1.f)
        for (int j = offsets[row] + threadIdx.x; j < offsets[row + 1]; j += blockDim.x) {
            int c = tokens[j] - base;
            if (c < 0 || c >= SAMPLE_CHUNK || base + c >= vocab) continue;
            float v = __uint_as_float((unsigned)keys[c]);
            keys[c] = __float_as_uint(v < 0.f ? v * p : v / p);
        }
    __syncthreads();
    for (int i = threadIdx.x; i < SAMPLE_CHUNK; i += blockDim.x) {
        if (base + i >= vocab) {
            keys[i] = ~0ull;
            continue;
        }
        float v = __uint_as_float((unsigned)keys[i]);
        scores[at + base + i] = v;
        if (v != v) seen_nan = 1;
        keys[i] = sample_key(v, base + i);
    }
    sort_keys(keys, SAMPLE_CHUNK);
    unsigned long long* out = top + ((size_t)row * chunks + blockIdx.x) * SAMPLE_TOP;
    for (int j = threadIdx.x; j < SAMPLE_TOP; j += blockDim.x) out[j] = keys[j];
    if (threadIdx.x == 0) nan[row * chunks + blockIdx.x] = seen_nan;
}
#endif

#if IN_GROUP(8)
// Grid (rows), SAMPLE_THREADS threads, after sample_chunks: row r's SAMPLE_TOP largest keys of
// its `chunks` (chunks × SAMPLE_TOP ≤ SAMPLE_CHUNK) to out[r * (SAMPLE_TOP + 2) ...], then the
// sum over the row of exp(f64(v / t − max / t)) as a double's bits when `temperatures[r]` = t
// > 0 (0 otherwise), then 1 when the row holds NaN.
extern "C" __global__ void sample_merge(const unsigned long long* top, const int* nan,
                                        int chunks, const float* scores, int vocab,
                                        const float* temperatures, unsigned long long* out) {
    __shared__ unsigned long long keys[SAMPLE_CHUNK];
    __shared__ double partial[SAMPLE_THREADS];
    int row = blockIdx.x, n = chunks * SAMPLE_TOP, size = 1;
    while (size < n) size <<= 1;
    for (int i = threadIdx.x; i < size; i += blockDim.x)
        keys[i] = i < n ? top[(size_t)row * n + i] : ~0ull;
    sort_keys(keys, size);
    unsigned long long* o = out + (size_t)row * (SAMPLE_TOP + 2);
    for (int j = threadIdx.x; j < SAMPLE_TOP; j += blockDim.x) o[j] = keys[j];
    float t = temperatures[row];
    double s = 0.0;
    if (t > 0.f) {
        float max = __fdiv_rn(sample_value(keys[0]), t);
        const float* r = scores + (size_t)row * vocab;
        for (int c = threadIdx.x; c < vocab; c += blockDim.x)
            s += exp((double)__fsub_rn(__fdiv_rn(r[c], t), max));
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int any = 0;
        for (int c = 0; c < chunks; ++c) any |= nan[row * chunks + c];
        o[SAMPLE_TOP] = (unsigned long long)__double_as_longlong(partial[0]);
        o[SAMPLE_TOP + 1] = (unsigned long long)any;
    }
}
#endif

#if IN_GROUP(9)
// The MLP's middle. Gated: out[r, c] = act(gate + bias) * (up + bias) where `gu` row r holds the
// gate's `inter` outputs then the up projection's; `bias` (2 * inter, or null) likewise. Plain
// (`gated` 0): out[r, c] = act(up + bias), `gu` and `bias` holding the up projection's `inter`
// alone. Grid (rows, blocks of ROW_THREADS).
extern "C" __global__ void mlp_act(const T* gu, const T* bias, int inter, int act, int gated,
                                   T* out) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= inter) return;
    size_t r = blockIdx.x;
    if (!gated) {
        float u = ld(gu[r * inter + c]);
        if (bias) u = round_t(u + ld(bias[c]));
        out[r * inter + c] = st(activate(u, act));
        return;
    }
    float g = ld(gu[r * 2 * inter + c]), u = ld(gu[r * 2 * inter + inter + c]);
    if (bias) {
        g = round_t(g + ld(bias[c]));
        u = round_t(u + ld(bias[inter + c]));
    }
    out[r * inter + c] = st(round_t(activate(g, act)) * u);
}
#endif

#if IN_GROUP(9)
// Splits the fused q / k / v projection (row r = b * n_new + i, `heads` query heads, then
// `kv_heads` key heads, then `kv_heads` value heads, each `head_dim` wide) plus its bias: rotates
// q and k at position `positions[r]` (HF's rotate_half: feature d pairs with d + head_dim / 2)
// unless `inv_freq` is null (learned positions: `positions` is not read), writes q to `q`
// `[rows, heads * head_dim]` and k, v into the caches `[batch, kv_heads, cap, head_dim]` at
// column past + i. With `heads` 0 it splits the keys and values of a cross-attention; with
// `kv_heads` 0 it adds the bias of queries alone. Grid (rows, heads + 2 * kv_heads), block
// head_dim / 2.
extern "C" __global__ void rope_split(const T* qkv, const T* bias, const int* positions,
                                      const float* inv_freq, const int* past, int heads,
                                      int kv_heads, int head_dim, int n_new, int cap, T* q,
                                      T* k_cache, T* v_cache) {
    allow_next();
    int r = blockIdx.x, slot = blockIdx.y, i = threadIdx.x, half = head_dim / 2;
    int b = r / n_new, s = r - b * n_new;
    size_t width = (size_t)(heads + 2 * kv_heads) * head_dim;
    const T* src = qkv + r * width + (size_t)slot * head_dim;
    const T* bs = bias + (size_t)slot * head_dim;
    float x1 = round_t(ld(src[i]) + ld(bs[i]));
    float x2 = round_t(ld(src[i + half]) + ld(bs[i + half]));
    if (inv_freq && slot < heads + kv_heads) {
        float a = (float)positions[r] * inv_freq[i];
        float c = round_t(cosf(a)), sn = round_t(sinf(a));
        float y1 = x1 * c - x2 * sn, y2 = x2 * c + x1 * sn;
        x1 = y1;
        x2 = y2;
    }
    T* dst;
    if (slot < heads) {
        dst = q + (size_t)r * heads * head_dim + (size_t)slot * head_dim;
    } else {
        int kvh = slot < heads + kv_heads ? slot - heads : slot - heads - kv_heads;
        T* cache = slot < heads + kv_heads ? k_cache : v_cache;
        dst = cache + (((size_t)b * kv_heads + kvh) * cap + past[0] + s) * head_dim;
    }
    dst[i] = st(x1);
    dst[i + half] = st(x2);
}
#endif

// Attention of the call's queries over a KV cache. SELF: query i of row b sits at column
// past + i and sees the columns j <= past + i whose mask is set (and, with a sliding window,
// j > past + i - window). RELATIVE (T5): the same, or with `causal` 0 every column of the call
// (an encoder stack), with the bias rel_table[rel_bucket[j - (past + i) + rel_offset], head] added
// to each score. CROSS (cross-attention): every query sees the columns j < keys (an encoder's
// states) whose `mask` (`[batch, keys]`, or null: all) is set. CROSS and SELF split their keys
// into splits of `split_keys` columns when `parts` is given (flash-decoding: a decoding step's
// few queries would otherwise leave most of the GPU idle over 1500 keys, or a long cache); a
// block then writes its split's unnormalised output, running max and sum there for
// cross_combine, else (one split) the output. Softmax is online over chunks of blockDim keys (no
// limit on the context): one thread scores one key of the chunk, then every thread adds W
// features of the values of a strided subset of the chunk's keys (W-wide loads, independent
// across keys). A query that sees no key gets zeros (PyTorch SDPA's answer for a fully masked
// row).
// q and out `[batch * n_new, heads * head_dim]`; caches `[batch, kv_heads, cap, head_dim]`;
// values read in packs of W (head_dim a multiple of W). Grid (n_new × splits, heads, batch),
// block a multiple of 32 and at least head_dim; shared memory (head_dim + blockDim * (1 + W) +
// 32) floats.
#define SELF 0
#define RELATIVE 1
#define CROSS 2
template <int W, int MODE>
__device__ void cached_attention_impl(const T* q, const T* k_cache, const T* v_cache,
                                      const int* mask, const int* past, int heads, int kv_heads,
                                      int head_dim, int n_new, int cap, int window, int keys,
                                      int split_keys, int causal, const int* rel_bucket,
                                      const T* rel_table, int rel_offset, float scale,
                                      float* parts, T* out) {
    allow_next();
    float* qs = shared_floats();
    float* ps = qs + head_dim;
    float* accs = ps + blockDim.x;
    float* red = accs + blockDim.x * W;
    const bool cross = MODE == CROSS;
    // Split keys (cross-attention, or a decoding step's self-attention with `parts`): blocks
    // (split, query) in x.
    const bool splits = cross || parts;
    int i = splits ? blockIdx.x % n_new : blockIdx.x, split = splits ? blockIdx.x / n_new : 0;
    int h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
    int kvh = h / (heads / kv_heads);
    int first, col, qpos = 0;
    if (cross) {
        first = split * split_keys;
        col = min(keys, first + split_keys) - 1;
    } else if (MODE == RELATIVE) {
        qpos = past[0] + i;
        col = causal ? qpos : past[0] + n_new - 1;
        first = 0;
    } else {
        col = past[0] + i;
        first = window > 0 ? max(0, col - window + 1) : 0;
        if (parts) {  // this split's keys only (none past the query's column: an empty part)
            first = max(first, split * split_keys);
            col = min(col, split * split_keys + split_keys - 1);
        }
    }
    size_t row = (size_t)b * n_new + i;
    const T* qr = q + row * heads * head_dim + (size_t)h * head_dim;
    for (int d = t; d < head_dim; d += blockDim.x) qs[d] = ld(qr[d]) * scale;
    __syncthreads();
    const T* kb = k_cache + ((size_t)b * kv_heads + kvh) * cap * head_dim;
    const T* vb = v_cache + ((size_t)b * kv_heads + kvh) * cap * head_dim;
    const int* mrow = mask ? mask + (size_t)b * cap : nullptr;
    // Value accumulation: thread t adds features [pk * W, pk * W + W) of keys kg, kg +
    // groups, ... of each chunk.
    int packs = head_dim / W, groups = blockDim.x / packs;
    int pk = t % packs, kg = t / packs;
    float acc[W];
#pragma unroll
    for (int e = 0; e < W; ++e) acc[e] = 0.f;
    float m = NEG_INF, l = 0.f;
    for (int c0 = first; c0 <= col; c0 += blockDim.x) {
        int j = c0 + t;
        bool on = j <= col && ((cross && !mrow) || mrow[j] != 0);
        float s = NEG_INF;
        if (on) {
            const T* kr = kb + (size_t)j * head_dim;
            s = 0.f;
            for (int e = 0; e < head_dim; e += W) {
                Pack<W> kp = load_pack<W>(kr + e);
#pragma unroll
                for (int u = 0; u < W; ++u) s += qs[e + u] * ld(kp.v[u]);
            }
            if (MODE == RELATIVE) s += ld(rel_table[rel_bucket[j - qpos + rel_offset] * heads + h]);
        }
        float m_new = fmaxf(m, block_reduce(s, red, BLOCK_MAX));
        if (m_new == NEG_INF) continue;  // nothing visible yet (uniform over the block)
        float p = on ? expf(s - m_new) : 0.f;
        ps[t] = p;
        float alpha = m == NEG_INF ? 0.f : expf(m - m_new);
        l = l * alpha + block_reduce(p, red, BLOCK_SUM);  // its barriers publish ps
        m = m_new;
        if (kg < groups) {
#pragma unroll
            for (int e = 0; e < W; ++e) acc[e] *= alpha;
            int n = min((int)blockDim.x, col + 1 - c0);
            const T* vc = vb + (size_t)c0 * head_dim + pk * W;
#pragma unroll 4
            for (int jj = kg; jj < n; jj += groups) {
                float pj = ps[jj];  // 0 for a masked key, whose (finite) values add nothing
                Pack<W> vp = load_pack<W>(vc + (size_t)jj * head_dim);
#pragma unroll
                for (int e = 0; e < W; ++e) acc[e] += pj * ld(vp.v[e]);
            }
        }
        __syncthreads();  // ps is rewritten by the next chunk
    }
    if (kg < groups) {
#pragma unroll
        for (int e = 0; e < W; ++e) accs[kg * head_dim + pk * W + e] = acc[e];
    }
    __syncthreads();
    if (t < head_dim) {
        float o = 0.f;
        for (int gg = 0; gg < groups; ++gg) o += accs[gg * head_dim + t];
        if (parts) {
            int splits = gridDim.x / n_new;
            float* part = parts + ((row * heads + h) * splits + split) * (head_dim + 2);
            part[t] = o;
            if (t == 0) part[head_dim] = m, part[head_dim + 1] = l;
        } else {
            out[row * heads * head_dim + (size_t)h * head_dim + t] = st(l > 0.f ? o / l : 0.f);
        }
    }
}

// The entry points: 16-byte packs when head_dim is a multiple of VEC, single values otherwise;
// causal self-attention and cross-attention apart (the cross form's bounds cost the causal one 16
// registers).
#define ATTENTION_ENTRY(NAME, W)                                                                   \
    extern "C" __global__ void NAME(const T* q, const T* k_cache, const T* v_cache,              \
                                    const int* mask, const int* past, int heads, int kv_heads,     \
                                    int head_dim, int n_new, int cap, int window, float scale,     \
                                    int split_keys, float* parts, T* out) {                        \
        cached_attention_impl<W, SELF>(q, k_cache, v_cache, mask, past, heads, kv_heads, head_dim, \
                                       n_new, cap, window, 0, split_keys, 1, nullptr, nullptr, 0,  \
                                       scale, parts, out);                                         \
    }
#define RELATIVE_ENTRY(NAME, W)                                                                    \
    extern "C" __global__ void NAME(const T* q, const T* k_cache, const T* v_cache,              \
                                    const int* mask, const int* past, int heads, int head_dim,     \
                                    int n_new, int cap, int causal, const int* rel_bucket,         \
                                    const T* rel_table, int rel_offset, float scale, T* out) {     \
        cached_attention_impl<W, RELATIVE>(q, k_cache, v_cache, mask, past, heads, heads,          \
                                           head_dim, n_new, cap, 0, 0, 0, causal, rel_bucket,      \
                                           rel_table, rel_offset, scale, nullptr, out);            \
    }
#define CROSS_ENTRY(NAME, W)                                                                       \
    extern "C" __global__ void NAME(const T* q, const T* k_cache, const T* v_cache,              \
                                    const int* mask, int heads, int head_dim, int n_new, int keys, \
                                    int split_keys, float scale, float* parts, T* out) {           \
        cached_attention_impl<W, CROSS>(q, k_cache, v_cache, mask, nullptr, heads, heads,          \
                                        head_dim, n_new, keys, 0, keys, split_keys, 0, nullptr,    \
                                        nullptr, 0, scale, parts, out);                            \
    }
// A prefill's causal self-attention over the cache on tensor cores (kernels.cu's
// flash_attention_impl): queries `[batch * n_new, heads * D]`, caches `[batch, kv_heads, cap, D]`
// holding `past + n_new` columns, `mask` `[batch, cap]`; query i sees the columns up to past + i.
// Grid (ceil(n_new / FLASH_ROWS), batch * heads), FLASH_ROWS * 2 threads; f16 storage.
#define CACHED_FLASH(D)                                                                            \
    extern "C" __global__ void FLASH_BOUNDS cached_flash_attention_##D(                            \
        const T* q, const T* k_cache, const T* v_cache, const int* mask, int past, int n_new,     \
        int heads, int kv_heads, int cap, float scale_log2, T* out) {                              \
        int b = blockIdx.y / heads, h = blockIdx.y - b * heads, kvh = h / (heads / kv_heads);     \
        long long width = (long long)heads * D;                                                    \
        long long kv = ((long long)b * kv_heads + kvh) * cap * D;                                  \
        flash_attention_impl<D>(q + (long long)b * n_new * width + h * D, width, n_new,            \
                                k_cache + kv, v_cache + kv, D, past + n_new,                       \
                                mask + (long long)b * cap, nullptr, nullptr, 1, past, scale_log2,  \
                                out + (long long)b * n_new * width + h * D, width);                \
    }
#if IN_GROUP(10)
CACHED_FLASH(32)
#endif
#if IN_GROUP(11)
CACHED_FLASH(64)
#endif
#if IN_GROUP(12)
ATTENTION_ENTRY(cached_attention, VEC)
#endif
#if IN_GROUP(12)
ATTENTION_ENTRY(cached_attention_scalar, 1)
#endif
#if IN_GROUP(13)
RELATIVE_ENTRY(relative_attention, VEC)
#endif
#if IN_GROUP(13)
RELATIVE_ENTRY(relative_attention_scalar, 1)
#endif
#if IN_GROUP(14)
CROSS_ENTRY(cross_attention, VEC)
#endif
#if IN_GROUP(14)
CROSS_ENTRY(cross_attention_scalar, 1)
#endif

#if IN_GROUP(14)
// Joins a cross-attention's splits: out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s, M the
// largest running max, for each query row and head. `parts` as cross_attention writes them
// (`splits` per row and head, head_dim + 2 floats each). Grid (rows, heads), block a multiple of
// 32 and at least head_dim.
extern "C" __global__ void cross_combine(const float* parts, int heads, int head_dim, int splits,
                                         T* out) {
    size_t row = blockIdx.x;
    int h = blockIdx.y, t = threadIdx.x, stride = head_dim + 2;
    const float* p = parts + (row * heads + h) * splits * stride;
    float top = NEG_INF;
    for (int s = 0; s < splits; ++s) top = fmaxf(top, p[s * stride + head_dim]);
    if (t >= head_dim) return;
    float o = 0.f, l = 0.f;
    for (int s = 0; s < splits; ++s) {
        float m = p[s * stride + head_dim];
        float w = m == NEG_INF ? 0.f : expf(m - top);
        o += w * p[s * stride + t];
        l += w * p[s * stride + head_dim + 1];
    }
    out[row * heads * head_dim + (size_t)h * head_dim + t] = st(l > 0.f ? o / l : 0.f);
}
#endif

// ---- Products on the weight as stored: dense rows of T, or ggml blocks (ggml_blocks.cuh) that
// are dequantized in registers. A row is read in units: VEC values of T, or 8 weights of a block.
#define DENSE (-1)
template <int F> struct Unit { static const int N = 8; };
template <> struct Unit<DENSE> { static const int N = VEC; };

template <int F>
__device__ __forceinline__ void load_unit(const unsigned char* row, int u, float* w) {
    if (F == DENSE) {
        Pack<VEC> p = load_pack<VEC>((const T*)row + (size_t)u * VEC);
#pragma unroll
        for (int e = 0; e < (int)VEC; ++e) w[e] = ld(p.v[e]);
    } else {
        ggml_unit(F, row, u, w);
    }
}

// N values of x from column c in packs of VEC (N a multiple of VEC).
template <int N>
__device__ __forceinline__ void load_x(const T* x, float* v) {
#pragma unroll
    for (int p = 0; p < N; p += (int)VEC) {
        Pack<VEC> xv = load_pack<VEC>(x + p);
#pragma unroll
        for (int e = 0; e < (int)VEC; ++e) v[p + e] = ld(xv.v[e]);
    }
}

#define GEMV_ROWS 8

// acc[r] += sum_e wv[e] * x'[r, c + e] for one unit of a weight row (N values from column c) and
// each of the `rows` (<= R) rows of x; x' is x's norm with `gamma`: its LayerNorm with `beta`
// (`mean[r]`, `inv[r]` = 1 / std of row r), else its RMSNorm (`inv[r]` = 1 / rms); x itself
// without `gamma` (see gemv_impl). `beta` is read by the WIDE kernels only.
template <int N, int R, bool WIDE>
__device__ __forceinline__ void gemv_unit(const float* wv, int c, const T* x, int x_stride,
                                          int rows, const T* gamma, const T* beta,
                                          const float* mean, const float* inv, float* acc) {
    float g[N], bt[N];
    if (gamma) load_x<N>(gamma + c, g);
    if (WIDE && beta) load_x<N>(beta + c, bt);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < rows) {
            float xv[N];
            load_x<N>(x + (size_t)r * x_stride + c, xv);
#pragma unroll
            for (int e = 0; e < N; ++e) {
                float xe = !gamma           ? xv[e]
                           : (WIDE && beta) ? ln_value(xv[e], mean[r], inv[r], g[e], bt[e])
                                            : rms_value(xv[e], inv[r], g[e]);
                acc[r] += wv[e] * xe;
            }
        }
    }
}

// y[r, o] = sum_c w[o, c] * x'[r, c] for the few rows of a decoding step (rows <= R, R = 1 or
// GEMV_ROWS): `split` warps (1, 2, 4 or 8) per output feature, so a product of few outputs or
// long rows still has enough loads in flight; their lanes read the weight row (`row_bytes` bytes
// from w + o * row_bytes) in units, the rows of x (which every warp reads, so they stay in L1 /
// L2) in 16-byte loads; f32 sums, the split's partial sums added in shared memory. k is a
// multiple of the unit, x_stride of VEC. The one-row kernel (R = 1, the decoding step of one
// sequence) takes its units GEMV_BATCH at a time, every load of a batch issued before its
// arithmetic: with one load in flight per lane the product reached about a third of the
// bandwidth. The GEMV_ROWS kernel takes one at a time (a batch's registers over 8 rows would cost
// resident blocks).
// Prologue: with `gamma`, x' is x's norm as residual_norm writes it: its LayerNorm with `beta`,
// else its RMSNorm (x / rms(x), rounded to T, times gamma, rounded); else x itself. Epilogue: the
// bias when given (rounded with the product, as a linear layer's output), then the activation
// `act` (an activation code, -1 for none) or with `residual` y = residual + that (the residual
// stream; `residual` may be `y`). Output row r is at y + r * y_stride (a part of a stacked
// weight writes its own columns). Grid (out / (GEMV_WARPS / split)), block (32 * GEMV_WARPS).
// Gated (`gated` an activation code, not -1): w holds 2 * out rows, the gate's then the up
// projection's, and y[r, j] = act(gate_j + bias_j) * (up_j + bias_{out + j}) as mlp_act
// computes it; the block's first half of output slots takes gate features, the second half the
// same features of the up projection (split at most GEMV_WARPS / 2). Grid (out / pairs), pairs =
// GEMV_WARPS / split / 2.
#define GEMV_WARPS 8
#define GEMV_BATCH 4
template <int F, int R, bool WIDE>
__device__ void gemv_impl(const unsigned char* w, long long row_bytes, const T* x, int x_stride,
                          int rows, int out, int k, const T* gamma, const T* beta, float eps,
                          const T* bias, const T* residual, T* y, int y_stride, int split,
                          int gated, int act) {
    const int N = Unit<F>::N;
    const int B = R == 1 ? GEMV_BATCH : 1;
    __shared__ float red[32];
    __shared__ float mean[R];
    __shared__ float inv[R];
    __shared__ float partial[GEMV_WARPS][R];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int sub = warp % split, slot = warp / split, slots = GEMV_WARPS / split, pairs = slots / 2;
    // The feature of the slot (gated: of the gate's or the up projection's half) and its row.
    int j = gated < 0 ? blockIdx.x * slots + slot : blockIdx.x * pairs + slot % pairs;
    bool active = j < out;
    int o = gated < 0 ? j : j + (slot / pairs) * out;
    const unsigned char* wr = w + (size_t)(active ? o : 0) * row_bytes;
    // The weights do not depend on the kernel before: this warp's part of its row is on its way
    // to L2 while that kernel finishes.
    if (active) prefetch_l2(wr, row_bytes, sub * 32 + lane, 32 * split);
    wait_for_previous();
    allow_next();
    if (gamma) {
        for (int r = 0; r < rows; ++r) {
            const T* xr = x + (size_t)r * x_stride;
            float m = 0.f;
            if (WIDE && beta) {  // LayerNorm: the mean first, then the squares about it
                float s = 0.f;
                for (int c = threadIdx.x; c < k; c += blockDim.x) s += ld(xr[c]);
                m = block_reduce(s, red, BLOCK_SUM) / k;
            }
            float ss = 0.f;
            for (int c = threadIdx.x; c < k; c += blockDim.x) {
                float v = ld(xr[c]) - m;
                ss += v * v;
            }
            float total = block_reduce(ss, red, BLOCK_SUM);
            if (threadIdx.x == 0) {
                mean[r] = m;
                inv[r] = WIDE && beta ? rsqrtf(total / k + eps) : rms_inv(total, k, eps);
            }
        }
        __syncthreads();
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    int units = active ? k / N : 0, step = 32 * split;
    int u = sub * 32 + lane;
    // Whole batches: no branch between the loads, so they are all in flight at once.
    for (; u + (B - 1) * step < units; u += B * step) {
        float wv[B][N];
#pragma unroll
        for (int i = 0; i < B; ++i) load_unit<F>(wr, u + i * step, wv[i]);
#pragma unroll
        for (int i = 0; i < B; ++i)
            gemv_unit<N, R, WIDE>(wv[i], (u + i * step) * N, x, x_stride, rows, gamma, beta,
                                  mean, inv, acc);
    }
    for (; u < units; u += step) {
        float wv[N];
        load_unit<F>(wr, u, wv);
        gemv_unit<N, R, WIDE>(wv, u * N, x, x_stride, rows, gamma, beta, mean, inv, acc);
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (r < rows) acc[r] = warp_reduce(acc[r], BLOCK_SUM);
    if (split > 1 || gated >= 0) {
        if (lane == 0)
            for (int r = 0; r < rows; ++r) partial[warp][r] = acc[r];
        __syncthreads();
        if (sub != 0) return;
        for (int r = 0; r < rows; ++r)
            for (int p = 1; p < split; ++p) acc[r] += partial[warp + p][r];
    }
    if (!active || lane != 0) return;
    if (gated >= 0) {
        if (slot >= pairs) return;  // an up feature: the gate's warp reads its sums
        for (int r = 0; r < rows; ++r) {
            float u = 0.f;
            for (int p = 0; p < split; ++p) u += partial[(slot + pairs) * split + p][r];
            float g = round_t(acc[r]);
            u = round_t(u);
            if (bias) {
                g = round_t(g + ld(bias[j]));
                u = round_t(u + ld(bias[out + j]));
            }
            y[(size_t)r * y_stride + j] = st(round_t(activate(g, gated)) * u);
        }
        return;
    }
    for (int r = 0; r < rows; ++r) {
        float v = acc[r];
        size_t at = (size_t)r * y_stride + o;
        if (bias) v = round_t(v + ld(bias[o]));
        if (WIDE && act >= 0) v = activate(round_t(v), act);
        if (residual) v = ld(residual[at]) + round_t(v);
        y[at] = st(v);
    }
}

// Rows of a weight dequantized to T: out[r, :] = w[ids ? ids[r] : first + r, :] (k values, a
// multiple of the unit): the embedding rows of a token batch, or a slice of a weight for a
// cuBLAS product. Grid (rows, units / 256 rounded up), block 256.
template <int F>
__device__ void dequant_impl(const unsigned char* w, long long row_bytes, const int* ids,
                             int first, int k, T* out) {
    const int N = Unit<F>::N;
    int r = blockIdx.x, u = blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= k / N) return;
    long long src = ids ? ids[r] : first + r;
    float v[N];
    load_unit<F>(w + src * row_bytes, u, v);
    T* dst = out + (size_t)r * k + (size_t)u * N;
#pragma unroll
    for (int e = 0; e < N; ++e) dst[e] = st(v[e]);
}

// The entry points of each format: gemv_<name> (up to GEMV_ROWS rows), gemv1_<name> (one row)
// and dequant_<name>.
#define GEMV_ENTRY(NAME, F, R, WIDE)                                                            \
    extern "C" __global__ void NAME(const unsigned char* w, long long row_bytes, const T* x,    \
                                    int x_stride, int rows, int out, int k, const T* gamma,     \
                                    const T* beta, float eps, const T* bias, const T* residual, \
                                    T* y, int y_stride, int split, int gated, int act) {        \
        gemv_impl<F, R, WIDE>(w, row_bytes, x, x_stride, rows, out, k, gamma, beta, eps, bias,  \
                              residual, y, y_stride, split, gated, act);                        \
    }
#define DEQUANT_ENTRY(NAME, F)                                                                  \
    extern "C" __global__ void dequant_##NAME(const unsigned char* w, long long row_bytes,      \
                                              const int* ids, int first, int k, T* out) {       \
        dequant_impl<F>(w, row_bytes, ids, first, k, out);                                      \
    }
// A weight storage's kernels in two groups (compiled apart, `KernelSet` in compile.rs): the few-row
// product, then the one-row product with the row reader. Dense weights take groups 15 and 16;
// the engine appends each block format's pair (groups 19 + 2 × its index and the next:
// `WEIGHT_KERNELS_FEW(q4_k, 12)`, ...) for the formats the model stores only (`kernel_source`):
// they are most of the module's compile time on a fresh machine.
#define WEIGHT_KERNELS_FEW(NAME, F) GEMV_ENTRY(gemv_##NAME, F, GEMV_ROWS, false)
#define WEIGHT_KERNELS_ONE(NAME, F)                                                             \
    GEMV_ENTRY(gemv1_##NAME, F, 1, false)                                                       \
    DEQUANT_ENTRY(NAME, F)
#if IN_GROUP(15)
WEIGHT_KERNELS_FEW(dense, DENSE)
#endif
#if IN_GROUP(16)
WEIGHT_KERNELS_ONE(dense, DENSE)
#endif
// The WIDE forms of the dense products (LayerNorm prologue, activation epilogue: Whisper's
// decoder), apart so the others keep their registers (the branches cost the one-row kernel 10
// and the few-row kernel 16).
#if IN_GROUP(17)
GEMV_ENTRY(gemv_wide_dense, DENSE, GEMV_ROWS, true)
#endif
#if IN_GROUP(18)
GEMV_ENTRY(gemv1_wide_dense, DENSE, 1, true)
#endif
