"""``mpisparse advise``: which scheme reaches the target first on a given network, and the crossover link.

Pure functions on top of the cost model (:mod:`mpisparse.bench.costmodel`) and the exchange models
(:mod:`mpisparse.bench.netmodel`): a step of scheme ``s`` on ``W`` ranks, ``G = W / hosts`` of them a host,
takes

    step(s) = compute + overhead(s) + exchange(s) - hidden(s)

* ``compute``: forward, backward and the local optimizer step (measured by a
  short run of the model, or given);
* ``overhead(s)``: what a step of the scheme adds to the compute besides moving bytes.  Measured
  (:func:`~mpisparse.bench.advise_measured.overheads_from`): the step of one rank alone (``advise-steps
  -n 1``: the library's gather, checks and write-back, the scheme's compensate and select, a 16-bit wire's
  casts) minus its compute, as a share of that compute, so that a loaded machine scales both alike; else the
  cost model's ``compensate``, ``select`` and ``update`` phases at a device's rates
  (:class:`~mpisparse.bench.costmodel.Rates`, per element and per call: :mod:`mpisparse.bench.rates`), plus
  the table's fixed cost per step where it has one, stretched by the ranks' turns on shared cores
  (:func:`~mpisparse.bench.costmodel.sharing`);
* ``exchange(s)``: the scheme's collectives (:func:`collectives`) at the link, as the code runs them:
  ``flat`` or ``two-level`` (``--hierarchical``, for the schemes that have that form), with the bytes that
  really cross each host's NIC, and the dense baseline either as MPI runs it here or as NCCL runs it on a GPU
  cluster (``dense_exchange``; :func:`exchange_model` names the model of each row);
* ``hidden(s)``: for a scheme that overlaps with backward (the optimized dense baseline: dense, 16-bit
  wire, overlapped), ``min(hidden_share * exchange, window * compute)``: overlap hides a share of the
  exchange, but never more than the backward pass it runs under (``window``: backward's share of the
  compute, about 2/3 of forward + backward).  Every other scheme exchanges after backward.

Time to target: ``step(s) * steps_to_target(s)``, the steps from a ``bench tta`` JSON
(:func:`~mpisparse.bench.advise_measured.load_tta`); without one every scheme is assumed to need as many steps
as the baseline (``steps_assumed`` in the result).  The crossover (:func:`crossover_bandwidth`): the NIC
bandwidth above which the optimized dense baseline reaches the target first.

The winner's ties (:func:`ties`): the schemes whose measured overheads (``advise-steps -n 1``, per turn) cannot
separate them from the winner: the distribution-free 95% interval of the median of their paired per-turn
difference (:func:`median_interval`) reaches far enough to close the predicted gap.  A user reads them as "as
good as the winner, at the precision of these measurements"; the validation asks whether the measured winner is
among them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import costmodel as cm
from . import netmodel as nm
from .rates import builtin_table

#: the optimized dense baseline's label: dense, 16-bit values on the wire, overlapped with backward
BASELINE = "dense-opt"
#: the schemes the advisor ranks (labels); ``dense`` is float32 dense exchanged after backward
ADVISE_SCHEMES = (BASELINE, "dense", "topk", "cltk", "deft", "gtopk", "powersgd", "oktopk", "localsgd")
#: schemes predicted only where their steps to target are measured (``--tta``): a local-update scheme's step is
#: cheap by construction, its price is in the steps it needs, which equal steps would hide
NEED_STEPS = ("localsgd",)


def labels_for(s: "Setting") -> tuple[str, ...]:
    """The labels a prediction covers: every scheme, those of :data:`NEED_STEPS` only with measured steps."""
    return tuple(x for x in ADVISE_SCHEMES if x not in NEED_STEPS or x in s.steps)
#: kernel rates of this 2-core machine, 2 processes at once (the ``cpu`` table: docs/results/cost-model.md)
DEFAULT_RATES = builtin_table("cpu").rates
#: how a dense exchange runs: ``mpi``, as this library runs it (flat or two-level); ``nccl``, as NCCL runs it
DENSE_EXCHANGES = ("mpi", "nccl")


@dataclass(frozen=True)
class Setting:
    """What the prediction depends on besides the scheme and the link."""

    n: int  # gradient elements
    compute: float  # seconds of forward + backward + local optimizer step (the ranks' own, shared cores included)
    world: int
    hosts: int
    density: float = 0.01
    hidden_share: float = 0.35  # share of the exchange overlap hides (bench overlap's "exchange hidden")
    window: float = 2.0 / 3.0  # the most overlap can hide: this share of compute (backward's)
    dense_wire: str = "float16"
    sparse_wire: str = "float32"
    latency: float = 0.0
    rates: cm.Rates = DEFAULT_RATES
    shared_cores: int | None = None
    powersgd_elements: int | None = None  # elements one powersgd step allreduces (None: n / 100, a guess)
    steps: dict[str, float | None] = field(default_factory=dict)  # steps to target per label (None: not reached)
    #: measured step overhead per label, a share of the compute step
    #: (:func:`~mpisparse.bench.advise_measured.overheads_from`); empty: the cost model's kernel rates
    overheads: dict[str, float] = field(default_factory=dict)
    #: the same per timed turn, paired with the compute way's step of that turn
    #: (:func:`~mpisparse.bench.advise_measured.overhead_turns_from`): the noise the ties are read against;
    #: empty: no ties beyond equal predictions
    overhead_turns: dict[str, tuple[float, ...]] = field(default_factory=dict)
    #: measured bytes a rank sent per step, per label (:func:`~mpisparse.bench.advise_measured.bytes_from`);
    #: empty: the cost model's byte model
    bytes_sent: dict[str, float] = field(default_factory=dict)
    #: bytes a host's link lets through at once after it idled: a token bucket's size (tc's tbf, a cloud's
    #: burst allowance); 0: none
    burst: float = 0.0
    #: each rank's link to the other ranks of its host (NVLink, PCIe, shared memory); needed when hosts < world
    intra: cm.Link | None = None
    #: the schemes' collectives in two levels (:mod:`mpisparse.mpi.hierarchy`) where a scheme can run them so
    hierarchical: bool = False
    #: how the dense ways exchange (:data:`DENSE_EXCHANGES`)
    dense_exchange: str = "mpi"
    #: fixed seconds a step of a scheme costs beyond its kernels (launches, read backs, host work), per scheme
    #: name, from the rate table (:attr:`mpisparse.bench.rates.RateTable.step_fixed`); empty: none
    step_fixed: dict[str, float] = field(default_factory=dict)
    #: ``localsgd``'s period: its parameters are averaged (one float32 Allreduce of the model) every this many steps
    local_steps: int = 8

    def __post_init__(self) -> None:
        if not self.compute >= 0:
            raise ValueError(f"compute seconds {self.compute}; it must be >= 0")
        if not 0 <= self.hidden_share <= 1:
            raise ValueError(f"hidden share {self.hidden_share}; allowed: [0, 1]")
        if not self.burst >= 0:
            raise ValueError(f"burst {self.burst} bytes; it must be >= 0")
        if self.world < 1 or self.hosts < 1 or self.world % self.hosts:
            raise ValueError(f"W = {self.world} on {self.hosts} hosts; W must be a positive multiple of hosts")
        if self.hosts < self.world and self.intra is None:
            raise ValueError(f"W = {self.world} on {self.hosts} hosts: {self.world // self.hosts} ranks a host "
                             "need an intra-host link (intra)")
        if self.local_steps < 1:
            raise ValueError(f"local steps {self.local_steps}; it must be >= 1")
        if self.dense_exchange not in DENSE_EXCHANGES:
            raise ValueError(f"dense exchange {self.dense_exchange!r}; allowed: {', '.join(DENSE_EXCHANGES)}")


#: what each advisor label runs: ``(scheme, values' wire)`` (gtopk: float32 only)
def _scheme_wire(label: str, s: Setting) -> tuple[str, str]:
    if label == BASELINE:
        return "dense", s.dense_wire
    if label == "dense":
        return "dense", "float32"
    return label, "float32" if label in ("gtopk", "localsgd") else s.sparse_wire


def _sum(m_values: float, wire: str, W: int) -> list[tuple[str, float]]:
    """A sum over ranks of ``m_values`` bytes of ``wire`` values (:func:`mpisparse.mpi.wire.allreduce_sum`): one
    Allreduce (float32), or an Alltoallv reduce-scatter and an Allgatherv of the block sums (16-bit)."""
    if wire == "float32":
        return [("allreduce", m_values)]
    return [("alltoallv", m_values), ("allgatherv", m_values / W)]


def collectives(label: str, s: Setting) -> list[tuple[str, float]]:
    """The collectives of one step of ``label`` as the code calls them, ``(op, bytes)`` in
    :func:`mpisparse.bench.netmodel.collective`'s terms (``allgatherv``: bytes a rank; ``rounds``: that many
    message latencies, no bytes); a zero-byte op is a small message (counts, bins) that costs its latency."""

    W, n = s.world, s.n
    scheme, wire = _scheme_wire(label, s)
    vb, ib = cm.value_bytes(wire), 4
    k = max(1, int(s.density * n))
    if scheme == "dense":
        return _sum(vb * n, wire, W)
    if scheme == "topk":  # counts, indices, values: three Allgathervs
        return [("allgatherv", 0.0), ("allgatherv", ib * k), ("allgatherv", vb * k)]
    if scheme == "cltk":  # the leader's indices (Bcast), the values summed
        return [("bcast", ib * k)] + _sum(vb * k, wire, W)
    if scheme == "deft":
        from ..schemes.deft import PACK_COST  # "size": every rank packs the same bins once, no Bcast

        bins = [("bcast", 0.0)] if PACK_COST == "eq3" else []
        return bins + [("allgatherv", 0.0), ("allgatherv", ib * k / W)] + _sum(vb * k, wire, W)
    if scheme == "gtopk":
        return [("pairwise", k * (ib + vb))]
    if scheme == "powersgd":  # three Allreduces (the dense layers, P, Q): their elements in all
        elements = s.powersgd_elements if s.powersgd_elements is not None else max(1, n // 100)
        return [("allreduce", 4.0 * elements), ("allreduce", 0.0), ("allreduce", 0.0)]
    if scheme == "oktopk":  # (index, value) pairs, one message each way (mpisparse/schemes/oktopk.py):
        # the split's Alltoallv of the rank's k entries (its counts first), the Allgatherv of the probes'
        # counts (128 a rank, int64), the gather's Allgatherv of the rank's k/W of the global top-k: 2 x 8k(W-1)/W
        # bytes out, two thirds of the paper's bound 6k(W-1)/W of 4-byte elements (measured 0.67-0.70 of it)
        pair = ib + vb
        return [("alltoallv", 0.0), ("alltoallv", pair * k), ("allgatherv", 8.0 * 128), ("allgatherv", pair * k / W)]
    if scheme == "localsgd":  # one float32 Allreduce of the parameters a period (spread over its steps: _exchange)
        return [("allreduce", 4.0 * n)]
    raise ValueError(f"scheme {label!r}; allowed: {', '.join(ADVISE_SCHEMES)}")


def exchange_model(label: str, s: Setting) -> str:
    """How ``label``'s exchange runs in the prediction (:data:`mpisparse.bench.netmodel.EXCHANGES`): the dense ways
    as ``s.dense_exchange`` says (``nccl``, or this library's), every scheme ``two-level`` under
    ``s.hierarchical`` where its class can run so (gtopk and oktopk cannot: flat), else ``flat``.  The overlapped
    baseline stays flat under ``--hierarchical`` too: its buckets exchange on a plain duplicate of the
    communicator (:class:`mpisparse.torch.overlap.BucketExchange`)."""
    scheme = _scheme_wire(label, s)[0]
    if scheme == "dense" and s.dense_exchange == "nccl":
        return "nccl"
    if s.hierarchical and s.hosts < s.world and label != BASELINE:
        from ..registry import SCHEMES

        return "two-level" if SCHEMES[scheme].hierarchical else "flat"
    return "flat"


def _exchange(label: str, s: Setting, nic: cm.Link, intra: cm.Link | None) -> float:
    """Seconds of ``label``'s exchange with each host's NIC ``nic`` and the ranks' ``intra`` link."""
    if s.world == 1:
        return 0.0
    how = exchange_model(label, s)
    G = s.world // s.hosts
    t = nm.Topology(s.world, G, nic, intra if G > 1 else None, hierarchical=how == "two-level")
    if how == "nccl":
        return nm.nccl_allreduce(t, cm.value_bytes(_scheme_wire(label, s)[1]) * s.n)
    total = 0.0
    for op, m in collectives(label, s):
        total += m * t.latency if op == "rounds" else nm.collective(op, t, m)
    return total / s.local_steps if _scheme_wire(label, s)[0] == "localsgd" else total


def nic_bytes(label: str, s: Setting) -> float:
    """Bytes that leave the busiest host's NIC in one step of ``label`` (each direction), by the exchange model:
    its exchange with a 1 byte/s NIC, no latency and an unbounded intra-host link (every round then takes as long
    as its NIC's bytes); 0 on one host.  What ``bin/emucluster --stats`` counts on a host's link."""
    if s.hosts == 1:
        return 0.0
    intra = None if s.intra is None else cm.Link(latency=0.0, bandwidth=math.inf)
    return _exchange(label, s, cm.Link(latency=0.0, bandwidth=1.0), intra)


def _compute(label: str, s: Setting) -> dict[str, float]:
    """``compensate``, ``select``, ``update`` (and ``fixed``: the table's per-step cost) of one step of ``label``
    at ``s.rates``, stretched by the ranks' turns on shared cores."""
    W, n, r = s.world, s.n, s.rates
    scheme = _scheme_wire(label, s)[0]
    if scheme == "powersgd":  # the error feedback, the two products M Q and M^T P (rank 1), the update P Q^T
        comp = {"compensate": r.cost("stream", n), "select": r.cost("stream", 2 * n, calls=2),
                "update": r.cost("stream", n)}
    elif scheme == "localsgd":  # a period's parameter copy out, the average in, the scale: over its steps
        comp = {"compensate": 0.0, "select": 0.0, "update": r.cost("stream", 3 * n) / s.local_steps}
    elif scheme == "oktopk":  # top-k's pass and pick, the region's reduction and the update (a scatter each)
        k = max(1, int(s.density * n))
        comp = {"compensate": r.cost("fused", n), "select": r.cost("pick", k),
                "update": r.cost("scatter", 2 * k, calls=2)}
    else:
        comp = cm.compute_phases(scheme, n, s.density, W, r)
    fixed = s.step_fixed.get(label, s.step_fixed.get(scheme, 0.0))
    if fixed:
        comp["fixed"] = fixed
    stretch = cm.sharing(W, s.shared_cores)[1]
    return {p: v * stretch for p, v in comp.items()}


def peer_phases(scheme: str, s: Setting, link: cm.Link) -> dict[str, float]:
    """The phases of powersgd, oktopk and localsgd (:func:`scheme_phases` of the cost model's other schemes).

    powersgd: three Allreduces (the dense layers, the P factors, the Q factors) of ``powersgd_elements``
    elements in all; its compute is the error feedback (a stream), the two products M Q and M^T P (a stream
    each at rank 1) and the update P Q^T (a stream).  oktopk: two thirds of the paper's bound of
    ``6 k (W-1)/W`` 4-byte elements (:func:`mpisparse.schemes.oktopk.oktopk_bound_bytes`; :func:`collectives`)
    in two messages of (index, value) pairs and two small collectives; its compute is top-k's (the fused pass,
    the pick) plus the region's reduction and the update (a scatter per selected element each).  localsgd: one
    float32 Allreduce of the parameters and three passes over them every ``local_steps`` steps, a step's
    share of it each step (nothing overlaps: the average follows the optimizer's step)."""
    if scheme not in ("powersgd", "oktopk", "localsgd"):
        raise ValueError(f"scheme {scheme!r}: not a peer scheme; allowed: powersgd, oktopk, localsgd")
    return scheme_phases(scheme, s, link)


def scheme_phases(label: str, s: Setting, link: cm.Link) -> dict[str, float]:
    """``compensate``, ``select``, ``update`` (``fixed`` where the rate table has it) and ``exchange`` seconds of
    one step of ``label``; ``link`` is each host's NIC (its ranks reach each other over ``s.intra``)."""
    return {**_compute(label, s), "exchange": _exchange(label, s, link, s.intra)}


def model_bytes(label: str, s: Setting) -> float:
    """The bytes one rank sends per step of ``label`` by the byte model: the exchange's bandwidth term
    (the exchange at 1 byte/s less the exchange with no bandwidth cost) at one rank a host."""
    one = Setting(**{**_setting_fields(s), "hosts": s.world, "hierarchical": False})
    slow = _exchange(label, one, cm.Link(latency=0.0, bandwidth=1.0), None)
    free = _exchange(label, one, cm.Link(latency=0.0, bandwidth=math.inf), None)
    return slow - free


def _setting_fields(s: Setting) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(s, f.name) for f in fields(s)}


def exchange_time(label: str, s: Setting, link: cm.Link, phases: dict[str, float] | None = None) -> float:
    """The exchange of ``label`` at ``link``: the cost model's (:func:`scheme_phases`), its bandwidth term scaled
    to the bytes measured for the label (``s.bytes_sent``, where given: a scheme whose selected count drifts
    from k, oktopk's reused thresholds or a union that grows, then moves what it really moved), less what a
    token bucket of ``s.burst`` bytes lets through at once: the bucket refills at the link's rate while the
    ranks compute, so a step's first ``min(burst, compute x rate)`` bytes cost no time (a host's ranks share
    its bucket as they share its link).  ``phases``: :func:`scheme_phases` at ``link``, when the caller has them."""
    ph = scheme_phases(label, s, link) if phases is None else phases
    if s.world == 1 or (label not in s.bytes_sent and not s.burst):
        return ph["exchange"]
    intra = None if s.intra is None else cm.Link(latency=s.intra.latency, bandwidth=math.inf)
    free = _exchange(label, s, cm.Link(latency=link.latency, bandwidth=math.inf), intra)
    wire = ph["exchange"] - free  # seconds the bytes take on the links
    measured, modelled = s.bytes_sent.get(label), model_bytes(label, s)
    if measured is not None and modelled > 0:
        wire *= measured / modelled
    if s.burst and s.hosts > 1:  # a host's bucket, refilled at its NIC's rate
        wire = max(0.0, wire - min(s.burst, s.compute * link.bandwidth) / link.bandwidth)
    return free + wire


def step_time(label: str, s: Setting, link: cm.Link) -> dict[str, float]:
    """Predicted ``step``, ``compute``, ``overhead``, ``exchange``, ``hidden`` and ``exposed`` seconds."""
    ph = scheme_phases(label, s, link)
    exchange = exchange_time(label, s, link, ph)
    overhead = sum(v for k, v in ph.items() if k != "exchange")
    if label in s.overheads:
        overhead = s.overheads[label] * s.compute
    hidden = min(s.hidden_share * exchange, s.window * s.compute) if label == BASELINE else 0.0
    exposed = exchange - hidden
    return {"step": s.compute + overhead + exposed, "compute": s.compute, "overhead": overhead,
            "exchange": exchange, "hidden": hidden, "exposed": exposed}


def steps_to_target(label: str, s: Setting) -> float | None:
    """Steps ``label`` needs to reach the target, relative to the baseline's when no tta result names it
    (1 when none is given); None: it did not reach the target."""
    if not s.steps:
        return 1.0
    base = s.steps.get(BASELINE, s.steps.get("dense"))
    if label in s.steps:
        return s.steps[label]
    return base if base is not None else None


def advise(s: Setting, link: cm.Link, labels: Sequence[str] | None = None) -> dict[str, Any]:
    """Every scheme's predicted step and time to target (``labels``, default :func:`labels_for`), the winner
    (the least time to target) and the crossover bandwidth (:func:`crossover_bandwidth`)."""
    labels = labels_for(s) if labels is None else labels
    rows = []
    for label in labels:
        st = step_time(label, s, link)
        steps = steps_to_target(label, s)
        rows.append({"scheme": label, "exchange_model": exchange_model(label, s), "nic_bytes": nic_bytes(label, s),
                     **{f"{k}_seconds": v for k, v in st.items()}, "steps_to_target": steps,
                     "time_to_target": None if steps is None else st["step"] * steps})
    reached = [r for r in rows if r["time_to_target"] is not None]
    winner = min(reached, key=lambda r: r["time_to_target"])["scheme"] if reached else None
    best_sparse = min((r for r in reached if r["scheme"] not in (BASELINE, "dense")),
                      key=lambda r: r["time_to_target"], default=None)
    cross = crossover_bandwidth(s, link.latency, labels)
    return {"bandwidth": link.bandwidth, "latency": link.latency, "rows": rows, "winner": winner,
            "ties": ties(rows, s), "tie_level": TIE_LEVEL,
            "best_sparse": None if best_sparse is None else best_sparse["scheme"],
            "crossover_bandwidth": cross, "steps_assumed": not s.steps, "setting": _setting_dict(s)}


#: the confidence of the interval within which the measured overheads cannot separate a scheme from the winner
TIE_LEVEL = 0.95


def median_interval(d: Sequence[float], level: float = TIE_LEVEL) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of ``d``: the order statistics ``(d_(j),
    d_(n+1-j))`` (1-based, sorted) with ``j`` the largest for which ``P[Binomial(n, 1/2) < j] <= (1 - level) /
    2``.  None when ``d`` is too short to bound the median at that level (fewer than 6 values at 95%)."""
    n, x = len(d), sorted(d)
    tail, j = (1 - level) / 2, 0
    while j < n // 2 and sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n <= tail:
        j += 1
    return None if j == 0 else (x[j - 1], x[n - j])


def ties(rows: Sequence[dict[str, Any]], s: Setting) -> list[str]:
    """The winner (the least time to target of ``rows``, :func:`advise`'s) and every scheme its measured overheads
    cannot separate from it, in the rows' order.  For a scheme ``a`` and the winner ``w``, both measured per turn
    (``s.overhead_turns``), the paired differences ``d = a - w`` (shares of the compute step) bound the overhead
    gap from below by their median's interval's low end (:func:`median_interval`); ``a`` ties when its predicted
    time less ``(median(d) - low) * compute * steps`` is not above the winner's (an interval the turns cannot
    bound: it ties).  A scheme without measured turns ties only at an equal prediction."""
    import statistics

    times = {r["scheme"]: r["time_to_target"] for r in rows if r["time_to_target"] is not None}
    if not times:
        return []
    w = min(times, key=times.get)
    out = []
    for label, t in times.items():
        a, b = s.overhead_turns.get(label), s.overhead_turns.get(w)
        slack = 0.0
        if label != w and a and b and len(a) == len(b):
            d = [x - y for x, y in zip(a, b)]
            iv = median_interval(d)
            slack = math.inf if iv is None else \
                (statistics.median(d) - iv[0]) * s.compute * (steps_to_target(label, s) or 1.0)
        if label == w or t - slack <= times[w]:
            out.append(label)
    return out


def _margin(s: Setting, bandwidth: float, latency: float, labels: Sequence[str]) -> float:
    """The dense ways' time to target (the baseline's, or float32 dense's where that is less) minus the best
    other scheme's (> 0: a sparse scheme wins)."""
    link = cm.Link(latency=latency, bandwidth=bandwidth)
    times = {}
    for label in labels:
        steps = steps_to_target(label, s)
        if steps is not None:
            times[label] = step_time(label, s, link)["step"] * steps
    base = min(times.get(BASELINE, math.inf), times.get("dense", math.inf))
    others = [t for k, t in times.items() if k not in (BASELINE, "dense")]
    return base - min(others, default=math.inf)


def crossover_bandwidth(s: Setting, latency: float = 0.0, labels: Sequence[str] | None = None, *,
                        low: float = 1e4, high: float = 1e13) -> float | None:
    """The link bandwidth (bytes/s) above which dense training reaches the target first: the optimized
    baseline, or float32 dense where that is faster (over shared memory a 16-bit wire's casts can cost more
    than its halved bytes save).  The highest change of the winner between dense and the schemes that are not
    dense, on a log scale from ``low`` to ``high``, bisected to 0.1%.  ``low``: dense wins at every bandwidth
    in range.  None: it wins at none (or there is no sparse scheme to compare)."""
    labels = labels_for(s) if labels is None else labels
    if BASELINE not in labels:
        raise ValueError(f"the crossover needs the baseline {BASELINE!r} among the schemes")
    grid = [low * (high / low) ** (i / 200) for i in range(201)]
    margins = [_margin(s, bw, latency, labels) for bw in grid]
    if not math.isfinite(margins[-1]) and margins[-1] > 0:
        return None
    if margins[-1] > 0:
        return None  # a sparse scheme wins even on the fastest link
    i = len(grid) - 1
    while i > 0 and margins[i - 1] <= 0:
        i -= 1
    if i == 0:
        return low
    lo, hi = grid[i - 1], grid[i]  # margin(lo) > 0 >= margin(hi)
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if _margin(s, mid, latency, labels) > 0:
            lo = mid
        else:
            hi = mid
    return hi


def _setting_dict(s: Setting) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(s)
    out["rates"] = cm.rates_dict(s.rates)
    out["rates_per_call"] = dict(s.rates.per_call)
    return out


def format_advice(res: dict[str, Any]) -> str:
    """The table, the winner and the crossover, as printed."""
    from ..results.tables import Column, format_rows

    ms = lambda v: f"{1e3 * v:,.1f}"  # noqa: E731
    base = next((r["time_to_target"] for r in res["rows"] if r["scheme"] == BASELINE), None) or 1.0
    s = res["setting"]
    for r in res["rows"]:
        r.setdefault("exchange_model", "flat")
    cols = [Column("scheme", "scheme", "{}", "<"), Column("exchange_model", "exchange", "{}", "<"),
            Column("step_seconds", "step ms", ms),
            Column("compute_seconds", "compute ms", ms), Column("overhead_seconds", "scheme compute ms", ms),
            Column("exchange_seconds", "exchange ms", ms), Column("hidden_seconds", "hidden ms", ms),
            Column("steps_to_target", "steps to target", lambda v: "not reached" if v is None else f"{v:g}"),
            Column("time_to_target", "time to target", lambda v: "-" if v is None else
                   (f"{v:,.2f} s" if res["steps_assumed"] is False else f"{v / base:.3f}x {BASELINE}'s"))]
    G = s["world"] // s["hosts"]
    title = (f"advise: n={s['n']:,}, W={s['world']} on {s['hosts']} hosts ({G} a host), NIC "
             f"{_gbit(res['bandwidth'])}" + (f", intra-host {_gbit(s['intra']['bandwidth'])}" if s.get("intra") else "")
             + f", compute {1e3 * s['compute']:.1f} ms, density {s['density']}, overlap hides "
             f"{100 * s['hidden_share']:.0f}% (at most {100 * s['window']:.0f}% of compute); {BASELINE}: dense, "
             f"{s['dense_wire']} wire, overlapped")
    lines = [format_rows(res["rows"], cols, title=title)]
    lines.append("exchange models: " + "; ".join(f"{m}: {', '.join(v)}" for m, v in _by_model(res["rows"]).items())
                 + f" ({EXCHANGE_NOTES[s.get('dense_exchange', 'mpi')]}; {G} consecutive ranks a host"
                 + (", the bytes that cross each NIC counted)" if G > 1 else ")"))
    if res.get("rates_from"):
        lines.append(f"scheme compute: rate table {res['rates_from']}"
                     + (", with its fixed cost per step" if any(s.get("step_fixed", {}).values()) else "")
                     + (f" (replaced by the measured overheads of {res['overhead_from']})"
                        if s.get("overheads") else ""))
    if res["steps_assumed"]:
        lines.append("steps to target: not given (--tta); every scheme assumed to need as many steps as dense")
    lines.append(f"winner: {res['winner']}" + _ties_note(res))
    c = res["crossover_bandwidth"]
    lines.append("crossover: " + ("none (a sparse scheme wins on every link)" if c is None else
                                  f"dense ({BASELINE} or float32, the faster) wins above {_gbit(c)}"))
    return "\n".join(lines)


#: what the exchange-models line says about the dense ways' model
EXCHANGE_NOTES = {"mpi": "dense as this library's MPI exchange runs it",
                  "nccl": "dense as NCCL runs it: reduce-scatter in the node, the shards across nodes, allgather in "
                          "the node"}


def _by_model(rows: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["exchange_model"], []).append(r["scheme"])
    return out


def _ties_note(res: dict[str, Any]) -> str:
    others = [t for t in res.get("ties") or [] if t != res["winner"]]
    if not others:
        return ""
    return (f" (tied at the measured overheads' {100 * res.get('tie_level', TIE_LEVEL):.0f}% interval: "
            f"{', '.join(others)})")


def _gbit(bandwidth: float) -> str:
    bits = 8 * bandwidth
    if bits >= 1e12:
        return f"{bits / 1e9:,.0f} Gbit/s"
    return f"{bits / 1e9:.3g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.3g} Mbit/s"
