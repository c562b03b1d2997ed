"""The guard of tests/conftest.py seen from a test without the ``mpi`` marker (this module runs no MPI).

A test that runs MPI without the marker must fail, or the Open MPI pass (``-m mpi``) would miss it.
"""

import os
import subprocess
import sys

import pytest

import conftest


def test_an_unmarked_test_gets_the_guard(_guard_mpiexec):
    assert os.environ["MPISPARSE_MPIEXEC"] == _guard_mpiexec
    assert os.environ["MPI4PY_RC_INITIALIZE"] == "0"
    argv = [_guard_mpiexec, *"-n 2".split(), sys.executable, "-c", "pass"]  # (written so: this module is unmarked)
    launch = subprocess.run(argv, capture_output=True, text=True)
    assert launch.returncode == 97
    assert "test_an_unmarked_test_gets_the_guard" in launch.stderr and "not marked mpi" in launch.stderr
    version = subprocess.run([_guard_mpiexec, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip()  # a launcher's query reaches the real one


def test_mpi4py_in_this_process_fails_an_unmarked_test():
    mpi = sys.modules[conftest.MPI_MODULE]
    if not isinstance(mpi, conftest._NoMPI):
        pytest.skip("the MPI module was imported by an earlier (marked) test of this session")
    with pytest.raises(RuntimeError, match="test_mpi4py_in_this_process_fails_an_unmarked_test .*not marked mpi"):
        mpi.COMM_WORLD
    assert not hasattr(mpi, "__file__")  # introspection of sys.modules still works
