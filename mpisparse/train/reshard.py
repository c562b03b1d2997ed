"""Resume at another world size without losing error-feedback mass: the rank parts of ``W`` ranks
redistributed over ``W'``.

What is preserved.  Every collective scheme's update is the *mean* over
ranks of what they send (``out = (1/W) sum_i sent_i``), so rank ``i``'s
residual ``e_i`` is a pending update of ``e_i / W``: what error feedback
would still apply to the parameters.  The sum over ranks of the pending
updates, ``P = (1/W) sum_i e_i`` (the mean residual), is what a resume must
keep.  The rule: **every new rank takes the mean of the old ranks' buffer**,
``e'_j = (1/W) sum_i e_i`` for ``j < W'``, so ``(1/W') sum_j e'_j = P``
exactly (the mean is summed in float64, stored as float32: equal to float
tolerance).  Keeping ``sum_i e_i`` instead would scale the pending update
by ``W / W'``.  Per scheme (its memory's buffers, :mod:`mpisparse.schemes`):

* plain error feedback (``topk``, ``randomk``, ``threshold``, ``gtopk``,
  ``dct``, ``deft``, ``oktopk``): the residual, as above;
* ``powersgd``: the residual ``e = acc - output``, as above (the output is
  the ranks' mean, so ``(1/W) sum_i e_i`` is what is still pending); its
  warm-start ``Q`` factors and the count of random draws are the same on
  every rank (allreduced; one seeded stream) and do not depend on ``W``:
  carried over as they are, so the next step's power iteration starts from
  the saved ``Q``;
* ``dgc``: both the accumulated velocity ``v`` (the pending update) and the
  local momentum ``u`` (what momentum correction will still add to ``v``)
  are averaged, so the mean of each, and with it the mean dynamics of
  eq. 3-4, is unchanged; with ``--no-memory`` only ``u``;
* ``cltk``: the low-pass memory ``m`` (ScaleCom eq. 5 is linear in ``m``);
  ``beta`` is the same on every rank;
* a scheme without memory (``dense``, ``--no-memory``): nothing to move.

What cannot carry over.  Per-rank statistics that differ between the old
ranks: ``threshold``'s calibrated ``tau`` and ``dct``'s per-layer thresholds
(each rank's own quantile of its own error-compensated gradient) belong to
no new rank; they are dropped (:data:`RECOMPUTED`) and each new rank
recomputes its own at its first step, as a fresh run does.  ``oktopk``'s
local threshold is such a statistic; its global threshold and region
boundaries are the same on every old rank but estimate the old world (the
``k``-th largest of sums over ``W`` ranks' offers, ``W`` regions): they are
dropped whatever the ranks hold (:data:`WORLD_ESTIMATES`), and the first step
after the resume is an estimation step (exact top-k, boundaries, global
threshold), as a fresh run's first step is.  Values all old
ranks agree on (a ``--threshold`` given on the command line, ``beta``, the
iteration and with it the leader cycle ``t mod W'``) carry over.  A
scheme whose state holds anything else that differs between ranks, or a
memory buffer not known here, is reset with a warning (what every scheme
got before).  Each rank's torch RNG state is not restored (the models have
no dropout).  The losses of an interrupted epoch's steps go to new rank 0,
so the epoch's loss is still the mean over every step run.

Cost.  New rank ``j`` reads old rank files ``j, j + W', ...`` only; the
partial sums meet in one float64 Allreduce per buffer, the small parts in
one allgather of objects.  :func:`redistribute` is the same rule on a list
of parts, in one process (the reference the tests use).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["MEAN_BUFFERS", "RECOMPUTED", "WORLD_ESTIMATES", "gather_parts", "pending_update", "redistribute",
           "summarize"]

#: memory buffers that are error-feedback mass (linear in what is pending): averaged over the old ranks
MEAN_BUFFERS = ("residual", "u", "v")
#: per-rank statistics that are recomputed by each new rank (dropped when the old ranks differ)
RECOMPUTED = {"threshold": ("tau",), "dct": ("taus",), "oktopk": ("local_threshold",)}
#: estimates of the old world's sums or regions, agreed by its ranks: always dropped and re-estimated
WORLD_ESTIMATES = {"oktopk": ("global_threshold", "bounds")}
#: extra state naming the rank that saved it (DGC checks it on load): each new rank's own number
RANK_KEYS = ("rank",)


def pending_update(parts: Iterable[dict[str, Any]], world: int | None = None) -> dict[str, np.ndarray]:
    """``{buffer: (1/W) sum_i buf_i}`` (float64) over a world's rank parts: the sum over ranks of the
    pending update; a rank whose buffer is None (not stepped yet) counts as zeros."""
    parts = list(parts)
    sums = summarize(parts)["sums"]
    return {k: v / (len(parts) if world is None else world) for k, v in sums.items()}


def summarize(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What some old ranks' parts contribute: float64 sums of their memory buffers and, per rank, the
    small rest (scheme name, scalars, extra state, losses); summaries of disjoint sets add up."""
    sums: dict[str, np.ndarray] = {}
    small: list[dict[str, Any]] = []
    for part in parts:
        state = part.get("scheme") or {}
        memory = dict(state.get("memory") or {})
        buffers = []
        for name in [k for k, v in memory.items() if isinstance(v, np.ndarray) or v is None]:
            value = memory.pop(name)
            buffers.append(name)
            if name not in MEAN_BUFFERS:
                if value is not None:
                    memory[name] = "array"  # not error-feedback mass known here: the state is reset
                continue
            if value is not None:
                value = np.asarray(value, dtype=np.float64)
                if name in sums and sums[name].shape != value.shape:
                    raise ValueError(f"memory buffer {name!r}: ranks hold shapes {sums[name].shape} and "
                                     f"{value.shape}")
                sums[name] = sums[name] + value if name in sums else value.copy()
        small.append({"rest": {k: v for k, v in state.items() if k != "memory"}, "memory": memory,
                      "buffers": buffers, "losses": list(part.get("loop_losses", []))})
    return {"sums": sums, "small": small}


def _agreed(values: list[Any]) -> bool:
    first = values[0]
    return all(_equal(first, v) for v in values[1:])


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _new_state(sums: dict[str, np.ndarray], small: list[dict[str, Any]], old_world: int,
               warn: bool = True) -> dict[str, Any] | None:
    """The scheme state every new rank loads, or None where the state cannot be redistributed (reset)."""
    rests = [s["rest"] for s in small]
    if not rests or not rests[0]:
        return None
    name = rests[0].get("scheme")
    why = None
    if any("array" in s["memory"].values() for s in small):
        why = "its memory holds a buffer that is not error-feedback mass known here"
    for key in ("scheme", "iteration", "density", "options"):
        if why is None and not _agreed([r.get(key) for r in rests]):
            why = f"the ranks' {key!r} differ"
    if why is None and not _agreed([s["memory"] for s in small]):
        why = "the ranks' memory settings differ"
    extra: dict[str, Any] = {}
    for key in rests[0].get("extra", {}) if why is None else ():
        values = [r.get("extra", {}).get(key) for r in rests]
        if key in RANK_KEYS:
            extra[key] = None  # set per new rank by _rank_part
        elif key in WORLD_ESTIMATES.get(name, ()):
            extra[key] = None  # an estimate of the old world: re-estimated at the next step
        elif _agreed(values):
            extra[key] = values[0]
        elif key in RECOMPUTED.get(name, ()):
            extra[key] = None  # each new rank recomputes its own at its first step
        else:
            why = f"the ranks' {key!r} differ"
    if why is not None:
        if warn:
            warnings.warn(f"the {name} state of {old_world} ranks cannot be redistributed ({why}): every rank's "
                          "scheme state (residuals) is reset", stacklevel=3)
        return None
    memory = dict(small[0]["memory"])
    for k in sorted({b for s in small for b in s["buffers"]}):  # a buffer no old rank had yet stays None
        memory[k] = (sums[k] / old_world).astype(np.float32) if k in sums else None
    return {**rests[0], "memory": memory, "extra": extra}


def _rank_part(state: dict[str, Any] | None, small: list[dict[str, Any]], new_rank: int) -> dict[str, Any]:
    part: dict[str, Any] = {"loop_losses": [x for s in small for x in s["losses"]] if new_rank == 0 else []}
    if state is not None:
        extra = {k: (new_rank if k in RANK_KEYS else v) for k, v in state.get("extra", {}).items()}
        part["scheme"] = {**state, "extra": extra}
    return part


def redistribute(parts: list[dict[str, Any]], new_world: int) -> list[dict[str, Any]]:
    """The rank parts of ``len(parts)`` ranks as ``new_world`` ranks' parts (the module's rule, in one
    process): every new rank's scheme memory is the old ranks' mean; ``loop_losses`` all on rank 0; no
    ``torch_rng``.  A part without ``"scheme"`` (the state was reset) is what a rank then loads."""
    if new_world < 1:
        raise ValueError(f"new_world is {new_world}; it must be >= 1")
    summary = summarize(parts)
    state = _new_state(summary["sums"], summary["small"], len(parts))
    return [_rank_part(state, summary["small"], j) for j in range(new_world)]


def gather_parts(comm, old_world: int, read: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """Collective on the new world: this rank's part, each rank reading only old parts ``rank, rank +
    W', ...`` (``read(i)`` -> old rank ``i``'s part); the partial sums meet in float64 Allreduces."""
    mine = summarize(read(i) for i in range(comm.rank, old_world, comm.size))
    everyone = comm.allgather_obj({"small": mine["small"],
                                   "shapes": {k: v.shape for k, v in mine["sums"].items()}})
    small = [s for e in everyone for s in e["small"]]  # in old-rank order: rank j's share is j, j + W', ...
    order = [i for j in range(comm.size) for i in range(j, old_world, comm.size)]
    small = [s for _, s in sorted(zip(order, small), key=lambda x: x[0])]
    shapes: dict[str, tuple] = {}
    for e in everyone:
        shapes.update(e["shapes"])
    sums = {}
    for name in sorted(shapes):
        local = mine["sums"].get(name)
        sums[name] = comm.allreduce(np.zeros(shapes[name], np.float64) if local is None else local)
    state = _new_state(sums, small, old_world, warn=comm.rank == 0)
    return _rank_part(state, small, comm.rank)
