"""bin/build-cuda-mpi: the CUDA-aware Open MPI that travels to a lent GPU machine (docs/gpu.md).

The default tests check the script's plan, its env.sh and its size check in a few milliseconds each, with
no download or build. The ``slow`` test runs the built MPI (``bin/build-cuda-mpi`` first; skipped with the
reason without it): unpacked from its tarball into a fresh folder, it says it was built with CUDA, runs a
2-rank mpi4py job through this Python and reports on a machine without a GPU what it decides.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import mpi_run
from mpisparse.mpi.device import gpu_count

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bin" / "build-cuda-mpi"
CARRY = ROOT / "build" / "cuda-mpi" / "carry"


def _script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, **(env or {})))


def test_dry_run_plans_a_small_cuda_build_and_touches_nothing(tmp_path):
    out = tmp_path / "cm"
    p = _script("--dry-run", "--out", str(out))
    assert p.returncode == 0, p.stderr
    text = p.stdout
    configure = next(line for line in text.splitlines() if line.startswith("configure:"))
    assert f"--with-cuda={out}/src/cuda" in configure
    for flag in ("--disable-mpi-fortran", "--disable-oshmem", "--disable-static", "--enable-shared",
                 "--enable-mca-no-build=", f"--prefix={out}/openmpi-cuda"):
        assert flag in configure, flag
    assert re.search(r"^sha256: +[0-9a-f]{64}$", text, re.M)
    assert "deb.debian.org" in text and "openmpi_4.1.4.orig.tar.xz" in text
    assert "nvidia-cuda-runtime-cu12==" in text and "cp312" in text
    assert not out.exists()


def _sourced(env_sh: Path, cwd: Path, before: dict) -> dict:
    names = ("OPAL_PREFIX", "PATH", "LD_LIBRARY_PATH", "MPI4PY_LIBMPI", "MPISPARSE_MPIEXEC")
    shown = "; ".join(f'echo "{n}=${n}"' for n in names)
    p = subprocess.run(["bash", "-c", f'. "{env_sh}"; {shown}'], capture_output=True, text=True, cwd=cwd,
                       timeout=10, env={"PATH": "/usr/bin:/bin", **before})
    assert p.returncode == 0, p.stderr
    return dict(line.split("=", 1) for line in p.stdout.splitlines())


def test_env_sh_points_at_the_folder_it_lies_in_wherever_that_is(tmp_path):
    p = _script("--write-env", str(tmp_path / "a" / "openmpi-cuda"))
    assert p.returncode == 0, p.stderr
    here = (tmp_path / "a" / "openmpi-cuda").resolve()
    got = _sourced(here / "env.sh", Path("/"), {"LD_LIBRARY_PATH": "/keep/me"})
    assert got["OPAL_PREFIX"] == str(here)
    assert got["PATH"] == f"{here}/bin:/usr/bin:/bin"
    assert got["LD_LIBRARY_PATH"] == f"{here}/lib:/keep/me"
    assert got["MPI4PY_LIBMPI"] == f"{here}/lib/libmpi.so.40"
    assert got["MPISPARSE_MPIEXEC"] == f"{here}/bin/mpiexec"
    moved = tmp_path / "elsewhere"
    (tmp_path / "a").rename(moved)  # unpacked somewhere else: the same file follows
    got = _sourced(moved / "openmpi-cuda" / "env.sh", tmp_path, {})
    assert got["OPAL_PREFIX"] == str((moved / "openmpi-cuda").resolve())
    assert got["LD_LIBRARY_PATH"] == f"{(moved / 'openmpi-cuda').resolve()}/lib"


def test_size_check_refuses_a_carry_folder_over_the_budget(tmp_path):
    (tmp_path / "blob").write_bytes(b"\0" * (2 << 20))
    over = _script("--check-size", str(tmp_path), env={"CUDA_MPI_MAX_MIB": "1"})
    assert over.returncode == 1
    assert "2.0 MiB, over the carry budget of 1 MiB" in over.stderr
    within = _script("--check-size", str(tmp_path), env={"CUDA_MPI_MAX_MIB": "3"})
    assert within.returncode == 0 and "within the carry budget of 3 MiB" in within.stdout


def test_bad_arguments_exit_2_with_one_line(tmp_path):
    for args, named in ((["-j", "0"], "'0'"), (["--bogus"], "'--bogus'"), (["--check-size", str(tmp_path / "no")], "no")):
        p = _script(*args)
        assert p.returncode == 2, args
        assert len(p.stderr.strip().splitlines()) == 1 and named in p.stderr, p.stderr


HELLO = """\
import sys
from mpi4py import MPI
import numpy as np
from mpisparse.mpi.comm import mpix_query_cuda_support
comm = MPI.COMM_WORLD
x = np.arange(5, dtype=np.int64) + comm.rank
s = np.empty_like(x)
comm.Allreduce(x, s)
expect = comm.size * np.arange(5) + comm.size * (comm.size - 1) // 2
print(f"rank {comm.rank}/{comm.size} {MPI.Get_library_version().splitlines()[0]} "
      f"query={mpix_query_cuda_support()} sum_ok={bool((s == expect).all())}", flush=True)
"""


def _have_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.slow
def test_the_built_mpi_unpacked_elsewhere_runs_mpi4py_and_info(tmp_path, monkeypatch):
    tars = sorted(CARRY.glob("openmpi-*-cuda.tar.gz"))
    if not tars:
        pytest.skip(f"no CUDA-aware Open MPI built ({CARRY} has no tarball): run bin/build-cuda-mpi")
    with tarfile.open(tars[-1]) as t:
        t.extractall(tmp_path, filter="tar")
    env = _sourced(tmp_path / "openmpi-cuda" / "env.sh", tmp_path, {"PATH": os.environ["PATH"]})
    prefix = env["OPAL_PREFIX"]
    info = subprocess.run([f"{prefix}/bin/ompi_info", "--parsable", "--all"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **env))
    assert info.returncode == 0, info.stderr
    assert "mca:mpi:base:param:mpi_built_with_cuda_support:value:true" in info.stdout
    assert f"path:prefix:{prefix}" in info.stdout  # OPAL_PREFIX moved it
    for name, value in env.items():  # the launcher too: mpi_run finds MPISPARSE_MPIEXEC in os.environ
        monkeypatch.setenv(name, value)
    # each rank's own copy of a warning (4.1.4's aggregation of them often fails to unpack the second one)
    monkeypatch.setenv("OMPI_MCA_orte_base_help_aggregate", "0")
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    p = mpi_run(2, [str(script)], timeout=60)
    lines = sorted(line for line in p.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2, p.stdout + p.stderr
    for r, line in enumerate(lines):  # the library's answer is fixed when it is built: yes, GPU or not
        assert line.startswith(f"rank {r}/2 Open MPI v4.1.4") and "query=True sum_ok=True" in line, line
    if not _have_libcuda():  # Open MPI turns its CUDA path off at start, says so once, and runs on the host
        assert p.stderr.count("CUDA-aware support is disabled") == 2 and "ORTE_ERROR" not in p.stderr, p.stderr
    monkeypatch.setenv("OMPI_MCA_opal_warn_on_missing_libcuda", "0")
    out = tmp_path / "info.json"
    run = subprocess.run([sys.executable, "-m", "mpisparse", "info", "-n", "2", "--timeout", "60",
                          "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout + run.stderr
    r = json.loads(out.read_text())
    assert r["world_size"] == 2 and "Open MPI v4.1.4" in r["mpi_library"]
    if gpu_count() == 0:  # the library says yes; with no GPU on a rank there is nothing to probe
        assert r["cuda_aware_how"] == "library: yes (not probed: a rank has no GPU)", run.stdout
    else:  # with GPUs the probe decides (docs/gpu.md)
        assert r["cuda_aware_how"].startswith("probe: "), run.stdout
