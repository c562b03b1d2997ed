"""A cost model of one data-parallel step: per-phase time for any world size.

Pure functions: :func:`predict` takes the vector size ``n``, the density,
the world size ``W``, a :class:`Link` (latency and bandwidth of a host's
link) and :class:`Rates` (seconds per element of the compute kernels,
measured on this machine by :func:`measure_rates`), and returns the
predicted seconds of each phase of one step of a scheme.  ``mpisparse
bench model`` tabulates it for W up to 1,024 (:mod:`mpisparse.bench.model`).

The communication terms are the textbook costs of the collectives each
scheme calls (``a`` the link latency, ``b`` seconds per byte, ``m`` the
message bytes):

=============  ================================================  =========================
collective     time                                              used by
=============  ================================================  =========================
Allreduce      2 log2(W) a + 2 (W-1)/W m b (halving/doubling)    dense (n), cltk, deft (k)
Allgatherv     log2(W) a + (W-1) m b (m per rank)                topk (k indices, k values)
Bcast          log2(W) (a + m b) (binomial tree, small m)         cltk (k indices)
pairwise       log2(W) (a + m b) per exchanged set                gtopk (k indices + values)
=============  ================================================  =========================

Compute: compensation and selection stream over the ``n`` elements at the
measured rates; DEFT selects over its share of the layers, ``n / W`` times
the partition's imbalance; the update scatters the received entries (top-k:
up to ``W k``, the build-up, estimated as ``min(n, W k)`` distinct); dense
scales ``n``.  ``shared_cores``: when the ranks share fewer cores than
there are ranks (the emulated cluster: every host on this machine's cores),
compute phases stretch by ``W / shared_cores``.

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
    scatter: float  # one received (index, value) added into the dense output
    segmented: float  # DEFT's per-layer top-k over a rank's layers, per element


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
    if scheme == "dense":
        comp = {"compensate": 0.0, "select": 0.0, "update": rates.stream * n}
        m = 4 * n
        comm = 2 * lg * a + 2 * (W - 1) / W * m * b
    elif scheme == "topk":
        comp = {"compensate": rates.fused * n, "select": 0.0, "update": rates.scatter * min(n, W * k)}
        comm = 3 * lg * a + (W - 1) * k * (_INDEX_BYTES + _VALUE_BYTES) * b
    elif scheme == "cltk":
        comp = {"compensate": rates.fused * n, "select": 0.0, "update": rates.scatter * k}
        comm = lg * (a + k * _INDEX_BYTES * b) + 2 * lg * a + 2 * (W - 1) / W * k * _VALUE_BYTES * b
    elif scheme == "deft":
        share = n * min(1.0, imbalance / W)
        comp = {"compensate": rates.stream * n, "select": rates.segmented * share, "update": rates.scatter * k}
        comm = (2 * lg * a + (W - 1) / W * k * _INDEX_BYTES * b
                + 2 * lg * a + 2 * (W - 1) / W * k * _VALUE_BYTES * b)
    else:  # gtopk
        comp = {"compensate": rates.fused * n, "select": rates.scatter * 2 * k * lg, "update": rates.scatter * k}
        comm = lg * 2 * (a + k * (_INDEX_BYTES + _VALUE_BYTES) * b)
    out = {p: v * stretch for p, v in comp.items()}
    out["exchange"] = comm if W > 1 else 0.0
    return out


def fit_link(points: list[tuple[int, int, float]]) -> Link:
    """A :class:`Link` from ``(world, k, seconds)`` of top-k exchanges (``bench exchange``, one W, several
    densities): least squares of ``t = 3 log2(W) a + (W - 1) k 8 b`` over the points."""
    if len(points) < 2:
        raise ValueError(f"fitting a link needs top-k exchanges at 2 or more densities; got {len(points)}")
    A = np.array([[3 * _log2(w), (w - 1) * k * (_INDEX_BYTES + _VALUE_BYTES)] for w, k, _ in points], dtype=float)
    t = np.array([s for _, _, s in points], dtype=float)
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
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


def measure_rates(n: int = 1 << 23, density: float = 0.001, repeats: int = 3) -> Rates:
    """Time the kernels on this machine (one thread), median of ``repeats``: seconds per element."""
    from .backend import fused as fused_mod
    from .backend import numpy_kernels as nk

    rng = np.random.default_rng(0)
    g = rng.standard_normal(n).astype(np.float32)
    e = (rng.standard_normal(n) * 0.1).astype(np.float32)
    k = max(1, int(density * n))

    def med(fn) -> float:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    stream = med(lambda: np.add(e, g, out=e)) / n
    topk = med(lambda: nk.topk_abs(e, k)) / n
    fused = med(lambda: fused_mod.compensate_topk(e, g, k)) / n
    idx = rng.integers(0, n, size=k)
    out = np.zeros(n, dtype=np.float32)
    vals = g[:k].copy()

    def scatter_once() -> None:
        out[idx] += vals

    scatter = med(scatter_once) / k
    layers = 64
    starts = np.arange(layers, dtype=np.int64) * (n // layers)
    sizes = np.full(layers, n // layers, dtype=np.int64)
    ks = np.maximum(1, (sizes * density).astype(np.int64))
    segmented = med(lambda: nk.segment_topk_abs(e, starts, sizes, ks)) / n
    return Rates(stream=stream, topk=topk, fused=fused, scatter=scatter, segmented=segmented)


def rates_dict(r: Rates) -> dict[str, float]:
    return asdict(r)
