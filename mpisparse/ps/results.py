"""The result of a parameter-server run: the common fields plus the ``ps`` block.

Every rank contributes a summary (a worker's from
:meth:`.worker.WorkerStats.summary`, a server's from
:meth:`.server.ServerStats.summary`); they are gathered over all ranks and
reduced the same way on every rank:

``phases``
    the workers' phases (max over workers of each worker's mean seconds
    per minibatch step) plus ``server_apply`` (max over servers of the mean
    seconds per push served); ``phases_mean_over_ranks`` likewise;
``phases_worker``, ``phases_server``
    ``{phase: {"mean", "max"}}`` over workers / over servers (a server's
    phases are per push it served: ``wait`` is its idle time);
``step_seconds``
    the slowest worker's mean step (minibatch + its communication);
``bytes_sent_per_rank``
    max over ranks of the bytes a rank sends per communication (a worker:
    its push; a server: its answer to one push);
``bytes_up_per_communication`` / ``bytes_down_per_communication``
    mean over workers of what one communication sent up / received;
``density_actual``
    mean over workers and communications of the fraction of the ``n``
    parameters pushed (each push separately: there is no global selection);
``staleness_histogram``
    ``{staleness: pushes}`` summed over servers (each server applies each
    push once, with its own staleness);
``communications``, ``servers``, ``workers``, ``ps_mode``, and the bytes of
start, ``GET`` and the final bundles (``setup_bytes``, ``get_bytes``,
``final_bytes``; not part of any communication).

The printed report is :func:`mpisparse.results.format_ps_report`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..results import RunResult
from ..results.build import timing_fields
from ..results.provenance import gather_provenance
from ..results.timing import PHASES


def _reduce(dicts: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    names = [p for p in list(PHASES) + ["step"] if any(p in d for d in dicts)]
    return {k: {"mean": float(np.mean([d.get(k, 0.0) for d in dicts])),
                "max": float(max(d.get(k, 0.0) for d in dicts))} for k in names}


def gather_ps_result(comm, scheme, local: dict[str, Any], **known: Any) -> RunResult:
    """Combine every rank's summary into the result (a collective: all ranks call it).

    ``known``: further fields (``config``, memory figures).  The ``ps``
    block holds ``worker_extra`` (each worker's ``extra`` summary) for the
    driver to reduce or drop.
    """
    everyone = comm.allgather_obj(local)
    workers = [d for d in everyone if d["role"] == "worker"]
    servers = [d for d in everyone if d["role"] == "server"]
    pw = _reduce([d["phases"] for d in workers])
    ps = _reduce([d["phases"] for d in servers])
    timing = timing_fields(pw)
    if "server_apply" in ps:
        timing["phases"]["server_apply"] = ps["server_apply"]["max"]
        timing["phases_mean_over_ranks"]["server_apply"] = ps["server_apply"]["mean"]
    pw = {k: v for k, v in pw.items() if k != "step"}
    hist: Counter = Counter()
    for d in servers:
        hist.update({int(k): v for k, v in d["staleness"].items()})
    pushes = sum(hist.values())
    block = {
        "servers": scheme.roles.servers,
        "workers": scheme.roles.workers,
        "ps_mode": scheme.server_mode,
        "shards": [[sh.lo, sh.hi] for sh in scheme.shards],
        "communications": int(sum(d["communications"] for d in workers)),
        "bytes_up_per_communication": float(np.mean([d["bytes_up"] for d in workers])),
        "bytes_down_per_communication": float(np.mean([d["bytes_down"] for d in workers])),
        "staleness_histogram": {str(k): int(hist[k]) for k in sorted(hist)},
        "staleness_mean": float(sum(k * v for k, v in hist.items()) / pushes) if pushes else 0.0,
        "phases_worker": pw,
        "phases_server": ps,
        "setup_bytes": int(sum(d["setup_bytes"] for d in servers)),
        "get_bytes": int(sum(d["get_bytes"] for d in servers)),
        "final_bytes": int(sum(d["final_bytes"] for d in servers)),
        "worker_extra": [d.get("extra", {}) for d in workers],
    }
    known.setdefault("config", {})
    known.setdefault("provenance", gather_provenance(comm))
    return RunResult(
        scheme=scheme.name, runtime="ps", world_size=comm.size, density_target=scheme.density,
        density_actual=float(np.mean([d["density_up"] for d in workers])),
        bytes_sent_per_rank=float(max([d["bytes_up"] for d in workers]
                                      + [d["bytes_per_communication"] for d in servers])),
        n=scheme.layout.n, ps=block, **timing, **known)
