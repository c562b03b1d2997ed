"""``mpisparse info``: what this job runs on."""

from __future__ import annotations

import importlib.metadata as md
import platform
from typing import Any


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def gpus_seen() -> list[str]:
    """Names of the CUDA devices this process sees (empty without CuPy or a GPU)."""
    try:
        import cupy
    except ImportError:
        return []
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        return [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(n)]
    except Exception:  # CuPy without a driver
        return []


def collect_info(comm) -> dict[str, Any]:
    from mpi4py import MPI
    import mpi4py
    import numpy

    ranks = comm.allgather_obj({"rank": comm.rank, "host": MPI.Get_processor_name(),
                                "gpus": gpus_seen()})
    return {
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_standard": "%d.%d" % MPI.Get_version(),
        "mpi4py": mpi4py.__version__,
        "world_size": comm.size,
        "cuda_aware": comm.cuda_aware,
        "numpy": numpy.__version__,
        "cupy": _version("cupy") if _version("cupy") != "not installed" else _version("cupy-cuda12x"),
        "torch": _version("torch"),
        "python": platform.python_version(),
        "ranks": ranks,
    }


def format_info(r: dict[str, Any]) -> str:
    lines = [
        f"MPI library      {r['mpi_library']}",
        f"MPI standard     {r['mpi_standard']}",
        f"mpi4py           {r['mpi4py']}",
        f"world size       {r['world_size']}",
        f"CUDA-aware MPI   {'yes' if r['cuda_aware'] else 'no (device buffers staged through host memory)'}",
        f"numpy            {r['numpy']}",
        f"cupy             {r['cupy']}",
        f"torch            {r['torch']}",
        f"python           {r['python']}",
        "ranks:",
    ]
    for x in r["ranks"]:
        lines.append(f"  rank {x['rank']:<4} host {x['host']:<24} GPUs: {', '.join(x['gpus']) or 'none'}")
    return "\n".join(lines)
