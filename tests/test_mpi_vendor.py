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
