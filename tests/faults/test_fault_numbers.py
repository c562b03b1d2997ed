"""Faults of numbers: an exchange that overflows, an optimizer step that overflows, a run that stops learning.

Finite gradients near the float32 maximum overflow in the exchange's sum;
every scheme's result is checked and agreed on by all ranks, the step is
skipped and counted, parameters never become non-finite, and
``--max-skipped-steps`` skipped steps in a row end the run with one line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import SelfComm, launch  # noqa: E402
from mpisparse.config import TrainConfig  # noqa: E402
from mpisparse.results.timing import PhaseTimer  # noqa: E402
from mpisparse.train.core import NoProgress, StepOutcome, TrainStep, run_loop  # noqa: E402
from mpisparse.runtimes import validate

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _mpiexec(n: int, timeout: int) -> tuple[list[str], dict[str, str]]:
    from mpisparse.mpi.launch import build_mpiexec_command, find_mpiexec, has_remote_shell, launcher_flavor

    mpiexec = find_mpiexec()
    plan = build_mpiexec_command(n, [], mpiexec=mpiexec, flavor=launcher_flavor(mpiexec),
                                 as_root=os.geteuid() == 0, timeout=timeout, remote_shell=has_remote_shell())
    return plan.argv[: plan.argv.index(sys.executable)], dict(plan.env)


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [3])
def test_an_overflowing_exchange_is_skipped_on_every_rank_for_every_scheme(ranks):
    argv, env = _mpiexec(ranks, 180)
    p = launch([*argv, sys.executable, "-m", "mpi4py", str(HERE / "overflow_ranks.py")],
               capture_output=True, text=True, timeout=210, cwd=ROOT,
               env=dict(os.environ, **env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"overflow OK on {ranks} ranks" in p.stdout
    for name in ("dense", "topk", "gtopk", "cltk", "deft"):
        assert f"{name} stepped=False skipped=1" in p.stdout, p.stdout


def _train(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpisparse", "train", "--model", "mlp", "--data", "digits",
                           "--batch-size", "256", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))


@pytest.mark.timeout(240)
def test_a_run_that_only_skips_stops_with_one_line():
    p = _train("--epochs", "3", "--lr", "1e38", "--max-skipped-steps", "4")
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert "NoProgress: 4 steps in a row were skipped" in lines[0] and "--max-skipped-steps" in lines[0]


@pytest.mark.timeout(240)
def test_skips_are_in_the_result_and_the_summary(tmp_path):
    out = tmp_path / "r.json"
    p = _train("--epochs", "1", "--lr", "1e38", "--max-skipped-steps", "0", "--json", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    steps = r["metrics"]["final"]["iteration"]
    assert 0 < r["skipped_steps"] <= steps and r["skipped_steps"] >= steps - 2
    assert "skipped steps" in p.stdout and str(r["skipped_steps"]) in p.stdout


def test_max_skipped_steps_option_range():
    from click.testing import CliRunner

    from mpisparse.cli import cli

    res = CliRunner().invoke(cli, ["train", "--max-skipped-steps", "-1"])
    assert res.exit_code == 2 and "--max-skipped-steps" in res.output
    with pytest.raises(ValueError, match="--max-skipped-steps is -1; allowed range is an integer >= 0"):
        validate(TrainConfig(max_skipped_steps=-1))


# --------------------------------------------------------------------------- the loop core's count
class PatternStep(TrainStep):
    """Steps or skips as ``pattern(iteration)`` says (True: stepped)."""

    def __init__(self, pattern):
        self.timer, self.pattern, self.i = PhaseTimer(), pattern, 0

    def batches(self, epoch):
        return list(range(10))

    def bytes_sent(self):
        return 0

    def train_batch(self, b, x):
        self.i += 1
        ok = self.pattern(self.i)
        return StepOutcome(1.0 if ok else math.nan, stepped=ok)

    def epoch_loss(self, losses):
        return float(np.mean(losses))

    def evaluate(self, epoch):
        return {"loss": 0.0, "accuracy": 1.0}

    def result(self, loop):
        return loop


def test_consecutive_skips_stop_the_loop_and_a_step_resets_the_count():
    with pytest.raises(NoProgress, match=r"3 steps in a row were skipped.*epoch 1 batch 5 \(iteration 5\)"):
        run_loop(SelfComm(), TrainConfig(epochs=2, max_skipped_steps=3), PatternStep(lambda i: i < 3))
    # every third step taken: never 3 in a row, 2/3 of 20 skipped, the run ends
    loop = run_loop(SelfComm(), TrainConfig(epochs=2, max_skipped_steps=3), PatternStep(lambda i: i % 3 == 0))
    assert loop.iteration == 20 and loop.skipped == 14 and loop.consecutive_skipped == 2
    # 0: never stop
    loop = run_loop(SelfComm(), TrainConfig(epochs=2, max_skipped_steps=0), PatternStep(lambda i: False))
    assert loop.skipped == 20
