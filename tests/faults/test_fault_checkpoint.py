"""Faults of checkpoints: planted code, corrupt files, a resume of a different run, half-written saves.

A checkpoint is written by a real ``mpisparse train`` run once per module;
each case copies it, damages the copy the way it meets a user, and runs
``mpisparse train --resume`` as a real process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SelfComm, launch  # noqa: E402

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
BASE = ["train", "--model", "mlp", "--data", "digits", "--batch-size", "128", "--scheme", "topk",
        "--density", "0.05", "--seed", "3", "--lr", "0.1"]


def mpisparse(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mpisparse", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    ck = tmp_path_factory.mktemp("saved") / "ck"
    p = mpisparse(*BASE, "--epochs", "1", "--checkpoint", str(ck))
    assert p.returncode == 0, p.stderr[-2000:]
    return ck


@pytest.fixture
def ck(saved, tmp_path) -> Path:
    copy = tmp_path / "ck"
    shutil.copytree(saved, copy)
    return copy


def _step_dir(ck: Path) -> Path:
    return ck / (ck / "LATEST").read_text().strip()


def _error_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [line for line in p.stderr.splitlines() if "error" in line.lower()]


class _Planted:
    """Unpickling this runs ``touch MARKER`` (what a planted checkpoint would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.timeout(300)
def test_a_planted_pickle_is_refused_and_nothing_runs(ck, tmp_path):
    marker = tmp_path / "planted-code-ran"
    target = _step_dir(ck) / "common.pt"
    torch.save({"model": _Planted(marker)}, target)
    p = mpisparse(*BASE, "--epochs", "2", "--checkpoint", str(ck), "--resume")
    assert p.returncode != 0
    lines = _error_lines(p)
    assert len(lines) == 1, p.stderr[-2000:]
    assert f"checkpoint file {target} asks to load code" in lines[0] and "refused" in lines[0]
    assert not marker.exists()


def test_reading_a_planted_file_directly_runs_nothing(tmp_path):
    from mpisparse.train.checkpoint import CheckpointError, read

    marker = tmp_path / "ran"
    path = tmp_path / "rank-0.pt"
    torch.save([_Planted(marker)], path)
    with pytest.raises(CheckpointError, match=f"checkpoint file {path} asks to load code"):
        read(path)
    assert not marker.exists()
    # a pickled NumPy array (what checkpoints held before they were data only) is refused too
    torch.save({"residual": np.zeros(3, np.float32)}, path)
    with pytest.raises(CheckpointError, match=str(path)):
        read(path)


def test_state_round_trips_as_data_only(tmp_path):
    from mpisparse.train import checkpoint

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    state = {"model": model.state_dict(), "tau": np.float32(0.5), "taus": [1.0, 2.0], "pair": (1, "a"),
             "rng": np.random.default_rng(1).bit_generator.state, "residual": np.arange(4, dtype=np.float32),
             "torch_rng": torch.get_rng_state(), 0: {"momentum_buffer": torch.ones(2)}}
    checkpoint.save(tmp_path, SelfComm(), 7, state, {"scheme": {"u": np.ones(2, np.float64)}})
    common, mine = checkpoint.load(tmp_path, SelfComm())
    assert common["tau"] == np.float32(0.5) and isinstance(common["tau"], np.float32)
    assert common["pair"] == (1, "a") and common["taus"] == [1.0, 2.0] and common[0]["momentum_buffer"].sum() == 2
    assert common["rng"] == state["rng"] and torch.equal(common["torch_rng"], state["torch_rng"])
    assert common["residual"].dtype == np.float32 and common["residual"].tolist() == [0, 1, 2, 3]
    assert mine["scheme"]["u"].dtype == np.float64
    model.load_state_dict(common["model"])
    with pytest.raises(TypeError, match=r"checkpoint state state\['bad'\]: a object cannot be stored"):
        checkpoint.save(tmp_path, SelfComm(), 8, {"bad": object()}, {})


def test_a_truncated_rank_file_is_named(ck):
    from mpisparse.train.checkpoint import CheckpointError, load

    target = _step_dir(ck) / "rank-0.pt"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError) as e:
        load(ck, SelfComm())
    assert str(e.value).startswith(f"checkpoint file {target} cannot be read (") and "\n" not in str(e.value)
    target.unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint file {target} is missing"):
        load(ck, SelfComm())


def test_latest_naming_a_missing_step_is_named(ck):
    from mpisparse.train.checkpoint import CheckpointError, load

    (ck / "LATEST").write_text("step-000000999")
    with pytest.raises(CheckpointError, match=f"checkpoint file {ck / 'LATEST'} names 'step-000000999'"):
        load(ck, SelfComm())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("change,fields", [
    # one field alone (extended: CI runs it; the default suite has five fields below and the seed on 2 ranks)
    pytest.param(["--seed", "4"], ["seed: checkpoint has 3, this run has 4"], marks=pytest.mark.extended),
    (["--lr", "0.05", "--density", "0.1", "--data", "synthetic", "--model", "cnn", "--scheme", "dense"],
     ["density: checkpoint has 0.05, this run has 0.1", "lr: checkpoint has 0.1, this run has 0.05",
      "data: checkpoint has 'digits', this run has 'synthetic'", "model: checkpoint has 'mlp', this run has 'cnn'",
      "scheme: checkpoint has 'topk', this run has 'dense'"]),
])
def test_resume_of_a_different_run_fails_naming_the_fields(ck, change, fields):
    before = sorted(p.name for p in _step_dir(ck).iterdir())
    args = list(BASE)
    for flag, value in zip(change[::2], change[1::2]):  # replace the value BASE gives
        args[args.index(flag) + 1] = value
    p = mpisparse(*args, "--epochs", "2", "--checkpoint", str(ck), "--resume")
    assert p.returncode != 0
    lines = _error_lines(p)
    assert len(lines) == 1, p.stderr[-2000:]
    assert f"checkpoint in {ck} was written by a different run" in lines[0]
    for f in fields:
        assert f in lines[0], lines[0]
    assert "epoch 2/2" not in p.stdout  # nothing trained
    assert sorted(p.name for p in _step_dir(ck).iterdir()) == before


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_every_rank_refuses_a_different_run(ck):
    from mpisparse.mpi.launch import build_mpiexec_command, find_mpiexec, has_remote_shell, launcher_flavor

    mpiexec = find_mpiexec()
    plan = build_mpiexec_command(1, [], mpiexec=mpiexec, flavor=launcher_flavor(mpiexec),
                                 as_root=os.geteuid() == 0, timeout=120, remote_shell=has_remote_shell())
    argv = plan.argv[: plan.argv.index(sys.executable)]
    argv[2] = "2"  # -n 2
    # every rank compares before any collective of the training runs: a rank that stopped waiting for the
    # other would hang, so a bounded, failing job shows they all refused
    p = launch([*argv, sys.executable, "-m", "mpisparse", *BASE, "--seed", "9", "--epochs", "2",
                "--checkpoint", str(ck), "--resume"], capture_output=True, text=True, timeout=150,
               cwd=ROOT, env=dict(os.environ, **plan.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert p.returncode != 0
    assert "seed: checkpoint has 3, this run has 9" in p.stderr, p.stderr[-2000:]


@pytest.mark.timeout(300)
def test_a_half_written_save_is_cleaned_and_epochs_and_outputs_may_change(ck, tmp_path):
    latest = _step_dir(ck)
    half = ck / "step-000009999"
    half.mkdir()
    shutil.copy(latest / "rank-0.pt", half / "rank-0.pt")
    (half / "common.pt.tmp").write_bytes(b"partial")
    (ck / "LATEST.tmp").write_text("step-000009999")
    (latest / "rank-0.pt.tmp").write_bytes(b"partial")
    out = tmp_path / "r.json"
    p = mpisparse(*BASE, "--epochs", "2", "--checkpoint", str(ck), "--resume", "--diagnostics",
                  "--max-skipped-steps", "7", "--json", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "epoch 2/2" in p.stdout and out.exists()
    assert not half.exists() and not (ck / "LATEST.tmp").exists()
    assert not list(ck.rglob("*.tmp"))
    assert [d.name for d in ck.glob("step-*")] == [(ck / "LATEST").read_text().strip()]
