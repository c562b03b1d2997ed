"""``mpisparse bench scaling``: step time, speedup, bytes and density against W and density.

A driver, not an MPI job: for every model, world size ``W`` (``--worlds``)
and density (``--densities``) it runs one job

    mpisparse bench step -n W --model M --scheme S1 --scheme S2 ... --density D --json DIR/M-W<W>-d<D>.json

(:mod:`mpisparse.bench.runs`: ``mpiexec`` through :mod:`mpisparse.mpi.launch`,
bounded by ``--timeout``; or one emulated host per rank with
``--emucluster RATE``), collects the per-run JSON result objects,
prints one table (model x scheme x W x density: step time,
speedup over the baseline, bytes per rank per step, measured density) and
draws one plot (step time, speedup and bytes against W).

All schemes of one point run in the same job, one after another, so they
see the same machine.  The baseline of a collective scheme is ``dense``,
that of a parameter-server scheme ``plumpdp``; each job runs the baseline
too unless ``baseline=False``.  A scheme that needs more ranks than ``W``
(``min_world_size``; a parameter server needs ``--servers`` + 1) is left out
of that point, and so is a baseline with nothing to compare.

Each result gains ``baseline`` (the scheme it is compared with, or None)
and ``speedup_over_baseline`` (baseline step / this step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..results import Column, Panel, Series, format_rows, plot_panels, result_row
from .runs import Outcome, SubRun, display_command, results_list, run_subrun

__all__ = ["ScalingPoint", "plan_scaling", "run_scaling", "attach_speedups", "format_scaling", "scaling_row",
           "plot_scaling", "baseline_of"]


@dataclass
class ScalingPoint:
    model: str
    world: int
    density: float
    schemes: list[str]
    run: SubRun


def baseline_of(scheme: str) -> str:
    """``plumpdp`` for a parameter-server scheme, ``dense`` otherwise."""
    from ..runtimes import runtime_of

    return runtime_of(scheme).baseline or "dense"


def _fits(scheme: str, world: int, servers: int) -> bool:
    from ..registry import SCHEMES
    from ..runtimes import schemes_of

    if world < SCHEMES[scheme].min_world_size:
        return False
    return not (scheme in schemes_of("ps") and world < servers + 1)


def plan_scaling(*, models: Sequence[str], schemes: Sequence[str], worlds: Sequence[int],
                 densities: Sequence[float], iters: int, warmup: int, seed: int = 0, servers: int | None = None,
                 extra_options: Sequence[str] = (), out_dir: str | Path, baseline: bool = True,
                 emucluster_rate: str | None = None) -> list[ScalingPoint]:
    """One ``bench step`` job per (model, W, density), in that order."""
    from ..registry import SCHEMES
    from ..runtimes import runtime_of, schemes_of

    for s in schemes:
        if s not in SCHEMES:
            raise ValueError(f"unknown scheme {s!r}; known: {', '.join(sorted(SCHEMES))}")
        runtime_of(s).refuse_bench(s)
    ps = schemes_of("ps")
    servers_n = servers or 1
    points = []
    for model in models:
        for w in worlds:
            for d in densities:
                chosen = [s for s in schemes if _fits(s, w, servers_n)]
                if baseline:
                    bases = [baseline_of(s) for s in chosen]
                    chosen = [b for b in dict.fromkeys(bases) if b in SCHEMES and b not in chosen
                              and _fits(b, w, servers_n)] + chosen
                if not chosen:
                    continue
                path = Path(out_dir) / f"{model}-W{w}-d{d:g}.json"
                opts = ["--model", model]
                for s in chosen:
                    opts += ["--scheme", s]
                opts += ["--density", f"{d:g}", "--iters", str(iters), "--warmup", str(warmup), "--seed", str(seed)]
                if servers is not None and any(s in ps for s in chosen):
                    opts += ["--servers", str(servers)]
                opts += list(extra_options) + ["--json", str(path)]
                run = SubRun(["bench", "step"], opts, n=w, json_path=path, emucluster_rate=emucluster_rate,
                             label=f"{model} W={w} density {d:g}")
                points.append(ScalingPoint(model, w, d, chosen, run))
    return points


def attach_speedups(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``baseline`` and ``speedup_over_baseline`` to the results of one job."""
    by_name = {r["scheme"]: r for r in results}
    for r in results:
        base = by_name.get(baseline_of(r["scheme"]))
        r["baseline"] = base["scheme"] if base is not None else None
        r["speedup_over_baseline"] = (base["step_seconds"] / r["step_seconds"]
                                      if base is not None and r["step_seconds"] > 0 else None)
    return results


def run_scaling(points: Sequence[ScalingPoint], *, timeout: int | None, echo: Callable[[str], None] = print,
                stream: bool = False, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run every point's job (printing its command line); all result objects, each job's in order.

    ``progress``: receives each job's progress lines while it runs (the jobs
    are given ``--progress-interval`` by :func:`plan_scaling`)."""
    out: list[dict[str, Any]] = []
    for i, p in enumerate(points, 1):
        echo(f"[{i}/{len(points)}] $ {display_command(p.run, timeout)}")
        o: Outcome = run_subrun(p.run, timeout=timeout, stream=stream, progress=progress)
        echo(f"        done in {o.seconds:.1f} s")
        out += attach_speedups(results_list(o.result))
    return out


def scaling_row(res: dict[str, Any]) -> dict[str, Any]:
    """A CSV row: the contract's scalars and phases plus baseline and speedup."""
    return result_row(res, baseline=res.get("baseline"), speedup_over_baseline=res.get("speedup_over_baseline"))


def _key(r: dict[str, Any]) -> tuple:
    return (r["config"].get("model", ""), r["scheme"], r["density_target"], r["world_size"])


def format_scaling(results: Sequence[dict[str, Any]]) -> str:
    rows = []
    for r in sorted(results, key=_key):
        rows.append({"model": r["config"].get("model"), "scheme": r["scheme"], "W": r["world_size"],
                     "density": r["density_target"], "step": r["step_seconds"] * 1e3,
                     "speedup": r.get("speedup_over_baseline"), "baseline": r.get("baseline") or "-",
                     "bytes": r["bytes_sent_per_rank"], "density_actual": r["density_actual"]})
    cols = [Column("model", "model", align="<"), Column("scheme", "scheme", align="<"), Column("W", "W"),
            Column("density", "density", "{:g}"), Column("step", "step ms", "{:.2f}"),
            Column("speedup", "speedup", "{:.2f}x"), Column("baseline", "over", align="<"),
            Column("bytes", "bytes/rank/step", "{:,.0f}"), Column("density_actual", "density_actual", "{:.5f}")]
    return format_rows(rows, cols, title="scaling: step time of the slowest rank, speedup over the baseline "
                                         "in the same job")


def plot_scaling(path, results: Sequence[dict[str, Any]]):
    """Step time, speedup over the baseline and bytes per rank against W; a line per model/scheme/density.

    Times and bytes on log axes; a W=1 job sends no bytes: its zero is drawn at the axis bottom.
    Returns the figure."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(_key(r)[:3], []).append(r)
    models = {k[0] for k in groups}
    densities = {k[2] for k in groups}
    worlds = sorted({r["world_size"] for r in results})
    t, s, b = [], [], []
    for (model, scheme, d), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["world_size"])
        label = scheme + (f" {model}" if len(models) > 1 else "") + (f" d={d:g}" if len(densities) > 1 else "")
        w = [r["world_size"] for r in rs]
        t.append(Series(label, w, [r["step_seconds"] * 1e3 for r in rs]))
        sp = [(r["world_size"], r["speedup_over_baseline"]) for r in rs if r.get("speedup_over_baseline")]
        if sp:
            s.append(Series(label, [x for x, _ in sp], [y for _, y in sp]))
        b.append(Series(label, w, [r["bytes_sent_per_rank"] for r in rs]))  # W=1 sends 0: drawn at the bottom
    logx = len(worlds) > 1
    return plot_panels(path, [Panel("step time (slowest rank)", "W (ranks)", "ms", series=t, logx=logx, logy=True,
                                    xticks=worlds),
                              Panel("speedup over the baseline (dense | plumpdp)", "W (ranks)", "speedup", series=s,
                                    logx=logx, xticks=worlds),
                              Panel("bytes sent per rank per step", "W (ranks)", "bytes", series=b, logx=logx,
                                    logy=True, xticks=worlds)],
                       title="bench scaling")
