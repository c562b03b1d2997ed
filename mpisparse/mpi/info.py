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
    from .device import gpu_names

    return gpu_names()


def collect_info(comm) -> dict[str, Any]:
    from mpi4py import MPI
    import mpi4py
    import numpy

    from .device import assign_device, current_assignment

    mine = current_assignment() or assign_device(comm, use=False)  # collective when not assigned yet
    ranks = comm.allgather_obj({"rank": comm.rank, "host": MPI.Get_processor_name(),
                                "gpus": gpus_seen(), "local_rank": mine.local_rank,
                                "device": mine.device, "device_name": mine.device_name,
                                "cuda_visible_devices": mine.visible})
    return {
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_standard": "%d.%d" % MPI.Get_version(),
        "mpi4py": mpi4py.__version__,
        "world_size": comm.size,
        "cuda_aware": comm.cuda_aware,
        "cuda_aware_how": getattr(comm, "cuda_aware_how", "unknown"),
        "numpy": numpy.__version__,
        "cupy": next((v for v in map(_version, ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x"))
                      if v != "not installed"), "not installed"),
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
        f"CUDA-aware MPI   {'yes' if r['cuda_aware'] else 'no (device buffers staged through host memory)'}"
        f" [{r.get('cuda_aware_how', 'unknown')}]",
        f"numpy            {r['numpy']}",
        f"cupy             {r['cupy']}",
        f"torch            {r['torch']}",
        f"python           {r['python']}",
        "ranks:",
    ]
    for x in r["ranks"]:
        dev = "none" if x.get("device") is None else f"{x['device']} ({x['device_name']})"
        lines.append(f"  rank {x['rank']:<4} host {x['host']:<24} local rank {x.get('local_rank', '?'):<3} "
                     f"device {dev:<28} GPUs seen: {', '.join(x['gpus']) or 'none'}")
    return "\n".join(lines)
