// A small CPU emulator of the CUDA execution model, for running the kernels of
// mpisparse/backend/cuda/*.cu on a machine without a GPU (tests only).
//
// Every CUDA thread of a block is a fiber on one OS thread; blocks run one
// after another.  A fiber is started once per launch (ucontext) and then runs
// the kernel body once per block; switches between fibers and the scheduler
// are _setjmp/_longjmp, which save no signal mask (swapcontext makes a system
// call at every switch).  fakecupy.py compiles without _FORTIFY_SOURCE, whose
// checked longjmp refuses to jump to another stack.
//
// A fiber runs until it reaches a synchronisation point -- __syncthreads()
// or a warp intrinsic (__ballot_sync, __shfl_sync) -- where it waits until
// every thread of its block (or lane of its warp) has arrived.  So the
// kernels' barrier and warp-collective logic executes for real (results,
// counts, orders), and a thread that skips a barrier its block or warp
// reaches is reported as a deadlock.  What it cannot show:
// timing, memory-ordering races between barriers (threads interleave only at
// synchronisation points), and anything about real device performance.
//
// __shared__ variables become function statics: one copy, shared by the
// threads of the running block (blocks never overlap in time).

#ifndef MPISPARSE_EMU_HPP
#define MPISPARSE_EMU_HPP

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__ __attribute__((used))
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

// CUDA's 16-byte vector types (what a kernel's 16-byte loads read)
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) double2 {
    double x, y;
};

struct emu_dim3 {
    unsigned x, y, z;
};

namespace emu {
inline emu_dim3 g_thread{0, 1, 1}, g_block{0, 1, 1}, g_bdim{1, 1, 1}, g_gdim{1, 1, 1};

struct Fiber {
    ucontext_t ctx;  // only to enter the fiber's stack the first time
    jmp_buf jb;      // where it stopped
    unsigned tid = 0;
    bool started = false;
    bool done = false;
};

inline jmp_buf g_sched;
inline std::vector<std::vector<char>> g_stacks;  // reused by every launch (zero-filled once)
inline std::vector<Fiber>* g_fibers = nullptr;
inline Fiber* g_cur = nullptr;
inline const std::function<void()>* g_body = nullptr;
inline std::vector<unsigned> g_warp_arrived, g_warp_gen;
inline std::vector<uint64_t> g_warp_slot;
inline unsigned g_block_arrived = 0, g_block_gen = 0;
inline bool g_progress = false;

inline void yield() {
    if (!_setjmp(g_cur->jb)) _longjmp(g_sched, 1);
}

// A fiber's whole life in one launch: the body once per block, back to the scheduler after each.
inline void fiber_main() {
    for (;;) {
        (*g_body)();
        g_cur->done = true;
        g_progress = true;
        yield();
    }
}

inline void resume(Fiber& f) {
    if (_setjmp(g_sched)) return;
    if (f.started) _longjmp(f.jb, 1);
    f.started = true;
    setcontext(&f.ctx);
}

inline void block_barrier() {
    const unsigned gen = g_block_gen;
    g_progress = true;
    if (++g_block_arrived == g_bdim.x) {
        g_block_arrived = 0;
        ++g_block_gen;
        return;
    }
    while (g_block_gen == gen) yield();
}

inline void warp_barrier() {
    const unsigned w = g_cur->tid / 32;
    const unsigned gen = g_warp_gen[w];
    g_progress = true;
    if (++g_warp_arrived[w] == 32) {
        g_warp_arrived[w] = 0;
        ++g_warp_gen[w];
        return;
    }
    while (g_warp_gen[w] == gen) yield();
}

// every lane publishes a 64-bit value; returns the 32 values of the warp
inline void warp_exchange(uint64_t v, uint64_t out[32]) {
    const unsigned w = g_cur->tid / 32, lane = g_cur->tid % 32;
    g_warp_slot[w * 32 + lane] = v;
    warp_barrier();
    std::memcpy(out, &g_warp_slot[w * 32], 32 * sizeof(uint64_t));
    warp_barrier();  // nobody overwrites the slots before every lane has read them
}

// Run body() as a kernel of grid x block threads (1-D).
inline void launch(unsigned grid, unsigned block, const std::function<void()>& body) {
    if (block == 0 || block % 32 != 0 || block > 1024) {
        std::fprintf(stderr, "emu: blockDim.x must be a multiple of 32 in [32, 1024], got %u\n", block);
        std::abort();
    }
    std::vector<Fiber> fibers(block);
    if (g_stacks.size() < block) g_stacks.resize(block, std::vector<char>(64 * 1024));
    for (unsigned t = 0; t < block; ++t) {
        Fiber& f = fibers[t];
        f.tid = t;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = g_stacks[t].data();
        f.ctx.uc_stack.ss_size = g_stacks[t].size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
    }
    g_fibers = &fibers;
    g_body = &body;
    g_bdim = {block, 1, 1};
    g_gdim = {grid, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        g_block = {b, 0, 0};
        g_warp_arrived.assign(block / 32, 0);
        g_warp_gen.assign(block / 32, 0);
        g_warp_slot.assign(block, 0);
        g_block_arrived = 0;
        g_block_gen = 0;
        for (Fiber& f : fibers) f.done = false;
        unsigned remaining = block;
        int idle_rounds = 0;
        while (remaining) {
            g_progress = false;
            for (unsigned t = 0; t < block; ++t) {
                Fiber& f = fibers[t];
                if (f.done) continue;
                g_cur = &f;
                g_thread = {t, 0, 0};
                resume(f);
                if (f.done) --remaining;
            }
            idle_rounds = g_progress ? 0 : idle_rounds + 1;
            if (idle_rounds > 2) {
                std::fprintf(stderr, "emu: deadlock in block %u: %u threads wait at a barrier that the others "
                                     "never reach (divergent __syncthreads or warp intrinsic)\n", b, remaining);
                std::abort();
            }
        }
    }
    g_fibers = nullptr;
}
}  // namespace emu

#define threadIdx (emu::g_thread)
#define blockIdx (emu::g_block)
#define blockDim (emu::g_bdim)
#define gridDim (emu::g_gdim)

inline void __syncthreads() { emu::block_barrier(); }

inline unsigned __ballot_sync(unsigned mask, bool pred) {
    uint64_t all[32];
    emu::warp_exchange(pred ? 1u : 0u, all);
    unsigned r = 0;
    for (int l = 0; l < 32; ++l)
        if (all[l]) r |= 1u << l;
    return r & mask;
}

template <typename T>
inline T __shfl_sync(unsigned, T v, int src, int = 32) {
    static_assert(sizeof(T) <= 8, "emu: shuffle of at most 8 bytes");
    uint64_t bits = 0, all[32];
    std::memcpy(&bits, &v, sizeof(T));
    emu::warp_exchange(bits, all);
    T out;
    std::memcpy(&out, &all[src & 31], sizeof(T));
    return out;
}

inline void __threadfence() {}  // blocks run one after another: every write is already visible
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }
inline unsigned __float_as_uint(float v) {
    unsigned u;
    std::memcpy(&u, &v, 4);
    return u;
}
inline long long __double_as_longlong(double v) {
    long long u;
    std::memcpy(&u, &v, 8);
    return u;
}
template <typename T>
inline T atomicAdd(T* p, T v) {  // one OS thread: plain read-modify-write
    const T old = *p;
    *p = old + v;
    return old;
}

// Launch a kernel with cuLaunchKernel-style arguments (an array of pointers
// to each argument's value).
namespace emu {
template <typename... A, std::size_t... I>
void call_impl(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}
template <typename... A>
void call_with(void (*f)(A...), void** args) {
    call_impl(f, args, std::index_sequence_for<A...>{});
}
}  // namespace emu

#endif  // MPISPARSE_EMU_HPP
