"""Unit tests (one process, no MPI) of the cltk scheme's pure functions and memory."""

import numpy as np
import pytest

from mpisparse.schemes.memory import ResidualMemory
from mpisparse.schemes import SCHEMES
from mpisparse.schemes.cltk import (
    LowPassMemory, check_beta, chunk_bounds, chunk_sizes, chunked_topk, cosine_distance,
    lowpass_update, normalized_hamming,
)


def topk_ref(x, k):
    return set(np.argsort(-np.abs(x), kind="stable")[:k].tolist())


def chunked_ref(x, k, chunks):
    """Independent formulation: np.array_split of the positions and of range(k)."""
    out = set()
    for pos, picks in zip(np.array_split(np.arange(x.size), chunks), np.array_split(np.arange(k), chunks)):
        out |= {int(pos[i]) for i in topk_ref(x[pos], len(picks))}
    return out


def test_chunk_sizes_split_exactly():
    assert chunk_sizes(10, 3).tolist() == [4, 3, 3]
    assert chunk_sizes(9, 3).tolist() == [3, 3, 3]
    assert chunk_sizes(2, 5).tolist() == [1, 1, 0, 0, 0]
    assert chunk_bounds(10, 3).tolist() == [0, 4, 7, 10]
    for total in range(0, 40):
        for c in range(1, 9):
            s = chunk_sizes(total, c)
            assert s.sum() == total and s.max() - s.min() <= 1 and np.all(np.diff(s) <= 0)
    with pytest.raises(ValueError, match="at least 1"):
        chunk_sizes(10, 0)


@pytest.mark.parametrize("n,k,chunks", [(1000, 37, 1), (1000, 37, 3), (1001, 40, 7), (200_000, 2000, 4),
                                        (50, 3, 5), (50, 50, 6), (12, 0, 3), (7, 7, 7)])
def test_chunked_topk_matches_reference(n, k, chunks):
    x = np.random.default_rng(n + k + chunks).standard_t(3, size=n).astype(np.float32)
    idx = chunked_topk(x, k, chunks)
    assert idx.dtype == np.int32
    assert idx.size == k and np.unique(idx).size == k  # exactly k, distinct
    assert set(idx.tolist()) == chunked_ref(x, k, chunks)
    if chunks == 1:
        assert set(idx.tolist()) == topk_ref(x, k)
    # per chunk: exactly the split of k
    bounds = chunk_bounds(n, chunks)
    per_chunk = np.histogram(idx, bins=bounds)[0]
    assert per_chunk.tolist() == chunk_sizes(k, chunks).tolist()


def test_chunked_topk_scratch_and_errors():
    x = np.random.default_rng(0).normal(size=300_000).astype(np.float32)
    scratch = np.empty_like(x)
    a = chunked_topk(x, 3000, 3, scratch=scratch)
    assert set(a.tolist()) == chunked_ref(x, 3000, 3)
    with pytest.raises(ValueError, match=r"chunks is 11; it must lie in \[1, 10\]"):
        chunked_topk(x[:10], 2, 11)
    with pytest.raises(ValueError, match=r"k is 11"):
        chunked_topk(x[:10], 11, 1)


def test_lowpass_update_formula():
    rng = np.random.default_rng(1)
    m0 = rng.normal(size=50).astype(np.float32)
    g = rng.normal(size=50).astype(np.float32)
    sent = np.array([3, 7, 11, 40], dtype=np.int32)
    for beta in (0.5, 0.1, 0.9):
        m, acc = m0.copy(), (m0 + g).astype(np.float32)
        lowpass_update(m, acc, sent, beta)
        resid = (m0.astype(np.float64) + g)
        resid[sent] = 0
        want = (1 - beta) * m0.astype(np.float64) + beta * resid  # eq. 5
        np.testing.assert_allclose(m, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(acc, resid, rtol=1e-6)  # acc keeps the residual
        # equivalently m + beta (grad - g)
        alt = m0.astype(np.float64) + beta * g
        alt[sent] = (1 - beta) * m0[sent]
        np.testing.assert_allclose(m, alt, rtol=1e-5, atol=1e-7)
    # everything sent: m <- (1 - beta) m
    m, acc = m0.copy(), m0 + g
    lowpass_update(m, acc, None, 0.25)
    np.testing.assert_allclose(m, 0.75 * m0, rtol=1e-6)
    with pytest.raises(ValueError, match="separate buffers"):
        lowpass_update(m, m, sent, 0.5)


def test_beta_one_is_plain_error_feedback():
    rng = np.random.default_rng(2)
    lp, rm = LowPassMemory(1.0), ResidualMemory()
    for t in range(5):
        g = rng.normal(size=64).astype(np.float32)
        a1, a2 = lp.compensate(g.copy()), rm.compensate(g.copy())
        assert a1 is lp.residual  # in place, no second buffer
        np.testing.assert_array_equal(a1, a2)
        sent = rng.choice(64, size=6, replace=False)
        lp.update(a1, sent)
        rm.update(a2, sent)
        np.testing.assert_array_equal(lp.residual, rm.residual)


def test_lowpass_memory_steps_and_state():
    rng = np.random.default_rng(3)
    mem = LowPassMemory(0.5)
    ref = np.zeros(32)
    for t in range(4):
        g = rng.normal(size=32).astype(np.float32)
        acc = mem.compensate(g)
        assert acc is not mem.residual and acc is not g
        np.testing.assert_allclose(acc, ref + g, rtol=1e-6, atol=1e-7)
        sent = np.array([t, t + 5, 31])
        r = ref + g
        r[sent] = 0
        ref = 0.5 * ref + 0.5 * r
        mem.update(acc, sent)
        np.testing.assert_allclose(mem.residual, ref, rtol=1e-5, atol=1e-7)
    st = mem.state_dict()
    assert st["beta"] == 0.5
    other = LowPassMemory(1.0)
    other.load_state_dict(st)
    assert other.beta == 0.5
    np.testing.assert_array_equal(other.residual, mem.residual)
    mem.clear()
    assert not mem.residual.any()


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), "x"])
def test_beta_validation(bad):
    with pytest.raises(ValueError, match="beta"):
        check_beta(bad)
    with pytest.raises(ValueError, match="beta"):
        LowPassMemory(bad)


def test_scheme_options_validation():
    cls = SCHEMES["cltk"]
    assert cls.validate_options({}) == {"beta": 1.0, "chunks": 1, "warmup_iters": 0, "select_kernel": "native",
                                         "wire_dtype": "float32"}
    with pytest.raises(ValueError, match=r"--beta is 0.0; allowed range is \(0, 1\]"):
        cls.validate_options({"beta": 0.0})
    with pytest.raises(ValueError, match=r"--chunks is 0"):
        cls.validate_options({"chunks": 0})
    with pytest.raises(ValueError, match=r"--warmup-iters is -1"):
        cls.validate_options({"warmup_iters": -1})


def test_hamming_and_cosine():
    assert normalized_hamming(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1]), 4) == 0.0
    assert normalized_hamming(np.array([1, 2, 3, 4]), np.array([1, 2, 8, 9]), 4) == 0.5
    assert normalized_hamming(np.array([1, 2]), np.array([5, 6]), 2) == 1.0
    x = np.array([1.0, 0.0], np.float32)
    assert cosine_distance(x, x) == pytest.approx(0.0, abs=1e-12)
    assert cosine_distance(x, np.array([0.0, 2.0], np.float32)) == pytest.approx(1.0)
    assert cosine_distance(x, -x) == pytest.approx(2.0)
    z = np.zeros(2, np.float32)
    assert cosine_distance(z, z) == 0.0 and cosine_distance(x, z) == 1.0
    big = np.random.default_rng(4).normal(size=600_000).astype(np.float32)
    other = big + np.float32(0.5) * np.random.default_rng(5).normal(size=big.size).astype(np.float32)
    b64, o64 = big.astype(np.float64), other.astype(np.float64)
    want = 1 - b64 @ o64 / np.sqrt((b64 @ b64) * (o64 @ o64))
    assert cosine_distance(big, other) == pytest.approx(want, rel=1e-9)
