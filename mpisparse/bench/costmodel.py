"""A cost model of one data-parallel step: per-phase time for any world size.

Pure functions: :func:`predict` takes the vector size ``n``, the density,
the world size ``W``, a :class:`Link` (latency and bandwidth of a host's
link) and :class:`Rates` (seconds per element of the compute kernels,
measured on this machine by :func:`measure_rates`), and returns the
predicted seconds of each phase of one step of a scheme.  ``mpisparse
bench model`` tabulates it for W up to 1,024 (:mod:`mpisparse.bench.model`).

The communication terms are the textbook costs of the collectives each
scheme calls (``a`` the link latency, ``b`` seconds per byte, ``m`` the
message bytes), with MPICH's algorithm for the message sizes at hand:

=============  ================================================  =========================
collective     time                                              used by
=============  ================================================  =========================
Allreduce      2 log2(W) a + 2 (W-1)/W m b (halving/doubling)    dense (n), cltk, deft (k)
Allgatherv     log2(W) a + (W-1) m b (m per rank)                topk (k indices, k values)
Bcast, small   log2(W) (a + m b) (binomial tree, m < 12 KiB)     deft (its bins; only under the eq3 cost model)
Bcast          2 log2(W) a + 2 (W-1)/W m b (scatter + allgather)  cltk (k indices)
pairwise       log2(W) (2 a + m b) (sendrecv, both ways at once)  gtopk (k indices + values)
=============  ================================================  =========================

Compute, at the measured rates (:class:`Rates`): compensation and the
candidate search stream over the ``n`` elements (``fused``); the exact pick
costs ``pick`` per selected element (the fused pass's candidates cut to
``k`` and the values gathered; the leader's in cltk, the others wait for
its Bcast); DEFT's pass compensates every layer and sums its norm
(``stream``) and, in its share of the layers (``n / W`` times the
partition's imbalance), also searches each layer's candidates
(``segmented`` per element there), then picks ``pick`` per element it
selects;
gTop-k merges two ``k``-sets in each of its ``log2(W)`` rounds (``merge``
per merged entry); the update scatters the received entries (``scatter``
per entry, the compiled scatter-add with its clear and scale; top-k: ``W k``
entries, the build-up); dense scales ``n``.

Ranks sharing cores (``shared_cores``; the emulated cluster: every host on
this machine's cores), :func:`sharing`: ``min(W, cores)`` ranks run at once,
so the rates are measured with that many processes at once, each on its own
vectors (they share the memory bandwidth and the last-level cache; the
slowest process's time), and each rank gets ``cores / W`` of a core, so
compute stretches by ``W / cores`` (MPICH polls while a rank waits: a
waiting rank holds its share as a computing one does).

What it leaves out: overlap between phases, the wait for the slowest rank
beyond imbalance, congestion beyond one link per host, the protocol
switch points of a real MPI (eager vs rendezvous, algorithm choice), and,
with shared cores, the waits of a collective's rounds for a rank that is
not running (each holds its core for a scheduler slice).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["KERNELS", "Link", "Rates", "SCHEMES", "compute_phases", "crossover", "fit_link", "loaded_rates", "measure_rates", "parse_rate",
           "predict", "rates_from_times", "sharing", "slowest", "total", "value_bytes"]

#: schemes the model covers
SCHEMES = ("dense", "topk", "cltk", "deft", "gtopk")

_INDEX_BYTES = 4
_VALUE_BYTES = 4


@dataclass(frozen=True)
class Link:
    """A host's link: ``latency`` seconds per message, ``bandwidth`` bytes per second each way."""

    latency: float
    bandwidth: float

    def __post_init__(self) -> None:
        if not self.latency >= 0:
            raise ValueError(f"link latency is {self.latency} s; it must be >= 0")
        if not self.bandwidth > 0:
            raise ValueError(f"link bandwidth is {self.bandwidth} B/s; it must be > 0")


#: the kernels a :class:`Rates` holds a rate of (seconds per element), in its fields' order
KERNELS = ("stream", "topk", "fused", "scatter", "segmented", "pick", "merge")


@dataclass(frozen=True)
class Rates:
    """Seconds per element of the compute kernels on one core or one device (:func:`measure_rates`: alone, or
    as several processes at once; :mod:`mpisparse.bench.rates`: a table per device), and the fixed seconds of
    one call of each (``per_call``: launches, the read back that sizes a result, the host's work around the
    call; what a GPU pays whatever the size, about nothing on a CPU).  :meth:`cost` is a kernel's time."""

    stream: float  # one pass reading two vectors and writing one (e += g, out *= s)
    topk: float  # exact top-k of a compensated vector (whole vector, density 0.001-0.01)
    fused: float  # compensation and top-k in one pass (mpisparse/backend/fused.py), or stream + topk
    scatter: float  # one received (index, value) added into the dense output (clear and scale included)
    segmented: float  # DEFT's pass over a rank's own layers: e += g, the norms, each layer's candidate search
    pick: float = 0.0  # per selected element: the exact pick among the candidates and the values' gather
    merge: float = 0.0  # gTop-k: per entry of the two k-sets one round merges (union, sum, top k)
    #: kernel name -> fixed seconds of one call (a kernel not named: 0)
    per_call: dict[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        bad = sorted(set(self.per_call) - set(KERNELS))
        if bad:
            raise ValueError(f"per-call costs of {bad}: not kernels; allowed: {', '.join(KERNELS)}")
        for name in KERNELS:
            for what, v in ((name, getattr(self, name)), (f"{name} per call", self.per_call.get(name, 0.0))):
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    raise ValueError(f"rate {what} = {v!r}; it must be a finite number of seconds >= 0")

    def cost(self, kernel: str, elements: float, calls: float = 1.0) -> float:
        """Seconds of ``calls`` calls of ``kernel`` over ``elements`` elements in all: the per-element rate
        times the elements plus the fixed cost of each call (none when there is nothing to do)."""
        if elements <= 0 or calls <= 0:
            return 0.0
        return getattr(self, kernel) * elements + self.per_call.get(kernel, 0.0) * calls


def parse_rate(text: str) -> float:
    """``1gbit``, ``100mbit``, ``10gbit``, ``1.25e8`` (bytes/s) -> bytes per second."""
    t = text.strip().lower()
    units = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "kbit": 1e3 / 8, "gbps": 1e9 / 8, "mbps": 1e6 / 8}
    for u, f in units.items():
        if t.endswith(u):
            try:
                return float(t[: -len(u)]) * f
            except ValueError:
                break
    try:
        value = float(t)
    except ValueError:
        raise ValueError(f"link rate {text!r}; allowed: a number with gbit/mbit/kbit, or bytes per second") from None
    if value <= 0:
        raise ValueError(f"link rate {text!r}; it must be > 0")
    return value


def parse_size(text: str) -> float:
    """A size in tc's syntax -> bytes: ``128kb`` or ``128k`` (kilobytes, 1024 bytes), ``1mb``/``1m``,
    ``1gb``/``1g``, ``1500b`` or ``1500`` (bytes); 0 is allowed."""
    t = text.strip().lower()
    scale = 1.0
    for suffix, f in (("kb", 1024.0), ("mb", 1024.0 ** 2), ("gb", 1024.0 ** 3), ("k", 1024.0), ("m", 1024.0 ** 2),
                      ("g", 1024.0 ** 3), ("b", 1.0)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], f
            break
    try:
        value = float(t) * scale
    except ValueError:
        raise ValueError(f"size {text!r}; allowed: a number of bytes, or with kb, mb, gb (tc's syntax)") from None
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"size {text!r}; it must be a finite number >= 0")
    return value


def _log2(w: int) -> float:
    return math.log2(w) if w > 1 else 0.0


#: MPICH's Bcast: a binomial tree below this many bytes, scatter + allgather from it (MPIR_CVAR_BCAST_SHORT_MSG_SIZE)
BCAST_SHORT_BYTES = 12288


def _bcast(m: float, W: int, a: float, b: float) -> float:
    """Seconds of a Bcast of ``m`` bytes: binomial tree (short), else scatter + ring allgather (van de Geijn)."""
    lg = _log2(W)
    if m < BCAST_SHORT_BYTES:
        return lg * (a + m * b)
    return 2 * lg * a + 2 * (W - 1) / W * m * b


def predict(scheme: str, n: int, density: float, world: int, link: Link, rates: Rates, *,
            imbalance: float = 1.1, shared_cores: int | None = None, wire: str = "float32") -> dict[str, float]:
    """Predicted seconds of each phase of one step of ``scheme`` (``compensate``, ``select``,
    ``exchange``, ``update``) on ``world`` ranks, one per host.

    ``shared_cores``: the ranks share that many cores (the emulated cluster); compute is stretched by
    :func:`sharing`'s ``stretch``, and ``rates`` must then be measured with its ``processes`` at once
    (:func:`measure_rates`).  None: a core per rank, ``rates`` measured alone.

    ``wire``: the values' type on the wire (``--wire-dtype``): float16 and bfloat16 values are 2 bytes
    (indices stay 4); a 16-bit sum over ranks (dense, cltk, deft) is a reduce-scatter and an Allgatherv of
    the same bytes as the ring Allreduce's halves (:func:`mpisparse.mpi.wire.allreduce_bytes`)."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not in the cost model; allowed: {', '.join(SCHEMES)}")
    if world < 1:
        raise ValueError(f"world size {world}; it must be >= 1")
    if not 0 < density <= 1:
        raise ValueError(f"density {density}; allowed: (0, 1]")
    W, a, b = int(world), link.latency, 1.0 / link.bandwidth
    vb = value_bytes(wire)
    if wire != "float32" and scheme == "gtopk":
        raise ValueError("scheme 'gtopk' sends float32 values only; allowed wire: float32")
    k = max(1, int(density * n))
    lg = _log2(W)
    stretch = sharing(W, shared_cores)[1]
    comp = compute_phases(scheme, n, density, W, rates, imbalance=imbalance)
    if scheme == "dense":
        m = vb * n
        comm = 2 * lg * a + 2 * (W - 1) / W * m * b
    elif scheme == "topk":
        comm = 3 * lg * a + (W - 1) * k * (_INDEX_BYTES + vb) * b
    elif scheme == "cltk":
        comm = _bcast(k * _INDEX_BYTES, W, a, b) + 2 * lg * a + 2 * (W - 1) / W * k * vb * b
    elif scheme == "deft":
        from ..schemes.deft import PACK_COST  # "size": every rank packs the same bins once, no Bcast
        comm = ((lg * a if PACK_COST == "eq3" else 0.0)  # the leader's bins (an int32 per layer: a short Bcast)
                + 2 * lg * a + (W - 1) / W * k * _INDEX_BYTES * b  # counts, then the indices (Allgatherv)
                + 2 * lg * a + 2 * (W - 1) / W * k * vb * b)  # the values (Allreduce)
    else:  # gtopk
        comm = lg * (2 * a + k * (_INDEX_BYTES + vb) * b)  # each round: a sendrecv, both ways at once
    out = {p: v * stretch for p, v in comp.items()}
    out["exchange"] = comm if W > 1 else 0.0
    return out


def compute_phases(scheme: str, n: int, density: float, world: int, rates: Rates, *,
                   imbalance: float = 1.1) -> dict[str, float]:
    """Seconds of ``compensate``, ``select`` and ``update`` of one step of ``scheme`` on one rank of ``world``
    at ``rates`` (each kernel's per-element rate and its fixed cost per call, :meth:`Rates.cost`), with a core
    or a device of its own: the compute half of :func:`predict`, which depends on no link."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not in the cost model; allowed: {', '.join(SCHEMES)}")
    W, c = int(world), rates.cost
    k = max(1, int(density * n))
    lg = _log2(W)
    if scheme == "dense":
        return {"compensate": 0.0, "select": 0.0, "update": c("stream", n)}
    if scheme == "topk":
        return {"compensate": c("fused", n), "select": c("pick", k), "update": c("scatter", min(n, W * k))}
    if scheme == "cltk":  # the leader's pass and pick: the others wait for them in the Bcast
        return {"compensate": c("fused", n), "select": c("pick", k), "update": c("scatter", k)}
    if scheme == "deft":
        frac = min(1.0, imbalance / W)
        return {"compensate": c("stream", n * (1 - frac)) + c("segmented", n * frac), "select": c("pick", k * frac),
                "update": c("scatter", k)}
    return {"compensate": c("fused", n), "select": c("pick", k) + c("merge", 2 * k * lg, calls=lg),  # gtopk
            "update": c("scatter", k)}


def value_bytes(wire: str) -> int:
    """Bytes per value on the wire for ``--wire-dtype`` ``wire``."""
    if wire not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"wire dtype {wire!r}; allowed values are float32, float16, bfloat16")
    return 4 if wire == "float32" else 2


def fit_link(points: list[tuple[int, int, float]], *, messages: int = 3,
             bytes_per_element: int = _INDEX_BYTES + _VALUE_BYTES) -> Link:
    """A :class:`Link` from ``(world, k, seconds)`` of top-k exchanges (``bench exchange``, one W, several
    densities): least squares of ``t = messages log2(W) a + (W - 1) k bytes_per_element b`` over the points,
    in relative error (the largest exchange would otherwise decide the latency of the smallest).
    The defaults fit the whole exchange (counts, indices and values: three Allgathervs, 8 bytes per
    element); ``messages=1, bytes_per_element=4`` fits the values' Allgatherv alone."""
    if len(points) < 2:
        raise ValueError(f"fitting a link needs top-k exchanges at 2 or more densities; got {len(points)}")
    A = np.array([[messages * _log2(w), (w - 1) * k * bytes_per_element] for w, k, _ in points], dtype=float)
    t = np.array([s for _, _, s in points], dtype=float)
    if not np.all(t > 0):
        raise ValueError(f"exchange times {t.tolist()} s; they must be > 0")
    (a, b), *_ = np.linalg.lstsq(A / t[:, None], np.ones_like(t), rcond=None)  # relative errors: each counts alike
    if not b > 0:
        raise ValueError("the top-k exchange times do not grow with k: no bandwidth can be fitted")
    return Link(latency=max(0.0, float(a)), bandwidth=1.0 / float(b))


def total(phases: dict[str, float]) -> float:
    return float(sum(phases.values()))


def crossover(n: int, density: float, link: Link, rates: Rates, *, max_world: int = 1 << 20,
              shared_cores: int | None = None) -> int | None:
    """The smallest power-of-two W at which top-k's predicted step is slower than dense's, or None."""
    w = 2
    while w <= max_world:
        tk = total(predict("topk", n, density, w, link, rates, shared_cores=shared_cores))
        dn = total(predict("dense", n, density, w, link, rates, shared_cores=shared_cores))
        if tk > dn:
            return w
        w *= 2
    return None


def sharing(world: int, cores: int | None) -> tuple[int, float]:
    """How ``world`` ranks share ``cores`` cores (the emulated cluster: every host on this machine's cores):
    ``(processes, stretch)``.  ``processes``: how many of them run a kernel at once (``min(world, cores)``;
    the compute rates of a prediction are to be measured with that many processes at once, which share the
    memory bandwidth and the last-level cache).  ``stretch``: how much longer each rank's compute takes
    because the ranks take turns on the cores (``world / cores`` when there are more ranks than cores).
    A rank that waits in a collective holds its share of a core as one that computes does (MPICH polls
    while it waits), so the turns are taken whether or not the other ranks compute.  ``cores`` None: a
    core per rank (a real cluster), ``(1, 1.0)``."""
    if world < 1:
        raise ValueError(f"world size {world}; it must be >= 1")
    if cores is None:
        return 1, 1.0
    if cores < 1:
        raise ValueError(f"shared cores {cores}; it must be >= 1")
    return min(world, cores), max(1.0, world / cores)


def measure_rates(n: int = 1 << 23, density: float = 0.001, repeats: int = 5, *,
                  dense_density: float = 0.01, processes: int = 1, grad: np.ndarray | None = None,
                  other: np.ndarray | None = None, timeout: float = 600.0) -> Rates:
    """Time the kernels on this machine, the fastest of ``repeats``: seconds per element.  The fastest, not
    the median: other work on the machine only slows a kernel, and the model is of the steps without it.

    ``processes``: how many processes time them at once, each on its own copies of the vectors, each
    repetition started together (a barrier), a quarter second of calls long, and its time per call the
    slowest process's, counting only the repetitions the processes did run at once (:func:`slowest`): the
    rates of ranks that share this machine's cores and memory bandwidth (``processes`` = ranks running at
    once, :func:`sharing`).  1: one process on an otherwise idle machine (a host of a real cluster).
    ``timeout``: seconds the processes may take in all (``processes`` > 1).

    ``n``: the vector size (the model's: random accesses into the output cost more the larger it is).
    ``fused``, ``topk`` and ``segmented`` are timed at ``density`` (``segmented``: DEFT's pass over 64 layers,
    all of them the rank's, then its pick, per element); ``pick`` is the exact pick of
    ``dense_density * n`` elements among the fused pass's candidates and the gather of their values, per
    selected element (what ``select`` does after the pass); ``scatter`` is the
    compiled scatter-add (:func:`mpisparse.backend.scatter_sum`, the previous set cleared, the sum scaled)
    of ``dense_density * n`` random entries; ``merge`` gTop-k's merge of two such sets.
    ``grad``: the float32 gradient to time on (``n`` is then its size; ``bench model``: the model's synthetic
    gradients, whose top-k clusters in a few layers, as the steps' does) and ``other`` another rank's
    (default: ``grad`` rolled by a seventh of its length); the scattered and merged sets are then the
    top-k of the two, else random indices of a random normal vector.  ``scatter`` scatters both sets as
    two ranks' blocks (top-k's update at W = 2), clearing the previous union, per entry."""
    if not 0 < density < dense_density <= 1:
        raise ValueError(f"densities {density} and {dense_density}; allowed: 0 < density < dense_density <= 1")
    if processes < 1:
        raise ValueError(f"processes {processes}; it must be >= 1")
    if repeats < 1:
        raise ValueError(f"repeats {repeats}; it must be >= 1")
    if grad is not None:
        n = int(np.asarray(grad).shape[0])
    args = (n, density, dense_density, repeats, grad, other)
    if processes == 1:
        times = {name: [(t1 - t0) / calls for t0, t1, calls in spans]
                 for name, spans in _kernel_times(*args, start=lambda: None).items()}
    else:
        times = slowest(_times_at_once(args, processes, timeout))
    k_hi = _selected(n, density, dense_density)[1]
    per = {"stream": n, "topk": n, "fused": n, "segmented": n, "pick": k_hi, "scatter": 2 * k_hi, "merge": 2 * k_hi}
    return rates_from_times(times, per)


def rates_from_times(times: dict[str, list[float]], per: dict[str, int]) -> Rates:
    """:class:`Rates` from each kernel's seconds per repetition and the elements one repetition handles:
    the fastest repetition (other work on the machine only slows a kernel) per element."""
    missing = sorted(set(times) - set(per))
    if missing:
        raise ValueError(f"kernels {missing} have no element count; allowed: {', '.join(sorted(per))}")
    return Rates(**{name: float(np.min(ts)) / per[name] for name, ts in times.items()})


def slowest(runs: list[dict[str, list[tuple[float, float, int]]]], *,
            overlap: float = 0.5) -> dict[str, list[float]]:
    """Per kernel, the seconds per call of the repetitions the processes ran at once: each repetition's
    slowest process.  ``runs``: per process, kernel -> ``(start, end, calls)`` of each repetition (one clock
    for all processes).  A repetition counts when the processes' spans overlap by at least ``overlap`` of
    the shortest one; on a busy machine a process started together with the others may run after them, at
    nearly its rate alone.  If no repetition of a kernel counts, all do (the machine gave no better)."""
    if not runs:
        raise ValueError("no process reported kernel times")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap {overlap}; allowed: [0, 1]")
    out: dict[str, list[float]] = {}
    for key, first in runs[0].items():
        lens = {len(r[key]) for r in runs}
        if len(lens) != 1:
            raise ValueError(f"kernel {key}: the processes timed {sorted(lens)} repetitions; they must agree")
        every, together = [], []
        for i in range(len(first)):
            spans = [r[key][i] for r in runs]
            longest = max((t1 - t0) / calls for t0, t1, calls in spans)
            shortest = min(t1 - t0 for t0, t1, _ in spans)
            shared = min(t1 for _, t1, _ in spans) - max(t0 for t0, _, _ in spans)
            every.append(longest)
            if shared >= overlap * shortest:
                together.append(longest)
        out[key] = together or every
    return out


def _times_at_once(args: tuple, processes: int, timeout: float, window: float = 0.25) -> list[dict]:
    """:func:`_kernel_times` in ``processes`` forked processes at once, each repetition behind a barrier and
    ``window`` seconds of calls long (a process that wakes from the barrier late still overlaps the
    others for most of it)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")  # the children inherit the compiled kernels and the gradients
    barrier = ctx.Barrier(processes)
    queue = ctx.Queue()

    def child(i: int) -> None:
        try:
            queue.put((i, _kernel_times(*args, start=lambda: barrier.wait(timeout), window=window)))
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises)
            barrier.abort()
            queue.put((i, f"{type(exc).__name__}: {exc}"))

    procs = [ctx.Process(target=child, args=(i,), daemon=True) for i in range(processes)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=timeout) for _ in procs]
    except Exception:  # queue.Empty: a process hung or died
        raise RuntimeError(f"timing the kernels in {processes} processes at once took over {timeout:.0f} s "
                           "or a process died") from None
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    errors = [r for _, r in results if isinstance(r, str)]
    if errors:
        raise RuntimeError(f"timing the kernels in {processes} processes at once failed: {errors[0]}")
    return [r for _, r in sorted(results, key=lambda x: x[0])]


def _selected(n: int, density: float, dense_density: float) -> tuple[int, int]:
    """``k`` at ``density`` and at ``dense_density`` (at least ``k + 1``) for a vector of ``n``."""
    k = max(1, int(density * n))
    return k, max(k + 1, int(dense_density * n))


def _kernel_times(n: int, density: float, dense_density: float, repeats: int, grad, other, *,
                  start, window: float = 0.0) -> dict[str, list[tuple[float, float, int]]]:
    """``(start, end, calls)`` of each repetition of each kernel (:func:`measure_rates`;
    ``time.perf_counter``, one clock for all processes on Linux), each started after ``start()``: one call,
    or (``window`` > 0) as many calls as fill ``window`` seconds.  Works on its own copies of the vectors."""
    from .. import backend
    from ..backend import compiled_compensate
    from ..backend import fused as fused_mod
    from ..backend import numpy_segment_topk as nst
    from ..backend import numpy_select as nk
    from ..schemes.gtopk import merge_topk

    rng = np.random.default_rng(0)
    if grad is not None:
        g = np.array(grad, dtype=np.float32)  # a copy: each process streams its own vectors
        e = (g * np.float32(0.1)).astype(np.float32)
    else:
        g = rng.standard_normal(n).astype(np.float32)
        e = (rng.standard_normal(n) * 0.1).astype(np.float32)
    k, k_hi = _selected(n, density, dense_density)

    def timed(fn) -> list[tuple[float, float, int]]:
        fn()  # a first call (compiled kernels, buffers) is not timed
        spans = []
        for _ in range(repeats):
            start()
            t0 = t1 = time.perf_counter()
            calls = 0
            while calls == 0 or t1 - t0 < window:
                fn()
                calls += 1
                t1 = time.perf_counter()
            spans.append((t0, t1, calls))
        return spans

    def pick_once() -> None:  # the select phase after the fused pass: the exact k among the candidates, values
        idx = fused_mod.topk_from_candidates(e, cand, k_hi)
        e[idx]

    out: dict[str, list[tuple[float, float, int]]] = {}
    out["stream"] = timed(lambda: np.add(e, g, out=e))
    out["topk"] = timed(lambda: nk.topk_abs(e, k))
    out["fused"] = timed(lambda: fused_mod.topk_from_candidates(e, fused_mod.compensate_candidates(e, g, k), k))
    found = fused_mod.compensate_candidates(e, g, k_hi)
    cand = None if found is None else found.copy()  # (the pass's buffer is reused by the next call)
    out["pick"] = timed(pick_once)
    if grad is not None:  # the sets the steps scatter: a top-k of the gradients, and another rank's
        g2 = np.roll(g, n // 7) if other is None else np.ascontiguousarray(other, dtype=np.float32)
        idx = nk.topk_abs(g, k_hi).astype(backend.index_dtype(n))
        oth = nk.topk_abs(g2, k_hi).astype(idx.dtype)
    else:
        idx = rng.choice(n, size=k_hi, replace=False).astype(backend.index_dtype(n))
        oth = rng.choice(n, size=k_hi, replace=False).astype(idx.dtype)
    both = [np.concatenate((idx, oth)), np.concatenate((oth, idx))]  # two steps: the blocks swap places
    prev = [idx[:0]]
    dense_out = np.zeros(n, dtype=np.float32)
    vals = np.concatenate((g[:k_hi], g[-k_hi:]))

    def scatter_once() -> None:
        sets = both[0] if prev[0] is not both[0] else both[1]
        backend.scatter_sum(dense_out, sets, vals, [k_hi, k_hi], 0.5, clear=prev[0])
        prev[0] = sets

    out["scatter"] = timed(scatter_once)
    mine, theirs, v1 = np.sort(idx), np.sort(oth), vals[:k_hi]
    out["merge"] = timed(lambda: merge_topk(mine, v1, theirs, g[-k_hi:], k_hi))
    layers = 64
    starts = np.arange(layers, dtype=np.int64) * (n // layers)
    sizes = np.full(layers, n // layers, dtype=np.int64)
    ks = np.maximum(1, (sizes * density).astype(np.int64))
    every = np.arange(layers, dtype=np.int64)
    sizing = nst._segc_sizing()

    def deft_pass() -> None:  # every layer the rank's: what DEFT's pass does in its own layers
        got = compiled_compensate.compensate_norms_candidates(e, g, starts, sizes, every, ks, sizing, 0)
        if got is None:  # the plain steps (no numba): e += g, the norms, the segmented top-k
            np.add(e, g, out=e)
            backend.segment_norms(e, starts, sizes)
        elif got[1] is not None:
            compiled_compensate.take_candidates(got[1], ks)
            return
        nst.segment_topk_abs(e, starts, sizes, ks)

    out["segmented"] = timed(deft_pass)
    return out


def loaded_rates(alone: Rates, at_once: Rates, floor: float) -> Rates:
    """The rates of a step whose own job timed its memory passes at ``floor`` seconds per element
    (``bench step --floor``: one ``e += g`` on every rank at once, each rank's share of the cores taken out,
    :func:`sharing`).  A roofline: ``stream`` is that pass; ``fused`` and ``segmented`` (DEFT's pass) read and
    write the same vectors and do more per element, so each takes the longer of the floor and its rate
    ``alone`` (bandwidth-bound on a loaded machine, compute-bound on a quiet one); every other kernel keeps
    its rate ``at_once`` (the
    read-only passes move a third of the bytes; pick, scatter and merge wait on cache misses, not on
    bandwidth).  A shared machine's memory passes run up to twice as fast at one moment as at the next:
    the floor is the speed of the step's own moment."""
    if not floor > 0:
        raise ValueError(f"floor is {floor} s per element; it must be > 0")
    return replace(at_once, stream=floor, fused=max(alone.fused, floor), segmented=max(alone.segmented, floor))


def rates_dict(r: Rates) -> dict[str, float]:
    """The per-element rates of ``r`` by kernel (its fixed costs per call: ``r.per_call``)."""
    return {name: getattr(r, name) for name in KERNELS}
