"""The CPU emulator of CUDA blocks and threads (tests/gpu_emu/) that runs the package's kernels here.

The kernel tests trust it for barrier and warp semantics, so these check it directly: a block
reduction through shared memory and ``__syncthreads`` over several blocks and launches (fibers
restarted for each block), ``__ballot_sync`` and ``__shfl_sync`` within and across warps, and a
divergent barrier reported as a deadlock instead of a hang or a wrong answer.
"""

from __future__ import annotations

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
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=fakecupy.HERE.parent)
    assert p.returncode != 0 and "returned" not in p.stdout
    assert "emu: deadlock in block 0: 63 threads wait at a barrier" in p.stderr, p.stderr[-2000:]
