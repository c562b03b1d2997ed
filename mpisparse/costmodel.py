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
candidate search stream over the ``n`` elements (``fused``; DEFT's
compensation with its layer norms: ``stream``); the exact pick costs
``pick`` per selected element (the fused pass's candidates cut to ``k`` and
the values gathered; the leader's in cltk, the others wait for its Bcast);
DEFT selects over its share of the layers, ``n / W`` times the partition's
imbalance, ``segmented`` per element plus ``pick`` per element it selects;
gTop-k merges two ``k``-sets in each of its ``log2(W)`` rounds (``merge``
per merged entry); the update scatters the received entries (``scatter``
per entry, the compiled scatter-add with its clear and scale; top-k: ``W k``
entries, the build-up); dense scales ``n``.  ``shared_cores``: when the
ranks share fewer cores than there are ranks (the emulated cluster: every
host on this machine's cores), compute phases stretch by ``W / shared_cores``, and a pass over the vector
(compensation, dense's scaling) costs at least ``stream_shared`` per element
once ``W >= shared_cores``: that many passes run at once and share the
machine's memory bandwidth.

What it leaves out: overlap between phases, the wait for the slowest rank
beyond imbalance, congestion beyond one link per host, and the protocol
switch points of a real MPI (eager vs rendezvous, algorithm choice).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Link", "Rates", "SCHEMES", "crossover", "fit_link", "measure_rates", "parse_rate", "predict",
           "total"]

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


@dataclass(frozen=True)
class Rates:
    """Seconds per element of the compute kernels on one core."""

    stream: float  # one pass reading two vectors and writing one (e += g, out *= s)
    topk: float  # exact top-k of a compensated vector (whole vector, density 0.001-0.01)
    fused: float  # compensation and top-k in one pass (mpisparse/backend/fused.py), or stream + topk
    scatter: float  # one received (index, value) added into the dense output (clear and scale included)
    segmented: float  # DEFT's per-layer top-k over a rank's layers, per element
    pick: float = 0.0  # per selected element: the exact pick among the candidates and the values' gather
    merge: float = 0.0  # gTop-k: per entry of the two k-sets one round merges (union, sum, top k)
    stream_shared: float = 0.0  # ``stream`` with several passes at once sharing memory bandwidth (0: not timed)


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
            imbalance: float = 1.1, shared_cores: int | None = None) -> dict[str, float]:
    """Predicted seconds of each phase of one step of ``scheme`` (``compensate``, ``select``,
    ``exchange``, ``update``) on ``world`` ranks, one per host."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not in the cost model; allowed: {', '.join(SCHEMES)}")
    if world < 1:
        raise ValueError(f"world size {world}; it must be >= 1")
    if not 0 < density <= 1:
        raise ValueError(f"density {density}; allowed: (0, 1]")
    W, a, b = int(world), link.latency, 1.0 / link.bandwidth
    k = max(1, int(density * n))
    lg = _log2(W)
    stretch = max(1.0, W / shared_cores) if shared_cores else 1.0
    # shared cores all busy: as many passes over a vector at once, which share the memory bandwidth
    floor = rates.stream_shared if shared_cores and W >= shared_cores else 0.0
    fused, stream = max(rates.fused, floor), max(rates.stream, floor)
    if scheme == "dense":
        comp = {"compensate": 0.0, "select": 0.0, "update": stream * n}
        m = 4 * n
        comm = 2 * lg * a + 2 * (W - 1) / W * m * b
    elif scheme == "topk":
        comp = {"compensate": fused * n, "select": rates.pick * k, "update": rates.scatter * min(n, W * k)}
        comm = 3 * lg * a + (W - 1) * k * (_INDEX_BYTES + _VALUE_BYTES) * b
    elif scheme == "cltk":  # the leader's pass and pick: the others wait for them in the Bcast
        comp = {"compensate": fused * n, "select": rates.pick * k, "update": rates.scatter * k}
        comm = _bcast(k * _INDEX_BYTES, W, a, b) + 2 * lg * a + 2 * (W - 1) / W * k * _VALUE_BYTES * b
    elif scheme == "deft":
        frac = min(1.0, imbalance / W)
        comp = {"compensate": stream * n, "select": rates.segmented * n * frac + rates.pick * k * frac,
                "update": rates.scatter * k}
        from .schemes.deft import PACK_COST  # "size": every rank packs the same bins once, no Bcast
        comm = ((lg * a if PACK_COST == "eq3" else 0.0)  # the leader's bins (an int32 per layer: a short Bcast)
                + 2 * lg * a + (W - 1) / W * k * _INDEX_BYTES * b  # counts, then the indices (Allgatherv)
                + 2 * lg * a + 2 * (W - 1) / W * k * _VALUE_BYTES * b)  # the values (Allreduce)
    else:  # gtopk
        comp = {"compensate": fused * n, "select": rates.pick * k + rates.merge * 2 * k * lg,
                "update": rates.scatter * k}
        comm = lg * (2 * a + k * (_INDEX_BYTES + _VALUE_BYTES) * b)  # each round: a sendrecv, both ways at once
    out = {p: v * stretch for p, v in comp.items()}
    out["exchange"] = comm if W > 1 else 0.0
    return out


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


def measure_rates(n: int = 1 << 23, density: float = 0.001, repeats: int = 5, *,
                  dense_density: float = 0.01, concurrent: int = 1, grad: np.ndarray | None = None,
                  other: np.ndarray | None = None) -> Rates:
    """Time the kernels on this machine (one thread), median of ``repeats``: seconds per element.

    ``n``: the vector size (the model's: random accesses into the output cost more the larger it is).
    ``fused``, ``topk`` and ``segmented`` are timed at ``density``; ``pick`` is the exact pick of
    ``dense_density * n`` elements among the fused pass's candidates and the gather of their values, per
    selected element (what ``select`` does after the pass); ``scatter`` is the
    compiled scatter-add (:func:`mpisparse.backend.scatter_sum`, the previous set cleared, the sum scaled)
    of ``dense_density * n`` random entries; ``merge`` gTop-k's merge of two such sets.  ``concurrent`` > 1:
    ``stream_shared`` is the stream pass timed in that many threads at once, each over its own vectors
    (NumPy releases the GIL: the passes share only the memory bandwidth), wall seconds per element.
    ``grad``: the float32 gradient to time on (``n`` is then its size; ``bench model``: the model's synthetic
    gradients, whose top-k clusters in a few layers, as the steps' does) and ``other`` another rank's
    (default: ``grad`` rolled by a seventh of its length); the scattered and merged sets are then the
    top-k of the two, else random indices of a random normal vector.  ``scatter`` scatters both sets as
    two ranks' blocks (top-k's update at W = 2), clearing the previous union, per entry."""
    from . import backend
    from .backend import fused as fused_mod
    from .backend import numpy_kernels as nk
    from .schemes.gtopk import merge_topk

    if not 0 < density < dense_density <= 1:
        raise ValueError(f"densities {density} and {dense_density}; allowed: 0 < density < dense_density <= 1")
    rng = np.random.default_rng(0)
    if grad is not None:
        g = np.ascontiguousarray(grad, dtype=np.float32)
        n = g.shape[0]
        e = (g * np.float32(0.1)).astype(np.float32)
    else:
        g = rng.standard_normal(n).astype(np.float32)
        e = (rng.standard_normal(n) * 0.1).astype(np.float32)
    k = max(1, int(density * n))
    k_hi = max(k + 1, int(dense_density * n))

    def med(fn) -> float:
        fn()  # a first call (compiled kernels, buffers) is not timed
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    def pick_once() -> None:  # the select phase after the fused pass: the exact k among the candidates, values
        idx = fused_mod.topk_from_candidates(e, cand, k_hi)
        e[idx]

    stream = med(lambda: np.add(e, g, out=e)) / n
    topk = med(lambda: nk.topk_abs(e, k)) / n
    fused = med(lambda: fused_mod.topk_from_candidates(e, fused_mod.compensate_candidates(e, g, k), k)) / n
    found = fused_mod.compensate_candidates(e, g, k_hi)
    cand = None if found is None else found.copy()  # (the pass's buffer is reused by the next call)
    pick = med(pick_once) / k_hi
    if grad is not None:  # the sets the steps scatter: a top-k of the gradients, and another rank's
        g2 = np.roll(g, n // 7) if other is None else np.ascontiguousarray(other, dtype=np.float32)
        idx = nk.topk_abs(g, k_hi).astype(backend.index_dtype(n))
        other = nk.topk_abs(g2, k_hi).astype(idx.dtype)
    else:
        idx = rng.choice(n, size=k_hi, replace=False).astype(backend.index_dtype(n))
        other = rng.choice(n, size=k_hi, replace=False).astype(idx.dtype)
    both = [np.concatenate((idx, other)), np.concatenate((other, idx))]  # two steps: the blocks swap places
    prev = [idx[:0]]
    out = np.zeros(n, dtype=np.float32)
    vals = np.concatenate((g[:k_hi], g[-k_hi:]))

    def scatter_once() -> None:
        sets = both[0] if prev[0] is not both[0] else both[1]
        backend.scatter_sum(out, sets, vals, [k_hi, k_hi], 0.5, clear=prev[0])
        prev[0] = sets

    scatter = med(scatter_once) / (2 * k_hi)
    vals = vals[:k_hi]
    other = np.sort(other)
    mine = np.sort(idx)
    merge = med(lambda: merge_topk(mine, vals, other, g[-k_hi:], k_hi)) / (2 * k_hi)
    layers = 64
    starts = np.arange(layers, dtype=np.int64) * (n // layers)
    sizes = np.full(layers, n // layers, dtype=np.int64)
    ks = np.maximum(1, (sizes * density).astype(np.int64))
    segmented = med(lambda: nk.segment_topk_abs(e, starts, sizes, ks)) / n
    stream_shared = _stream_at_once(n, concurrent, med) if concurrent > 1 else 0.0
    return Rates(stream=stream, topk=topk, fused=fused, scatter=scatter, segmented=segmented, pick=pick,
                 merge=merge, stream_shared=stream_shared)


def _stream_at_once(n: int, threads: int, med) -> float:
    """Wall seconds per element of ``threads`` stream passes (``e += g``) run at once, one per thread."""
    import threading

    pairs = [(np.zeros(n, dtype=np.float32), np.ones(n, dtype=np.float32)) for _ in range(threads)]

    def run() -> None:
        start = threading.Barrier(threads)

        def one(e, g) -> None:
            start.wait()
            np.add(e, g, out=e)

        ts = [threading.Thread(target=one, args=p) for p in pairs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return med(run) / n


def rates_dict(r: Rates) -> dict[str, float]:
    return asdict(r)
