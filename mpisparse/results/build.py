"""Building a :class:`~.schema.RunResult`: the reductions over ranks every runtime shares.

Each runtime builds its result in one place: the collective runtime with
:func:`collective_result` (``train`` and ``bench step``), the parameter
server with :func:`mpisparse.ps.results.gather_ps_result`, the pipeline
with :meth:`mpisparse.mp.runtime.MPTrainer.result`.  All of them are
collectives: every rank calls them and gets the same result.
"""

from __future__ import annotations

import gc
import os
import resource
import sys
from typing import Any, Sequence

import numpy as np

from .timing import PHASES, reduce_over_ranks
from .provenance import provenance_block, rank_facts
from .schema import RunResult

__all__ = ["collective_result", "current_rss_bytes", "diagnostics_block", "peak_rss_bytes", "reset_peak_rss",
           "timing_fields"]


def _status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (Linux), in bytes; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident memory of this process since it started or since :func:`reset_peak_rss`.

    Linux: ``VmHWM`` of ``/proc/self/status`` (which the reset lowers);
    elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS; never reset).
    """
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_peak_rss() -> bool:
    """Start a new peak: free what is unreachable, then reset ``VmHWM`` to the current resident memory
    (Linux: ``5`` written to ``/proc/self/clear_refs``).  False where that is not possible."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def current_rss_bytes() -> int:
    """Resident memory of this process now (``/proc/self/statm``; elsewhere its peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def timing_fields(reduced: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``phases``, ``phases_mean_over_ranks``, ``step_seconds`` and its mean from ``{name: {"mean", "max"}}``."""
    reduced = dict(reduced)
    step = reduced.pop("step", {"mean": 0.0, "max": 0.0})
    return {"phases": {k: v["max"] for k, v in reduced.items()},
            "phases_mean_over_ranks": {k: v["mean"] for k, v in reduced.items()},
            "step_seconds": step["max"], "step_seconds_mean_over_ranks": step["mean"]}


def _check_over_steps(over_steps: str) -> None:
    if over_steps not in ("mean", "median"):
        raise ValueError(f"over_steps is {over_steps!r}; allowed: mean, median")


def _reduce_steps(step_max: np.ndarray, names: Sequence[str], over_steps: str) -> dict[str, float]:
    """``{name: reduction over steps}`` of a (steps x names) array of each step's max over ranks."""
    reduce = np.mean if over_steps == "mean" else np.median
    return {p: float(reduce(step_max[:, i])) for i, p in enumerate(names)}


def _step_names(keys: set[str]) -> list[str]:
    return [p for p in list(PHASES) + ["step"] if p in keys]


def slowest_per_step(records: Sequence[Sequence[dict[str, float]]], *,
                     over_steps: str = "mean") -> dict[str, float] | None:
    """Per phase (and ``step``), that step's max over ranks -- the time of the slowest worker of each
    iteration, as the DEFT paper's Fig. 7 measures it -- reduced over the timed steps by ``over_steps``:
    ``mean`` (Fig. 7's average) or ``median`` (a typical step: one step in which the operating system
    took a rank's core away does not move it), from every rank's per-step records
    (:attr:`mpisparse.results.timing.PhaseTimer.records`).  None without timed steps (or ranks that disagree on how
    many there were).  The reference for :func:`slowest_per_step_over_ranks`, which runs it distributed."""
    _check_over_steps(over_steps)
    steps = {len(r) for r in records}
    if not records or steps == {0} or len(steps) != 1:
        return None
    names = _step_names({k for r in records for d in r for k in d})
    step_max = np.max([[[d.get(p, 0.0) for p in names] for d in r] for r in records], axis=0)
    return _reduce_steps(step_max, names, over_steps)


def slowest_per_step_over_ranks(comm, records: Sequence[dict[str, float]],
                                over_steps: Sequence[str] = ("mean",)) -> list[dict[str, float] | None]:
    """:func:`slowest_per_step` of this rank's ``records`` and the other ranks', for each of ``over_steps``,
    without gathering the records: the ranks agree on the step count and the phase names, then one
    element-wise max over ranks of a (steps x phases) array, whose size does not grow with the ranks."""
    for o in over_steps:
        _check_over_steps(o)
    meta = comm.allgather_obj((len(records), sorted({k for d in records for k in d})))
    if {n for n, _ in meta} in ({0}, set()) or len({n for n, _ in meta}) != 1:
        return [None for _ in over_steps]
    names = _step_names({k for _, ks in meta for k in ks})
    local = np.array([[d.get(p, 0.0) for p in names] for d in records], dtype=np.float64)
    step_max = comm.allreduce(local.ravel(), op="max").reshape(local.shape)
    return [_reduce_steps(step_max, names, o) for o in over_steps]


def diagnostics_block(densities: Sequence[float], per_step: list[dict[str, float]]) -> dict[str, Any]:
    """The ``diagnostics`` field: density per step, the mean of each diagnostic, the per-step records."""
    keys = sorted({k for d in per_step for k in d if k != "iteration"})
    return {"density_per_step": list(densities),
            "mean": {k: float(np.mean([d[k] for d in per_step if k in d])) for k in keys},
            "per_step": per_step}


def collective_result(comm, *, scheme: str, density_target: float, timer, step_bytes: Sequence[int],
                      selected: Sequence[float], n: int, config: dict[str, Any],
                      diagnostics: list[dict[str, float]] | None = None, memory: bool = False,
                      staging: Sequence[dict[str, int]] | None = None, **known: Any) -> RunResult:
    """The result of a data-parallel run (a collective over ``comm``).

    ``step_bytes``: this rank's bytes sent per timed step; ``selected``:
    globally selected distinct elements per stepped step (the same on every
    rank); ``memory``: add ``peak_rss_bytes_per_rank`` and
    ``gradient_buffer_bytes``; ``known``: other fields (``k``, ``layers``,
    ``skipped_steps``, ``metrics``).  The ``provenance`` block is gathered in
    the same ``allgather`` as the per-rank counts.  ``staging``: this rank's
    communicator staging counts per step (dicts as
    :attr:`mpisparse.mpi.comm.Communicator.staging`, device runs only), reduced
    to ``staging_copies_per_step`` (mean per step, max over ranks).
    """
    timing = timing_fields(reduce_over_ranks(comm, timer.means()))
    slowest, typical = slowest_per_step_over_ranks(comm, timer.records, ("mean", "median"))
    wire = config.get("wire_dtype", config.get("scheme.wire_dtype"))  # the scheme's own option (resolved)
    known.setdefault("wire_dtype", wire)
    known.setdefault("overlap", bool(config["overlap"]) if "overlap" in config else None)
    known.setdefault("phases_slowest_step", slowest)
    known.setdefault("phases_median_step", typical)
    per_rank = comm.allgather_obj({"bytes": float(np.mean(step_bytes)) if len(step_bytes) else 0.0,
                                   "selected": float(np.mean(selected)) if len(selected) else 0.0,
                                   "peak_rss": peak_rss_bytes() if memory else None,
                                   "provenance": rank_facts(comm),
                                   "staging": None if staging is None else
                                   {k: float(np.mean([s[k] for s in staging])) if len(staging) else 0.0
                                    for k in ("d2h", "h2d", "d2h_bytes", "h2d_bytes")}})
    if staging is not None:
        known["staging_copies_per_step"] = {k: max(p["staging"][k] for p in per_rank)
                                            for k in ("d2h", "h2d", "d2h_bytes", "h2d_bytes")}
    if memory:
        known.update(gradient_buffer_bytes=n * 4, peak_rss_bytes_per_rank=max(p["peak_rss"] for p in per_rank))
    if diagnostics is not None:
        known["diagnostics"] = diagnostics_block([s / n for s in selected], diagnostics)
    known.setdefault("provenance", provenance_block([p["provenance"] for p in per_rank],
                                                    cuda_aware=getattr(comm, "cuda_aware", None),
                                                    cuda_aware_how=getattr(comm, "cuda_aware_how", None)))
    return RunResult(scheme=scheme, runtime="collective", world_size=comm.size, density_target=float(density_target),
                     density_actual=float(np.mean([p["selected"] for p in per_rank])) / n,
                     bytes_sent_per_rank=max(p["bytes"] for p in per_rank), n=n, config=config, **timing, **known)
