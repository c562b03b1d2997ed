"""An uncaught exception on one rank of a library user's script ends the whole job quickly."""

import os
import sys
import time
from pathlib import Path

import pytest

from conftest import launch, mpiexec_prefix  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_exception_after_import_aborts_the_job():
    prefix, env = mpiexec_prefix(60)
    script = str(Path(__file__).with_name("raise_after_torch_import.py"))
    full_env = dict(os.environ, **env, OMP_NUM_THREADS="1")
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full_env.get("PYTHONPATH")) if p)
    full_env.pop("PMI_RANK", None)
    t0 = time.time()
    p = launch([*prefix, "-n", "2", sys.executable, script], capture_output=True, text=True,
               timeout=90, cwd=ROOT, env=full_env)
    end = time.time()
    assert p.returncode != 0, p.stdout[-2000:]
    assert "injected failure on rank 1" in p.stderr, p.stderr[-2000:]
    raised = float(p.stderr.split("raising at ")[1].split()[0])
    assert end - raised < 10, f"the job ended {end - raised:.1f} s after rank 1 raised"
    assert raised > t0
