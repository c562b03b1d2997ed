"""Intel MPI as a supported configuration (mpisparse/mpi/vendor.py): its version text names the vendor, its
launcher is Hydra (launch flavour ``mpich``), and its CUDA-awareness comes from ``I_MPI_OFFLOAD`` -- pure
functions, no Intel MPI needed."""

from __future__ import annotations

import pytest

from mpisparse.mpi.launch import build_mpiexec_command, flavor_of_version_text
from mpisparse.mpi.vendor import intel_offload, intel_offload_env, library_cuda_support_for, vendor_of_version_text

INTEL_LIB = "Intel(R) MPI Library 2021.19 for Linux* OS\n"
INTEL_LAUNCHER = "Intel(R) MPI Library for Linux* OS, Version 2021.19 Build 20250901 (id: 1a2b3c)\nCopyright 2003-2025"


@pytest.mark.parametrize("text,vendor,flavor", [
    (INTEL_LIB, "intel", "mpich"),
    (INTEL_LAUNCHER, "intel", "mpich"),
    ("MPICH Version: 5.0.2\nMPICH Release date: ...", "mpich", "mpich"),
    ("HYDRA build details:\n    Version: 5.0.2", "mpich", "mpich"),
    ("Open MPI v5.0.11, package: Open MPI ...", "openmpi", "openmpi"),
    ("something else", "other", "other"),
])
def test_vendor_and_launch_flavor(text, vendor, flavor):
    assert vendor_of_version_text(text) == vendor
    assert flavor_of_version_text(text) == flavor  # Intel's mpiexec is Hydra: MPICH's options and timeout


def test_intel_launch_is_a_hydra_launch():
    plan = build_mpiexec_command(2, ["info"], mpiexec="mpiexec", python="py", flavor=flavor_of_version_text(
        INTEL_LAUNCHER), timeout=30)
    assert plan.argv == ["mpiexec", "-n", "2", "py", "-m", "mpisparse", "info"]
    assert plan.env == {"MPIEXEC_TIMEOUT": "30"}


@pytest.mark.parametrize("env,aware", [
    ({}, False),
    ({"I_MPI_OFFLOAD": "0"}, False),
    ({"I_MPI_OFFLOAD": "1"}, True),
    ({"I_MPI_OFFLOAD": "2"}, True),  # releases before 2021.10: enabled, MPI loads the GPU library
    ({"I_MPI_OFFLOAD": "1", "I_MPI_OFFLOAD_MODE": "cuda"}, True),
    ({"I_MPI_OFFLOAD": "1", "I_MPI_OFFLOAD_MODE": "auto"}, True),
    ({"I_MPI_OFFLOAD": "1", "I_MPI_OFFLOAD_MODE": "level_zero"}, False),  # Intel GPUs, not CUDA
])
def test_intel_cuda_awareness_follows_its_offload_switch(env, aware):
    got, how = intel_offload(env)
    assert got is aware and "Intel MPI" in how
    # for Intel MPI the MPICH query is not asked (it may be absent or say no under offload)
    assert library_cuda_support_for("intel", env, query=lambda: pytest.fail("queried"))[0] is aware
    assert intel_offload(intel_offload_env())[0] is True


def test_other_vendors_ask_the_library():
    assert library_cuda_support_for("mpich", {"I_MPI_OFFLOAD": "1"}, query=lambda: False) == \
        (False, "MPIX_Query_cuda_support")
    assert library_cuda_support_for("openmpi", {}, query=lambda: True)[0] is True
    assert library_cuda_support_for("other", {}, query=lambda: None) == (None, "no MPIX_Query_cuda_support")


# ------------------------------------------------------------------ the communicator's decision path (no MPI)
def test_the_communicator_asks_intel_mpi_its_offload_switch(monkeypatch):
    """decide_cuda_aware_how's default library answer goes through the vendor: an Intel MPI job with
    I_MPI_OFFLOAD=1 is CUDA-aware without --cuda-aware (MPIX_Query_cuda_support not asked), one without it
    is staged; another vendor still asks MPIX_Query_cuda_support.  No communicator: believed, not probed."""
    from mpisparse.mpi import comm, vendor

    monkeypatch.delenv("MPISPARSE_CUDA_AWARE", raising=False)
    monkeypatch.setattr(vendor, "mpi_vendor", lambda: "intel")
    monkeypatch.setattr(comm, "mpix_query_cuda_support", lambda: pytest.fail("MPIX query asked of Intel MPI"))
    monkeypatch.setenv("I_MPI_OFFLOAD", "1")
    monkeypatch.delenv("I_MPI_OFFLOAD_MODE", raising=False)
    assert comm.library_cuda_support() is True
    assert comm.decide_cuda_aware_how(None, None) == (True, "library: yes (Intel MPI with I_MPI_OFFLOAD=1)")
    monkeypatch.setenv("I_MPI_OFFLOAD_MODE", "level_zero")
    ok, how = comm.decide_cuda_aware_how(None, None)
    assert ok is False and how.startswith("library: no (Intel MPI") and "level_zero" in how
    monkeypatch.delenv("I_MPI_OFFLOAD")
    assert comm.decide_cuda_aware_how(None, None)[0] is False
    assert comm.decide_cuda_aware_how(True, None) == (True, "override")  # --cuda-aware still wins

    monkeypatch.setattr(vendor, "mpi_vendor", lambda: "mpich")
    monkeypatch.setenv("I_MPI_OFFLOAD", "1")  # not Intel MPI: its switch means nothing
    monkeypatch.setattr(comm, "mpix_query_cuda_support", lambda: False)
    assert comm.decide_cuda_aware_how(None, None) == (False, "library: no")
    monkeypatch.setattr(comm, "mpix_query_cuda_support", lambda: None)
    assert comm.decide_cuda_aware_how(None, None) == (False, "library: cannot tell")
    monkeypatch.setattr(comm, "mpix_query_cuda_support", lambda: True)
    assert comm.library_cuda_support_how() == (True, "MPIX_Query_cuda_support")
    assert comm.decide_cuda_aware_how(None, None) == (True, "library: yes")
