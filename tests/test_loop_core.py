"""The loop core (mpisparse.train.core) with a toy step on one process: SIGUSR1 mid-epoch, resume, skips."""

import math
import os
import signal

import numpy as np
import pytest

pytest.importorskip("torch")  # checkpoints are torch files

from conftest import SelfComm  # noqa: E402
from mpisparse.config import TrainConfig  # noqa: E402
from mpisparse.results.timing import PhaseTimer  # noqa: E402
from mpisparse.train.core import Preempted, StepOutcome, TrainStep, run_loop  # noqa: E402


class ToyStep(TrainStep):
    """Fits a scalar to seeded data by SGD; a NaN sample is a non-finite step; can send itself SIGUSR1."""

    checkpointable = True

    def __init__(self, signal_at=None):
        self.timer, self.w, self.signal_at, self.seen = PhaseTimer(), 0.0, signal_at, 0

    def batches(self, epoch):
        xs = np.random.default_rng([7, epoch]).normal(3.0, 1.0, 6)
        if epoch == 1:
            xs[2] = np.nan
        return list(xs)

    def bytes_sent(self):
        return 0

    def train_batch(self, b, x):
        self.seen += 1
        if self.seen == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        if not math.isfinite(x):
            return StepOutcome(0.0, stepped=False)
        loss = (self.w - x) ** 2
        self.w -= 0.1 * 2 * (self.w - x)
        return StepOutcome(loss, density=1.0, selected=1)

    def epoch_loss(self, losses):
        return float(np.mean(losses))

    def evaluate(self, epoch):
        return {"loss": (self.w - 3.0) ** 2, "accuracy": 1.0}

    def state(self):
        return {"w": self.w}, {}

    def load_state(self, common, mine):
        self.w = common["w"]

    def result(self, loop):
        return loop


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_signal_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path):
    cfg = TrainConfig(epochs=3, checkpoint=str(tmp_path / "ck"))
    full = run_loop(SelfComm(), TrainConfig(epochs=3), ToyStep())
    assert full.skipped == 1 and full.iteration == 18 and len(full.selected) == 17
    with pytest.raises(Preempted) as stop:
        run_loop(SelfComm(), cfg, ToyStep(signal_at=9))  # epoch 2, batch 3: after the NaN step
    assert stop.value.code == 0
    cfg.resume = True
    resumed = run_loop(SelfComm(), cfg, ToyStep())
    assert resumed.history == [{**h, "wall_seconds": r["wall_seconds"]} for h, r in zip(full.history,
                                                                                      resumed.history)]
    assert resumed.iteration == 18 and resumed.skipped == 1


def test_a_step_that_cannot_checkpoint_is_refused(tmp_path):
    step = ToyStep()
    step.checkpointable, step.description = False, "the toy runtime"
    with pytest.raises(ValueError, match="not supported for the toy runtime"):
        run_loop(SelfComm(), TrainConfig(epochs=1, checkpoint=str(tmp_path)), step)


class OtherSize(SelfComm):
    """Rank 0 of a job of another size than the one that wrote the checkpoint."""

    size = 2


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
@pytest.mark.parametrize("comm_after", [SelfComm, OtherSize])
def test_a_resumed_epochs_loss_is_the_mean_over_the_steps_run(tmp_path, comm_after):
    """The steps before the interruption count too, at the same world size and at another (whose rank 0
    takes the interrupted epoch's losses, mpisparse.train.reshard)."""
    cfg = TrainConfig(epochs=2, checkpoint=str(tmp_path / "ck"))
    before, after = [], []
    with pytest.raises(Preempted):
        run_loop(SelfComm(), cfg, ToyStep(signal_at=9), step_log=before.append)  # epoch 2, batch 3
    cfg.resume = True
    resumed = run_loop(comm_after(), cfg, ToyStep(), step_log=after.append)

    def losses(log):
        return [r["loss"] for r in log if r["epoch"] == 1]

    run = losses(before) + losses(after)
    assert len(losses(before)) == 3 and len(losses(after)) == 3  # batches 1-3 (one skipped), then 4-6
    assert resumed.history[1]["train_loss"] == pytest.approx(float(np.mean(run)), rel=1e-12)


def test_a_resume_of_another_configuration_is_refused_before_any_step(tmp_path):
    run_loop(SelfComm(), TrainConfig(epochs=1, checkpoint=str(tmp_path / "ck")), ToyStep())
    step = ToyStep()
    with pytest.raises(ValueError, match=r"different run \(lr: checkpoint has 0.1, this run has 0.2; "
                                         r"seed: checkpoint has 0, this run has 5\)"):
        run_loop(SelfComm(), TrainConfig(epochs=2, seed=5, lr=0.2, checkpoint=str(tmp_path / "ck"), resume=True),
                 step)
    assert step.seen == 0
    # --epochs, --diagnostics and --max-skipped-steps may change
    loop = run_loop(SelfComm(), TrainConfig(epochs=2, diagnostics=True, max_skipped_steps=3,
                                           checkpoint=str(tmp_path / "ck"), resume=True), ToyStep())
    assert loop.iteration == 12
