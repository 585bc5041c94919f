// The ggml block formats, read eight weights ("a unit") at a time: `unit_<fmt>(row, u, w)` writes
// weights 8u .. 8u + 7 of the row whose blocks start at `row`. Each follows ggml's reference
// `dequantize_row_*` (ggml-quants.c) operation by operation in f32, so the values are those the
// CPU's reference gives (`ipfs_accelerate_kernels::dequantize_row`). Plain C++ besides the
// qualifiers: NVRTC compiles it into the engine, and a unit test compiles it on the host with a
// C++ compiler and compares it with the Rust reference for every format.
//
// Blocks are read byte by byte (their fields are only 2-byte aligned in a row of 18-, 22- or
// 210-byte blocks).

#ifdef __CUDACC_RTC__
#define QFN __device__ __forceinline__
QFN float half_bits(const unsigned char* p) {
    unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#else
#define QFN static inline
#include <string.h>
QFN float half_bits(const unsigned char* p) {
    unsigned int h = (unsigned int)(p[0] | (p[1] << 8));
    unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do {
            man <<= 1;
            ++e;
        } while (!(man & 0x400));
        bits = sign | ((unsigned int)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif

// ggml's ids of the formats (`enum ggml_type`).
#define GGML_Q4_0 2
#define GGML_Q4_1 3
#define GGML_Q5_0 6
#define GGML_Q5_1 7
#define GGML_Q8_0 8
#define GGML_Q4_K 12
#define GGML_Q5_K 13
#define GGML_Q6_K 14

// 32 weights: f16 d, then 32 int8.
QFN void unit_q8_0(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 2) * 34;
    float d = half_bits(b);
    const signed char* q = (const signed char*)(b + 2) + (u & 3) * 8;
    for (int i = 0; i < 8; ++i) w[i] = q[i] * d;
}

// 32 weights: f16 d (and f16 m for Q4_1), 16 bytes: weight j in the low nibble of byte j, weight
// j + 16 in its high nibble.
QFN void unit_q4_0(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 2) * 18;
    float d = half_bits(b);
    int part = u & 3, shift = part >= 2 ? 4 : 0;
    const unsigned char* q = b + 2 + (part & 1) * 8;
    for (int i = 0; i < 8; ++i) w[i] = (((q[i] >> shift) & 0x0F) - 8) * d;
}

QFN void unit_q4_1(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 2) * 20;
    float d = half_bits(b), m = half_bits(b + 2);
    int part = u & 3, shift = part >= 2 ? 4 : 0;
    const unsigned char* q = b + 4 + (part & 1) * 8;
    for (int i = 0; i < 8; ++i) w[i] = ((q[i] >> shift) & 0x0F) * d + m;
}

// 32 weights: f16 d (and m for Q5_1), 4 bytes of fifth bits (bit j: weight j, bit j + 16:
// weight j + 16), 16 bytes of nibbles as Q4_0.
QFN unsigned int qh_word(const unsigned char* p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) |
           ((unsigned int)p[3] << 24);
}

QFN void unit_q5_0(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 2) * 22;
    float d = half_bits(b);
    unsigned int qh = qh_word(b + 2);
    int part = u & 3, j0 = (part & 1) * 8;
    const unsigned char* q = b + 6;
    for (int i = 0; i < 8; ++i) {
        int j = j0 + i;
        int x = part < 2 ? ((q[j] & 0x0F) | (((qh >> j) << 4) & 0x10))
                         : ((q[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        w[i] = (x - 16) * d;
    }
}

QFN void unit_q5_1(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 2) * 24;
    float d = half_bits(b), m = half_bits(b + 2);
    unsigned int qh = qh_word(b + 4);
    int part = u & 3, j0 = (part & 1) * 8;
    const unsigned char* q = b + 8;
    for (int i = 0; i < 8; ++i) {
        int j = j0 + i;
        int x = part < 2 ? ((q[j] & 0x0F) | (((qh >> j) << 4) & 0x10))
                         : ((q[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        w[i] = x * d + m;
    }
}

// The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K super-block (get_scale_min_k4).
QFN void scale_min_k4(int j, const unsigned char* q, int* d, int* m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// 256 weights: f16 d and dmin, 12 bytes of scales, 128 bytes of nibbles: chunk c of 64 weights
// takes bytes 32c .. 32c + 31, low nibbles first (sub-block 2c), then high (2c + 1).
QFN void unit_q4_k(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 5) * 144;
    int e = (u & 31) * 8, c = e >> 6, hi = (e >> 5) & 1, l0 = e & 31;
    int sc, mn;
    scale_min_k4(2 * c + hi, b + 4, &sc, &mn);
    float d1 = half_bits(b) * sc, m1 = half_bits(b + 2) * mn;
    const unsigned char* q = b + 16 + 32 * c + l0;
    for (int i = 0; i < 8; ++i) w[i] = d1 * ((q[i] >> (4 * hi)) & 0xF) - m1;
}

// Q4_K plus 32 bytes of fifth bits (bit 2c + hi of byte l for weight l of the sub-block).
QFN void unit_q5_k(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 5) * 176;
    int e = (u & 31) * 8, c = e >> 6, hi = (e >> 5) & 1, l0 = e & 31;
    int sc, mn;
    scale_min_k4(2 * c + hi, b + 4, &sc, &mn);
    float d1 = half_bits(b) * sc, m1 = half_bits(b + 2) * mn;
    const unsigned char* qh = b + 16 + l0;
    const unsigned char* q = b + 48 + 32 * c + l0;
    int bit = 1 << (2 * c + hi);
    for (int i = 0; i < 8; ++i)
        w[i] = d1 * (((q[i] >> (4 * hi)) & 0xF) + ((qh[i] & bit) ? 16 : 0)) - m1;
}

// 256 weights: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, f16 d. Half n of
// 128 weights: quarter r (32 weights) takes nibbles of ql[64n + 32 (r & 1) + l] (low for r < 2)
// and bits 2r of qh[32n + l], with scale 8n + r * 2 + l / 16.
QFN void unit_q6_k(const unsigned char* row, int u, float* w) {
    const unsigned char* b = row + (u >> 5) * 210;
    int e = (u & 31) * 8, n = e >> 7, r = (e & 127) >> 5, l0 = e & 31;
    float d = half_bits(b + 208);
    const unsigned char* ql = b + 64 * n + 32 * (r & 1) + l0;
    const unsigned char* qh = b + 128 + 32 * n + l0;
    const signed char* sc = (const signed char*)(b + 192) + 8 * n;
    float ds = d * sc[l0 / 16 + 2 * r];
    for (int i = 0; i < 8; ++i) {
        int q = ((ql[i] >> (r >= 2 ? 4 : 0)) & 0xF) | (((qh[i] >> (2 * r)) & 3) << 4);
        w[i] = ds * (q - 32);
    }
}

// Weights 8u .. 8u + 7 of a row in format `fmt` (a GGML_* id); false for another id.
QFN bool ggml_unit(int fmt, const unsigned char* row, int u, float* w) {
    switch (fmt) {
        case GGML_Q8_0: unit_q8_0(row, u, w); return true;
        case GGML_Q4_0: unit_q4_0(row, u, w); return true;
        case GGML_Q4_1: unit_q4_1(row, u, w); return true;
        case GGML_Q5_0: unit_q5_0(row, u, w); return true;
        case GGML_Q5_1: unit_q5_1(row, u, w); return true;
        case GGML_Q4_K: unit_q4_k(row, u, w); return true;
        case GGML_Q5_K: unit_q5_k(row, u, w); return true;
        case GGML_Q6_K: unit_q6_k(row, u, w); return true;
        default: return false;
    }
}
