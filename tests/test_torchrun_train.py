"""``mpisparse train`` under torchrun: the same schemes over torch.distributed (gloo), no MPI.

A 2-process torchrun job and a 2-rank MPI job with the same options must
give the same run: losses, accuracies, bytes and density, step by step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import HERE, mpi_run
from mpisparse.cli import cli

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "t", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}


def _results(path):
    res = json.loads(path.read_text())
    return {r["scheme"]: r for r in (res if isinstance(res, list) else [res])}


SCHEMES = ("topk", "deft")


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """Both schemes in one torchrun job and in one 2-rank MPI job (a launch costs seconds of imports)."""
    d = tmp_path_factory.mktemp("torchrun")
    args = ["train", "--model", "mlp", *sum((["--scheme", s] for s in SCHEMES), []), "--density", "0.05",
            "--epochs", "1", "--batch-size", "64"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p))
    tr = d / "torchrun.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "mpisparse", *args, "--json", str(tr)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mp = d / "mpi.json"
    mpi_run(2, [*args, "--json", str(mp)], module=True, timeout=300)
    return _results(tr), _results(mp)


@pytest.mark.mpi
@pytest.mark.timeout(400)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_torchrun_equals_mpi(scheme, both_runs):
    a, b = both_runs[0][scheme], both_runs[1][scheme]
    assert a["world_size"] == b["world_size"] == 2

    def learned(res):  # every epoch's losses and accuracies (not its wall-clock time)
        return [{k: v for k, v in e.items() if k != "wall_seconds"} for e in res["metrics"]["per_epoch"]]

    assert learned(a) == learned(b)  # the same bits
    for key in ("bytes_sent_per_rank", "density_actual", "skipped_steps", "n"):
        assert a[key] == b[key], key
    assert a["provenance"]["cuda_aware_how"] == "torch.distributed (gloo)"
    assert a["provenance"]["mpi"]["library"] is None  # MPI never started


@pytest.mark.parametrize("args, env, message", [
    (["--launcher", "torchrun"], {}, "--launcher torchrun: this process was not started by torchrun"),
    (["-n", "2"], TORCHRUN_ENV, "-n 2 with torchrun: torchrun decides the processes"),
    (["--scheme", "dgs"], TORCHRUN_ENV, "--scheme dgs needs MPI's point-to-point messages (runtime ps); under "
                                        "torchrun: the data-parallel schemes"),
    (["--mp-stages", "2"], TORCHRUN_ENV, "--mp-stages needs MPI's point-to-point messages (runtime mp)"),
    (["--hierarchical"], TORCHRUN_ENV, "--hierarchical, --check-collectives and --cuda-aware are MPI settings"),
])
def test_torchrun_refusals_are_one_line(args, env, message, monkeypatch):
    for k in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(cli, ["train", *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_torchrun_is_detected_only_without_mpi():
    from mpisparse.mpi.launch import under_torchrun

    assert under_torchrun(TORCHRUN_ENV)
    assert not under_torchrun({**TORCHRUN_ENV, "PMI_RANK": "0"})
    assert not under_torchrun({})


@pytest.mark.parametrize("argv, done, ended", [
    (["--version"], True, [0]),  # a torchrun job done: the process ends at once, its streams flushed
    (["--version"], False, []),  # any other run: the interpreter's exit
    (["no-such-command"], True, []),  # a failure keeps its code and the usual exit
])
def test_a_finished_torchrun_job_ends_without_the_interpreters_teardown(argv, done, ended, monkeypatch):
    import importlib

    from mpisparse.cli import session

    m = importlib.import_module("mpisparse.cli.main")  # the module (the package exports its function main)
    calls = []

    def fake_exit(code):
        calls.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(m.os, "_exit", fake_exit)
    monkeypatch.setattr(session, "END_WITHOUT_TEARDOWN", done)
    with pytest.raises(SystemExit) as e:
        m.main(argv)
    assert calls == ended
    assert (e.value.code == 0) == (argv == ["--version"])


def test_a_torchrun_workers_rank_is_torchruns_rank():
    from mpisparse.mpi.launch import env_rank

    assert env_rank({**TORCHRUN_ENV, "RANK": "1"}) == 1
    assert env_rank({"RANK": "1"}) == 0  # RANK alone is not a launcher's
    assert env_rank({**TORCHRUN_ENV, "RANK": "1", "PMI_RANK": "3"}) == 3  # an MPI rank wins


@pytest.mark.parametrize("local, local_size, gpus, expect", [
    (0, 1, 1, 0), (1, 2, 2, 1), (3, 4, 8, 3),
    (1, 2, 1, "2 processes on this host but 1 GPU; NCCL needs one GPU per process: --nproc-per-node at most 1"),
    (0, 1, 0, "no CUDA GPU is visible"),
])
def test_torchrun_device_gives_each_worker_its_own_gpu_or_one_line(local, local_size, gpus, expect):
    from mpisparse.mpi.device import torchrun_device

    if isinstance(expect, int):
        assert torchrun_device(local, local_size, gpus) == expect
    else:
        with pytest.raises(ValueError, match=expect) as e:
            torchrun_device(local, local_size, gpus)
        assert "\n" not in str(e.value)


def test_a_torchrun_workers_gpu_is_recorded_for_torch_device(monkeypatch):
    from mpisparse.mpi import device

    used = []
    monkeypatch.setattr(device, "gpu_count", lambda: 2)
    monkeypatch.setattr(device, "gpu_names", lambda: ["gpu a", "gpu b"])
    monkeypatch.setattr(device, "_use", used.append)
    monkeypatch.setattr(device, "_assignment", None)
    a = device.assign_torchrun_device({**TORCHRUN_ENV, "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (a.rank, a.local_rank, a.local_size, a.device, a.device_name) == (3, 1, 2, 1, "gpu b") and used == [1]
    # the train loop's torch device is that GPU, with no MPI communicator to split
    assert str(device.torch_device("cuda", comm=None)) == "cuda:1" and used == [1, 1]
    with pytest.raises(ValueError, match="3 processes on this host but 2 GPUs"):
        device.assign_torchrun_device({**TORCHRUN_ENV, "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"})


@pytest.mark.parametrize("dev, expect", [(0, "gpu a"), (1, "gpu b"), (2, "none"), (None, "none")])
def test_a_devices_name_is_none_when_this_process_does_not_see_it(monkeypatch, dev, expect):
    from mpisparse.mpi import device

    monkeypatch.setattr(device, "gpu_names", lambda: ["gpu a", "gpu b"])
    assert device.gpu_name(dev) == expect
