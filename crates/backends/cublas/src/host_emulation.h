// Runs the engine's CUDA kernels on the host for tests: each block's threads are std::threads,
// __syncthreads a barrier, __shfl_xor_sync an exchange through memory between two warp barriers;
// blocks run one after another (so `__shared__` arrays can be statics).
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
using std::max;
using std::min;
inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
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
