"""The result object of a parameter-server run (DESIGN.md section 2 plus PS keys).

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
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..timing import PHASES


def _reduce(dicts: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    names = [p for p in list(PHASES) + ["step"] if any(p in d for d in dicts)]
    return {k: {"mean": float(np.mean([d.get(k, 0.0) for d in dicts])),
                "max": float(max(d.get(k, 0.0) for d in dicts))} for k in names}


def gather_ps_result(comm, scheme, local: dict[str, Any]) -> dict[str, Any]:
    """Combine every rank's summary into the result object (a collective: all ranks call it)."""
    everyone = comm.allgather_obj(local)
    workers = [d for d in everyone if d["role"] == "worker"]
    servers = [d for d in everyone if d["role"] == "server"]
    pw = _reduce([d["phases"] for d in workers])
    ps = _reduce([d["phases"] for d in servers])
    step = pw.pop("step", {"mean": 0.0, "max": 0.0})
    phases = {k: v["max"] for k, v in pw.items()}
    phases_mean = {k: v["mean"] for k, v in pw.items()}
    if "server_apply" in ps:
        phases["server_apply"] = ps["server_apply"]["max"]
        phases_mean["server_apply"] = ps["server_apply"]["mean"]
    hist: Counter = Counter()
    for d in servers:
        hist.update({int(k): v for k, v in d["staleness"].items()})
    pushes = sum(hist.values())
    return {
        "scheme": scheme.name,
        "world_size": comm.size,
        "density_target": scheme.density,
        "density_actual": float(np.mean([d["density_up"] for d in workers])),
        "bytes_sent_per_rank": float(max([d["bytes_up"] for d in workers]
                                         + [d["bytes_per_communication"] for d in servers])),
        "phases": phases,
        "phases_mean_over_ranks": phases_mean,
        "step_seconds": step["max"],
        "step_seconds_mean_over_ranks": step["mean"],
        "n": scheme.layout.n,
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


def format_ps_report(res: dict[str, Any]) -> str:
    """What rank 0 prints after the worker table: the servers' phases, bytes each way, staleness."""
    lines = [f"{res['scheme']}: server phases per push served (ms); {res['servers']} server(s), "
             f"{res['workers']} worker(s), mode {res['ps_mode']}",
             f"{'phase':<18}{'mean ms':>12}{'max ms':>12}"]
    for name, v in res["phases_server"].items():
        lines.append(f"{name:<18}{v['mean'] * 1e3:>12.3f}{v['max'] * 1e3:>12.3f}")
    lines.append(f"{'bytes up/comm':<18}{res['bytes_up_per_communication']:,.0f}")
    lines.append(f"{'bytes down/comm':<18}{res['bytes_down_per_communication']:,.0f}")
    lines.append(f"{'communications':<18}{res['communications']:,}")
    hist = res["staleness_histogram"]
    if hist:
        shown = list(hist.items())
        text = "  ".join(f"{k}:{v}" for k, v in shown[:12]) + ("  ..." if len(shown) > 12 else "")
        lines.append(f"{'staleness':<18}mean {res['staleness_mean']:.2f}; histogram {text}")
    gaps = [e["final_gap"] for e in res.get("worker_extra", []) if "final_gap" in e]
    if gaps:
        lines.append(f"{'final model gap':<18}{max(gaps):.3g} (max |worker - server| after the last difference)")
    return "\n".join(lines)
