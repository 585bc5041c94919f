// Runs the engine's CUDA kernels on the host for tests: each block's threads are std::threads,
// __syncthreads a barrier, __shfl_xor_sync, __ballot_sync and __any_sync exchanges through memory
// between two warp barriers; blocks run one after another (so `__shared__` arrays can be statics).
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct EmuDim { unsigned x = 1, y = 1, z = 1; };
thread_local EmuDim threadIdx, blockIdx;
EmuDim blockDim, gridDim;
static std::barrier<>* emu_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> emu_warp_barriers;
static float emu_shfl[1024];
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    int t = threadIdx.x + threadIdx.y * blockDim.x, w = t >> 5;
    emu_shfl[t] = v;
    emu_warp_barriers[w]->arrive_and_wait();
    float r = emu_shfl[(t & ~31) | ((t & 31) ^ o)];
    emu_warp_barriers[w]->arrive_and_wait();
    return r;
}
// __ballot_sync over a warp: every lane puts its predicate in a shared array between two warp
// barriers; lane i's is bit i.
static int emu_votes[1024];
inline unsigned __ballot_sync(unsigned, int pred) {
    int t = threadIdx.x + threadIdx.y * blockDim.x, w = t >> 5;
    emu_votes[t] = pred != 0;
    emu_warp_barriers[w]->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (unsigned)emu_votes[(t & ~31) | i] << i;
    emu_warp_barriers[w]->arrive_and_wait();
    return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
// The f16 bits of `f`, rounded to nearest even (the device's cvt.rn.f16.f32).
static inline unsigned short emu_f16_bits(float f) {
    unsigned int x; memcpy(&x, &f, 4);
    unsigned int sign = (x >> 16) & 0x8000u; int exp = (int)((x >> 23) & 0xff) - 127 + 15; unsigned int man = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u : 0u));
    if (exp >= 0x1f) return (unsigned short)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (unsigned short)sign;
        unsigned int m = man | 0x800000u, shift = (unsigned int)(14 - exp), half = 1u << (shift - 1);
        unsigned int rest = m & ((1u << shift) - 1), hv = m >> shift;
        if (rest > half || (rest == half && (hv & 1))) ++hv;
        return (unsigned short)(sign | hv);
    }
    unsigned int hv = ((unsigned int)exp << 10) | (man >> 13), rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (hv & 1))) ++hv;
    return (unsigned short)(sign | hv);
}
// ggml_blocks.cuh's reader of f16 bits (defined after kernels.cu).
static inline float half_bits(const unsigned char* p);
static inline float emu_f16_value(unsigned short h) {
    unsigned char b[2] = {(unsigned char)(h & 0xff), (unsigned char)(h >> 8)};
    return half_bits(b);
}
// mma.sync.m16n8k16 (f16 operands, f32 accumulators) over a warp: every lane puts its fragments
// in shared arrays, then computes its four outputs from the whole tiles, in the register layout
// of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type").
static unsigned emu_fragments[1024][6];
static inline void emu_mma_16816(float* d, const unsigned* a, const unsigned* b) {
    int t = threadIdx.x + threadIdx.y * blockDim.x, w = t >> 5, lane = t & 31, first = t & ~31;
    for (int i = 0; i < 4; ++i) emu_fragments[t][i] = a[i];
    emu_fragments[t][4] = b[0];
    emu_fragments[t][5] = b[1];
    emu_warp_barriers[w]->arrive_and_wait();
    auto pick = [&](int from, int reg, int k) {
        unsigned v = emu_fragments[first + from][reg];
        return emu_f16_value((unsigned short)((k & 1) ? v >> 16 : v & 0xffff));
    };
    // A[r][k]: lane 4 (r % 8) + (k % 8) / 2, register (r >= 8) + 2 (k >= 8).
    // B[k][n]: lane 4 n + (k % 8) / 2, register (k >= 8).
    int g = lane >> 2, tg = lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        int r = g + 8 * (e >> 1), n = 2 * tg + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; ++k)
            acc += pick(4 * (r & 7) + (k & 7) / 2, (r >= 8) + 2 * (k >= 8), k) *
                   pick(4 * n + (k & 7) / 2, 4 + (k >= 8), k);
        out[e] = acc;
    }
    emu_warp_barriers[w]->arrive_and_wait();
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}
// ldmatrix.x4 over a warp: every lane puts its row address in a shared array; lane l then takes
// from matrix i (rows given by lanes 8i ... 8i + 7) row l / 4, columns 2 (l % 4) and + 1, or with
// `trans` column l / 4 of rows 2 (l % 4) and + 1.
static const unsigned short* emu_rows[1024];
static inline void emu_ldmatrix_x4(unsigned* r, const unsigned short* row, bool trans) {
    int t = threadIdx.x + threadIdx.y * blockDim.x, w = t >> 5, lane = t & 31, first = t & ~31;
    emu_rows[t] = row;
    emu_warp_barriers[w]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        unsigned short lo, hi;
        if (trans) {
            lo = emu_rows[first + 8 * i + 2 * (lane & 3)][lane >> 2];
            hi = emu_rows[first + 8 * i + 2 * (lane & 3) + 1][lane >> 2];
        } else {
            lo = emu_rows[first + 8 * i + (lane >> 2)][2 * (lane & 3)];
            hi = emu_rows[first + 8 * i + (lane >> 2)][2 * (lane & 3) + 1];
        }
        r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
    emu_warp_barriers[w]->arrive_and_wait();
}
using std::max;
using std::min;
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline long long __double_as_longlong(double d) { long long l; memcpy(&l, &d, 8); return l; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) alignas(n)
template <class K> void emu_launch(EmuDim grid, EmuDim block, K kernel) {
    blockDim = block;
    gridDim = grid;
    unsigned threads = block.x * block.y;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar(threads);
                emu_block_barrier = &bar;
                emu_warp_barriers.clear();
                for (unsigned w = 0; w < (threads + 31) / 32; ++w)
                    emu_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([&, t] {
                        threadIdx = {t % block.x, t / block.x, 0};
                        blockIdx = {bx, by, bz};
                        kernel();
                    });
                for (auto& th : pool) th.join();
            }
}
