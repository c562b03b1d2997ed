"""``mpisparse advise steps``: every scheme's real training step (forward, backward, exchange, update), measured.

What :mod:`mpisparse.bench.advise` predicts, measured under MPI: each rank trains the same net
(:func:`mpisparse.bench.overlap._way`: CIFAR-shaped random batches of its own) through
:class:`mpisparse.torch.DistributedOptimizer`, one way per scheme, the ways taking turns (a
change of the machine's load falls on all alike).  A turn is ``steps_per_turn`` consecutive steps of one
way, of which the last ``steps_per_turn - steps_per_turn // 2`` are timed (their mean is the turn's step): the
first settle what the other ways' turns left behind (a link's token bucket refilled while they ran, which one
scheme training alone would have drained: with one step a turn a small exchange rides on a full bucket).  The
ways:

* ``compute``: the local optimizer, no exchange (the advisor's ``compute``);
* ``dense``: float32 values, the exchange after backward;
* ``dense-16``: 16-bit values, after backward; ``dense-opt``: the same overlapped with backward (the
  optimized dense baseline); the two give the share of the exchange overlap hides;
* every other scheme at ``density``, after backward.

A step is timed from a barrier to the end of ``step()``; each rank's median, the slowest rank's reported, and
every timed step's time (the slowest rank's; :func:`step_samples`) with the fastest and the slowest of them,
so that a reader sees the noise two ways' steps differ within.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

from .advise import BASELINE
from .advise_measured import hidden_share_from

#: the sparse schemes a measurement runs by default (the advisor's)
SPARSE = ("topk", "cltk", "deft", "gtopk", "powersgd", "oktopk")


def plan_ways(schemes: Sequence[str], dense_wire: str) -> list[tuple[str, str | None, dict[str, Any], bool]]:
    """``(label, scheme, options, overlap)`` of each way: compute, the dense ones, then ``schemes``."""
    ways = [("compute", None, {}, False), ("dense", "dense", {}, False),
            ("dense-16", "dense", {"wire_dtype": dense_wire}, False),
            (BASELINE, "dense", {"wire_dtype": dense_wire}, True)]
    return ways + [(s, s, {}, False) for s in schemes if s not in ("dense", BASELINE)]


def run_steps(comm, *, model: str, schemes: Sequence[str], density: float, batch: int, iters: int, warmup: int,
              dense_wire: str = "float16", bucket_cap_mb: float = 25.0, seed: int = 0, steps_per_turn: int = 1,
              progress=None, device: str = "cpu") -> dict[str, Any]:
    """The slowest rank's median step of each way (``iters`` timed turns after ``warmup``); ``hidden_share``:
    ``(dense-16 - dense-opt) / (dense-16 - compute)``.  ``device`` ``cuda``: the nets, batches and exchanges on
    each rank's GPU, the device synchronised before a step's clock starts and before it stops."""
    if steps_per_turn < 1:
        raise ValueError(f"steps per turn {steps_per_turn}; it must be >= 1")
    settle = steps_per_turn // 2  # untimed steps at the start of each turn
    import os

    import torch

    from .overlap import _bytes, _way

    from ..mpi.device import torch_device, torch_synchronizer
    from ..mpi.hierarchy import HierarchicalCommunicator

    load_before = os.getloadavg()
    dev = torch_device(device, comm) if device != "cpu" else None
    sync = (torch_synchronizer(dev) if dev is not None else None) or (lambda: None)

    ways = {}
    for label, scheme, opts, overlap in plan_ways(schemes, dense_wire):
        ways[label] = (scheme, opts, overlap) + _way(comm, model, scheme=scheme, density=density, options=opts,
                                                     overlap=overlap, batch=batch, bucket_cap_mb=bucket_cap_mb,
                                                     seed=seed, device=dev)
    times: dict[str, list[float]] = {k: [] for k in ways}
    sent = {k: 0 for k in ways}
    for it in range(warmup + iters):
        for label, (_, _, _, net, x, y, opt) in ways.items():
            turn = []
            for j in range(steps_per_turn):
                sync()
                comm.barrier()
                b0 = _bytes(opt)
                t0 = time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
                sync()
                if it >= warmup and j >= settle:
                    turn.append(time.perf_counter() - t0)
                    sent[label] += _bytes(opt) - b0
            if turn:
                times[label].append(statistics.fmean(turn))
        if progress is not None:
            progress(f"turn {it + 1} of {warmup + iters}")
    mine = {k: statistics.median(v) for k, v in times.items()}
    timed = iters * (steps_per_turn - settle)  # timed steps per way
    everyone = comm.allgather_obj({"times": mine, "steps": times, "bytes": {k: v / timed for k, v in sent.items()}})
    rows = []
    for label, (scheme, opts, overlap, *_rest) in ways.items():
        samples = step_samples([e["steps"][label] for e in everyone])
        rows.append({"scheme": label, "base_scheme": scheme, "options": opts, "overlap": overlap,
                     "step_seconds": max(e["times"][label] for e in everyone),
                     "step_samples_seconds": samples, "step_min_seconds": min(samples),
                     "step_max_seconds": max(samples),
                     "bytes_per_step": max(e["bytes"][label] for e in everyone)})
    for _, (_, _, _, _, _, _, opt) in ways.items():
        if getattr(opt, "overlap", None) is not None:
            opt.overlap.close()
    by = {r["scheme"]: r["step_seconds"] for r in rows}
    exchange = by["dense-16"] - by["compute"]
    hidden = (by["dense-16"] - by[BASELINE]) / exchange if exchange > 0 else 0.0
    hidden = hidden_share_from({"rows": rows, "hidden_share": min(1.0, max(0.0, hidden))})  # paired by turn
    return {"command": "advise steps", "model": model, "density": density, "batch": batch, "iters": iters,
            "warmup": warmup, "steps_per_turn": steps_per_turn, "world_size": comm.size, "dense_wire": dense_wire,
            "device": device, "hierarchical": isinstance(comm, HierarchicalCommunicator),
            "seed": seed, "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "compute_seconds": by["compute"], "hidden_share": min(1.0, max(0.0, hidden)), "rows": rows}


def _per_turn(res: dict[str, Any]) -> str:
    n = int(res.get("steps_per_turn", 1))
    return "" if n == 1 else f"; a turn: {n} steps, the mean of the last {n - n // 2}"


def step_samples(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Each timed step's time as the job saw it: the slowest rank's time of that step (``per_rank``: every
    rank's list of step times, in step order).  Their spread is the measurement's noise, which a comparison
    of two ways' medians has to be read against."""
    if not per_rank or len({len(r) for r in per_rank}) != 1:
        raise ValueError(f"step times of {[len(r) for r in per_rank]} steps per rank; every rank times as many")
    return [max(step) for step in zip(*per_rank)]


def format_steps(res: dict[str, Any]) -> str:
    from ..results.tables import Column, format_rows

    ms = lambda v: f"{1e3 * v:,.1f}"  # noqa: E731
    cols = [Column("scheme", "scheme", "{}", "<"), Column("step_seconds", "step ms", ms),
            Column("step_min_seconds", "fastest ms", ms), Column("step_max_seconds", "slowest ms", ms),
            Column("bytes_per_step", "bytes/rank/step", "{:,.0f}")]
    title = (f"advise steps: {res['model']}, batch {res['batch']}, W={res['world_size']}, density {res['density']}, "
             f"median of {res['iters']} turns (slowest rank"
             f"{_per_turn(res)}); overlap hid {100 * res['hidden_share']:.0f}% of "
             f"the {res['dense_wire']} exchange")
    return format_rows(res["rows"], cols, title=title)
