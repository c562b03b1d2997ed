"""What a reproduce target is, the context it runs in, and its claim-vs-measured report.

A :class:`Target` names one paper's claim (a figure or table), runs the
``mpisparse`` jobs that measure it through :meth:`Context.run` (each one a
subprocess whose command line is printed first, see
:mod:`mpisparse.bench.runs`) and returns a :class:`Report`: detail tables of
what was measured and a list of :class:`Claim` rows -- the paper's claim,
quoted or paraphrased with its figure/table number, the paper's value, the
measured value, and whether the measurement agrees.

Sizes: ``full`` (a cluster run: the paper's models, more ranks), ``quick``
(``--quick``: a few minutes on two cores) and ``tiny`` (``--quick`` with
``MPISPARSE_QUICK=1``: the smallest form, for CI).  A target picks its
parameters with :meth:`Context.pick`.

A target's ``evaluate``-style helpers are pure functions of the loaded JSON
results, so the tests check them without MPI.

Time claims are judged by :func:`time_verdict`: medians of repeated jobs,
and a noise band that is the larger of a fixed fraction
(:data:`TIME_MARGIN`) and the medians' uncertainty (:data:`SPREAD_FACTOR`
times the repeats' median absolute deviations over the square root of their
number); a difference inside the band is
``noise``, not a verdict that flips from run to run.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from ..bench.runs import SubRun, display_command, emucluster_status, run_subrun

__all__ = ["Claim", "Context", "Report", "Target", "Skip", "SIZES", "TIME_MARGIN", "SPREAD_FACTOR", "TimeVerdict",
           "all_hold", "format_claims", "claims_markdown", "fmt_series", "machine_info", "median", "median_error",
           "median_of_repeats", "noise_rule", "samples", "spread", "time_claim", "time_less", "time_verdict"]

SIZES = ("full", "quick", "tiny")

# The papers the targets reproduce (a target's ``seed``).
DCT = "DCT (Gupta et al.)"
DEFT = "DEFT (Yoon & Oh, ICPP 2023)"
SCALECOM = "ScaleCom (Chen et al., NeurIPS 2020)"
SLIM_DP = "Slim-DP (Sun et al., AAAI 2018)"
DGS = "DGS (Yan et al., slides)"

#: the Python packages a target that trains models needs (``mpisparse train``)
TRAINING = ("torch", "sklearn")


class Skip(Exception):
    """The target cannot run here (a scheme or package is missing); the message says why."""


@dataclass
class Claim:
    """One row of the claim-vs-measured table."""

    source: str  # "Fig. 1", "Table 1", "Sec. 3.4"
    claim: str  # the paper's claim, quoted or paraphrased
    paper: str  # the paper's value(s)
    measured: str  # what this run measured
    holds: bool | None  # None: not comparable (e.g. another W than the paper's), or within noise
    note: str = ""
    #: a time comparison too close to call on this machine (``holds`` is then None)
    within_noise: bool = False

    @property
    def verdict(self) -> str:
        """``yes``, ``no``, ``n/a`` or ``noise`` (a time comparison within its noise band, :func:`time_verdict`)."""
        return "noise" if self.within_noise else holds_text(self.holds)


#: two medians of times closer than this (relative to the larger) are "within noise" on a shared machine
TIME_MARGIN = 0.10
#: ... and closer than this many times the medians' uncertainty (:func:`median_error` of each side, summed)
SPREAD_FACTOR = 3.0


def median(values: Sequence[float]) -> float:
    """The median of repeated measurements (the middle one, or the mean of the middle two)."""
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("median of no values")
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def median_of_repeats(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """The first of ``rows`` (the same point measured by repeated jobs) with each of ``keys`` it has
    replaced by the median over the rows; the repeats are kept as ``<key>_samples`` (:func:`samples`)."""
    row = dict(rows[0])
    if len(rows) > 1:
        for key in (k for k in keys if k in row):
            row[key + "_samples"] = [r[key] for r in rows]
            row[key] = median(row[key + "_samples"])
    return row


def samples(row: dict[str, Any], key: str) -> list[float]:
    """The repeated measurements of ``key`` in a row of :func:`median_of_repeats` (its one value if not
    repeated)."""
    return list(row.get(key + "_samples", [row[key]]))


def _values(x: float | Sequence[float]) -> list[float]:
    return [float(v) for v in x] if isinstance(x, Sequence) else [float(x)]


def spread(values: float | Sequence[float]) -> float:
    """How much repeats disagree: their median absolute deviation from their median (0 for one value).

    One outlier among three repeats does not move it (a burst of load during
    one job), unlike the range.
    """
    v = _values(values)
    m = median(v)
    return median([abs(x - m) for x in v])


def median_error(values: float | Sequence[float]) -> float:
    """How far the median of repeats may be off: their :func:`spread` over the square root of their number.

    It shrinks as repeats are added, so a real difference that one job's
    noise hides is judged once there are enough jobs (the spread itself does
    not shrink).
    """
    v = _values(values)
    return spread(v) / math.sqrt(len(v))


@dataclass(frozen=True)
class TimeVerdict:
    """The verdict of one comparison "time a < time b" and the numbers it rests on."""

    holds: bool | None  # None: within noise
    a: float  # median of a's repeats
    b: float  # median of b's repeats
    band: float  # the difference of the medians must exceed this to be judged

    @property
    def within_noise(self) -> bool:
        return self.holds is None

    def text(self) -> str:
        """``5.1 vs 4.2: differ by 0.9, noise band 0.51`` (the medians)."""
        return f"{self.a:.3g} vs {self.b:.3g}: differ by {abs(self.a - self.b):.2g}, noise band {self.band:.2g}"


def time_verdict(a: float | Sequence[float], b: float | Sequence[float], *,
                 margin: float = TIME_MARGIN) -> TimeVerdict:
    """"Time ``a`` < time ``b``" judged on the medians of the repeats, with a noise band.

    The band is the larger of ``margin`` of the larger median and
    :data:`SPREAD_FACTOR` times the medians' uncertainty (:func:`median_error`
    of ``a`` plus that of ``b``: the repeats' spread over the square root of
    their number): two medians closer than that are too close to call
    (``holds`` None), so a verdict does not flip with the machine's noise; the
    noisier the repeats the wider the band, the more repeats the narrower.  A
    single value has no spread (only ``margin`` applies).
    """
    va, vb = _values(a), _values(b)
    ma, mb = median(va), median(vb)
    band = max(margin * max(abs(ma), abs(mb)), SPREAD_FACTOR * (median_error(va) + median_error(vb)))
    holds = None if abs(ma - mb) <= band else ma < mb
    return TimeVerdict(holds, ma, mb, band)


def time_less(a: float | Sequence[float], b: float | Sequence[float], *,
              margin: float = TIME_MARGIN) -> tuple[bool | None, bool]:
    """The verdict of "time ``a`` < time ``b``" from repeats: ``(holds, within_noise)`` (see :func:`time_verdict`)."""
    v = time_verdict(a, b, margin=margin)
    return v.holds, v.within_noise


def all_hold(verdicts: Sequence[TimeVerdict]) -> bool | None:
    """Several comparisons that must all hold: False if any clearly fails, True if all clearly hold, else None."""
    hs = [v.holds for v in verdicts]
    if any(h is False for h in hs):
        return False
    return True if hs and all(hs) else None


def noise_rule(margin: float = TIME_MARGIN) -> str:
    """The words of the noise band, for a claim's note."""
    return (f"medians of the repeats compared; closer than the noise band (the larger of {margin:.0%} of the "
            f"larger median and {SPREAD_FACTOR:g}x the medians' uncertainty: the repeats' median absolute "
            "deviation over the square root of their number, both sides added) is 'noise'")


#: the note of a time claim that ``--no-timing`` leaves unjudged
NOT_TIMED = ("not judged: run with --no-timing (a shared or busy machine), so no time comparison is made; the "
             "measured times are shown for the record")


def time_claim(source: str, claim: str, paper: str, measured: str, a, b, *, note: str = "",
               margin: float = TIME_MARGIN, a_name: str = "a") -> Claim:
    """A :class:`Claim` whose rule is "time ``a`` < time ``b``" with a noise band (:func:`time_verdict`).

    ``b`` may be a dict of named repeats (``{"topk": [...], "cltk": [...]}``):
    then ``a`` must be below every one of them (:func:`all_hold`).
    """
    bs = b if isinstance(b, dict) else {"": b}
    verdicts = {name: time_verdict(a, x, margin=margin) for name, x in bs.items()}
    holds = all_hold(list(verdicts.values()))
    judged = "; ".join((f"against {name} " if name else "") + v.text() for name, v in verdicts.items())
    rule = (f"holds = the median of {a_name} below {'each of ' + ', '.join(bs) if len(bs) > 1 else 'b'} by more than "
            f"the noise band, 'no' if {'any is' if len(bs) > 1 else 'it is'} clearly above; "
            f"{noise_rule(margin)}. Here: {judged}")
    return Claim(source, claim, paper, measured, holds, note=f"{note}; {rule}" if note else rule,
                 within_noise=holds is None)


def paired_time_claim(source: str, claim: str, paper: str, measured: str, a: Sequence[float],
                      b: dict[str, Sequence[float]], *, note: str = "", margin: float = TIME_MARGIN,
                      a_name: str = "a") -> Claim:
    """A :class:`Claim` whose rule is "time ``a`` < each time of ``b``", judged job by job: ``a[j] / b[name][j]``
    (the same job's two times, which share that job's load on the machine) against 1, medians with a noise band
    (:func:`time_verdict`).  ``a`` and each of ``b`` hold one time per job, in the same order."""
    verdicts = {}
    for name, x in b.items():
        if len(x) != len(a) or not all(v > 0 for v in x):
            raise ValueError(f"paired times need one positive time per job on both sides; {name} has {len(x)}, "
                             f"{a_name} {len(a)}")
        verdicts[name] = time_verdict([ai / xi for ai, xi in zip(a, x)], [1.0], margin=margin)
    holds = all_hold(list(verdicts.values()))
    judged = "; ".join(f"{a_name} / {name} {v.text()}" for name, v in verdicts.items())
    rule = (f"holds = {a_name} over each of {', '.join(b)}, job by job (the same job's runs share the machine's "
            f"load), below 1 by more than the noise band, 'no' if any is clearly above 1; {noise_rule(margin)}. "
            f"Here: {judged}")
    return Claim(source, claim, paper, measured, holds, note=f"{note}; {rule}" if note else rule,
                 within_noise=holds is None)


@dataclass
class Report:
    target: str
    title: str
    seed: str
    size: str
    claims: list[Claim] = field(default_factory=list)
    #: (title, text table) pairs printed before the claims
    details: list[tuple[str, str]] = field(default_factory=list)
    #: measured numbers behind the claims (written to --json)
    data: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    network: str = ""
    skipped: str | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "title": self.title, "seed": self.seed, "size": self.size,
                "network": self.network, "machine": machine_info(), "commands": self.commands,
                "claims": [asdict(c) for c in self.claims], "details": [{"title": t, "table": x}
                                                                        for t, x in self.details],
                "data": self.data, "notes": self.notes, "skipped": self.skipped, "seconds": self.seconds,
                "provenance": _provenance()}


def _provenance() -> dict[str, Any]:
    from ..results.provenance import local_provenance

    return local_provenance()


def machine_info() -> dict[str, Any]:
    """The machine the driver runs on (the MPI library read without starting MPI)."""
    info: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(),
                            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        from mpi4py import MPI

        info["mpi"] = MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - informational only
        info["mpi"] = "unknown"
    return info


class Context:
    """Where a target runs: size, output directory, time limit, world sizes, network, printing."""

    def __init__(self, *, size: str = "quick", out_dir: str | Path, timeout: int = 900,
                 worlds: Sequence[int] | None = None, max_world: int | None = None, emucluster: str = "auto",
                 stream: bool = False, echo: Callable[[str], None] = print, timing: bool = True):
        if size not in SIZES:
            raise ValueError(f"size is {size!r}; allowed: {', '.join(SIZES)}")
        self.size = size
        self.out_dir = Path(out_dir)
        self.timeout = int(timeout)
        self.worlds_given = list(worlds) if worlds else None
        self.max_world = max_world
        self.emucluster = emucluster
        self.stream = stream
        self.echo = echo
        #: False (``--no-timing``): leave out the runs whose claims are only timings, and judge no time claim
        #: (a shared or busy machine)
        self.timing = bool(timing)
        self.commands: list[str] = []

    # ------------------------------------------------------------ parameters
    def pick(self, full: Any, quick: Any, tiny: Any = None) -> Any:
        """The value for this size (``tiny`` defaults to ``quick``)."""
        return {"full": full, "quick": quick, "tiny": quick if tiny is None else tiny}[self.size]

    def worlds(self, default: Sequence[int]) -> list[int]:
        """``--worlds`` if given; with ``-n W`` the defaults below W, then W; else the defaults."""
        if self.worlds_given:
            return list(self.worlds_given)
        if self.max_world is not None:
            return [w for w in default if w < self.max_world] + [self.max_world]
        return list(default)

    def world(self, default: int) -> int:
        """A single world size: the largest of :meth:`worlds`."""
        return max(self.worlds([default]))

    def network(self, rate: str, *, auto: bool) -> tuple[str | None, str]:
        """``(emucluster rate or None, description)`` for the runs a target wants network-bound.

        ``--emucluster off`` never uses it; ``--emucluster RATE`` always
        (at RATE); ``auto`` uses it at ``rate`` when ``auto`` is set and it
        is available.
        """
        mode = self.emucluster
        if mode == "off":
            return None, "shared memory (--emucluster off)" + self._shm_suffix()
        ok, why = emucluster_status()
        if mode != "auto":
            if not ok:
                raise Skip(f"--emucluster {mode}: {why}")
            return mode, f"emulated cluster: one rank per host, links of {mode} each way (bin/emucluster)"
        if auto and ok:
            return rate, f"emulated cluster: one rank per host, links of {rate} each way (bin/emucluster)"
        if auto:
            return None, f"shared memory, no emulated cluster ({why})" + self._shm_suffix()
        return None, "shared memory" + self._shm_suffix()

    @staticmethod
    def _shm_suffix() -> str:
        return f", {os.cpu_count()} cores"

    # ------------------------------------------------------------------ runs
    def path(self, name: str, ext: str) -> Path:
        """Where a run's extra output goes (``OUT/name.ext``), e.g. a ``--csv`` log."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir / f"{name}.{ext}"

    def run(self, command: Sequence[str], options: Sequence[str], *, name: str, n: int | None = None,
            rate: str | None = None, env: dict[str, str] | None = None) -> Any:
        """Run ``mpisparse COMMAND [-n N] OPTIONS --json OUT/name.json``; print its command line; its JSON."""
        path = self.out_dir / f"{name}.json"
        run = SubRun(list(command), list(options) + ["--json", str(path)], n=n, json_path=path,
                     emucluster_rate=rate, label=name,
                     env=dict(env) if env is not None else {"OMP_NUM_THREADS": "1"})
        line = display_command(run, self.timeout)
        self.commands.append(line)
        self.echo(f"$ {line}")
        t0 = time.perf_counter()
        out = run_subrun(run, timeout=self.timeout, stream=self.stream)
        self.echo(f"  done in {time.perf_counter() - t0:.1f} s")
        return out.result


class Target:
    """One paper's claim: :func:`mpisparse.reproduce.registry.register` sets the class attributes,
    a subclass implements :meth:`run`."""

    name: ClassVar[str] = "abstract"
    title: ClassVar[str] = ""
    seed: ClassVar[str] = ""  # the paper: one of DCT, DEFT, SCALECOM, SLIM_DP, DGS below
    sources: ClassVar[str] = ""  # "Fig. 1"
    #: schemes that must be registered
    requires_schemes: ClassVar[tuple[str, ...]] = ()
    #: Python packages the underlying runs need (``train`` needs torch and scikit-learn)
    requires_modules: ClassVar[tuple[str, ...]] = ()

    def check(self) -> None:
        """Raise :class:`Skip` naming what is missing."""
        from ..schemes import SCHEMES

        missing = [s for s in self.requires_schemes if s not in SCHEMES]
        if missing:
            many = len(missing) > 1
            raise Skip(f"scheme{'s' if many else ''} {', '.join(repr(m) for m in missing)} "
                       f"{'are' if many else 'is'} not registered in this installation (mpisparse/schemes/); "
                       f"{self.name} runs once {'they exist' if many else 'it exists'}")
        import importlib.util

        for m in self.requires_modules:
            if importlib.util.find_spec(m) is None:
                raise Skip(f"{self.name} trains models: the Python package {m!r} is missing "
                           "(pip install '.[train]')")

    def run(self, ctx: Context) -> Report:
        raise NotImplementedError

    def claims(self, data: dict[str, Any], network: str = "") -> list[Claim]:
        """The claim rows from a report's ``data`` (what :meth:`run` measured) and its network description.

        A pure function of recorded numbers: :meth:`run` calls it on what it
        just measured, and the tests call it on saved reports
        (``tests/data/reproduce/``), so a rule cannot change unnoticed.
        """
        raise NotImplementedError

    def report(self, ctx: Context, **kw: Any) -> Report:
        return Report(target=self.name, title=self.title, seed=self.seed, size=ctx.size, **kw)


# --------------------------------------------------------------------------- formatting
def fmt_series(values: Sequence[float], labels: Sequence[Any], fmt: str = "{:.4f}", prefix: str = "W=") -> str:
    """``0.0100 (W=1), 0.0174 (W=2)``."""
    return ", ".join(f"{fmt.format(v)} ({prefix}{lab})" for v, lab in zip(values, labels))


def holds_text(h: bool | None) -> str:
    return "n/a" if h is None else ("yes" if h else "no")


def _wrap(text: str, width: int) -> list[str]:
    out: list[str] = []
    for para in str(text).split("\n"):
        out += textwrap.wrap(para, width) or [""]
    return out


def format_claims(claims: Sequence[Claim], widths: tuple[int, int, int, int] = (10, 50, 30, 36)) -> str:
    """The claim-vs-measured table, cells wrapped to ``widths`` (source, claim, paper, measured)."""
    heads = ("source", "paper's claim", "paper", "measured", "holds")
    w = list(widths) + [5]
    sep = "  "
    lines = [sep.join(h.ljust(x) for h, x in zip(heads, w)).rstrip(), sep.join("-" * x for x in w)]
    for c in claims:
        cols = [_wrap(c.source, w[0]), _wrap(c.claim, w[1]), _wrap(c.paper, w[2]), _wrap(c.measured, w[3]),
                [c.verdict]]
        for i in range(max(len(col) for col in cols)):
            lines.append(sep.join((col[i] if i < len(col) else "").ljust(x) for col, x in zip(cols, w)).rstrip())
        if c.note:
            for ln in _wrap("note: " + c.note, sum(w) + len(sep) * 4 - w[0] - len(sep)):
                lines.append(" " * (w[0] + len(sep)) + ln)
        lines.append("")
    return "\n".join(lines).rstrip()


def claims_markdown(claims: Sequence[Claim]) -> str:
    """The same table in Markdown (for a README)."""
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    rows = ["| source | paper's claim | paper | measured | holds |", "| --- | --- | --- | --- | --- |"]
    for c in claims:
        measured = c.measured + (f" ({c.note})" if c.note else "")
        rows.append(f"| {cell(c.source)} | {cell(c.claim)} | {cell(c.paper)} | {cell(measured)} | "
                    f"{c.verdict} |")
    return "\n".join(rows)


def claims_summary(reports: Sequence[Report]) -> str:
    """One line counting the verdicts of every claim of ``reports``."""
    verdicts = [c.verdict for r in reports if not r.skipped for c in r.claims]
    count = {v: verdicts.count(v) for v in ("yes", "no", "noise", "n/a")}
    return (f"claims: {count['yes']} hold, {count['no']} do not, {count['noise']} within noise, "
            f"{count['n/a']} not comparable ({len(verdicts)} in all)")


def format_report(rep: Report) -> str:
    """Everything printed after the runs: details, then the claim-vs-measured table."""
    out = [f"\n== {rep.target}: {rep.title}", f"   {rep.seed}; size {rep.size}; {rep.network}"]
    if rep.skipped:
        out.append(f"SKIPPED: {rep.skipped}")
        return "\n".join(out)
    for title, table in rep.details:
        out += ["", title, table]
    if rep.notes:
        out.append("")
        out += [ln for n in rep.notes for ln in _wrap("* " + n, 110)]
    out += ["", "claim vs measured", format_claims(rep.claims)]
    out += ["", f"({rep.seconds:.0f} s; commands above, each a separate job)"]
    return "\n".join(out)


def write_report_json(path: str | Path, reports: Sequence[Report]) -> None:
    obj: Any = reports[0].to_json() if len(reports) == 1 else [r.to_json() for r in reports]
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


__all__ += ["busy_note", "busy_now", "others_running", "claims_summary", "format_report", "write_report_json",
            "holds_text", "NOT_TIMED", "unexplained", "untimed", "judge_times"]


def others_running(loadavg: str) -> int:
    """Processes running now besides the reader, from the text of ``/proc/loadavg`` (its fourth field,
    ``running/total``, counts the reader itself)."""
    return max(0, int(loadavg.split()[3].split("/")[0]) - 1)


def busy_now(readings: int = 5, interval: float = 0.1) -> float:
    """The median over ``readings`` readings, ``interval`` seconds apart, of :func:`others_running`: the
    machine's load at this moment.  (The 1-minute load average would still count the previous target's
    finished jobs.)  Where there is no ``/proc/loadavg``, the 1-minute load average."""
    seen = []
    for i in range(readings):
        try:
            with open("/proc/loadavg") as f:
                seen.append(others_running(f.read()))
        except (OSError, IndexError, ValueError):
            return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if i + 1 < readings:
            time.sleep(interval)
    return float(statistics.median(seen))


def busy_note(load: float, cores: int, claims: Sequence[Claim]) -> str | None:
    """A report note when the machine was busy as a target with time claims started: ``load``
    (:func:`busy_now`: other processes running) above its ``cores``.  Such runs widen the repeats'
    spread, so a time claim an idle machine separates may read 'noise'; None otherwise."""
    if load <= cores or not any("noise band" in c.note for c in claims):
        return None
    return (f"the machine was busy when this target started: {load:g} other processes running on {cores} cores "
            "(they share the cores with the jobs), so the time claims' repeats spread wider and a "
            "difference an idle machine separates may read 'noise'; rerun on an idle machine, or with "
            "--no-timing")


def untimed(claim: Claim) -> Claim:
    """``claim`` (a time comparison) left unjudged: ``n/a`` with :data:`NOT_TIMED` in front of its note."""
    return Claim(claim.source, claim.claim, claim.paper, claim.measured, None,
                 note=NOT_TIMED + (f"; {claim.note}" if claim.note else ""))


def judge_times(claims: Sequence[Claim], data: dict[str, Any], timed: Callable[[Claim], bool]) -> list[Claim]:
    """``claims`` as they are, or with every time claim (``timed``) unjudged when ``data["timing"]`` is False."""
    if data.get("timing", True):
        return list(claims)
    return [untimed(c) if timed(c) else c for c in claims]


def unexplained(claims: Sequence[Claim]) -> list[Claim]:
    """The claims that do not hold and carry no note saying why (each "no" must explain itself)."""
    return [c for c in claims if c.holds is False and not c.note.strip()]
