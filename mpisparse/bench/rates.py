"""Rate tables: the kernel rates of one device, per element and per call, as a file the advisor reads.

``mpisparse advise`` takes a scheme's own compute from the rates of the device the user names: ``--device cpu``
(this 2-core machine's, :data:`BUILTIN` ``cpu``), ``--device cuda`` (an NVIDIA H200's, built from the kernel and
step measurements in ``docs/results/gpu/``), or ``--rates FILE`` (a user's own, written by ``advise
--measure-rates FILE`` on their machine, :func:`measure_table`).  A table (:data:`FORMAT`, JSON) holds

* ``kernels``: for each of :data:`mpisparse.bench.costmodel.KERNELS`, ``seconds_per_element`` and
  ``seconds_per_call`` (the fixed cost of a call: launches, the read back that sizes a result, the host's work
  around it) and where the numbers came from (``source``);
* ``step_fixed``: per scheme, fixed seconds a whole step costs beyond its kernels and its bytes (a device's
  launches and read backs between them, the library's host work), where a measured step gave it (``source``);
* ``device``, ``about``, ``sources`` (file, commit, date of each measurement used) or ``measured`` (the command,
  commit, date and machine that measured the table).

:func:`load_table` refuses a file that is not one in one line naming it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import costmodel as cm

__all__ = ["BUILTIN", "FORMAT", "RateTable", "builtin_table", "fit_two_sizes", "load_table", "measure_table",
           "table_json", "time_kernels", "write_table"]

#: the ``format`` field of a rate table file
FORMAT = "mpisparse-rates/1"
#: the committed tables, by ``--device`` (files in ``mpisparse/bench/rate_tables/``)
BUILTIN = {"cpu": "cpu-amd-epyc-2cores.json", "cuda": "nvidia-h200.json"}
#: the vector sizes :func:`measure_table` times each kernel at: a small one (its fixed cost) and the model's
SMALL_N = 1 << 16


@dataclass(frozen=True)
class RateTable:
    """A device's kernel rates (:class:`~mpisparse.bench.costmodel.Rates`, per element and per call), the fixed
    cost of a step per scheme, and where they came from."""

    device: str
    rates: cm.Rates
    step_fixed: dict[str, float] = field(default_factory=dict)
    about: str = ""
    sources: tuple[dict[str, str], ...] = ()
    kernel_sources: dict[str, str] = field(default_factory=dict)
    step_sources: dict[str, str] = field(default_factory=dict)
    measured: dict[str, Any] | None = None
    path: str | None = None

    @property
    def name(self) -> str:
        """How the advice names the table: its device and its file."""
        return f"{self.device} ({self.path})" if self.path else self.device


def _rates_dir() -> Path:
    return Path(__file__).resolve().parent / "rate_tables"


def builtin_table(device: str) -> RateTable:
    """The committed table of ``--device`` ``device`` (:data:`BUILTIN`)."""
    if device not in BUILTIN:
        raise ValueError(f"device {device!r} has no committed rate table; allowed: {', '.join(BUILTIN)}")
    table = load_table(str(_rates_dir() / BUILTIN[device]))
    return RateTable(**{**table.__dict__, "path": f"mpisparse/bench/rate_tables/{BUILTIN[device]}"})


def _number(path: str, where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{path}: not a rate table ({where} is {v!r}; a finite number of seconds >= 0)")
    return float(v)


def load_table(path: str) -> RateTable:
    """The rate table in ``path``; a file that is not one (not JSON, another ``format``, a kernel missing, a rate
    that is not a finite number >= 0) is a ValueError naming the file and what is wrong, in one line."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a rate table ({type(e).__name__})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a rate table (not JSON: {e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a rate table (no \"format\": \"{FORMAT}\"; write one with "
                         "`mpisparse advise --measure-rates FILE`)")
    kernels = data.get("kernels")
    if not isinstance(kernels, dict):
        raise ValueError(f"{path}: not a rate table (no \"kernels\" object)")
    missing = [k for k in cm.KERNELS if not isinstance(kernels.get(k), dict)]
    if missing:
        raise ValueError(f"{path}: not a rate table (kernels {', '.join(missing)} missing; every one of "
                         f"{', '.join(cm.KERNELS)} needs seconds_per_element and seconds_per_call)")
    per_el = {k: _number(path, f"{k}.seconds_per_element", kernels[k].get("seconds_per_element"))
              for k in cm.KERNELS}
    per_call = {k: _number(path, f"{k}.seconds_per_call", kernels[k].get("seconds_per_call", 0.0))
                for k in cm.KERNELS}
    steps = data.get("step_fixed") or {}
    if not isinstance(steps, dict) or not all(isinstance(v, dict) for v in steps.values()):
        raise ValueError(f"{path}: not a rate table (\"step_fixed\" must map schemes to {{\"seconds\": ...}})")
    step_fixed = {s: _number(path, f"step_fixed.{s}.seconds", v.get("seconds")) for s, v in steps.items()}
    return RateTable(device=str(data.get("device") or "unnamed device"),
                     rates=cm.Rates(**per_el, per_call={k: v for k, v in per_call.items() if v}),
                     step_fixed=step_fixed, about=str(data.get("about", "")),
                     sources=tuple(data.get("sources") or ()),
                     kernel_sources={k: str(kernels[k].get("source", "")) for k in cm.KERNELS},
                     step_sources={s: str(v.get("source", "")) for s, v in steps.items()},
                     measured=data.get("measured"), path=path)


def table_json(t: RateTable) -> dict[str, Any]:
    """The file form of ``t`` (:func:`load_table` reads it back)."""
    out: dict[str, Any] = {"format": FORMAT, "device": t.device, "about": t.about}
    if t.measured is not None:
        out["measured"] = t.measured
    if t.sources:
        out["sources"] = list(t.sources)
    out["kernels"] = {k: {"seconds_per_element": getattr(t.rates, k),
                          "seconds_per_call": t.rates.per_call.get(k, 0.0),
                          **({"source": t.kernel_sources[k]} if t.kernel_sources.get(k) else {})}
                      for k in cm.KERNELS}
    out["step_fixed"] = {s: {"seconds": v, **({"source": t.step_sources[s]} if t.step_sources.get(s) else {})}
                         for s, v in t.step_fixed.items()}
    return out


def write_table(path: str, t: RateTable) -> None:
    Path(path).write_text(json.dumps(table_json(t), indent=1) + "\n")


def fit_two_sizes(small: tuple[float, float], big: tuple[float, float]) -> tuple[float, float]:
    """``(seconds per unit, seconds per call)`` of a kernel timed at two sizes, each ``(units, seconds of one
    call)``: the slope between them and what is left of the small call (neither below 0: a faster big call per
    unit, from caches, makes the small call all per-unit)."""
    (u0, t0), (u1, t1) = small, big
    if not u1 > u0 > 0:
        raise ValueError(f"sizes {u0} and {u1}; the big one must be larger than the small one, both > 0")
    slope = max(0.0, (t1 - t0) / (u1 - u0))
    return slope, max(0.0, t0 - slope * u0)


def time_kernels(xp, n: int, density: float = 0.001, dense_density: float = 0.01, repeats: int = 5, *,
                 sync: Callable[[], None] | None = None, layers: int = 64) -> dict[str, tuple[float, float]]:
    """``kernel -> (units, seconds of one call)`` of the kernels the cost model uses, on array module ``xp``
    (NumPy or CuPy: the library's own dispatch, :mod:`mpisparse.backend`), for a vector of ``n`` float32
    elements: the fastest of ``repeats`` calls, ``sync`` (a device's stream synchronisation) before the clock
    starts and before it stops.  Units: elements (``stream``, ``topk``, ``fused``: compensation then top-k, as
    a device runs them; ``segmented``: DEFT's pass over ``layers`` layers, norms and each layer's top-k),
    selected elements (``pick``: the top-k's growth from ``density`` to ``dense_density`` and the values'
    gather), entries (``scatter``: two ranks' sets scattered and summed; ``merge``: gTop-k's merge of two
    sets)."""
    import numpy as np

    from .. import backend
    from ..backend import reference
    from ..schemes.gtopk import merge_topk

    sync = sync or (lambda: None)
    rng = np.random.default_rng(0)
    g = backend.to_module(rng.standard_normal(n).astype(np.float32), xp)
    e = backend.to_module((rng.standard_normal(n) * 0.1).astype(np.float32), xp)
    k = max(1, int(density * n))
    k_hi = max(k + 1, int(dense_density * n))

    def best(fn) -> float:
        fn()  # a first call (compilation, workspaces) is not timed
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    out: dict[str, tuple[float, float]] = {}
    out["stream"] = (n, best(lambda: xp.add(e, g, out=e)))
    out["topk"] = (n, best(lambda: reference.topk_abs(e, k)))
    out["fused"] = (n, best(lambda: (xp.add(e, g, out=e), reference.topk_abs(e, k))))
    lo = best(lambda: e[reference.topk_abs(e, k)])
    hi = best(lambda: e[reference.topk_abs(e, k_hi)])
    out["pick"] = (k_hi - k, max(0.0, hi - lo))
    idx = reference.topk_abs(g, k_hi).astype(backend.index_dtype(n))
    oth = reference.topk_abs(xp.roll(g, n // 7), k_hi).astype(idx.dtype)
    idx, oth = xp.sort(idx), xp.sort(oth)
    both = xp.concatenate((idx, oth))
    vals = xp.concatenate((g[:k_hi], g[-k_hi:]))
    dense_out = xp.zeros(n, dtype=np.float32)
    out["scatter"] = (2 * k_hi, best(lambda: backend.scatter_sum(dense_out, both, vals, [k_hi, k_hi], 0.5)))
    out["merge"] = (2 * k_hi, best(lambda: merge_topk(idx, vals[:k_hi], oth, vals[k_hi:], k_hi)))
    layers = max(1, min(layers, n))
    starts = np.arange(layers, dtype=np.int64) * (n // layers)
    sizes = np.full(layers, n // layers, dtype=np.int64)
    ks = np.maximum(1, (sizes * density).astype(np.int64))

    def deft_pass() -> None:  # every layer the rank's: e += g, the layer norms, each layer's top-k
        xp.add(e, g, out=e)
        backend.segment_norms(e, starts, sizes)
        reference.segment_topk_abs(e, starts, sizes, ks)

    out["segmented"] = (int(sizes.sum()), best(deft_pass))
    return out


def measure_table(device: str, n: int, *, density: float = 0.001, repeats: int = 5, processes: int = 1,
                  small_n: int = SMALL_N, xp=None, measured: dict[str, Any] | None = None) -> RateTable:
    """A rate table of this machine, timed now: every kernel at ``small_n`` and at ``n`` elements
    (:func:`time_kernels`, :func:`fit_two_sizes`: the per-element rate and the fixed cost of a call).

    ``cpu``: the per-element rates are :func:`mpisparse.bench.costmodel.measure_rates`'s at ``n`` (the CPU
    table's own method: its fused pass, ``processes`` at once where ranks share the cores) and the per-call
    costs the two sizes' fit.  ``cuda``: both from the two sizes on the current GPU (CuPy), each call
    synchronised.  ``xp``: the array module (default: NumPy for ``cpu``, CuPy for ``cuda``)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}; allowed: cpu, cuda")
    small_n = min(small_n, n // 8)  # a small model's vector: an eighth of it
    if small_n < 256:
        raise ValueError(f"n = {n}; timing a kernel's fixed cost needs a vector of at least 2,048 elements")
    from ..mpi.device import synchronizer

    if xp is None:
        if device == "cuda":
            import cupy as xp  # noqa: F811 (only on a GPU machine)
        else:
            import numpy as xp
    sync = synchronizer(xp)
    hi = min(1.0, max(0.01, 10 * density))  # the pick's growth: from density to ten times it (0.01 at 0.001)
    small = time_kernels(xp, small_n, density, hi, repeats=repeats, sync=sync)
    big = time_kernels(xp, n, density, hi, repeats=repeats, sync=sync)
    fits = {k: fit_two_sizes(small[k], big[k]) for k in cm.KERNELS}
    per_el = {k: fits[k][0] for k in cm.KERNELS}
    how = {k: f"timed at {small_n:,} and {n:,} elements (units: {_UNITS[k]})" for k in cm.KERNELS}
    if device == "cpu":
        cpu = cm.measure_rates(n=n, density=density, repeats=repeats, dense_density=hi, processes=processes)
        per_el = cm.rates_dict(cpu)
        how = {k: f"seconds per {_UNITS[k][:-1]}: costmodel.measure_rates at {n:,} elements, {processes} "
                  f"process(es) at once; per call: timed at {small_n:,} and {n:,}" for k in cm.KERNELS}
    rates = cm.Rates(**per_el, per_call={k: fits[k][1] for k in cm.KERNELS if fits[k][1]})
    return RateTable(device=_device_name(device, xp), rates=rates, kernel_sources=how, measured=measured,
                     about=f"measured by `mpisparse advise --measure-rates` on {device}; no per-step fixed costs "
                           "(those come from measured steps)")


_UNITS = {"stream": "elements", "topk": "elements", "fused": "elements", "segmented": "elements",
          "pick": "selected elements", "scatter": "entries", "merge": "entries"}


def _device_name(device: str, xp) -> str:
    if device == "cuda":
        try:
            props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
            name = props["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 (a name is only a label)
            return "a CUDA GPU"
    import platform

    return f"CPU ({platform.processor() or platform.machine()})"
