"""Which MPI library runs the job, and what it says about device buffers: Intel MPI as a supported configuration.

:func:`mpisparse.mpi.launch.flavor_of_version_text` sorts launchers by the
options they take (Open MPI's or Hydra's); Intel MPI's ``mpiexec`` is Hydra
(``mpiexec.hydra``), so its launch flavour is ``mpich``.  What sets it apart
is the CUDA-awareness decision, and that needs the *vendor*
(:func:`vendor_of_version_text`: ``intel``, ``mpich``, ``openmpi``,
``other``).

Intel MPI (``pip install mpi4py impi-rt``: its ``mpiexec`` and ``libmpi``;
``pip install -e '.[impi]'``) hands NVIDIA device buffers to MPI functions
when its GPU support is on: ``I_MPI_OFFLOAD=1`` (``2`` in releases before
2021.10: enabled, library loaded by MPI), with ``I_MPI_OFFLOAD_MODE`` unset,
``auto`` or ``cuda`` (``level_zero`` means Intel GPUs).  Without it the
library must never see a device pointer.  So for Intel MPI the library's
answer is read from that environment (:func:`intel_offload`), not from
``MPIX_Query_cuda_support`` (an MPICH extension that may be absent or say
no); a "yes" is then confirmed by the run-time probe like any library's
(:func:`mpisparse.mpi.comm.decide_cuda_aware_how`).
:func:`library_cuda_support_for` is that decision as a pure function of the
vendor, the environment and the MPICH query.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

#: Intel MPI's GPU switch and API choice (Intel MPI Library Developer Reference, "GPU Support")
OFFLOAD, OFFLOAD_MODE = "I_MPI_OFFLOAD", "I_MPI_OFFLOAD_MODE"


def vendor_of_version_text(text: str) -> str:
    """``"intel"``, ``"openmpi"``, ``"mpich"`` or ``"other"`` from ``MPI_Get_library_version`` or ``mpiexec
    --version`` text (Intel MPI says "Intel(R) MPI Library"; its Hydra is MPICH's lineage)."""
    low = text.lower()
    if "intel(r) mpi" in low or "intel mpi" in low:
        return "intel"
    if "open mpi" in low or "open-rte" in low or "prrte" in low:
        return "openmpi"
    if "hydra" in low or "mpich" in low or "mvapich" in low:
        return "mpich"
    return "other"


def mpi_vendor() -> str:
    """The vendor of the MPI library mpi4py is built on (reads its version text; MPI is not initialised)."""
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    return vendor_of_version_text(MPI.Get_library_version())


def intel_offload(env: Mapping[str, str] = os.environ) -> tuple[bool, str]:
    """Whether Intel MPI takes CUDA device buffers under ``env``, and why (``I_MPI_OFFLOAD``, ``_MODE``)."""
    on = env.get(OFFLOAD, "").strip().lower()
    mode = env.get(OFFLOAD_MODE, "").strip().lower()
    if on not in ("1", "2", "yes", "on", "enable", "true"):
        return False, f"Intel MPI with {OFFLOAD}={on or 'unset'} (GPU buffers off)"
    if mode not in ("", "auto", "cuda"):
        return False, f"Intel MPI with {OFFLOAD_MODE}={mode} (not CUDA)"
    return True, f"Intel MPI with {OFFLOAD}={on}" + (f", {OFFLOAD_MODE}={mode}" if mode else "")


def library_cuda_support_for(vendor: str, env: Mapping[str, str] = os.environ,
                             query: Callable[[], "bool | None"] | None = None) -> tuple["bool | None", str]:
    """The library's own answer to "CUDA-aware?" and its source: ``(True/False/None, how)``.

    Intel MPI: its offload environment (:func:`intel_offload`).  Any other
    vendor: ``query()`` (``MPIX_Query_cuda_support``; None where the
    library has no such call).  A True still goes through the run-time
    probe before a device pointer is handed over.
    """
    if vendor == "intel":
        return intel_offload(env)
    got = query() if query is not None else None
    return got, "MPIX_Query_cuda_support" if got is not None else "no MPIX_Query_cuda_support"


def intel_offload_env(mode: str = "cuda") -> dict[str, str]:
    """The environment that turns Intel MPI's NVIDIA device-buffer support on (for a launch or a job script)."""
    return {OFFLOAD: "1", OFFLOAD_MODE: mode}
