"""``mpisparse advise``: which scheme reaches the target first on a given network, and the crossover link.

Pure functions on top of the cost model (:mod:`mpisparse.bench.costmodel`): a
step of scheme ``s`` on ``W`` ranks (``hosts`` hosts, one link each) takes

    step(s) = compute + overhead(s) + exchange(s) - hidden(s)

* ``compute``: forward, backward and the local optimizer step (measured by a
  short run of the model, or given);
* ``overhead(s)``: what a step of the scheme adds to the compute besides moving bytes.  Measured
  (:func:`~mpisparse.bench.advise_measured.overheads_from`): the step of one rank alone (``advise-steps
  -n 1``: the library's gather, checks and write-back, the scheme's compensate and select, a 16-bit wire's
  casts) minus its compute, as a share of that compute, so that a loaded machine scales both alike; else the
  cost model's ``compensate``, ``select`` and ``update`` phases at the kernel rates
  (:class:`~mpisparse.bench.costmodel.Rates`), stretched by the ranks' turns on shared cores
  (:func:`~mpisparse.bench.costmodel.sharing`), which leave out the library's own cost;
* ``exchange(s)``: the cost model's exchange term at the link (its byte model, ``wire``: 16-bit values);
  powersgd and oktopk are added here (:func:`peer_phases`);
* ``hidden(s)``: for a scheme that overlaps with backward (the optimized dense baseline: dense, 16-bit
  wire, overlapped), ``min(hidden_share * exchange, window * compute)``: overlap hides a share of the
  exchange, but never more than the backward pass it runs under (``window``: backward's share of the
  compute, about 2/3 of forward + backward).  Every other scheme exchanges after backward.

Time to target: ``step(s) * steps_to_target(s)``, the steps from a ``bench tta`` JSON
(:func:`~mpisparse.bench.advise_measured.load_tta`); without one every scheme is assumed to need as many steps
as the baseline (``steps_assumed`` in the result).  The crossover (:func:`crossover_bandwidth`): the link
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

#: the optimized dense baseline's label: dense, 16-bit values on the wire, overlapped with backward
BASELINE = "dense-opt"
#: the schemes the advisor ranks (labels); ``dense`` is float32 dense exchanged after backward
ADVISE_SCHEMES = (BASELINE, "dense", "topk", "cltk", "deft", "gtopk", "powersgd", "oktopk")
#: kernel rates of this 2-core machine, 2 processes at once (docs/results/cost-model.md, ns per element)
DEFAULT_RATES = cm.Rates(stream=0.47e-9, topk=0.41e-9, fused=0.52e-9, scatter=30.92e-9, segmented=0.52e-9,
                         pick=30.00e-9, merge=18.43e-9)


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

    def __post_init__(self) -> None:
        if not self.compute >= 0:
            raise ValueError(f"compute seconds {self.compute}; it must be >= 0")
        if not 0 <= self.hidden_share <= 1:
            raise ValueError(f"hidden share {self.hidden_share}; allowed: [0, 1]")
        if not self.burst >= 0:
            raise ValueError(f"burst {self.burst} bytes; it must be >= 0")
        if self.world < 1 or self.hosts < 1 or self.world % self.hosts:
            raise ValueError(f"W = {self.world} on {self.hosts} hosts; W must be a positive multiple of hosts")


def peer_phases(scheme: str, s: Setting, link: cm.Link) -> dict[str, float]:
    """The phases of powersgd and oktopk (the cost model's other schemes: :func:`~costmodel.predict`).

    powersgd: three Allreduces (the dense layers, the P factors, the Q factors) of ``powersgd_elements``
    elements in all; its compute is the error feedback (a stream), the two products M Q and M^T P (a stream
    each at rank 1) and the update P Q^T (a stream).  oktopk: its bytes are half the paper's bound of
    ``6 k (W-1)/W`` elements (:func:`mpisparse.schemes.oktopk.oktopk_bound_bytes`), in ``W - 1`` point to
    point rounds and three small collectives; its compute is top-k's (the fused pass, the pick) plus the
    region's reduction and the update (a scatter per selected element each)."""
    from ..schemes.oktopk import oktopk_bound_bytes

    W, n, r = s.world, s.n, s.rates
    a, b = link.latency, 1.0 / link.bandwidth
    lg = math.log2(W) if W > 1 else 0.0
    stretch = cm.sharing(W, s.shared_cores)[1]
    if scheme == "powersgd":
        elements = s.powersgd_elements if s.powersgd_elements is not None else max(1, n // 100)
        comp = {"compensate": r.stream * n, "select": 2 * r.stream * n, "update": r.stream * n}
        comm = 3 * 2 * lg * a + 2 * (W - 1) / W * elements * 4 * b
    elif scheme == "oktopk":
        k = max(1, int(s.density * n))
        comp = {"compensate": r.fused * n, "select": r.pick * k, "update": 2 * r.scatter * k}
        comm = (W - 1 + 3 * lg) * a + oktopk_bound_bytes(k, W, 4 + cm.value_bytes(s.sparse_wire)) / 2 * b
    else:
        raise ValueError(f"scheme {scheme!r}: not a peer scheme; allowed: powersgd, oktopk")
    out = {p: v * stretch for p, v in comp.items()}
    out["exchange"] = comm if W > 1 else 0.0
    return out


def scheme_phases(label: str, s: Setting, link: cm.Link) -> dict[str, float]:
    """``compensate``, ``select``, ``update`` and ``exchange`` seconds of one step of ``label``.

    The link is a host's: ranks of one host share it, so with ``W / hosts`` ranks a host the bandwidth of each
    rank's share of the exchange is the link's over that many (the inter-host collectives carry every rank's
    bytes across the host's one link)."""
    per_host = s.world // s.hosts
    link = cm.Link(latency=link.latency, bandwidth=link.bandwidth / per_host)
    if label in ("powersgd", "oktopk"):
        return peer_phases(label, s, link)
    scheme, wire = ("dense", s.dense_wire) if label == BASELINE else \
        ("dense", "float32") if label == "dense" else (label, "float32" if label == "gtopk" else s.sparse_wire)
    return cm.predict(scheme, s.n, s.density, s.world, link, s.rates, shared_cores=s.shared_cores, wire=wire)


def model_bytes(label: str, s: Setting) -> float:
    """The bytes one rank sends per step of ``label`` by the byte model: the exchange's bandwidth term
    (the exchange at 1 byte/s less the exchange with no bandwidth cost) at one rank a host."""
    one = Setting(**{**_setting_fields(s), "hosts": s.world})
    slow = scheme_phases(label, one, cm.Link(latency=0.0, bandwidth=1.0))["exchange"]
    free = scheme_phases(label, one, cm.Link(latency=0.0, bandwidth=math.inf))["exchange"]
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
    free = scheme_phases(label, s, cm.Link(latency=link.latency, bandwidth=math.inf))["exchange"]
    wire = ph["exchange"] - free  # seconds the bytes take at the rank's share of the link
    measured, modelled = s.bytes_sent.get(label), model_bytes(label, s)
    if measured is not None and modelled > 0:
        wire *= measured / modelled
    if s.burst:
        rate = link.bandwidth / (s.world // s.hosts)  # a rank's share of its host's link, bytes/s
        wire = max(0.0, wire - min(s.burst / (s.world // s.hosts), s.compute * rate) / rate)
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


def advise(s: Setting, link: cm.Link, labels: Sequence[str] = ADVISE_SCHEMES) -> dict[str, Any]:
    """Every scheme's predicted step and time to target, the winner (the least time to target) and the
    crossover bandwidth (:func:`crossover_bandwidth`)."""
    rows = []
    for label in labels:
        st = step_time(label, s, link)
        steps = steps_to_target(label, s)
        rows.append({"scheme": label, **{f"{k}_seconds": v for k, v in st.items()}, "steps_to_target": steps,
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


def crossover_bandwidth(s: Setting, latency: float = 0.0, labels: Sequence[str] = ADVISE_SCHEMES, *,
                        low: float = 1e4, high: float = 1e13) -> float | None:
    """The link bandwidth (bytes/s) above which dense training reaches the target first: the optimized
    baseline, or float32 dense where that is faster (over shared memory a 16-bit wire's casts can cost more
    than its halved bytes save).  The highest change of the winner between dense and the schemes that are not
    dense, on a log scale from ``low`` to ``high``, bisected to 0.1%.  ``low``: dense wins at every bandwidth
    in range.  None: it wins at none (or there is no sparse scheme to compare)."""
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
    return out


def format_advice(res: dict[str, Any]) -> str:
    """The table, the winner and the crossover, as printed."""
    from ..results.tables import Column, format_rows

    ms = lambda v: f"{1e3 * v:,.1f}"  # noqa: E731
    base = next((r["time_to_target"] for r in res["rows"] if r["scheme"] == BASELINE), None) or 1.0
    cols = [Column("scheme", "scheme", "{}", "<"), Column("step_seconds", "step ms", ms),
            Column("compute_seconds", "compute ms", ms), Column("overhead_seconds", "scheme compute ms", ms),
            Column("exchange_seconds", "exchange ms", ms), Column("hidden_seconds", "hidden ms", ms),
            Column("steps_to_target", "steps to target", lambda v: "not reached" if v is None else f"{v:g}"),
            Column("time_to_target", "time to target", lambda v: "-" if v is None else
                   (f"{v:,.2f} s" if res["steps_assumed"] is False else f"{v / base:.3f}x {BASELINE}'s"))]
    s = res["setting"]
    title = (f"advise: n={s['n']:,}, W={s['world']} on {s['hosts']} hosts, link {_gbit(res['bandwidth'])}, "
             f"compute {1e3 * s['compute']:.1f} ms, density {s['density']}, overlap hides "
             f"{100 * s['hidden_share']:.0f}% (at most {100 * s['window']:.0f}% of compute); {BASELINE}: dense, "
             f"{s['dense_wire']} wire, overlapped")
    lines = [format_rows(res["rows"], cols, title=title)]
    if res["steps_assumed"]:
        lines.append("steps to target: not given (--tta); every scheme assumed to need as many steps as dense")
    lines.append(f"winner: {res['winner']}" + _ties_note(res))
    c = res["crossover_bandwidth"]
    lines.append("crossover: " + ("none (a sparse scheme wins on every link)" if c is None else
                                  f"dense ({BASELINE} or float32, the faster) wins above {_gbit(c)}"))
    return "\n".join(lines)


def _ties_note(res: dict[str, Any]) -> str:
    others = [t for t in res.get("ties") or [] if t != res["winner"]]
    if not others:
        return ""
    return (f" (tied at the measured overheads' {100 * res.get('tie_level', TIE_LEVEL):.0f}% interval: "
            f"{', '.join(others)})")


def _gbit(bandwidth: float) -> str:
    bits = 8 * bandwidth
    return f"{bits / 1e9:.3g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.3g} Mbit/s"
