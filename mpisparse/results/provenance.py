"""Provenance of a result: what produced it, where, when and how (the ``provenance`` block).

Every result builder (:func:`mpisparse.results.build.collective_result`,
:func:`mpisparse.ps.results.gather_ps_result`,
:meth:`mpisparse.mp.runtime.MPTrainer.result`) gathers the ranks' facts
once, with one ``allgather`` (:func:`gather_provenance`), and every rank
gets the same block:

``schema_version``
    :data:`~mpisparse.results.schema.SCHEMA_VERSION` of the writer.
``toolkit``
    ``{"name": "mpisparse", "version", "git_commit"}``; the commit is read
    from the checkout the package was imported from (None for an installed
    wheel or outside git; no subprocess is started).
``mpi``
    ``{"library", "version", "library_version", "standard"}``: the MPI
    library's name and version parsed from ``MPI.Get_library_version()``
    (its first line as ``library_version``), and the MPI standard it
    implements.
``versions``
    ``python``, ``mpi4py``, ``numpy``, ``torch``, ``cupy``: the version of
    the module this process imported (of the installed distribution when it
    was not imported; None when it is not installed).
``world_size``, ``hosts``
    ranks in the job, and host name (``socket.gethostname()``) -> the
    ranks on it, in rank order.
``gpus``, ``cuda_aware``, ``cuda_aware_how``
    the device each rank uses (``[{"rank", "host", "device", "name"}]``,
    empty on CPU-only runs), and whether MPI gets device buffers directly
    (see ``mpisparse info``).
``timestamp_utc``
    rank 0's clock when the result was built (ISO 8601, UTC).
``argv``, ``command_line``
    the command line of rank 0 (``argv[0]`` is shown as ``mpisparse`` when it
    is the package's entry point).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import importlib.util
import platform
import re
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["gather_provenance", "git_commit", "module_version", "mpi_library", "provenance_block", "rank_facts"]

#: the distributions a CuPy build can come from
_CUPY_DISTS = ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy-rocm-5-0")


def module_version(module: str, dists: tuple[str, ...] | None = None) -> str | None:
    """``module.__version__`` if this process imported it, else the installed distribution's; None: absent."""
    mod = sys.modules.get(module)
    if mod is not None and getattr(mod, "__version__", None):
        return str(mod.__version__)
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in dists or (module,):
        try:
            return _md.version(dist)
        except _md.PackageNotFoundError:
            continue
    return None


def _git_dir(start: Path) -> Path | None:
    for d in (start, *start.parents):
        g = d / ".git"
        if g.is_dir():
            return g
        if g.is_file():  # a worktree or submodule: "gitdir: PATH"
            text = g.read_text().strip()
            if text.startswith("gitdir:"):
                p = Path(text.split(":", 1)[1].strip())
                return p if p.is_absolute() else (d / p)
            return None
    return None


def git_commit(start: str | Path | None = None) -> str | None:
    """The commit checked out where the package lives (read from ``.git``; None when not a checkout)."""
    try:
        gd = _git_dir(Path(start or Path(__file__).resolve().parent))
        if gd is None:
            return None
        head = (gd / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head if re.fullmatch(r"[0-9a-f]{40,64}", head) else None
        ref = head.split(":", 1)[1].strip()
        common = gd
        if (gd / "commondir").is_file():
            c = Path((gd / "commondir").read_text().strip())
            common = c if c.is_absolute() else (gd / c)
        for base in (gd, common):
            f = base / ref
            if f.is_file():
                return f.read_text().strip() or None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    except OSError:
        return None
    return None


def mpi_library(text: str) -> dict[str, str | None]:
    """``{"library", "version", "library_version"}`` from ``MPI.Get_library_version()``'s text.

    ``MPICH Version: 4.2.0`` -> MPICH 4.2.0; ``Open MPI v5.0.3, package: ...``
    -> Open MPI 5.0.3; ``Intel(R) MPI Library 2021.10 for Linux*`` -> Intel(R)
    MPI Library 2021.10.
    """
    first = (text.strip().splitlines() or [""])[0].strip()
    m = re.match(r"^(.*?)[\s,:]+(?:version[:\s]*|v)?(\d+(?:\.\d+)+[\w.+-]*)", first, re.IGNORECASE)
    if not m:
        return {"library": first or None, "version": None, "library_version": first or None}
    name = re.sub(r"\s+version$", "", m.group(1).strip(), flags=re.IGNORECASE)
    return {"library": name or None, "version": m.group(2).rstrip(",."), "library_version": first}


def _command_line(argv: list[str]) -> str:
    prog = argv[0] if argv else "mpisparse"
    name = Path(prog).name
    if name in ("mpisparse", "__main__.py") or prog.endswith(("mpisparse/__main__.py", "-m")):
        prog = "mpisparse"
    return shlex.join([prog, *argv[1:]])


def rank_facts(comm=None) -> dict[str, Any]:
    """What this rank contributes: host name, its device, and (read by rank 0 only) the rest."""
    from ..mpi.device import current_assignment

    dev = current_assignment()
    facts: dict[str, Any] = {"host": socket.gethostname(),
                             "device": None if dev is None else dev.device,
                             "device_name": None if dev is None else dev.device_name}
    if comm is None or comm.rank == 0:
        facts["process"] = process_facts()
    return facts


def process_facts() -> dict[str, Any]:
    """The facts of this process that do not need MPI to be gathered (rank 0's are kept)."""
    from .. import __version__

    mpi = {"library": None, "version": None, "library_version": None, "standard": None}
    mpi_mod = sys.modules.get("mpi4py.MPI")
    if mpi_mod is not None:
        mpi.update(mpi_library(mpi_mod.Get_library_version()))
        mpi["standard"] = "%d.%d" % mpi_mod.Get_version()
    return {
        "toolkit": {"name": "mpisparse", "version": __version__, "git_commit": git_commit()},
        "mpi": mpi,
        "versions": {"python": platform.python_version(), "mpi4py": module_version("mpi4py"),
                     "numpy": module_version("numpy"), "torch": module_version("torch"),
                     "cupy": module_version("cupy", _CUPY_DISTS)},
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "command_line": _command_line(list(sys.argv)),
    }


def provenance_block(facts: list[dict[str, Any]], *, cuda_aware: bool | None = None,
                     cuda_aware_how: str | None = None) -> dict[str, Any]:
    """The ``provenance`` block from every rank's :func:`rank_facts` (a pure function)."""
    from .schema import SCHEMA_VERSION

    proc = facts[0]["process"]
    hosts: dict[str, list[int]] = {}
    for r, f in enumerate(facts):
        hosts.setdefault(f["host"], []).append(r)
    gpus = [{"rank": r, "host": f["host"], "device": f["device"], "name": f["device_name"]}
            for r, f in enumerate(facts) if f.get("device") is not None]
    return {"schema_version": SCHEMA_VERSION, **proc, "world_size": len(facts), "hosts": hosts, "gpus": gpus,
            "cuda_aware": cuda_aware, "cuda_aware_how": cuda_aware_how}


def local_provenance() -> dict[str, Any]:
    """The ``provenance`` block of a command that runs as one process (``bench select``, ``bench model``,
    ``reproduce``'s driver): world size 1, this host."""
    return provenance_block([rank_facts(None)])


def gather_provenance(comm) -> dict[str, Any]:
    """The ``provenance`` block (a collective over ``comm``: one ``allgather``; every rank gets the same)."""
    facts = comm.allgather_obj(rank_facts(comm))
    return provenance_block(facts, cuda_aware=getattr(comm, "cuda_aware", None),
                            cuda_aware_how=getattr(comm, "cuda_aware_how", None))
