"""Resume at another world size (mpisparse/train/reshard.py): every data-parallel scheme's real state, as its
``state_dict`` writes it at W = 4, redistributed to W' = 2 and 3 and loaded by the new ranks' schemes: the
sum over ranks of the pending update is the same to float tolerance; what cannot carry over is recomputed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import SelfComm

from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import SCHEMES
from mpisparse.train.reshard import pending_update, redistribute

LAYOUT = FusionLayout([("a", (40, 10)), ("b", (250,)), ("c", (3,))])
#: (name, options, memory): every collective scheme with state, and the variants whose state differs
CASES = [("topk", {}, True), ("randomk", {}, True), ("threshold", {}, True), ("threshold", {"threshold": 0.3}, True),
         ("gtopk", {}, True), ("dct", {}, True), ("deft", {}, True), ("dgc", {"momentum": 0.9}, True),
         ("dgc", {"momentum": 0.9}, False), ("cltk", {}, True), ("cltk", {"beta": 0.5}, True), ("dense", {}, True),
         ("topk", {}, False), ("powersgd", {}, True), ("powersgd", {}, False), ("oktopk", {}, True)]


class RankComm(SelfComm):
    def __init__(self, rank, size):
        super().__init__()
        self.rank, self.size = rank, size


def make(name, opts, memory, rank, world):
    return SCHEMES[name](RankComm(rank, world), LAYOUT, 0.05, memory=memory, seed=1, **opts)


def buffers(scheme) -> dict[str, np.ndarray | None]:
    return {b: getattr(scheme.memory, b) for b in scheme.memory.buffers if not b.startswith("_")}


def old_world(name, opts, memory, world=4):
    """``world`` schemes in mid-run: random buffers (one rank's u not yet set), per-rank thresholds."""
    rng = np.random.default_rng(7)
    parts = []
    for r in range(world):
        s = make(name, opts, memory, r, world)
        s.iteration = 13
        for b in buffers(s):
            if not (name == "dgc" and (b == "u" and r == 1 or b == "v" and not memory)):  # no-memory: no v
                setattr(s.memory, b, rng.standard_normal(LAYOUT.n).astype(np.float32))
        if name == "threshold" and s.tau is None:
            s.tau = 0.1 + r
        if name == "dct":
            s.taus = [0.1 * (r + 1)] * len(LAYOUT)
            s.recomputed_at = [0]
        if name == "powersgd":  # warm start: the same Q and draws on every rank
            s._draw_q()
        if name == "oktopk":  # a local threshold of its own; the world's global threshold and boundaries
            s.local_threshold, s.global_threshold = 0.1 * (r + 1), 0.7
            s.bounds = np.linspace(0, LAYOUT.n, world + 1).astype(np.int64)
        parts.append({"scheme": s.state_dict(), "loop_losses": [float(r), float(r) + 0.5]})
    return parts


@pytest.mark.parametrize("name,opts,memory", CASES, ids=[f"{c[0]}{c[1] or ''}{'' if c[2] else '-nomem'}"
                                                          for c in CASES])
@pytest.mark.parametrize("new_world", [2, 3])
def test_the_pending_update_is_kept_at_another_world_size(name, opts, memory, new_world):
    parts = old_world(name, opts, memory)
    before = pending_update(parts)
    assert before or name == "dense" or (name in ("topk", "powersgd") and not memory)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no case is reset with the warning: every scheme's state has a rule
        new = redistribute(parts, new_world)
    assert len(new) == new_world
    schemes = [make(name, opts, memory, j, new_world) for j in range(new_world)]
    for s, part in zip(schemes, new):
        s.load_state_dict(part["scheme"])
        assert s.iteration == 13 and "torch_rng" not in part
    for b, mass in before.items():
        after = sum(np.asarray(buffers(s)[b], np.float64) for s in schemes) / new_world
        np.testing.assert_allclose(after, mass, rtol=1e-6, atol=1e-7)
    if name == "dgc" and memory:
        assert set(before) == {"u", "v"}  # rank 1's u was not set yet: zeros in the mean
    if name == "threshold":
        assert all(s.tau == opts.get("threshold") for s in schemes)  # given: kept; calibrated per rank: None
    if name == "dct":
        assert all(s.taus is None and s.recomputed_at == [0] for s in schemes)  # recomputed at the next step
    if name == "cltk":
        assert all(s.beta == opts.get("beta", 1.0) for s in schemes)
    if name == "powersgd":  # Q identical on every old rank: carried over; the stream continues where it was
        q = parts[0]["scheme"]["extra"]["q"]
        fresh = np.random.RandomState(1)
        second = [fresh.randint(10**9) for _ in range(2)][1]
        assert all(s.draws == 1 and np.array_equal(s._q, q) and s._seeds.randint(10**9) == second for s in schemes)
    if name == "oktopk":  # dropped: the first step after the resume estimates all three again
        assert all(s.local_threshold is None and s.global_threshold is None and s.bounds is None and s._estimating()
                   for s in schemes)
    assert new[0]["loop_losses"] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert all(p["loop_losses"] == [] for p in new[1:])


def test_the_mean_not_the_sum_is_kept():
    """The update is the ranks' mean, so e'_j = mean e_i (keeping sum e_i would scale it by W / W')."""
    parts = [{"scheme": {"scheme": "topk", "iteration": 1, "density": 0.1, "options": {},
                         "memory": {"residual": np.full(3, float(r), np.float32)}, "extra": {}}} for r in range(4)]
    new = redistribute(parts, 2)
    assert [p["scheme"]["memory"]["residual"].tolist() for p in new] == [[1.5] * 3, [1.5] * 3]
    assert pending_update(parts)["residual"].tolist() == [1.5] * 3


def test_state_that_cannot_be_redistributed_is_reset_with_a_warning():
    parts = [{"scheme": {"scheme": "x", "iteration": 1, "density": 0.1, "options": {},
                         "memory": {"q": np.ones(2, np.float32)}, "extra": {}}} for _ in range(2)]
    with pytest.warns(UserWarning, match="x state of 2 ranks cannot be redistributed"):
        new = redistribute(parts, 3)
    assert all("scheme" not in p for p in new)
    parts = [{"scheme": {"scheme": "y", "iteration": 1, "density": 0.1, "options": {}, "memory": {},
                         "extra": {"cycle": r}}} for r in range(2)]
    with pytest.warns(UserWarning, match="the ranks' 'cycle' differ"):
        assert "scheme" not in redistribute(parts, 1)[0]
