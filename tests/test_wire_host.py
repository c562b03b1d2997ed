"""The host fast path of :func:`mpisparse.mpi.wire.allreduce_sum` (torch loaded: the predivide fused with the
cast, the blocks summed piece by piece from their 16-bit form) gives the bits of the plain NumPy path."""

import sys

import numpy as np
import pytest

from mpisparse.mpi import wire


def _values(n, seed=0):
    g = np.random.default_rng(seed)
    x = (g.standard_normal(n) * 10.0 ** g.integers(-8, 6, n)).astype(np.float32)
    x[:7] = [0.0, -0.0, np.inf, -np.inf, np.nan, 7e4, -1.3e5]  # non-finite, beyond float16 before the divide
    return x


def _same(a, b, wire_dtype):
    """The same bits, but for NaN payloads (torch's casts and the NumPy ones may set other payload bits)."""
    if a.dtype == np.uint16:
        fa, fb = (wire.decode(v, wire_dtype) for v in (a, b))
    else:
        fa, fb, a, b = a, b, a.view(np.uint32), b.view(np.uint32)
    nan = np.isnan(fa)
    return np.array_equal(nan, np.isnan(fb)) and np.array_equal(a[~nan], b[~nan])


def _numpy_path(f, *args):
    torch = sys.modules.pop("torch", None)
    try:
        return f(*args)
    finally:
        if torch is not None:
            sys.modules["torch"] = torch


@pytest.mark.parametrize("W", [2, 3, 5])
def test_the_fused_predivide_and_cast_gives_the_bits_of_dividing_first(W):
    pytest.importorskip("torch")
    n = 3 * wire._PIECE + 17  # several pieces and a short last one
    x = _values(n, W)
    for w in ("float16", "bfloat16"):
        scale = W if wire.predivides(w) else None
        got = wire._encode_divided(x, w, scale)
        with np.errstate(over="ignore"):
            want = _numpy_path(wire.encode, x / np.float32(W) if scale else x, w)
        assert got.dtype == np.uint16 and _same(got, want, w), w


@pytest.mark.parametrize("W", [1, 2, 3, 4])
def test_the_blocks_sum_in_rank_order_as_numpy_does(W):
    pytest.importorskip("torch")
    mine = 2 * wire._PIECE + 5
    for w in ("float16", "bfloat16"):
        recv = _numpy_path(wire.encode, _values(W * mine, 7 + W), w)
        got = wire._sum_blocks(recv, w, W, mine)
        want = _numpy_path(wire._sum_blocks, recv, w, W, mine)
        # the same values (a sum of negative zeros stays -0.0 here, NumPy's starts from +0.0)
        assert got.dtype == np.float32 and np.array_equal(got, want, equal_nan=True), w
    assert wire._sum_blocks(np.empty(0, np.uint16), "float16", 3, 0).size == 0


def test_decode_through_torch_keeps_the_bits():
    pytest.importorskip("torch")
    bits = np.arange(0, 1 << 16, dtype=np.uint16)  # every pattern, NaNs included
    for w in ("bfloat16", "float16"):
        got, want = wire.decode(bits, w), _numpy_path(wire.decode, bits, w)
        nan = np.isnan(got)
        assert np.array_equal(nan, np.isnan(want)) and np.array_equal(got.view(np.uint32)[~nan],
                                                                      want.view(np.uint32)[~nan]), w
