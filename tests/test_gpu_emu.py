"""The CPU emulator of CUDA blocks and threads (tests/gpu_emu/) that runs the package's kernels here.

The kernel tests trust it for barrier and warp semantics, so these check it directly: a block
reduction through shared memory and ``__syncthreads`` over several blocks and launches (fibers
restarted for each block), ``__ballot_sync`` and ``__shfl_sync`` within and across warps, a
divergent barrier reported as a deadlock instead of a hang or a wrong answer, and the order of a
launch's blocks (``MPISPARSE_EMU_BLOCK_ORDER``): forward, reverse, seeded permutations and interleaved
blocks each run every block exactly once, in the order asked for, with shared memory private to each
resident block; a kernel that assumes block 0 (or the highest block) finishes first fails out of order.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gpu_emu import fakecupy

pytestmark = pytest.mark.skipif(not fakecupy.compiler_available(),
                                reason="the CPU emulator of the CUDA kernels needs g++ (or $CXX)")

KERNELS = r"""
extern "C" __global__ void block_sums(const float* x, long long n, float* out) {
    __shared__ float part[256];
    const unsigned t = threadIdx.x;
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + t; i < n; i += (long long)gridDim.x * blockDim.x)
        s += x[i];
    part[t] = s;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) part[t] += part[t + half];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = part[0];
}

extern "C" __global__ void warp_ops(const int* flags, unsigned* ballots, int* shifted) {
    const unsigned t = threadIdx.x, lane = t % 32;
    const unsigned b = __ballot_sync(0xffffffffu, flags[t] != 0);
    if (lane == 0) ballots[t / 32] = b;
    shifted[t] = __shfl_sync(0xffffffffu, (int)t * 10, (lane + 1) % 32);
}

// thread 0 of each block: a ticket when the block starts and one after a barrier; every thread counts itself
extern "C" __global__ void order_probe(unsigned long long* ticket, unsigned* started, unsigned* phases,
                                       unsigned* threads, unsigned* own) {
    __shared__ unsigned s_block;
    __shared__ unsigned long long s_marks[2];
    const unsigned b = blockIdx.x;
    if (threadIdx.x == 0) {
        started[atomicAdd(ticket + 1, 1ull)] = b;  // ticket[1]: blocks started
        phases[2 * b] = (unsigned)atomicAdd(ticket, 1ull);  // ticket[0]: the starts and the barriers passed
        s_block = b;
        s_marks[0] = b;
    }
    atomicAdd(&threads[b], 1u);
    __syncthreads();
    if (threadIdx.x == 0) phases[2 * b + 1] = (unsigned)atomicAdd(ticket, 1ull);
    __syncthreads();
    if (s_block == b && s_marks[0] == b) atomicAdd(&own[b], 1u);  // shared memory still this block's
}

// wrong on a GPU: blocks 1.. read what block 0 writes, as if block 0 always ran first
extern "C" __global__ void assumes_block0_first(int* flag, int* out, unsigned long long* ticket, unsigned* tickets) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *flag = 1;
        tickets[gridDim.x] = (unsigned)atomicAdd(ticket, 1ull);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        tickets[blockIdx.x] = (unsigned)atomicAdd(ticket, 1ull);
        out[blockIdx.x] = *flag;
    }
}

// per-block sums of x, totalled by one block: the last to finish (an atomic count, right in any order)
// or, with by_last_id, the block with the highest index (right only when it finishes last)
extern "C" __global__ void total(const int* x, int* partial, unsigned long long* done, unsigned* finish, int* out,
                                int by_last_id) {
    __shared__ int s_sum;
    __shared__ int s_last;
    if (threadIdx.x == 0) s_sum = 0;
    __syncthreads();
    atomicAdd(&s_sum, x[blockIdx.x * blockDim.x + threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = s_sum;
        __threadfence();
        const unsigned long long f = atomicAdd(done, 1ull);
        finish[blockIdx.x] = (unsigned)f;
        const bool last_to_finish = f == (unsigned long long)gridDim.x - 1ull;
        s_last = by_last_id ? blockIdx.x == gridDim.x - 1 : last_to_finish;
    }
    __syncthreads();
    if (!s_last || threadIdx.x != 0) return;
    int sum = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) sum += ((volatile int*)partial)[b];
    *out = sum;
}

extern "C" __global__ void divergent(int* out) {
    if (threadIdx.x != 0) __syncthreads();  // thread 0 never arrives: the other 63 wait for ever
    out[threadIdx.x] = 1;
}
"""


@pytest.fixture(scope="module")
def module():
    return fakecupy.RawModule(KERNELS)


def test_block_reduction_over_blocks_and_launches(module):
    fn = module.get_function("block_sums")
    rng = np.random.default_rng(5)
    for n, grid in ((10_000, 3), (777, 5), (256 * 4, 4)):
        x = rng.integers(-50, 50, n).astype(np.float32)  # small integers: every order of sums is exact
        out = np.full(grid, np.nan, dtype=np.float32)
        fn((grid,), (256,), (x, np.int64(n), out))
        ref = [x[np.arange(n) % (grid * 256) // 256 == b].sum() for b in range(grid)]
        np.testing.assert_array_equal(out, np.array(ref, dtype=np.float32))
    assert fn.launches == 3


def test_ballot_and_shuffle_within_each_warp(module):
    fn = module.get_function("warp_ops")
    rng = np.random.default_rng(6)
    flags = rng.integers(0, 2, 128).astype(np.int32)
    ballots = np.zeros(4, dtype=np.uint32)
    shifted = np.zeros(128, dtype=np.int32)
    for _ in range(2):  # a second launch starts fresh fibers
        fn((2,), (128,), (flags, ballots, shifted))
        for w in range(4):
            bits = flags[32 * w:32 * w + 32]
            assert int(ballots[w]) == sum(1 << lane for lane in range(32) if bits[lane])
        t = np.arange(128)
        np.testing.assert_array_equal(shifted, (t // 32 * 32 + (t % 32 + 1) % 32) * 10)


def test_a_barrier_some_threads_never_reach_is_reported_as_a_deadlock():
    code = ("import numpy as np; from gpu_emu import fakecupy; "
            f"m = fakecupy.RawModule({KERNELS!r}); "
            "m.get_function('divergent')((1,), (64,), (np.zeros(64, dtype=np.int32),)); print('returned')")
    env = {k: v for k, v in os.environ.items() if k != fakecupy.ORDER_ENV}  # the default order
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=fakecupy.HERE.parent, env=env)
    assert p.returncode != 0 and "returned" not in p.stdout
    assert "emu: deadlock in block 0: 63 threads wait at a barrier" in p.stderr, p.stderr[-2000:]
    assert "block order interleave, launch seed" in p.stderr  # the default order, named for a rerun


ORDERS = ("forward", "reverse", "seed:1", "seed:2", "interleave:1", "interleave:2")


def probe(module, monkeypatch, order: str, grid: int = 12, block: int = 64):
    monkeypatch.setenv(fakecupy.ORDER_ENV, order)
    ticket = np.zeros(2, dtype=np.uint64)
    started = np.full(grid, 9999, dtype=np.uint32)
    phases = np.zeros(2 * grid, dtype=np.uint32)
    threads = np.zeros(grid, dtype=np.uint32)
    own = np.zeros(grid, dtype=np.uint32)
    module.get_function("order_probe")((grid,), (block,), (ticket, started, phases, threads, own))
    return started, phases.reshape(grid, 2), threads, own


@pytest.mark.parametrize("order", ORDERS)
def test_every_block_runs_once_with_all_its_threads_and_its_own_shared_memory(module, monkeypatch, order):
    started, phases, threads, own = probe(module, monkeypatch, order)
    assert sorted(started.tolist()) == list(range(12))  # a permutation: every block started exactly once
    np.testing.assert_array_equal(threads, 64)
    np.testing.assert_array_equal(own, 64)  # no other resident block wrote this block's __shared__
    assert sorted(phases.ravel().tolist()) == list(range(24))


def test_the_order_is_the_one_asked_for_and_reproducible(module, monkeypatch):
    runs = {o: probe(module, monkeypatch, o)[0].tolist() for o in ORDERS}
    assert runs["forward"] == list(range(12))
    assert runs["reverse"] == list(range(11, -1, -1))
    shuffled = [runs[o] for o in ORDERS[2:]]
    assert all(r not in (runs["forward"], runs["reverse"]) for r in shuffled)
    assert len({tuple(r) for r in shuffled}) == len(shuffled)  # each seed its own permutation
    for o in ORDERS:  # the same order variable and launch: the same order again
        assert probe(module, monkeypatch, o)[0].tolist() == runs[o], o
    # the permutation depends on the launch (here its grid), not only on the seed
    assert probe(module, monkeypatch, "seed:1", grid=11)[0].tolist() != runs["seed:1"][:11]


def test_only_interleave_overlaps_blocks_between_barriers(module, monkeypatch):
    for order in ORDERS:
        phases = probe(module, monkeypatch, order)[1]
        overlapped = int(np.sum(phases[:, 1] - phases[:, 0] > 1))  # another block's ticket between a block's two
        if order.startswith("interleave"):
            assert overlapped >= 3, (order, phases)
        else:
            assert overlapped == 0, (order, phases)


def test_the_default_order_is_interleaved_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.delenv(fakecupy.ORDER_ENV, raising=False)
    assert fakecupy.block_order() == (3, 1, "interleave:1")
    assert "MPISPARSE_EMU_BLOCK_ORDER=interleave:1" in fakecupy.describe_block_order()
    for bad in ("sideways", "seed", "seed:x", "forward:2", "interleave:-1"):
        monkeypatch.setenv(fakecupy.ORDER_ENV, bad)
        with pytest.raises(ValueError, match="MPISPARSE_EMU_BLOCK_ORDER=.*forward, reverse, seed:N or interleave:N"):
            fakecupy.block_order()


def test_a_kernel_that_assumes_a_block_finishes_first_fails_out_of_order(module, monkeypatch):
    grid, block = 10, 32
    x = np.arange(grid * block, dtype=np.int32) % 7
    wrong = set()
    for order in ORDERS:
        monkeypatch.setenv(fakecupy.ORDER_ENV, order)
        flag, out = np.zeros(1, dtype=np.int32), np.full(grid, -1, dtype=np.int32)
        ticket, tickets = np.zeros(1, dtype=np.uint64), np.zeros(grid + 1, dtype=np.uint32)
        module.get_function("assumes_block0_first")((grid,), (block,), (flag, out, ticket, tickets))
        # block b reads the flag set only if block 0 wrote it first (tickets[grid]: block 0's write)
        np.testing.assert_array_equal(out, (tickets[:grid] > tickets[grid]).astype(np.int32))
        if not (out == 1).all():
            wrong.add(("block 0 first", order))
        for by_last_id in (0, 1):
            partial, done, res = np.zeros(grid, np.int32), np.zeros(1, np.uint64), np.full(1, -1, np.int32)
            finish = np.full(grid, 99, dtype=np.uint32)
            module.get_function("total")((grid,), (block,), (x, partial, done, finish, res, np.int32(by_last_id)))
            assert sorted(finish.tolist()) == list(range(grid))
            right = int(res[0]) == int(x.sum())
            # the atomic count of finished blocks is right in every order; "the highest block finishes last"
            # only when it did
            assert right == (not by_last_id or finish[grid - 1] == grid - 1), (order, by_last_id, finish)
            if not right:
                wrong.add(("highest block last", order))
    assert {o for what, o in wrong} == set(ORDERS) - {"forward"}, wrong  # every order but forward breaks one


def test_shared_declarations_become_one_copy_per_resident_block():
    code = "__shared__ u64 s_bin, s_above;\n  __shared__ unsigned int hist[A][B + 1];"
    out = fakecupy.rewrite_shared(code)
    assert out == ("static u64 emu_sh_s_bin[EMU_SLOTS]; auto& s_bin = emu_sh_s_bin[emu::g_slot]; "
                   "static u64 emu_sh_s_above[EMU_SLOTS]; auto& s_above = emu_sh_s_above[emu::g_slot];\n  "
                   "static unsigned int emu_sh_hist[EMU_SLOTS][A][B + 1]; "
                   "auto& hist = emu_sh_hist[emu::g_slot];")
    for bad in ("extern __shared__ float dyn[];", "__shared__ int x = 0;"):
        with pytest.raises(RuntimeError, match="cannot rewrite the shared declaration"):
            fakecupy.rewrite_shared(bad)
