// The element-wise and row kernels of the cuBLAS encoder. Compiled by NVRTC at load time, once per
// storage type: the prefix the engine puts before this file defines `T` (float, or the bits of an
// IEEE half in an unsigned short) with `ld` (to float) and `st` (from float, round to nearest).
// Arithmetic is f32 throughout; only storage is `T`.

// Which entry points this compile holds: group g when bit g of KERNEL_GROUPS is set (every group
// unless the engine defines it; it compiles a kernel set in several parts at once, `KernelSet`).
#ifndef KERNEL_GROUPS
#define KERNEL_GROUPS (~0ull)
#endif
#define IN_GROUP(g) ((KERNEL_GROUPS >> (g)) & 1ull)

#define BLOCK_SUM 0
#define BLOCK_MAX 1

// Sum or max of `v` over the warp; every lane gets the result.
__device__ __forceinline__ float warp_reduce(float v, int op) {
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = op == BLOCK_SUM ? v + other : fmaxf(v, other);
    }
    return v;
}

// Sum or max of `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. `red` holds 32 floats of shared memory.
__device__ float block_reduce(float v, float* red, int op) {
    v = warp_reduce(v, op);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < warps; ++i) r = op == BLOCK_SUM ? r + red[i] : fmaxf(r, red[i]);
    return r;
}

// The dynamic shared memory of the row kernels, as floats.
__device__ __forceinline__ float* shared_floats() {
    extern __shared__ float dynamic_shared[];
    return dynamic_shared;
}

// Layer norm of the f32 row `row[0..n)` (shared memory) into `out`.
__device__ void norm_row(const float* row, int n, const T* gamma, const T* beta, float eps,
                         T* out, float* red) {
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += row[i];
    float mean = block_reduce(s, red, BLOCK_SUM) / n;
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = row[i] - mean;
        v += d * d;
    }
    float var = block_reduce(v, red, BLOCK_SUM) / n;
    float inv = 1.f / sqrtf(var + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[i] = st((row[i] - mean) * inv * ld(gamma[i]) + ld(beta[i]));
}

// The encoder's entry points are compiled into the encoder engine's module only
// (`ENCODER_KERNELS`, `KernelSet` in compile.rs); the helpers serve the decoder's too.
#ifdef ENCODER_KERNELS
#if IN_GROUP(0)
// One block per token: word + token type + position embedding (row `positions[m]` of the
// table), then layer norm (`normalize`; without it `gamma` and `beta` are not read and the sum is
// written). Shared memory: (hidden + 32) floats.
extern "C" __global__ void embeddings(const int* ids, const int* types, const int* positions,
                                      const T* word, const T* position, const T* token_type,
                                      const T* gamma, const T* beta, float eps, int hidden,
                                      int normalize, T* out) {
    float* shared = shared_floats();
    float* row = shared;
    float* red = shared + hidden;
    long long m = blockIdx.x;
    long long s = positions[m];
    const T* w = word + (long long)ids[m] * hidden;
    const T* t = token_type + (long long)types[m] * hidden;
    const T* p = position + s * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = (ld(w[i]) + ld(t[i])) + ld(p[i]);
        row[i] = v;
        if (!normalize) out[m * hidden + i] = st(v);
    }
    if (!normalize) return;
    __syncthreads();
    norm_row(row, hidden, gamma, beta, eps, out + m * hidden, red);
}
#endif

#if IN_GROUP(0)
// `[batch, channels, height, width]` images as `[batch * patches, channels * patch * patch]`
// rows in T: patch (gy, gx) of image b at row b * patches + gy * (width / patch) + gx, its values
// in the projection's (channel, y, x) order, so the strided convolution is one GEMM. Grid
// (batch * patches, blocks of ROW_THREADS columns).
extern "C" __global__ void patch_rows(const T* px, int channels, int height, int width,
                                      int patch, T* out) {
    int cols = channels * patch * patch;
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    int gw = width / patch, n = (height / patch) * gw;
    long long r = blockIdx.x;
    long long b = r / n;
    int i = (int)(r - b * n), gy = i / gw, gx = i - gy * gw;
    int c = j / (patch * patch), yx = j - c * patch * patch, y = yx / patch, x = yx - y * patch;
    out[r * cols + j] =
        px[((b * channels + c) * height + gy * patch + y) * (long long)width + gx * patch + x];
}
#endif

#if IN_GROUP(0)
// ViT's patch embeddings: token 0 of each image is the class token, token 1 + i the projected
// patch i (`pe` `[batch * (tokens - 1), hidden]`, without its bias) plus the bias; then the
// position embedding of the token. Images are `stride` rows apart; rows past `tokens` (X-CLIP's
// message rows) get zeros. Grid (batch * stride, blocks of ROW_THREADS columns).
extern "C" __global__ void patch_embeddings(const T* pe, const T* bias, const T* cls,
                                            const T* pos, int tokens, int stride, int hidden,
                                            T* out) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    long long m = blockIdx.x;
    long long b = m / stride, s = m - b * stride;
    if (s >= tokens) {
        out[m * hidden + c] = st(0.f);
        return;
    }
    float v = s == 0 ? ld(cls[c])
                     : ld(pe[(b * (tokens - 1) + s - 1) * hidden + c]) + ld(bias[c]);
    out[m * hidden + c] = st(v + ld(pos[s * hidden + c]));
}

// Rows into a table: out[ids[r]] = src[r] (X-CLIP's messages into their rows of the residual
// stream); grid (rows, blocks of ROW_THREADS).
extern "C" __global__ void scatter_rows(const int* ids, const T* src, int hidden, T* out) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    long long r = blockIdx.x;
    out[(long long)ids[r] * hidden + c] = src[r * hidden + c];
}
#endif
#endif  // ENCODER_KERNELS

#define ACT_GELU 0
#define ACT_GELU_TANH 1
#define ACT_RELU 2
#define ACT_TANH 3
#define ACT_NONE 4
#define ACT_SILU 5
#define ACT_QUICK_GELU 6
#define ACT_RELU6 7
#define ACT_SIGMOID 8
#define ACT_MISH 9

__device__ __forceinline__ float activate(float v, int act) {
    if (act == ACT_NONE) return v;
    if (act == ACT_GELU) return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    if (act == ACT_GELU_TANH)
        return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    if (act == ACT_RELU) return fmaxf(v, 0.f);
    if (act == ACT_SILU) return v / (1.f + expf(-v));
    if (act == ACT_QUICK_GELU) return v / (1.f + expf(-1.702f * v));
    if (act == ACT_RELU6) return fminf(fmaxf(v, 0.f), 6.f);
    if (act == ACT_SIGMOID) return 1.f / (1.f + expf(-v));
    if (act == ACT_MISH) return v * tanhf(log1pf(expf(v)));
    return tanhf(v);
}

// The f16 bits of `x`, rounded to nearest even.
__device__ __forceinline__ unsigned short f16_bits(float x) {
#if defined(__CUDA_ARCH__)
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    return emu_f16_bits(x);
#endif
}

// Two f16 in one register: `lo` in bits 0-15, `hi` in 16-31 (an mma operand's pair of columns).
// One paired conversion from sm_80 on, where two single ones take the slower conversion pipe.
__device__ __forceinline__ unsigned f16_pair(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)f16_bits(lo) | ((unsigned)f16_bits(hi) << 16);
#endif
}

// ---- Row kernels in packs of W values: W = 1 for the plain kernels, W = VEC (16 bytes: 8 halves
// or 4 floats) for the `_vec` ones, which the engine uses when the row lengths and the head size
// are multiples of VEC.

#define VEC (16 / sizeof(T))
template <int W>
struct __align__(sizeof(T) * W) Pack {
    T v[W];
};

template <int W>
__device__ __forceinline__ Pack<W> load_pack(const T* p) {
    return *reinterpret_cast<const Pack<W>*>(p);
}
template <int W>
__device__ __forceinline__ void store_pack(T* p, const Pack<W>& x) {
    *reinterpret_cast<Pack<W>*>(p) = x;
}

// `f[0..W)` rounded to T: f16 in pairs (f16_pair), f32 as it is.
template <int W>
__device__ __forceinline__ Pack<W> pack_floats(const float* f) {
    Pack<W> o;
    if (sizeof(T) == 2 && W % 2 == 0) {
#pragma unroll
        for (int e = 0; e + 1 < W; e += 2) {
            unsigned w = f16_pair(f[e], f[e + 1]);
            o.v[e] = (T)(w & 0xffffu);
            o.v[e + 1] = (T)(w >> 16);
        }
    } else {
#pragma unroll
        for (int e = 0; e < W; ++e) o.v[e] = st(f[e]);
    }
    return o;
}

// The W values of y + bias + residual from `y[at]` (the bias from `bias[col]`) into `x`; with
// `sum`, also stored there rounded to T, and `x` holds the rounded values.
template <int W>
__device__ __forceinline__ void add_pack(const T* y, const T* bias, const T* residual, T* sum,
                                         size_t at, int col, float* x) {
    Pack<W> a = load_pack<W>(y + at), z;
    Pack<W> bb, r;
    if (bias) bb = load_pack<W>(bias + col);
    if (residual) r = load_pack<W>(residual + at);
#pragma unroll
    for (int e = 0; e < W; ++e) {
        x[e] = ld(a.v[e]);
        if (bias) x[e] += ld(bb.v[e]);
        if (residual) x[e] += ld(r.v[e]);
        if (sum) {
            z.v[e] = st(x[e]);
            x[e] = ld(z.v[e]);
        }
    }
    if (sum) store_pack<W>(sum + at, z);
}

// One block per row: z = (y + bias) + residual, out = layer_norm(z). `bias` and `residual` may be
// null (left out of the sum); when `sum` is not null, z is also written there (rounded to T, and
// the norm then reads the rounded value, as a framework that stores the residual stream in T
// does). `sum` may be `residual` and `out` may be `y` (each thread reads its values before any
// write). Shared memory: (hidden + 32) floats.
template <int W>
__device__ void add_norm_impl(const T* y, const T* bias, const T* residual, const T* gamma,
                              const T* beta, float eps, int hidden, T* sum, T* out) {
    float* shared = shared_floats();
    float* row = shared;
    float* red = shared + hidden;
    size_t base = (size_t)blockIdx.x * hidden;
    float s = 0.f;
    for (int c = threadIdx.x * W; c < hidden; c += blockDim.x * W) {
        float x[W];
        add_pack<W>(y, bias, residual, sum, base + c, c, x);
#pragma unroll
        for (int e = 0; e < W; ++e) {
            row[c + e] = x[e];
            s += x[e];
        }
    }
    float mean = block_reduce(s, red, BLOCK_SUM) / hidden;
    float var = 0.f;
    for (int c = threadIdx.x * W; c < hidden; c += blockDim.x * W) {
#pragma unroll
        for (int e = 0; e < W; ++e) {
            float d = row[c + e] - mean;
            var += d * d;
        }
    }
    float inv = 1.f / sqrtf(block_reduce(var, red, BLOCK_SUM) / hidden + eps);
    for (int c = threadIdx.x * W; c < hidden; c += blockDim.x * W) {
        Pack<W> g = load_pack<W>(gamma + c), bt = load_pack<W>(beta + c), o;
#pragma unroll
        for (int e = 0; e < W; ++e)
            o.v[e] = st((row[c + e] - mean) * inv * ld(g.v[e]) + ld(bt.v[e]));
        store_pack<W>(out + base + c, o);
    }
}

// Packs of a row one lane of `add_norm_warp_impl` holds: rows of up to 32 · WARP_NORM_PACKS packs
// (1024 halves or 512 floats) take the warp-per-row kernels.
#define WARP_NORM_PACKS 4

// add_norm_impl with one warp per row (blockDim.x / 32 rows per block, `rows` in all), the row
// in registers and the sums by shuffles: no shared memory and no block barrier. The same
// arguments, aliasing and rounding; `hidden` is a multiple of W of at most 32 · W ·
// WARP_NORM_PACKS.
template <int W>
__device__ void add_norm_warp_impl(const T* y, const T* bias, const T* residual, const T* gamma,
                                   const T* beta, float eps, int hidden, int rows, T* sum,
                                   T* out) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    size_t base = (size_t)row * hidden;
    float v[WARP_NORM_PACKS][W];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < WARP_NORM_PACKS; ++i) {
        int c = (lane + 32 * i) * W;
        if (c >= hidden) break;
        add_pack<W>(y, bias, residual, sum, base + c, c, v[i]);
#pragma unroll
        for (int e = 0; e < W; ++e) s += v[i][e];
    }
    float mean = warp_reduce(s, BLOCK_SUM) / hidden, var = 0.f;
#pragma unroll
    for (int i = 0; i < WARP_NORM_PACKS; ++i) {
        if ((lane + 32 * i) * W >= hidden) break;
#pragma unroll
        for (int e = 0; e < W; ++e) {
            float d = v[i][e] - mean;
            var += d * d;
        }
    }
    float inv = 1.f / sqrtf(warp_reduce(var, BLOCK_SUM) / hidden + eps);
#pragma unroll
    for (int i = 0; i < WARP_NORM_PACKS; ++i) {
        int c = (lane + 32 * i) * W;
        if (c >= hidden) break;
        Pack<W> g = load_pack<W>(gamma + c), bt = load_pack<W>(beta + c);
        float o[W];
#pragma unroll
        for (int e = 0; e < W; ++e) o[e] = (v[i][e] - mean) * inv * ld(g.v[e]) + ld(bt.v[e]);
        store_pack<W>(out + base + c, pack_floats<W>(o));
    }
}

// y[r, c] = act(y[r, c] + bias[c]); grid (rows, blocks of packs along the columns). One body
// per activation, so the element loop holds no activation test.
template <int W, int ACT>
__device__ void bias_act_body(T* y, const T* bias, int cols) {
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * W;
    if (c >= cols) return;
    T* p = y + (size_t)blockIdx.x * cols + c;
    Pack<W> x = load_pack<W>(p), bb = load_pack<W>(bias + c);
    float f[W];
#pragma unroll
    for (int e = 0; e < W; ++e) f[e] = activate(ld(x.v[e]) + ld(bb.v[e]), ACT);
    store_pack<W>(p, pack_floats<W>(f));
}

template <int W>
__device__ void bias_act_impl(T* y, const T* bias, int cols, int act) {
    switch (act) {
        case ACT_GELU: return bias_act_body<W, ACT_GELU>(y, bias, cols);
        case ACT_GELU_TANH: return bias_act_body<W, ACT_GELU_TANH>(y, bias, cols);
        case ACT_RELU: return bias_act_body<W, ACT_RELU>(y, bias, cols);
        case ACT_NONE: return bias_act_body<W, ACT_NONE>(y, bias, cols);
        case ACT_SILU: return bias_act_body<W, ACT_SILU>(y, bias, cols);
        case ACT_QUICK_GELU: return bias_act_body<W, ACT_QUICK_GELU>(y, bias, cols);
        case ACT_RELU6: return bias_act_body<W, ACT_RELU6>(y, bias, cols);
        case ACT_SIGMOID: return bias_act_body<W, ACT_SIGMOID>(y, bias, cols);
        case ACT_MISH: return bias_act_body<W, ACT_MISH>(y, bias, cols);
        default: return bias_act_body<W, ACT_TANH>(y, bias, cols);
    }
}

// Row m of the fused QKV projection `[batch * seq, 3 * hidden]` plus its bias, split into q, k, v
// laid out `[batch, heads, head_rows, head_dim]` (head_rows ≥ seq: rows past seq are padding the
// engine keeps zero); grid (tokens, blocks of packs).
template <int W>
__device__ void split_heads_impl(const T* qkv, const T* bias, int seq, int head_rows, int heads,
                                 int head_dim, T* q, T* k, T* v) {
    int hidden = heads * head_dim;
    int j = (blockIdx.y * blockDim.x + threadIdx.x) * W;
    if (j >= 3 * hidden) return;
    int m = blockIdx.x;
    int which = j / hidden, c = j - which * hidden;
    int h = c / head_dim, d = c - h * head_dim;
    int b = m / seq, s = m - b * seq;
    T* dst = which == 0 ? q : (which == 1 ? k : v);
    Pack<W> x = load_pack<W>(qkv + (size_t)m * 3 * hidden + j), bb = load_pack<W>(bias + j), o;
#pragma unroll
    for (int e = 0; e < W; ++e) o.v[e] = st(ld(x.v[e]) + ld(bb.v[e]));
    store_pack<W>(dst + (((size_t)b * heads + h) * head_rows + s) * head_dim + d, o);
}

// `[batch, heads, seq, head_dim]` back to `[batch, seq, heads * head_dim]`; grid (tokens, blocks of
// packs).
template <int W>
__device__ void merge_heads_impl(const T* ctx, int seq, int heads, int head_dim, T* out) {
    int hidden = heads * head_dim;
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * W;
    if (c >= hidden) return;
    int m = blockIdx.x;
    int h = c / head_dim, d = c - h * head_dim;
    int b = m / seq, s = m - b * seq;
    store_pack<W>(out + (size_t)m * hidden + c,
                  load_pack<W>(ctx + (((size_t)b * heads + h) * seq + s) * head_dim + d));
}

// The entry points: the same argument lists at pack widths 1 and VEC.
#define ROW_KERNELS(SUFFIX, W)                                                                  \
    extern "C" __global__ void bias_residual_norm##SUFFIX(                                      \
        const T* y, const T* bias, const T* residual, const T* gamma, const T* beta, float eps, \
        int hidden, T* out) {                                                                   \
        add_norm_impl<W>(y, bias, residual, gamma, beta, eps, hidden, nullptr, out);            \
    }                                                                                           \
    extern "C" __global__ void add_norm_sum##SUFFIX(const T* y, const T* bias, T* stream,       \
                                                    const T* gamma, const T* beta, float eps,   \
                                                    int hidden, T* out) {                       \
        add_norm_impl<W>(y, bias, stream, gamma, beta, eps, hidden, stream, out);               \
    }                                                                                           \
    extern "C" __global__ void layer_norm##SUFFIX(const T* x, const T* gamma, const T* beta,    \
                                                  float eps, int hidden, T* out) {              \
        add_norm_impl<W>(x, nullptr, nullptr, gamma, beta, eps, hidden, nullptr, out);          \
    }                                                                                           \
    extern "C" __global__ void bias_act##SUFFIX(T* y, const T* bias, int cols, int act) {       \
        bias_act_impl<W>(y, bias, cols, act);                                                   \
    }                                                                                           \
    extern "C" __global__ void split_heads##SUFFIX(const T* qkv, const T* bias, int seq,        \
                                                   int head_rows, int heads, int head_dim, T* q,  \
                                                   T* k, T* v) {                                  \
        split_heads_impl<W>(qkv, bias, seq, head_rows, heads, head_dim, q, k, v);               \
    }                                                                                           \
    extern "C" __global__ void merge_heads##SUFFIX(const T* ctx, int seq, int heads,            \
                                                   int head_dim, T* out) {                      \
        merge_heads_impl<W>(ctx, seq, heads, head_dim, out);                                    \
    }

#ifdef ENCODER_KERNELS
#if IN_GROUP(1)
ROW_KERNELS(, 1)
#endif
#if IN_GROUP(2)
ROW_KERNELS(_vec, VEC)
// The warp-per-row norms: the `_vec` kernels' arguments, then the row count.
extern "C" __global__ void bias_residual_norm_warp(const T* y, const T* bias, const T* residual,
                                                   const T* gamma, const T* beta, float eps,
                                                   int hidden, T* out, int rows) {
    add_norm_warp_impl<VEC>(y, bias, residual, gamma, beta, eps, hidden, rows, nullptr, out);
}
extern "C" __global__ void add_norm_sum_warp(const T* y, const T* bias, T* stream, const T* gamma,
                                             const T* beta, float eps, int hidden, T* out,
                                             int rows) {
    add_norm_warp_impl<VEC>(y, bias, stream, gamma, beta, eps, hidden, rows, stream, out);
}
extern "C" __global__ void layer_norm_warp(const T* x, const T* gamma, const T* beta, float eps,
                                           int hidden, T* out, int rows) {
    add_norm_warp_impl<VEC>(x, nullptr, nullptr, gamma, beta, eps, hidden, rows, nullptr, out);
}
#endif
#endif

// ---- Masked softmax over score rows `[batch, heads, q_len, k_len]`: probabilities over the keys
// whose `mask[b, key]` is non-zero (masked keys get 0), and with `causal` only keys up to the
// query's position. A row with no visible key attends to every key it may see (every key, or
// with `causal` the keys up to its own), as HF's additive mask (finfo.min on every key) does.

// One row of `row_len` values (a multiple of VEC, the row 16-byte aligned) whose packs p = lane +
// i * stride (i < PER), keys p * VEC ... p * VEC + VEC - 1, sit in this thread's registers; `reduce`
// combines a value over the threads sharing the row. `limit`: the keys the row may see at all
// (k_len, or with a causal mask the query's position + 1); the values past k_len (the padding that
// keeps the product with V aligned) are written 0.
template <int PER, class Reduce>
__device__ __forceinline__ void softmax_row(T* row, const int* keep, int row_len, int limit,
                                            int lane, int stride, Reduce reduce) {
    float v[PER][VEC];
    bool on[PER][VEC];
    float mx = NEG_INF, mx_all = NEG_INF;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        int base = (lane + i * stride) * VEC;
        Pack<VEC> x;
        if (base < row_len) x = load_pack<VEC>(row + base);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            int j = base + e;
            bool in = j < limit;
            v[i][e] = in ? ld(x.v[e]) : NEG_INF;
            on[i][e] = in && keep[j] != 0;
            if (on[i][e]) mx = fmaxf(mx, v[i][e]);
            if (in) mx_all = fmaxf(mx_all, v[i][e]);
        }
    }
    mx = reduce(mx, BLOCK_MAX);
    if (mx == NEG_INF) {
        mx = reduce(mx_all, BLOCK_MAX);
#pragma unroll
        for (int i = 0; i < PER; ++i)
#pragma unroll
            for (int e = 0; e < VEC; ++e) on[i][e] = (lane + i * stride) * VEC + e < limit;
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            v[i][e] = on[i][e] ? expf(v[i][e] - mx) : 0.f;
            s += v[i][e];
        }
    float inv = 1.f / reduce(s, BLOCK_SUM);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        int base = (lane + i * stride) * VEC;
        if (base >= row_len) continue;
        Pack<VEC> o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(v[i][e] * inv);
        store_pack<VEC>(row + base, o);
    }
}

#if IN_GROUP(3)
// Rows of a table: out[r] = table[ids[r]] (the token embedding of a decoder, the pooled tokens
// of an encoder's projection); grid (rows, blocks of ROW_THREADS).
extern "C" __global__ void gather_rows(const int* ids, const T* table, int hidden, T* out) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    long long r = blockIdx.x;
    out[r * hidden + c] = table[(long long)ids[r] * hidden + c];
}
#endif

#ifdef ENCODER_KERNELS
#if IN_GROUP(4)
// Feature frames as im2col rows for a 1-D convolution: the value of channel c at frame t of
// input b is `x[b * batch_stride + c * channel_stride + t * frame_stride]` (channel-major input
// features, frame-major convolution outputs); row b * out_frames + t holds the window of output
// frame t in the weight's (channel, tap) order, zero outside the frames (padding). Grid
// (batch * out_frames, blocks of ROW_THREADS columns).
extern "C" __global__ void frame_rows(const T* x, long long batch_stride, int channel_stride,
                                      int frame_stride, int channels, int frames, int kernel,
                                      int stride, int padding, int out_frames, T* out) {
    int cols = channels * kernel;
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    long long r = blockIdx.x;
    long long b = r / out_frames;
    int t = (int)(r - b * out_frames);
    int c = j / kernel, tap = j - c * kernel;
    int at = t * stride + tap - padding;
    out[r * cols + j] = at >= 0 && at < frames
                            ? x[b * batch_stride + (long long)c * channel_stride +
                                (long long)at * frame_stride]
                            : st(0.f);
}
#endif

#if IN_GROUP(4)
// The last convolution's output (`conv` `[batch * seq, hidden]`, without its bias) plus the bias,
// through the activation, plus the position embedding of the frame. Grid (batch * seq, blocks of
// ROW_THREADS columns).
extern "C" __global__ void frame_embeddings(const T* conv, const T* bias, const T* pos, int seq,
                                            int hidden, int act, T* out) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    long long m = blockIdx.x;
    long long s = m % seq;
    float v = activate(ld(conv[m * hidden + c]) + ld(bias[c]), act);
    out[m * hidden + c] = st(v + ld(pos[s * hidden + c]));
}
#endif

#if IN_GROUP(4)
// Wav2Vec2's GroupNorm with one group per channel, in place: `y` holds `[batch, frames, channels]`
// (frame-major convolution outputs); each (input, channel) gets its bias added, is normed over its
// frames, scaled, shifted and activated. Grid (batch, channel blocks of 32), block (32,
// CHANNEL_NORM_ROWS): a warp reads 32 neighbouring channels of one frame.
#define CHANNEL_NORM_ROWS 16
extern "C" __global__ void channel_norm_act(T* y, const T* bias, const T* gamma, const T* beta,
                                            int frames, int channels, float eps, int act) {
    __shared__ float part[CHANNEL_NORM_ROWS][33];
    int c = blockIdx.y * 32 + threadIdx.x;
    bool live = c < channels;
    T* base = y + (long long)blockIdx.x * frames * channels + c;
    float b = live ? ld(bias[c]) : 0.f;
    float s = 0.f;
    if (live)
        for (int t = threadIdx.y; t < frames; t += CHANNEL_NORM_ROWS)
            s += ld(base[(long long)t * channels]) + b;
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    float mean = 0.f;
    for (int r = 0; r < CHANNEL_NORM_ROWS; ++r) mean += part[r][threadIdx.x];
    mean /= frames;
    __syncthreads();
    float v = 0.f;
    if (live)
        for (int t = threadIdx.y; t < frames; t += CHANNEL_NORM_ROWS) {
            float d = ld(base[(long long)t * channels]) + b - mean;
            v += d * d;
        }
    part[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    float var = 0.f;
    for (int r = 0; r < CHANNEL_NORM_ROWS; ++r) var += part[r][threadIdx.x];
    if (!live) return;
    float scale = ld(gamma[c]) / sqrtf(var / frames + eps), shift = ld(beta[c]);
    for (int t = threadIdx.y; t < frames; t += CHANNEL_NORM_ROWS) {
        float x = ld(base[(long long)t * channels]) + b;
        base[(long long)t * channels] = st(activate((x - mean) * scale + shift, act));
    }
}
#endif

// One block per row of `k_stride` values (a multiple of VEC) holding `k_len` keys (the rest
// written 0), k_stride <= SOFTMAX_PACKS * VEC * blockDim.
#define SOFTMAX_PACKS 2
#if IN_GROUP(4)
extern "C" __global__ void masked_softmax(T* scores, const int* mask, int heads, int q_len,
                                          int k_len, int k_stride, int causal) {
    __shared__ float red[32];
    long long r = blockIdx.x;
    long long b = r / ((long long)heads * q_len);
    int limit = causal ? min(k_len, (int)(r % q_len) + 1) : k_len;
    softmax_row<SOFTMAX_PACKS>(scores + r * k_stride, mask + b * k_len, k_stride, limit,
                                    threadIdx.x, blockDim.x,
                                    [&](float v, int op) { return block_reduce(v, red, op); });
}
#endif

// One warp per row (blockDim (32, rows per block)), k_stride <= 256 (a multiple of VEC): no
// block barriers.
#define WARP_PACKS (256 / (32 * VEC))
#if IN_GROUP(4)
extern "C" __global__ void masked_softmax_warp(T* scores, const int* mask, int heads, int q_len,
                                               int k_len, int k_stride, long long rows,
                                               int causal) {
    long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    long long b = r / ((long long)heads * q_len);
    int limit = causal ? min(k_len, (int)(r % q_len) + 1) : k_len;
    softmax_row<WARP_PACKS>(scores + r * k_stride, mask + b * k_len, k_stride, limit, threadIdx.x, 32,
                           [](float v, int op) { return warp_reduce(v, op); });
}
#endif

#endif  // ENCODER_KERNELS

// ---- Fused attention on tensor cores (flash-style): softmax(scale · q kᵀ + mask) v for one head
// and 64 queries per block. The encoder reads q, k and v from the fused QKV projection `[batch *
// seq, 3 * hidden]` and writes the context into `[batch * seq, hidden]` at the head's columns, so
// neither the split into heads, the score rows nor the merge touch global memory; the decoder's
// prefill reads its queries `[batch * n_new, heads * head_dim]` and the KV cache (decoder.cu,
// `cached_flash_attention_*`).
// - The products are mma.sync m16n8k16 (f16 operands, f32 accumulators; compute capability 8.0 and
//   later, which the engine checks), their operands read from shared memory by ldmatrix.
// - The softmax runs online over tiles of 64 keys (FlashAttention-2); its unnormalised
//   probabilities are rounded to f16 for the product with v. The scores stay f32.
// - The biases: q's is added to its operand registers (rounded to f16, as the unfused split
//   does). k's shifts every score of a query by the same q · bias, which the softmax cancels, so
//   it is left out; v's is added to the output (the probabilities sum to 1). So the q, k, v and
//   mask tiles are plain copies (cp.async; keys double-buffered: the next tile loads while this
//   one computes), and no thread waits on a global load inside the loop.
// - Keys whose `mask[b, key]` is 0, keys past `seq`, and with `causal` keys after the query get
//   probability 0. The engine sends a batch with a row that sees no key at all to the unfused
//   kernels (whose softmax then attends to every key, as HF does).

#define FLASH_ROWS 64  // queries per block: 4 warps of 16
#define FLASH_KEYS 64  // keys per tile
#define FLASH_PAD 8    // halves past each shared row (spreads ldmatrix's rows over the banks)
#define FLASH_THREADS (2 * FLASH_ROWS)  // 4 warps
// The fused kernels' entry points: at most 128 registers, so 4 blocks fit an SM (as their shared
// memory does).
#if defined(__CUDA_ARCH__)
#define FLASH_BOUNDS __launch_bounds__(FLASH_THREADS, 4)
#else
#define FLASH_BOUNDS
#endif

// 2^x by the special-function unit (relative error below 2^-22; 2^-inf = 0), where the
// accurate exp2f adds range handling to every call.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

// The value of f16 bits.
__device__ __forceinline__ float f16_value(unsigned short h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return emu_f16_value(h);
#endif
}

// A register of two f16 plus `lo` and `hi`, rounded back to f16.
__device__ __forceinline__ unsigned f16_pair_plus(unsigned x, float lo, float hi) {
    return f16_pair(f16_value((unsigned short)(x & 0xffff)) + lo,
                    f16_value((unsigned short)(x >> 16)) + hi);
}

// d += a · b for a 16 × 16 f16 tile `a` (row major) and a 16 × 8 f16 tile `b` (column major),
// f32 `d` (16 × 8), in the register layout of PTX's mma.m16n8k16 (lane = 4 · group + thread
// in group).
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, const unsigned* b) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
#else
    emu_mma_16816(d, a, b);
#endif
}

#if defined(__CUDA_ARCH__)
// The shared-memory address (a 32-bit offset in the shared window) of a generic pointer to it.
__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// A place in shared memory holding f16 bits: on the device its 32-bit address in the shared
// window, so an access at a constant distance from it is one instruction with an immediate offset
// (through a generic pointer every access paid a 64-bit address computation); in the host
// emulation a pointer. `+` counts f16 values.
struct Smem {
    unsigned a;
    __device__ __forceinline__ Smem operator+(int halves) const {
        return {a + 2u * (unsigned)halves};
    }
};
__device__ __forceinline__ Smem smem_at(unsigned short* p) { return {shared_address(p)}; }
#else
struct Smem {
    unsigned short* p;
    Smem operator+(int halves) const { return {p + halves}; }
};
inline Smem smem_at(unsigned short* p) { return {p}; }
#endif

// ldmatrix.x4: lanes 8i ... 8i + 7 give the rows (8 f16 each, 16-byte aligned) of 8 × 8 matrix
// i, and r[i] gets this lane's pair of it: row lane / 4, columns 2 (lane % 4) and + 1, or with
// `TRANS` column lane / 4 of rows 2 (lane % 4) and + 1.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, Smem row) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(row.a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(row.a));
#endif
#else
    emu_ldmatrix_x4(r, row.p, TRANS);
#endif
}

// 8 values of a row (16-byte aligned) into shared memory as f16: an asynchronous 16-byte copy
// when they are f16 already (flash_commit, flash_wait), else converted here (the f32 build, which
// the engine never launches, and the host emulation).
__device__ __forceinline__ void stage8(Smem dst, const T* src) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
    if (sizeof(T) == 2) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst.a), "l"(src));
        return;
    }
#endif
    for (int e = 0; e < 8; ++e)
        asm volatile("st.shared.u16 [%0], %1;" ::"r"(dst.a + 2 * e), "h"(f16_bits(ld(src[e]))));
#else
    for (int e = 0; e < 8; ++e) dst.p[e] = f16_bits(ld(src[e]));
#endif
}

// 8 zeros into shared memory (16-byte aligned).
__device__ __forceinline__ void zero8(Smem dst) {
#if defined(__CUDA_ARCH__)
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(dst.a), "r"(0));
#else
    for (int e = 0; e < 8; ++e) dst.p[e] = 0;
#endif
}

// One int into shared memory, asynchronously where cp.async is (as stage8).
__device__ __forceinline__ void stage_int(int* dst, const int* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(dst)),
                 "l"(src));
#else
    *dst = *src;
#endif
}

// Closes the group of the asynchronous copies issued since the last one.
__device__ __forceinline__ void flash_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most `pending` groups of asynchronous copies are in flight.
template <int pending>
__device__ __forceinline__ void flash_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
#endif
}

// Rows [row0, row0 + FLASH_KEYS) of one head's `D` columns (`src` at the head's first column,
// rows `stride` apart) into shared memory as f16, row r at `dst + r * (D + FLASH_PAD)`; rows past
// `seq` are 0. Thread i copies the 8 columns (i % (D / 8)) * 8 of every (FLASH_THREADS / (D /
// 8))-th row from row i / (D / 8): a fixed handful of copies with no bounds test unless the rows
// end inside the tile.
template <int D>
__device__ __forceinline__ void stage_rows(const T* src, long long stride, int row0, int seq,
                                           Smem dst) {
    constexpr int CHUNKS = D / 8, STEP = FLASH_THREADS / CHUNKS, LD = D + FLASH_PAD;
    static_assert(FLASH_THREADS % CHUNKS == 0 && FLASH_KEYS % STEP == 0, "whole passes");
    int r = threadIdx.x / CHUNKS, c = (threadIdx.x - r * CHUNKS) * 8;
    const T* s = src + (row0 + r) * stride + c;
    Smem d = dst + r * LD + c;
    if (row0 + FLASH_KEYS <= seq) {
#pragma unroll
        for (int n = 0; n < FLASH_KEYS / STEP; ++n) stage8(d + n * STEP * LD, s + n * STEP * stride);
    } else {
#pragma unroll
        for (int n = 0; n < FLASH_KEYS / STEP; ++n) {
            if (row0 + r + n * STEP < seq)
                stage8(d + n * STEP * LD, s + n * STEP * stride);
            else
                zero8(d + n * STEP * LD);
        }
    }
}

// Keys [k0, k0 + FLASH_KEYS) of one head (`k`, `v` at the head's first column) and their mask
// values (0 past `seq`) into shared memory.
template <int D>
__device__ __forceinline__ void stage_keys(const T* k, const T* v, long long stride, int k0,
                                           int seq, const int* visible, Smem ks, Smem vs,
                                           int* keep) {
    stage_rows<D>(k, stride, k0, seq, ks);
    stage_rows<D>(v, stride, k0, seq, vs);
    static_assert(FLASH_KEYS <= FLASH_THREADS, "one mask value per thread");
    int i = threadIdx.x;
    if (i < FLASH_KEYS) {
        if (k0 + i < seq)
            stage_int(keep + i, visible + k0 + i);
        else
            keep[i] = 0;
    }
}

// One (batch row, head): its `queries` query rows at `q` (the head's first column; rows `q_stride`
// apart), its `keys` keys and values at `k`, `v` (rows `kv_stride` apart) and their mask
// `visible[key]`; with `causal` query i sees keys up to i + `offset` (the columns cached before
// it). `q_bias` and `v_bias` (the head's columns, or null) are added to the queries and the
// output. The context rows go to `out` (the head's first column, rows `out_stride` apart). Grid
// x: ceil(queries / FLASH_ROWS) blocks of FLASH_THREADS threads; `D` = the head size (a
// multiple of 16). `scale_log2` = scale · log2(e), positive.
template <int D>
__device__ void flash_attention_impl(const T* q, long long q_stride, int queries, const T* k,
                                     const T* v, long long kv_stride, int keys,
                                     const int* visible, const T* q_bias, const T* v_bias,
                                     int causal, int offset, float scale_log2, T* out,
                                     long long out_stride) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int LD = D + FLASH_PAD, TILE = FLASH_KEYS * LD;
    static_assert(FLASH_ROWS == FLASH_KEYS, "the queries are staged as a key tile is");
    // f16 bits in 16-byte words (ldmatrix and cp.async address 16-byte rows): the queries, then
    // two buffers of keys and of values.
    __shared__ unsigned q_words[FLASH_ROWS * LD / 2], kv_words[4 * TILE / 2];
    __shared__ int keep[2][FLASH_KEYS];
    Smem qs = smem_at(reinterpret_cast<unsigned short*>(q_words));
    Smem kv = smem_at(reinterpret_cast<unsigned short*>(kv_words));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int q0 = blockIdx.x * FLASH_ROWS;
    int tiles = (keys + FLASH_KEYS - 1) / FLASH_KEYS;
    if (causal) tiles = min(tiles, (q0 + FLASH_ROWS - 1 + offset) / FLASH_KEYS + 1);
    // The queries and the first key tile, one group of copies.
    stage_rows<D>(q, q_stride, q0, queries, qs);
    stage_keys<D>(k, v, kv_stride, 0, keys, visible, kv, kv + TILE, keep[0]);
    flash_commit();
    flash_wait<0>();
    __syncthreads();
    // This warp's 16 queries as the A operand, D / 16 tiles of 16 columns: matrices (rows 0-7,
    // columns 0-7), (rows 8-15, columns 0-7), (rows 0-7, columns 8-15), (rows 8-15, columns
    // 8-15), plus the bias of their columns (rounded to f16, as the unfused split does).
    unsigned qa[D / 16][4];
    const T* qb = q_bias + 2 * t;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        ldmatrix_x4<false>(qa[kk], qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
        if (!q_bias) continue;
        float b0 = ld(qb[kk * 16]), b1 = ld(qb[kk * 16 + 1]);
        float b8 = ld(qb[kk * 16 + 8]), b9 = ld(qb[kk * 16 + 9]);
        qa[kk][0] = f16_pair_plus(qa[kk][0], b0, b1);
        qa[kk][1] = f16_pair_plus(qa[kk][1], b0, b1);
        qa[kk][2] = f16_pair_plus(qa[kk][2], b8, b9);
        qa[kk][3] = f16_pair_plus(qa[kk][3], b8, b9);
    }
    // This lane's rows for ldmatrix in buffer 0: of the keys (the B operand of q kᵀ: key lane % 8,
    // columns 8 (lane / 8)) and of the values (transposed, the B operand of p v: key lane % 16,
    // columns 8 (lane / 16)). Every product's operand lies a constant distance from these.
    Smem k_lane = kv + (lane & 7) * LD + (lane >> 3) * 8;
    Smem v_lane = kv + TILE + (lane & 15) * LD + (lane >> 4) * 8;
    // This thread's two query rows (g and g + 8 of the warp's 16): the running max (of scores
    // times scale_log2), the running sum of its keys' probabilities, and its output columns.
    int query[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float run_max[2] = {NEG_INF, NEG_INF}, run_sum[2] = {0.f, 0.f};
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
    for (int tile = 0; tile < tiles; ++tile) {
        int buf = tile & 1, k0 = tile * FLASH_KEYS;
        if (tile + 1 < tiles) {
            Smem next = kv + (buf ^ 1) * 2 * TILE;
            stage_keys<D>(k, v, kv_stride, k0 + FLASH_KEYS, keys, visible, next, next + TILE,
                          keep[buf ^ 1]);
            flash_commit();
            flash_wait<1>();
        } else {
            flash_wait<0>();
        }
        __syncthreads();  // this tile is in shared memory for every warp
        // A warp whose 16 queries are all past the last skips the products (it still loads its
        // share of the tiles).
        if (q0 + warp * 16 < queries) {
            Smem ks = k_lane + buf * 2 * TILE, vs = v_lane + buf * 2 * TILE;
            const int* on = keep[buf];
            // s = q kᵀ: 16 queries × 64 keys, eight 16 × 8 tiles; one ldmatrix gives the B
            // operand of key tile j for two 16-column steps.
            float s[FLASH_KEYS / 8][4];
#pragma unroll
            for (int j = 0; j < FLASH_KEYS / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < D / 16; kk += 2) {
                    unsigned kb[4];
                    ldmatrix_x4<false>(kb, ks + j * 8 * LD + kk * 16);
                    mma_16816(s[j], qa[kk], kb);
                    mma_16816(s[j], qa[kk + 1], kb + 2);
                }
            }
            // Mask, then the online softmax: element e of tile j is query row e / 2, key
            // j * 8 + 2t + e % 2. The tile's visible keys as bits (key i: bit i % 32 of word
            // i / 32); a tile every one of this warp's queries sees whole needs no mask. The
            // maxima are of the raw scores (the scale is positive), which one fused multiply-add
            // per score then scales and shifts.
            unsigned seen[FLASH_KEYS / 32];
#pragma unroll
            for (int w = 0; w < FLASH_KEYS / 32; ++w)
                seen[w] = __ballot_sync(0xffffffffu, on[w * 32 + lane] != 0);
            bool whole = (!causal || k0 + FLASH_KEYS - 1 <= q0 + warp * 16 + offset);
#pragma unroll
            for (int w = 0; w < FLASH_KEYS / 32; ++w) whole = whole && seen[w] == 0xffffffffu;
            float tile_max[2] = {NEG_INF, NEG_INF};
            if (whole) {
#pragma unroll
                for (int j = 0; j < FLASH_KEYS / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[j][e]);
            } else {
                // This thread's keys j * 8 + 2t and + 1 as bits 2j and 2j + 1.
                unsigned mine = 0;
#pragma unroll
                for (int j = 0; j < FLASH_KEYS / 8; ++j)
                    mine |= ((seen[j >> 2] >> ((j & 3) * 8 + 2 * t)) & 3u) << (2 * j);
#pragma unroll
                for (int j = 0; j < FLASH_KEYS / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int key = j * 8 + 2 * t + (e & 1), row = e >> 1;
                        float x = s[j][e];
                        if (!((mine >> (2 * j + (e & 1))) & 1u) ||
                            (causal && k0 + key > query[row] + offset))
                            x = NEG_INF;
                        s[j][e] = x;
                        tile_max[row] = fmaxf(tile_max[row], x);
                    }
            }
            float base[2], alpha[2];
            bool grew = false;
#pragma unroll
            for (int row = 0; row < 2; ++row) {
                // The 4 threads of a group hold the row's 64 keys.
                float m = fmaxf(tile_max[row], __shfl_xor_sync(0xffffffffu, tile_max[row], 1));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
                float next = fmaxf(run_max[row], m * scale_log2);
                // No visible key yet: every probability so far is 0 (and exp2(-inf - 0) is 0).
                base[row] = next == NEG_INF ? 0.f : next;
                alpha[row] = fast_exp2(run_max[row] - base[row]);
                grew = grew || next != run_max[row];
                run_max[row] = next;
                run_sum[row] *= alpha[row];
            }
            // The output so far is rescaled only when a row's maximum grew (else alpha is 1): once
            // the maxima settle, most tiles skip these multiplications.
            if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
                for (int j = 0; j < D / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[j][e] *= alpha[e >> 1];
            }
#pragma unroll
            for (int j = 0; j < FLASH_KEYS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[j][e] = fast_exp2(fmaf(s[j][e], scale_log2, -base[e >> 1]));
                    run_sum[e >> 1] += s[j][e];
                }
            // o += p v: the score tiles 2kk and 2kk + 1 are the A operand of keys 16kk ... 16kk + 15;
            // one ldmatrix.trans gives the B operand of two 8-column tiles of v.
#pragma unroll
            for (int kk = 0; kk < FLASH_KEYS / 16; ++kk) {
                unsigned pa[4] = {f16_pair(s[2 * kk][0], s[2 * kk][1]),
                                  f16_pair(s[2 * kk][2], s[2 * kk][3]),
                                  f16_pair(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  f16_pair(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int j = 0; j < D / 8; j += 2) {
                    unsigned vb[4];
                    ldmatrix_x4<true>(vb, vs + kk * 16 * LD + j * 8);
                    mma_16816(o[j], pa, vb);
                    mma_16816(o[j + 1], pa, vb + 2);
                }
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    const T* vb = v_bias + 2 * t;
#pragma unroll
    for (int row = 0; row < 2; ++row) {
        float total = run_sum[row] + __shfl_xor_sync(0xffffffffu, run_sum[row], 1);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        float inv = total > 0.f ? 1.f / total : 0.f;
        if (query[row] >= queries) continue;
        T* dst = out + query[row] * out_stride + 2 * t;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            float lo = o[j][2 * row] * inv + (v_bias ? ld(vb[j * 8]) : 0.f);
            float hi = o[j][2 * row + 1] * inv + (v_bias ? ld(vb[j * 8 + 1]) : 0.f);
            if (sizeof(T) == 2) {
                *reinterpret_cast<unsigned*>(dst + j * 8) = f16_pair(lo, hi);
            } else {
                dst[j * 8] = st(lo);
                dst[j * 8 + 1] = st(hi);
            }
        }
    }
#endif
}

#ifdef ENCODER_KERNELS
// The encoder's: grid (ceil(seq / FLASH_ROWS), batch * heads).
#define FLASH_ATTENTION(D)                                                                        \
    extern "C" __global__ void FLASH_BOUNDS flash_attention_##D(                                  \
        const T* qkv, const T* bias, const int* mask, int seq, int heads, float scale_log2,       \
        int causal, T* out) {                                                                     \
        int hidden = heads * D, b = blockIdx.y / heads, h = blockIdx.y - b * heads;               \
        long long stride = 3LL * hidden;                                                          \
        const T* rows = qkv + (long long)b * seq * stride + h * D;                                \
        flash_attention_impl<D>(rows, stride, seq, rows + hidden, rows + 2 * hidden, stride, seq, \
                                mask + (long long)b * seq, bias + h * D,                          \
                                bias + 2 * hidden + h * D, causal, 0, scale_log2,                 \
                                out + (long long)b * seq * hidden + h * D, hidden);               \
    }
#if IN_GROUP(5)
FLASH_ATTENTION(32)
#endif
#if IN_GROUP(6)
FLASH_ATTENTION(64)
#endif
#endif  // ENCODER_KERNELS
