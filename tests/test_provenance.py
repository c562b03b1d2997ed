"""The ``provenance`` block of every result: toolkit, MPI, versions, hosts, GPUs, time, command line."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import HERE
from mpisparse import __version__
from mpisparse.results import SCHEMA_VERSION, RunResult
from mpisparse.results.provenance import git_commit, mpi_library, provenance_block, rank_facts

ROOT = HERE.parent


@pytest.mark.parametrize("text, library, version", [
    ("MPICH Version:      4.2.0\nMPICH Release date: ...", "MPICH", "4.2.0"),
    ("Open MPI v5.0.3, package: Open MPI builder, ident: 5.0.3", "Open MPI", "5.0.3"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS\n", "Intel(R) MPI Library", "2021.10"),
    ("MVAPICH2 Version      :\t2.3.7\n", "MVAPICH2", "2.3.7"),
    ("some MPI", "some MPI", None),
])
def test_mpi_library_name_and_version(text, library, version):
    got = mpi_library(text)
    assert (got["library"], got["version"]) == (library, version)
    assert got["library_version"] == text.strip().splitlines()[0].strip()


def test_git_commit_of_this_checkout():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert git_commit(ROOT / "mpisparse") == head.stdout.strip()
    assert git_commit("/") is None or len(git_commit("/")) >= 40


class _FakeComm:
    rank, size = 0, 1


def test_block_from_facts_groups_ranks_per_host():
    proc = rank_facts(_FakeComm())
    facts = [dict(proc, host="a"), {"host": "b", "device": 1, "device_name": "GPU X"},
             {"host": "a", "device": None, "device_name": None}]
    block = provenance_block(facts, cuda_aware=False, cuda_aware_how="forced")
    assert block["hosts"] == {"a": [0, 2], "b": [1]} and block["world_size"] == 3
    assert block["gpus"] == [{"rank": 1, "host": "b", "device": 1, "name": "GPU X"}]
    assert block["cuda_aware"] is False and block["schema_version"] == SCHEMA_VERSION
    import numpy

    assert block["versions"]["numpy"] == numpy.__version__
    assert block["versions"]["cupy"] is None or isinstance(block["versions"]["cupy"], str)


@pytest.mark.mpi
def test_bench_step_result_carries_provenance(tmp_path):
    out = tmp_path / "r.json"
    args = ["bench", "step", "-n", "2", "--model", "ncf", "--scheme", "dense", "--scheme", "topk", "--iters", "1",
            "--warmup", "0", "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    p = subprocess.run([sys.executable, "-m", "mpisparse", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results[0]["schema_version"] == SCHEMA_VERSION == 2
    prov = results[0]["provenance"]
    assert results[1]["provenance"]["hosts"] == prov["hosts"]
    assert prov["schema_version"] == SCHEMA_VERSION and prov["world_size"] == 2
    assert prov["hosts"] == {socket.gethostname(): [0, 1]}
    assert prov["argv"][1:] == args and prov["command_line"].startswith("mpisparse bench step -n 2 --model ncf")
    assert prov["toolkit"]["name"] == "mpisparse" and prov["toolkit"]["version"] == __version__
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert prov["toolkit"]["git_commit"] == head.stdout.strip()
    import mpi4py
    import numpy

    # the MPI library as a fresh process sees it (importing mpi4py.MPI here would initialize MPI in pytest)
    lib, std = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from mpi4py import MPI; "
                               "print(json.dumps([MPI.Get_library_version(), '%d.%d' % MPI.Get_version()]))"],
        capture_output=True, text=True, env=env, timeout=60, check=True).stdout)

    v = prov["versions"]
    assert v["mpi4py"] == mpi4py.__version__ and v["numpy"] == numpy.__version__
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    try:
        import torch
    except ImportError:
        assert v["torch"] is None
    else:
        assert v["torch"] == torch.__version__
    try:
        import cupy
    except ImportError:
        assert v["cupy"] is None
    else:
        assert v["cupy"] == cupy.__version__
    assert prov["mpi"]["library_version"] == lib.strip().splitlines()[0].strip()
    assert prov["mpi"]["library"] and prov["mpi"]["standard"] == std
    assert prov["gpus"] == [] and prov["cuda_aware"] in (True, False)
    when = dt.datetime.fromisoformat(prov["timestamp_utc"])
    assert when.utcoffset() == dt.timedelta(0) and before <= when <= dt.datetime.now(dt.timezone.utc)
    assert RunResult.from_dict(results[0]).provenance == prov
    assert "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized()


def _single_process_block(prov):
    assert prov["schema_version"] == SCHEMA_VERSION and prov["world_size"] == 1
    assert prov["hosts"] == {socket.gethostname(): [0]}
    assert prov["toolkit"]["name"] == "mpisparse" and prov["toolkit"]["version"] == __version__
    ts = dt.datetime.fromisoformat(prov["timestamp_utc"])
    assert abs((dt.datetime.now(dt.timezone.utc) - ts).total_seconds()) < 600


def test_single_process_commands_carry_provenance(tmp_path):
    """bench select (both modes) and bench model write the same block (world size 1)."""
    from click.testing import CliRunner

    from mpisparse.cli import cli

    runs = {"kernels": ["bench", "select", "--sizes", "20000", "--densities", "0.01", "--repeats", "1"],
            "deft": ["bench", "select", "--mode", "deft", "--model", "ncf", "--worlds", "1,2", "--repeats", "1"],
            "model": ["bench", "model", "--worlds", "2,4"]}
    for name, args in runs.items():
        path = tmp_path / f"{name}.json"
        res = CliRunner().invoke(cli, [*args, "--json", str(path)])
        assert res.exit_code == 0, (name, res.output[-2000:])
        data = json.loads(path.read_text())
        for obj in data if isinstance(data, list) else [data]:
            _single_process_block(obj["provenance"])


def test_reproduce_report_carries_provenance():
    from mpisparse.reproduce.base import Report

    rep = Report(target="deft-buildup", title="t", seed=0, size="quick", network="shared memory")
    _single_process_block(rep.to_json()["provenance"])
