"""``mpisparse bench model``: the cost model's step time for W up to 1,024, and its validation.

Tabulates :func:`mpisparse.bench.costmodel.predict` for every scheme of the model,
each density and each world size; the link comes from ``--rate`` and
``--latency-us`` or is fitted to a ``bench exchange`` result
(:func:`mpisparse.bench.costmodel.fit_link`); the compute rates are measured on
this machine when the command runs (:func:`mpisparse.bench.costmodel.measure_rates`).
Given ``bench step`` results (``--measured``), it also compares each
measured step with the prediction at the same scheme, density and W
(with ``--shared-cores``, that prediction's rates are measured with as many
processes at once as ranks run at once, and its compute is stretched by the
ranks' turns on the cores, :func:`mpisparse.bench.costmodel.sharing`; the
tabulated predictions assume a core per rank, rates measured alone).
A measured step of a ``bench step --floor`` job is also predicted at the
memory speed of its own moment (:func:`floor_rate`,
:func:`mpisparse.bench.costmodel.loaded_rates`): on a shared machine the rates
and the steps are measured at different moments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from . import costmodel as cm
from ..models.shapes import layer_shapes


def model_size(model: str) -> int:
    import math

    return int(sum(math.prod(s) for _, s in layer_shapes(model)))


def model_gradient(model: str, rank: int = 0) -> Any:
    """Rank ``rank``'s first synthetic gradient of ``model`` (:mod:`mpisparse.bench.gradgen`, as ``bench step``
    draws it): a float32 vector."""
    import numpy as np

    from ..backend.fusion import FusionLayout
    from .gradgen import SyntheticGradients

    layout = FusionLayout(layer_shapes(model))
    out = np.empty(layout.n, dtype=np.float32)
    return SyntheticGradients(layout, rank).fill(out, 0)


def link_from_exchange(path: str) -> cm.Link:
    """Fit the link to the ``topk`` results of a ``bench exchange --json`` file.

    Where the results hold the exchange's phases, the values' Allgatherv alone is fitted (the ranks
    enter it together, right after the indices' Allgatherv); the whole exchange also holds each rank's
    wait for the slowest selection, which is not the link's."""
    data = json.loads(Path(path).read_text())
    rows = [r for r in (data if isinstance(data, list) else [data])
            if r.get("scheme") == "topk" and r.get("k") and r.get("exchange_seconds")]
    values = [(int(r["world_size"]), int(r["k"]), float(r["exchange_phases"]["exchange_values"]))
              for r in rows if (r.get("exchange_phases") or {}).get("exchange_values")]
    if len(values) >= 2 and len(values) == len(rows):
        return cm.fit_link(values, messages=1, bytes_per_element=4)
    points = [(int(r["world_size"]), int(r["k"]), float(r["exchange_seconds"])) for r in rows]
    if len(points) < 2:
        raise ValueError(f"{path}: needs topk exchange results at 2 or more densities (bench exchange --scheme "
                         f"topk --densities D1,D2); found {len(points)}")
    return cm.fit_link(points)


def load_measured(paths: Sequence[str]) -> list[dict[str, Any]]:
    """``bench step`` results (one object or a list per file; a directory: its ``*.json``) of the schemes the
    model covers."""
    files = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    for p in files:
        data = json.loads(p.read_text())
        for r in data if isinstance(data, list) else [data]:
            # whole steps only: a `bench exchange` result (exchange_seconds) times the exchange alone
            if r.get("scheme") in cm.SCHEMES and "step_seconds" in r and "exchange_seconds" not in r:
                out.append(r)
    return out


def floor_rate(result: dict[str, Any], shared_cores: int | None) -> float | None:
    """The memory pass of a measured ``bench step --floor`` job, seconds per element of one rank among
    those running at once: the job's floor (``e += g``, every rank at once; each rank's mean, max over
    ranks) over ``n`` and over the ranks' turns on the cores (:func:`mpisparse.bench.costmodel.sharing`'s
    ``stretch``).  None without a floor in the result."""
    floor = (result.get("floor") or {}).get("seconds")
    n = result.get("n")
    if not floor or not n:
        return None
    return float(floor) / (int(n) * cm.sharing(int(result["world_size"]), shared_cores)[1])


#: the phases of a step that compute on the rank (the rest of a measured step's phases are its exchange and waits)
COMPUTE_PHASES = ("compensate", "select", "update")


def compute_and_exchange(phases: dict[str, float]) -> dict[str, float]:
    """``{"compute": ..., "exchange": ...}`` seconds of a step's phases (predicted by
    :func:`mpisparse.bench.costmodel.predict` or measured by ``bench step``): compensate + select + update, and
    every other phase (the exchange phases, and any wait timed apart)."""
    compute = sum(float(v) for k, v in phases.items() if k in COMPUTE_PHASES)
    return {"compute": compute, "exchange": sum(float(v) for k, v in phases.items() if k not in COMPUTE_PHASES)}


def run_model(*, model: str, densities: Sequence[float], worlds: Sequence[int], link: cm.Link,
              rates: cm.Rates, shared_cores: int | None, measured: Sequence[dict[str, Any]] = (),
              rates_at: Callable[[int], cm.Rates] | None = None) -> dict[str, Any]:
    """Predictions (``rates``: measured alone, a core per rank) and their validation against ``measured``.

    With ``shared_cores``, a measured point at W ranks is predicted with ``rates_at(p)``, the rates of ``p``
    processes at once (``p``: :func:`mpisparse.bench.costmodel.sharing`'s ``processes``; 1: ``rates``), each
    ``p`` measured once.  A measured point with a floor (``bench step --floor``) is also predicted with
    the rates of its own job's moment (:func:`floor_rate`, :func:`mpisparse.bench.costmodel.loaded_rates`):
    ``floor_seconds_per_element``, ``predicted_seconds_floor``, ``error_floor`` and ``split_floor`` (its
    compute and exchange, :func:`compute_and_exchange`); a measured point with phases gets
    ``split_measured``, the same split of them."""
    n = model_size(model)
    shared: dict[int, cm.Rates] = {1: rates}
    predictions = []
    for d in densities:
        for w in worlds:
            for s in cm.SCHEMES:
                ph = cm.predict(s, n, d, w, link, rates)  # a real cluster: a core per rank
                predictions.append({"scheme": s, "density": d, "world_size": w, "phases": ph,
                                    "step_seconds": cm.total(ph)})
    cross = {str(d): cm.crossover(n, d, link, rates) for d in densities}
    validation = []
    for r in measured:
        w, d = int(r["world_size"]), float(r["density_target"])
        m_n = int(r.get("n") or n)
        procs = cm.sharing(w, shared_cores)[0]
        if procs not in shared:
            if rates_at is None:
                raise ValueError(f"the measured point at W = {w} on {shared_cores} cores needs rates of {procs} "
                                 "processes at once; none given (rates_at)")
            shared[procs] = rates_at(procs)
        pred = cm.total(cm.predict(r["scheme"], m_n, d, w, link, shared[procs], shared_cores=shared_cores))
        meas = float(r["step_seconds"])
        point = {"scheme": r["scheme"], "density": d, "world_size": w, "n": m_n,
                 "predicted_seconds": pred, "measured_seconds": meas,
                 "error": (pred - meas) / meas if meas else None}
        fr = floor_rate(r, shared_cores)
        if fr is not None:
            at = cm.predict(r["scheme"], m_n, d, w, link, cm.loaded_rates(rates, shared[procs], fr),
                            shared_cores=shared_cores)
            point.update(floor_seconds_per_element=fr, predicted_seconds_floor=cm.total(at),
                         error_floor=(cm.total(at) - meas) / meas if meas else None,
                         split_floor=compute_and_exchange(at))
        if isinstance(r.get("phases"), dict):
            point["split_measured"] = compute_and_exchange(r["phases"])
        validation.append(point)
    return {"model": model, "n": n, "link": {"latency_seconds": link.latency, "bytes_per_second": link.bandwidth},
            "rates_seconds_per_element": cm.rates_dict(rates), "shared_cores": shared_cores,
            "rates_at_once_seconds_per_element": {str(p): cm.rates_dict(r) for p, r in sorted(shared.items())
                                                  if p > 1},
            "predictions": predictions, "topk_slower_than_dense_at_world": cross, "validation": validation}


def format_model(res: dict[str, Any]) -> str:
    from ..results.tables import simple_table

    lines = [f"{res['model']} (n = {res['n']:,}); link {res['link']['bytes_per_second'] * 8 / 1e9:.3g} Gbit/s, "
             f"latency {res['link']['latency_seconds'] * 1e6:.0f} us"
             + (f"; measured steps compared with compute shared by all ranks on {res['shared_cores']} cores"
               if res["shared_cores"] else "")]
    lines.append("kernel rates, ns per element: alone " + _rates_text(res["rates_seconds_per_element"]))
    for p, r in (res.get("rates_at_once_seconds_per_element") or {}).items():
        lines.append(f"  {p} processes at once (the slowest) " + _rates_text(r))
    by = {}
    for p in res["predictions"]:
        by.setdefault(p["density"], {}).setdefault(p["world_size"], {})[p["scheme"]] = p["step_seconds"]
    for d, rows in by.items():
        lines.append(f"\npredicted step ms, density {d} (top-k slower than dense from W = "
                     f"{res['topk_slower_than_dense_at_world'][str(d)] or 'never (up to 2^20)'})")
        lines.append(simple_table(["W", *cm.SCHEMES],  # noqa: E501
                                  [[str(w)] + [f"{v[s] * 1e3:,.1f}" for s in cm.SCHEMES] for w, v in rows.items()]))
    if res["validation"]:
        lines.append("\npredicted vs measured")
        floor = any("error_floor" in v for v in res["validation"])
        lines.append(simple_table(["scheme", "density", "W", "predicted ms", "measured ms", "error"]
                                  + (["floor ns", "at the floor ms", "error"] if floor else []),
                                  [[v["scheme"], str(v["density"]), str(v["world_size"]),
                                    f"{v['predicted_seconds'] * 1e3:,.1f}", f"{v['measured_seconds'] * 1e3:,.1f}",
                                    f"{100 * v['error']:+.0f}%"] + (_floor_cells(v) if floor else [])
                                   for v in res["validation"]]))
    return "\n".join(lines)


def _floor_cells(v: dict[str, Any]) -> list[str]:
    if v.get("error_floor") is None:
        return ["-", "-", "-"]
    return [f"{v['floor_seconds_per_element'] * 1e9:.2f}", f"{v['predicted_seconds_floor'] * 1e3:,.1f}",
            f"{100 * v['error_floor']:+.0f}%"]


def _rates_text(rates: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1e9:.2f}" for k, v in rates.items())


def plot_model(res: dict[str, Any], path: str) -> None:
    """Predicted step time against W (log-log), one line per scheme and density, measured points on top."""
    from ..results import plots

    plt = plots._pyplot()

    densities = sorted({p["density"] for p in res["predictions"]}, reverse=True)
    fig, axes = plt.subplots(1, len(densities), figsize=(5 * len(densities) + 2.5, 4.5), squeeze=False)
    colors = dict(zip(cm.SCHEMES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, d in zip(axes[0], densities):
        for s in cm.SCHEMES:
            pts = sorted((p["world_size"], p["step_seconds"] * 1e3) for p in res["predictions"]
                         if p["scheme"] == s and p["density"] == d)
            ax.plot([w for w, _ in pts], [t for _, t in pts], label=f"{s} (model)", color=colors[s])
            meas = [(v["world_size"], v["measured_seconds"] * 1e3) for v in res["validation"]
                    if v["scheme"] == s and v["density"] == d]
            if meas:
                ax.scatter([w for w, _ in meas], [t for _, t in meas], color=colors[s], marker="o", zorder=3,
                           label=f"{s} (measured)")
                pred = [(v["world_size"], v["predicted_seconds"] * 1e3) for v in res["validation"]
                        if v["scheme"] == s and v["density"] == d]
                ax.scatter([w for w, _ in pred], [t for _, t in pred], color=colors[s], marker="x", zorder=3,
                           label=f"{s} (model, shared cores)" if res["shared_cores"] else None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks W (one per host; lines: a core per rank)")
        ax.set_ylabel("step ms")
        ax.set_title(f"{res['model']}, density {d}")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.8, 0.5), fontsize="small")
    fig.tight_layout(rect=(0, 0, 0.8, 1))  # the legend sits right of the panels, outside the data
    plots._save(fig, path)
