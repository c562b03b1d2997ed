"""Faults of configuration: ranks started with different options fail at start, naming the difference.

Every option of ``train`` and ``bench step`` is either a field of the
configuration the ranks compare, or in the documented allow-list
:data:`mpisparse.config.CLI_ONLY_OPTIONS`; a new option that is neither
fails :func:`test_every_option_is_compared_or_allow_listed`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

from mpisparse.config import CLI_ONLY_OPTIONS, OPTION_FIELDS, BenchConfig, MPConfig, TrainConfig
from mpisparse.registry import all_options
from conftest import launch, mpiexec_prefix  # noqa: E402


def _field_names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


@pytest.mark.parametrize("command,cfg_cls", [(("train",), TrainConfig), (("bench", "step"), BenchConfig)])
def test_every_option_is_compared_or_allow_listed(command, cfg_cls):
    from mpisparse.cli import cli

    cmd = cli
    for name in command:
        cmd = cmd.get_command(None, name)
    own = _field_names(cfg_cls)
    nested = {f"mp.{n}" for n in _field_names(MPConfig)} if cfg_cls is TrainConfig else set()
    scheme_opts = set(all_options())
    missing = []
    for param in cmd.params:
        name = param.name
        if name in CLI_ONLY_OPTIONS or name in scheme_opts:
            continue  # scheme options become cfg.scheme_options (compared as a whole)
        target = OPTION_FIELDS.get(name, name)
        if target not in own and target not in nested:
            missing.append(name)
    assert not missing, (f"options of `{' '.join(command)}` that no rank compares: {missing}; make each a field "
                         f"of {cfg_cls.__name__}, or add it with its reason to CLI_ONLY_OPTIONS")
    assert "scheme_options" in own


def test_allow_list_names_only_real_options():
    from mpisparse.cli import cli

    names = ({p.name for p in cli.get_command(None, "train").params}
             | {p.name for p in cli.get_command(None, "bench").get_command(None, "step").params})
    assert set(CLI_ONLY_OPTIONS) <= names
    assert all(reason.strip() for reason in CLI_ONLY_OPTIONS.values())


ROOT = Path(__file__).resolve().parents[2]




def _mpmd(rank0: list[str], rank1: list[str], timeout: int = 60) -> subprocess.CompletedProcess:
    prefix, env = mpiexec_prefix(timeout)
    cmd = [*prefix, "-n", "1", sys.executable, "-m", "mpisparse", *rank0, ":",
           "-n", "1", sys.executable, "-m", "mpisparse", *rank1]
    return launch(cmd, capture_output=True, text=True, timeout=timeout + 30, cwd=ROOT,
                          env=dict(os.environ, **env, OMP_NUM_THREADS="1"))


BENCH = ["bench", "step", "--model", "ncf", "--scheme", "topk", "--iters", "2", "--warmup", "0"]
TRAIN = ["train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--batch-size", "64"]


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_mpmd_with_different_check_collectives_fails_at_start():
    t0 = time.time()
    p = _mpmd(BENCH + ["--check-collectives"], BENCH)
    assert p.returncode != 0
    assert "ranks disagree on the configuration: check_collectives: rank 0 has True, rank 1 has False" \
        in p.stderr, p.stderr[-2000:]
    assert time.time() - t0 < 60


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("extra,line", [
    (["--weight-decay", "0.001"], "weight_decay: rank 0 has 0.001, rank 1 has 0.0"),
    (["--max-skipped-steps", "5"], "max_skipped_steps: rank 0 has 5, rank 1 has 100"),
    (["--no-cuda-aware"], "cuda_aware: rank 0 has False, rank 1 has None"),
])
def test_mpmd_train_with_different_options_fails_at_start(extra, line):
    p = _mpmd(TRAIN + extra, TRAIN)
    assert p.returncode != 0
    assert line in p.stderr, p.stderr[-2000:]
