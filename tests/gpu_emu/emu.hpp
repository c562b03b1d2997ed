// A small CPU emulator of the CUDA execution model, for running the kernels of
// mpisparse/backend/cuda/*.cu on a machine without a GPU (tests only).
//
// Every CUDA thread of a block is a fiber on one OS thread.  Fibers live as
// long as the process: each is entered once (ucontext) and then runs the
// kernel body of the current launch once per block it is given; switches between fibers and the scheduler are
// _setjmp/_longjmp, which save no signal mask (swapcontext makes a system
// call at every switch).  fakecupy.py compiles without _FORTIFY_SOURCE, whose
// checked longjmp refuses to jump to another stack.
//
// A fiber runs until it reaches a synchronisation point -- __syncthreads()
// or a warp intrinsic (__ballot_sync, __shfl_sync) -- where it waits until
// every thread of its block (or lane of its warp) has arrived.  So the
// kernels' barrier and warp-collective logic executes for real (results,
// counts, orders), and a thread that skips a barrier its block or warp
// reaches is reported as a deadlock.
//
// Blocks run in the order the launch asks for (`mode`, `seed`: fakecupy.py
// reads MPISPARSE_EMU_BLOCK_ORDER): forward (0, 1, 2, ...), reverse, a
// seeded permutation run one block after another, or interleaved: up to
// EMU_SLOTS blocks of the permutation resident at once, and at each step a
// seeded choice of which resident block runs one round (every waiting thread
// of it to its next barrier), so one block's atomics and global writes land
// between another block's barrier phases.  What it cannot show: timing,
// memory-ordering races (every write is visible at once, threads interleave
// only at synchronisation points, so a missing __threadfence goes unseen),
// and anything about real device performance.
//
// __shared__ declarations are rewritten by fakecupy.py into function statics
// with one copy per slot (emu_sh_NAME[EMU_SLOTS]...) and a reference to the
// running slot's copy, bound when the declaration executes.

#ifndef MPISPARSE_EMU_HPP
#define MPISPARSE_EMU_HPP

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sys/mman.h>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__ __attribute__((used))
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
// fakecupy.py rewrites every __shared__ declaration (one copy per slot); one left over fails to compile
#define __shared__ emu_shared_declaration_not_rewritten_by_fakecupy
#define EMU_SLOTS 3

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
inline unsigned g_slot = 0;  // the resident block (slot) whose thread runs now: its copy of __shared__

struct Fiber {
    ucontext_t ctx;  // only to enter the fiber's stack the first time
    jmp_buf jb;      // where it stopped
    unsigned tid = 0;
    bool started = false;
    bool done = false;
};

// one resident block: its threads (blockDim.x fibers of the pool) and its barrier state
struct Slot {
    size_t first = 0;  // its thread t is fiber g_pool[first + t]
    unsigned block = 0, remaining = 0;
    bool active = false;
    int idle_rounds = 0;
    std::vector<unsigned> warp_arrived, warp_gen;
    std::vector<uint64_t> warp_slot;
    unsigned block_arrived = 0, block_gen = 0;
};

enum Order { FORWARD = 0, REVERSE = 1, SHUFFLE = 2, INTERLEAVE = 3 };

inline jmp_buf g_sched;
inline std::vector<std::unique_ptr<Fiber>> g_pool;  // every fiber ever made, each on its own mmap'ed stack
inline ucontext_t g_ctx0;           // what a new fiber's context starts from (getcontext once)
inline const size_t STACK = 64 * 1024;
inline Fiber* g_cur = nullptr;
inline Slot* g_cur_slot = nullptr;
inline const std::function<void()>* g_body = nullptr;
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
    Slot& s = *g_cur_slot;
    const unsigned gen = s.block_gen;
    g_progress = true;
    if (++s.block_arrived == g_bdim.x) {
        s.block_arrived = 0;
        ++s.block_gen;
        return;
    }
    while (s.block_gen == gen) yield();
}

inline void warp_barrier() {
    Slot& s = *g_cur_slot;
    const unsigned w = g_cur->tid / 32;
    const unsigned gen = s.warp_gen[w];
    g_progress = true;
    if (++s.warp_arrived[w] == 32) {
        s.warp_arrived[w] = 0;
        ++s.warp_gen[w];
        return;
    }
    while (s.warp_gen[w] == gen) yield();
}

// every lane publishes a 64-bit value; returns the 32 values of the warp
inline void warp_exchange(uint64_t v, uint64_t out[32]) {
    Slot& s = *g_cur_slot;
    const unsigned w = g_cur->tid / 32, lane = g_cur->tid % 32;
    s.warp_slot[w * 32 + lane] = v;
    warp_barrier();
    std::memcpy(out, &s.warp_slot[w * 32], 32 * sizeof(uint64_t));
    warp_barrier();  // nobody overwrites the slots before every lane has read them
}

// splitmix64: the seeded choices of a launch (permutation, which resident block runs next)
inline uint64_t next_random(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline const char* order_name(int mode) {
    static const char* names[] = {"forward", "reverse", "seed", "interleave"};
    return mode >= 0 && mode <= 3 ? names[mode] : "?";
}

inline void start_block(Slot& s, unsigned block_id, unsigned block) {
    s.block = block_id;
    s.active = true;
    s.remaining = block;
    s.idle_rounds = 0;
    s.warp_arrived.assign(block / 32, 0);
    s.warp_gen.assign(block / 32, 0);
    s.warp_slot.assign(block, 0);
    s.block_arrived = s.block_gen = 0;
    for (unsigned t = 0; t < block; ++t) g_pool[s.first + t]->done = false;
}

// One round of a resident block: every thread not done runs to its next synchronisation point (or its end).
inline void run_round(Slot& s, unsigned slot, int mode, uint64_t seed) {
    g_progress = false;
    g_cur_slot = &s;
    g_slot = slot;
    g_block = {s.block, 0, 0};
    for (unsigned t = 0; t < g_bdim.x; ++t) {
        Fiber& f = *g_pool[s.first + t];
        if (f.done) continue;
        g_cur = &f;
        g_thread = {f.tid, 0, 0};
        resume(f);
        if (f.done) --s.remaining;
    }
    s.idle_rounds = g_progress ? 0 : s.idle_rounds + 1;
    if (s.idle_rounds > 2) {
        std::fprintf(stderr, "emu: deadlock in block %u: %u threads wait at a barrier that the others "
                             "never reach (divergent __syncthreads or warp intrinsic; block order %s, "
                             "launch seed %llu)\n", s.block, s.remaining, order_name(mode),
                     (unsigned long long)seed);
        std::abort();
    }
    if (s.remaining == 0) s.active = false;
}

// Run body() as a kernel of grid x block threads (1-D), its blocks in the order `mode` (enum Order) draws
// from `seed`.
inline void launch(unsigned grid, unsigned block, int mode, uint64_t seed, const std::function<void()>& body) {
    if (block == 0 || block % 32 != 0 || block > 1024) {
        std::fprintf(stderr, "emu: blockDim.x must be a multiple of 32 in [32, 1024], got %u\n", block);
        std::abort();
    }
    if (mode < FORWARD || mode > INTERLEAVE) {
        std::fprintf(stderr, "emu: unknown block order %d\n", mode);
        std::abort();
    }
    std::vector<unsigned> order(grid);
    for (unsigned b = 0; b < grid; ++b) order[b] = mode == REVERSE ? grid - 1 - b : b;
    uint64_t rng = seed;
    if (mode >= SHUFFLE)
        for (unsigned i = grid; i > 1; --i) std::swap(order[i - 1], order[next_random(rng) % i]);
    const unsigned nslots = mode == INTERLEAVE ? (grid < EMU_SLOTS ? (grid ? grid : 1) : EMU_SLOTS) : 1;
    if (g_pool.empty()) getcontext(&g_ctx0);
    while (g_pool.size() < (size_t)nslots * block) {  // a fiber waits in fiber_main between launches
        void* p = mmap(nullptr, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            std::fprintf(stderr, "emu: cannot map a fiber stack\n");
            std::abort();
        }
        Fiber& f = *g_pool.emplace_back(new Fiber());
        f.ctx = g_ctx0;
        f.ctx.uc_stack.ss_sp = p;
        f.ctx.uc_stack.ss_size = STACK - g_pool.size() % 61 * 64;  // stack tops staggered over the cache sets
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_main, 0);
    }
    std::vector<Slot> slots(nslots);
    for (unsigned s = 0; s < nslots; ++s) {
        slots[s].first = (size_t)s * block;
        for (unsigned t = 0; t < block; ++t) g_pool[slots[s].first + t]->tid = t;
    }
    g_body = &body;
    g_bdim = {block, 1, 1};
    g_gdim = {grid, 1, 1};
    unsigned next = 0;
    if (mode != INTERLEAVE) {  // one block after another
        for (; next < grid; ++next) {
            start_block(slots[0], order[next], block);
            while (slots[0].active) run_round(slots[0], 0, mode, seed);
        }
    } else {  // up to nslots resident blocks; a seeded choice of which one runs the next round
        unsigned active = 0;
        for (unsigned s = 0; s < nslots && next < grid; ++s, ++active) start_block(slots[s], order[next++], block);
        while (active) {
            unsigned pick = (unsigned)(next_random(rng) % active), s = 0;
            for (;; ++s)
                if (slots[s].active && pick-- == 0) break;
            run_round(slots[s], s, mode, seed);
            if (!slots[s].active) {
                if (next < grid) start_block(slots[s], order[next++], block);
                else --active;
            }
        }
    }
    g_cur = nullptr;
    g_cur_slot = nullptr;
    g_slot = 0;
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

inline void __threadfence() {}  // one memory, every write visible at once (a missing fence goes unseen)
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
inline T atomicAdd(T* p, T v) {  // one OS thread, switches only at barriers: plain read-modify-write
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
