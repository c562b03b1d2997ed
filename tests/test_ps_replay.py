"""DGS and ASGD converge under any fixed staleness (deterministic replay, no MPI).

Under MPI the staleness depends on timing, so a divergence comes and goes
from run to run; :func:`mpisparse.ps.replay.replay` drives the real worker
and server sides through a fixed schedule (``K`` workers in turn, plus
``delay`` injected steps of lag on every worker).
"""

import numpy as np
import pytest

from mpisparse.ps.algorithm import async_momentum
from mpisparse.ps.replay import replay


@pytest.mark.parametrize("delay", [0, 1, 2, 3, 4])
def test_dgs_converges_on_digits_at_every_injected_delay(delay):
    r = replay("dgs", workers=2, delay=delay, epochs=8)
    assert r.staleness == 2 * delay + 1
    assert r.final_accuracy > 0.90, (delay, r.test_accuracy, r.train_loss)
    assert r.train_loss[-1] < r.train_loss[0]


def test_dgs_with_three_workers_converges():
    r = replay("dgs", workers=3, delay=2, epochs=8)
    assert r.staleness == 8
    assert r.final_accuracy > 0.90, r.test_accuracy


def test_asgd_converges_with_the_same_compensation():
    r = replay("asgd", workers=2, delay=2, epochs=8)
    assert r.final_accuracy > 0.90, r.test_accuracy


@pytest.mark.parametrize("scheme", ["dgs", "asgd"])
def test_the_momentum_as_given_is_unstable_at_staleness_one(scheme):
    """The cause: two asynchronous workers add implicit momentum to m = 0.9 (both schemes, not DGS alone).

    As given, DGS diverges (11 % after 20 epochs) and ASGD is unstable (its loss climbs back to 3x its
    best, its accuracy falls from 94 % to 75 % at epoch 18; where in the 20 epochs such a fall comes
    changes with the libraries' rounding, so the test looks at the whole run after the best epoch, not
    at its last one); the compensated momentum ends above 90 % in 8 epochs for both.
    """
    plain = replay(scheme, workers=2, delay=0, epochs=20, async_momentum="as-given")
    fixed = replay(scheme, workers=2, delay=0, epochs=8)
    assert fixed.final_accuracy > 0.9, fixed.test_accuracy
    best = int(np.argmax(plain.test_accuracy))
    assert min(plain.test_accuracy[best:]) < fixed.final_accuracy - 0.15, (plain.test_accuracy, fixed.test_accuracy)
    lowest = int(np.argmin(plain.train_loss))
    assert max(plain.train_loss[lowest:]) > 1.5 * plain.train_loss[lowest], plain.train_loss  # it got worse again


def test_one_worker_replays_the_momentum_unchanged():
    assert async_momentum(0.9, 1) == 0.9
    assert async_momentum(0.9, 2) == pytest.approx(0.4)
    assert async_momentum(0.9, 4) == pytest.approx(0.15)
    assert async_momentum(0.5, 4) == 0.0
    assert async_momentum(0.9, 8, "as-given") == 0.9
    with pytest.raises(ValueError, match="--async-momentum is 'x'; allowed values are compensated, as-given"):
        async_momentum(0.9, 2, "x")


def test_replay_refuses_a_synchronous_scheme():
    with pytest.raises(ValueError, match="asynchronous parameter-server scheme"):
        replay("slimdp")
