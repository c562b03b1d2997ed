"""The command line: option errors, the -n launcher, failure behaviour.

Option errors are checked in-process (click's runner; no MPI starts).  The
launch and failure tests run bounded MPI jobs.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from conftest import HERE, launch, mpi_run, mpiexec_prefix
from mpisparse.cli import cli
from mpisparse.mpi.launch import build_mpiexec_command, env_rank, under_mpi_launcher


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("args, message", [
    (["--density", "0"], "0.0 is not in the allowed range (0, 1]"),
    (["--density", "1.5"], "1.5 is not in the allowed range (0, 1]"),
    (["--density", "-0.1"], "-0.1 is not in the allowed range (0, 1]"),
    (["--density", "nan"], "nan is not in the allowed range (0, 1]"),
    (["--density", "abc"], "'abc' is not a valid float"),
    (["--scheme", "nope"], "'nope' is not one of"),
    (["--model", "alexnet"], "'alexnet' is not one of"),
    (["--iters", "0"], "0 is not in the range x>=1"),
    (["--warmup", "-1"], "-1 is not in the range x>=0"),
    (["-n", "0"], "0 is not in the range x>=1"),
    (["--scheme", "dense", "--layerwise"], "--layerwise is an option of topk, not of the chosen scheme"),
    (["--scheme", "threshold", "--threshold", "-1"], "--threshold is -1.0; allowed range is [0, inf]"),
])
def test_bad_options_fail_in_one_line_before_mpi(args, message):
    res = invoke("bench", "step", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert "Traceback" not in res.output
    assert "mpi4py.MPI" not in sys.modules or not sys.modules["mpi4py.MPI"].Is_initialized()


def test_help_lists_registry_schemes_and_their_options():
    res = invoke("bench", "step", "--help")
    assert res.exit_code == 0
    for name in ("dense", "topk", "randomk", "threshold", "--layerwise", "--threshold", "--check-collectives"):
        assert name in res.output


def _commands(group, path=()):
    for name in group.list_commands(None):  # every command, a lazily loaded one too (LazyGroup)
        cmd = group.get_command(None, name)
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def test_each_command_lists_only_the_options_of_schemes_it_accepts():
    """A scheme option is shown under the schemes that declare it, and only where the command runs them."""
    from mpisparse.cli.bench import OVERLAP_SCHEMES
    from mpisparse.cli.options import SectionOption
    from mpisparse.runtimes import bench_schemes

    seen = 0
    for path, cmd in _commands(cli):
        choice = next((p.type.choices for p in cmd.params if p.name == "schemes"), None)
        for p in cmd.params:
            if isinstance(p, SectionOption) and p.section and p.section.startswith("Options of "):
                owners = p.section[len("Options of "):].split(", ")
                assert choice is not None and set(owners) <= set(choice), (path, p.name, owners)
                if path[0] == "bench" and path[1] != "tta":  # bench tta trains: train's data-parallel schemes
                    assert set(owners) <= set(bench_schemes()), (path, p.name, owners)
                seen += 1
    assert seen > 20
    overlap = CliRunner().invoke(cli, ["bench", "overlap", "--help"]).output
    sections = {line.strip() for line in overlap.splitlines() if line.startswith("Options of ")}
    assert sections == {"Options of dense, threshold, topk:", "Options of threshold:", "Options of topk:"}, sections
    assert set(OVERLAP_SCHEMES) == {"dense", "threshold", "topk"}
    from mpisparse.registry import all_options

    refused = [o.flag for o, owners in all_options().values() if not set(owners) & set(OVERLAP_SCHEMES)]
    assert "--beta" in refused  # cltk's
    for flag in refused:
        assert f"{flag} " not in overlap, flag


def test_mpiexec_command_for_mpich():
    plan = build_mpiexec_command(4, ["bench", "step", "-n", "4"], mpiexec="/x/mpiexec", python="/py",
                                 flavor="mpich", timeout=60)
    assert plan.argv == ["/x/mpiexec", "-n", "4", "/py", "-m", "mpisparse", "bench", "step", "-n", "4"]
    assert plan.env == {"MPIEXEC_TIMEOUT": "60"}


def test_mpiexec_command_for_openmpi_as_root():
    plan = build_mpiexec_command(2, ["info"], mpiexec="mpirun", python="py", flavor="openmpi",
                                 as_root=True, timeout=30)
    assert plan.argv == ["mpirun", "-n", "2", "--allow-run-as-root", "--oversubscribe",
                         "--timeout", "30", "py", "-m", "mpisparse", "info"]
    assert plan.env == {}
    plan = build_mpiexec_command(2, ["info"], mpiexec="mpirun", python="py", flavor="openmpi")
    assert plan.argv == ["mpirun", "-n", "2", "--oversubscribe", "py", "-m", "mpisparse", "info"]


def test_mpiexec_command_rejects_zero_ranks():
    with pytest.raises(ValueError, match="-n is 0"):
        build_mpiexec_command(0, [])


def test_launcher_detection():
    assert not under_mpi_launcher({})
    assert under_mpi_launcher({"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert under_mpi_launcher({"OMPI_COMM_WORLD_SIZE": "2"})
    assert under_mpi_launcher({"PMIX_RANK": "0"})
    assert env_rank({"PMI_RANK": "3"}) == 3
    assert env_rank({"OMPI_COMM_WORLD_RANK": "2"}) == 2
    assert env_rank({}) == 0


def _mpisparse(*args, timeout=120, env=None):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    for v in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        full_env.pop(v, None)
    return subprocess.run([sys.executable, "-m", "mpisparse", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=HERE.parent)


@pytest.mark.mpi
def test_dash_n_spawns_mpiexec_and_writes_contract_json(tmp_path):
    out = tmp_path / "r.json"
    p = _mpisparse("bench", "step", "-n", "2", "--timeout", "90", "--model", "ncf", "--scheme", "topk",
                   "--density", "0.01", "--iters", "2", "--warmup", "1", "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    for key in ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank",
                "phases", "step_seconds", "config"):
        assert key in r
    assert r["world_size"] == 2 and r["scheme"] == "topk" and r["density_target"] == 0.01
    assert set(r["phases"]) == {"compensate", "select", "exchange_indices", "exchange_values", "update"}
    assert r["config"]["model"] == "ncf" and r["config"]["iters"] == 2
    assert "topk on ncf" in p.stdout and "exchange_values" in p.stdout


@pytest.mark.mpi
def test_under_mpiexec_the_same_command_works_and_checks_n(tmp_path):
    p = mpi_run(2, ["bench", "step", "-n", "2", "--model", "ncf", "--scheme", "dense", "--iters", "1"],
                module=True)
    assert "dense on ncf" in p.stdout and "W=2" in p.stdout
    p = mpi_run(2, ["bench", "step", "-n", "3", "--model", "ncf", "--iters", "1"], module=True, check=False)
    assert p.returncode != 0
    assert "-n 3 was given but the MPI job has 2 ranks" in p.stderr


@pytest.mark.mpi
def test_ranks_with_different_configurations_fail_on_start(tmp_path):
    """MPMD launch: rank 0 and rank 1 get different --density."""
    prefix, env = mpiexec_prefix(60)
    args = ["-m", "mpisparse", "bench", "step", "--model", "ncf", "--iters", "1", "--density"]
    cmd = [*prefix, "-n", "1", sys.executable, *args, "0.01", ":", "-n", "1", sys.executable, *args, "0.02"]
    t0 = time.time()
    p = launch(cmd, capture_output=True, text=True, timeout=90, cwd=HERE.parent, env=dict(os.environ, **env))
    assert p.returncode != 0
    assert "ranks disagree on the configuration: density: rank 0 has 0.01, rank 1 has 0.02" in p.stderr
    assert time.time() - t0 < 60


@pytest.mark.mpi
def test_a_rank_that_raises_ends_the_job_quickly():
    t0 = time.time()
    p = mpi_run(3, [str(HERE / "mpi" / "raise_on_rank.py"), "1"], check=False, timeout=60)
    elapsed = time.time() - t0
    assert p.returncode != 0
    assert "error on rank 1: RuntimeError: injected failure on rank 1" in p.stderr
    assert elapsed < 30, elapsed


@pytest.mark.mpi
def test_info_reports_mpi_and_world_size(tmp_path):
    out = tmp_path / "info.json"
    p = _mpisparse("info", "-n", "2", "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["world_size"] == 2 and len(r["ranks"]) == 2
    assert r["cuda_aware"] is False
    assert "MPI library" in p.stdout and "world size       2" in p.stdout


@pytest.mark.mpi
def test_a_rank_that_raises_ends_the_job_without_mpi4py_run():
    """The console entry point aborts by itself (no ``python -m mpi4py``)."""
    prefix, env = mpiexec_prefix(60)
    t0 = time.time()
    p = launch([*prefix, "-n", "2", sys.executable, str(HERE / "mpi" / "raise_on_rank.py"), "0"],
               capture_output=True, text=True, timeout=90, cwd=HERE.parent,
               env=dict(os.environ, **env, PYTHONPATH=str(HERE.parent)))
    assert p.returncode != 0
    assert "error on rank 0: RuntimeError: injected failure on rank 0" in p.stderr
    assert time.time() - t0 < 30


# --------------------------------------------------------------------------- launcher flavour
@pytest.mark.parametrize("text,flavor", [
    ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to ...", "openmpi"),
    ("mpirun (Open MPI) 4.1.6", "openmpi"),
    ("HYDRA build details:\n    Version: 5.0.2", "mpich"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10", "mpich"),
    ("something else entirely", "other"),
])
def test_flavor_is_read_from_version_text(text, flavor):
    from mpisparse.mpi.launch import flavor_of_version_text

    assert flavor_of_version_text(text) == flavor


def test_launcher_flavor_comes_from_the_mpiexec_used_not_the_library(tmp_path):
    """An Open MPI mpiexec in front of an MPICH library (or the reverse) gets its own options."""
    from mpisparse.mpi.launch import launcher_flavor, mpi_flavor

    fake = tmp_path / "mpiexec"
    other = "mpich" if mpi_flavor() == "openmpi" else "openmpi"
    banner = "HYDRA build details:" if other == "mpich" else "mpiexec (Open MPI) 5.0.11"
    fake.write_text(f"#!/bin/sh\necho '{banner}'\n")
    fake.chmod(0o755)
    assert launcher_flavor(str(fake)) == other
    plan = build_mpiexec_command(2, ["info"], mpiexec=str(fake), python="py", flavor=launcher_flavor(str(fake)),
                                 as_root=True)
    assert ("--allow-run-as-root" in plan.argv) == (other == "openmpi")


def test_open_mpi_without_a_remote_shell_gets_an_empty_agent():
    plan = build_mpiexec_command(2, ["info"], mpiexec="mpirun", python="py", flavor="openmpi", remote_shell=False)
    assert plan.env["OMPI_MCA_plm_rsh_agent"] == ""
    with_ssh = build_mpiexec_command(2, ["info"], mpiexec="mpirun", python="py", flavor="openmpi")
    assert "OMPI_MCA_plm_rsh_agent" not in with_ssh.env
    hydra = build_mpiexec_command(2, ["info"], mpiexec="mpiexec", python="py", flavor="mpich", remote_shell=False)
    assert hydra.env == {}
