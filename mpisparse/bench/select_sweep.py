"""``mpisparse bench select``: the kernels over lists of vector sizes and densities.

:func:`run_select_sweep` calls one backend's single-point benchmark
(:func:`mpisparse.bench.select.run_select_bench` for NumPy,
:func:`mpisparse.bench.select_gpu.run_select_bench_gpu` for CuPy) once per
(size, density) point, sizes outermost, and returns its result objects;
:func:`select_row` flattens one into a row (best and median ms per
kernel, the ratios); :func:`format_select_sweep` is the table the command
prints for more than one point; :func:`plot_select_sweep` draws time against
size (one panel per density) or, for a single size, against density.

The DEFT mode's rows (:mod:`mpisparse.bench.select_deft`) get their CSV row
(:func:`deft_row`) and plot (:func:`plot_deft_select`: measured selection
speedup against W beside eq. 6 and linear speedup, DEFT Fig. 9) here too.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..results import Column, Panel, Series, format_rows, plot_panels

__all__ = ["run_select_sweep", "select_row", "format_select_sweep", "plot_select_sweep", "deft_row",
           "plot_deft_select"]

#: short labels of the kernels' result keys (others are shown by their key)
LABELS = {"torch_topk": "torch.topk", "np_argpartition": "argpartition", "abs_pass": "np.abs pass",
          "abs_pass_out": "np.abs(out=)", "topk_abs_noscratch": "topk_abs (alloc)"}


#: the ratios the table shows (the targets: exact top-k vs torch.topk, threshold select vs one pass)
KEY_RATIOS = ("torch_topk/topk_abs", "threshold_select/abs_pass", "threshold_select/one_read")


def run_select_sweep(sizes: Sequence[int], densities: Sequence[float], run_point: Callable[..., dict],
                     progress: Callable[[str], None] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """``run_point(n=size, density=d, **kwargs)`` for every (size, density), sizes outermost.

    ``run_point`` is :func:`mpisparse.bench.select.run_select_bench` (NumPy
    backend) or :func:`mpisparse.bench.select_gpu.run_select_bench_gpu`
    (CuPy): both return ``params``, ``timings`` (kernel -> best/median ms),
    ``ratios`` and ``machine``.
    """
    if not sizes or not densities:
        raise ValueError("the sweep needs at least one size and one density")
    for n in sizes:
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ValueError(f"sizes holds {n!r}; every size must be an integer of at least 1")
    for d in densities:
        if not (0.0 < float(d) <= 1.0):
            raise ValueError(f"densities holds {d!r}; every density must be in (0, 1]")
    out = []
    for n in sizes:
        for d in densities:
            if progress is not None:
                progress(f"size {int(n):,}, density {float(d):g}")
            out.append(run_point(n=int(n), density=float(d), **kwargs))
    return out


def _kernels(results: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for r in results for k in r["timings"]))


def select_row(res: dict[str, Any]) -> dict[str, Any]:
    """One flat row: backend, size, density, k, ``<kernel>_best_ms``/``_median_ms``, the ratios."""
    p = res["params"]
    row: dict[str, Any] = {"backend": res.get("backend", "numpy"), "n": p["n"], "density": p["density"],
                           "k": p["k"], "repeats": p["repeats"], "distribution": p.get("distribution")}
    if "threads" in p:
        row["threads"] = p["threads"]
    for name, t in res["timings"].items():
        row[f"{name}_best_ms"] = t["best_ms"]
        row[f"{name}_median_ms"] = t["median_ms"]
    for name, r in res["ratios"].items():
        row[f"ratio {name}"] = r
    if "auto" in res:  # the GPU kernels: which top-k method auto picked, flagged when it is not the fastest
        a = res["auto"]
        row["auto"] = a["picked"] + ("" if a["auto_is_fastest"] else f" (NOT fastest: {a['fastest']})")
    return row


def format_select_sweep(results: Sequence[dict[str, Any]]) -> str:
    """The sweep table: best ms of each kernel per point, and the result's ratios."""
    rows = [select_row(r) for r in results]
    cols = [Column("n", "size", "{:,}"), Column("density", "density", "{:g}"), Column("k", "k", "{:,}")]
    cols += [Column(f"{k}_best_ms", LABELS.get(k, k), "{:.2f}") for k in _kernels(results)]
    ratios = list(dict.fromkeys(k for r in results for k in r["ratios"]))
    shown = [k for k in KEY_RATIOS if k in ratios] or ratios  # all of them are in the CSV and JSON
    cols += [Column(f"ratio {k}", k.replace("torch_topk", "torch").replace("threshold_select", "thr"), "{:.2f}")
             for k in shown]
    if any("auto" in r for r in rows):
        cols.append(Column("auto", "auto pick", "{}"))
    r0 = results[0]
    m, p = r0["machine"], r0["params"]
    where = (m.get("device") or f"numpy {m.get('numpy')}, torch {m.get('torch')}, "
             f"torch threads {p.get('threads')}, OMP_NUM_THREADS={m.get('OMP_NUM_THREADS')}")
    title = f"selection kernels ({r0.get('backend', 'numpy')}), best of {p['repeats']} (ms); {where}"
    return format_rows(rows, cols, title=title)


def plot_select_sweep(path, results: Sequence[dict[str, Any]]) -> None:
    """Best ms per kernel against size (a panel per density), or against density for one size."""
    sizes = sorted({r["params"]["n"] for r in results})
    densities = sorted({r["params"]["density"] for r in results})
    kernels = _kernels(results)

    def series(pts, x):
        return [Series(LABELS.get(k, k), [x(r) for r in pts if k in r["timings"]],
                       [r["timings"][k]["best_ms"] for r in pts if k in r["timings"]]) for k in kernels]

    panels = []
    if len(sizes) > 1:
        for d in densities:
            pts = sorted((r for r in results if r["params"]["density"] == d), key=lambda r: r["params"]["n"])
            panels.append(Panel(f"density {d:g}", "elements", "best ms", logx=True, logy=True,
                                series=series(pts, lambda r: r["params"]["n"])))
    else:
        pts = sorted(results, key=lambda r: r["params"]["density"])
        panels.append(Panel(f"{sizes[0]:,} elements", "density", "best ms", logx=len(densities) > 1, logy=True,
                            series=series(pts, lambda r: r["params"]["density"])))
    plot_panels(path, panels, title=f"selection kernels ({results[0].get('backend', 'numpy')}, one process)")


def deft_row(row: dict[str, Any]) -> dict[str, Any]:
    """A CSV row of ``bench select --mode deft`` (per-rank list left out, times in ms)."""
    out = {k: v for k, v in row.items() if not isinstance(v, (list, dict))}
    for k in list(out):
        if k.endswith("_seconds"):
            out[k[: -len("_seconds")] + "_ms"] = out.pop(k) * 1e3
    return out


def plot_deft_select(path, rows: Sequence[dict[str, Any]]) -> None:
    """DEFT Fig. 9: selection speedup over whole-vector top-k against W, per model."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    worlds = sorted({r["world_size"] for r in rows})
    sp, ms = [], []
    for m in models:
        pts = sorted((r for r in rows if r["model"] == m), key=lambda r: r["world_size"])
        w = [r["world_size"] for r in pts]
        sp.append(Series(f"{m} measured", w, [r["speedup_measured"] for r in pts]))
        if all("speedup_with_overhead" in r for r in pts):
            sp.append(Series(f"{m} incl. overhead", w, [r["speedup_with_overhead"] for r in pts], style="s:"))
        if all("speedup_predicted" in r for r in pts):
            sp.append(Series(f"{m} eq. 6", w, [r["speedup_predicted"] for r in pts], style="^--"))
        ms.append(Series(f"{m} deft max", w, [r["deft_max_seconds"] * 1e3 for r in pts]))
        ms.append(Series(f"{m} top-k", w, [r["topk_seconds"] * 1e3 for r in pts], style="--"))
    panels = [Panel("selection speedup of DEFT over top-k", "W (ranks)", "speedup", series=sp, logx=True,
                    logy=True, xticks=worlds, references=[Series("linear (= W)", worlds, worlds, style="k--")]),
              Panel("selection time", "W (ranks)", "ms (slowest rank)", series=ms, logx=True, logy=True,
                    xticks=worlds)]
    d = rows[0]["density"] if rows else 0
    plot_panels(path, panels, title=f"DEFT per-rank selection (density {d:g})")


# --------------------------------------------------------------------------- command glue
def _point_runner(backend: str, threads: int, distribution: str) -> Callable[..., dict]:
    """The single-point benchmark of ``backend``; RuntimeError (one sentence) when it cannot run."""
    if backend == "cupy":
        from ..backend.cupy_launch import available

        if not available():
            raise RuntimeError("--backend cupy: no GPU/CuPy available (needs CuPy, e.g. pip install cupy-cuda12x, "
                               "and a CUDA device)")
        from .select_gpu import run_select_bench_gpu

        return lambda **kw: run_select_bench_gpu(distribution=distribution, **kw)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise RuntimeError("bench select compares with torch.topk: install torch (pip install '.[train]')") from None
    from .select import run_select_bench

    return lambda **kw: run_select_bench(threads=threads, distribution=distribution, **kw)


def select_sweep_command(backend: str, sizes: Sequence[int], densities: Sequence[float], *, repeats: int,
                         seed: int, threads: int, distribution: str, json_path, csv_path, plot_path,
                         echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """``bench select --sizes ... --densities ...``: run, print the table, write the outputs."""
    import json
    import os
    from pathlib import Path

    run_point = _point_runner(backend, threads, distribution)
    results = run_select_sweep(sizes, densities, run_point, repeats=repeats, seed=seed)
    echo(format_select_sweep(results))
    if json_path:
        from ..results.provenance import local_provenance

        prov = local_provenance()
        for r in results:
            r.setdefault("provenance", prov)
        tmp = Path(str(json_path) + ".tmp")
        tmp.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, json_path)
    select_outputs("kernels", results, csv_path, plot_path, echo=echo)
    return results


def select_outputs(mode: str, results: Sequence[dict[str, Any]], csv_path, plot_path,
                   echo: Callable[[str], None] = print) -> None:
    """--csv and --plot of ``bench select`` (kernels: result objects; deft: rows)."""
    from ..results import write_csv

    if csv_path:
        write_csv(csv_path, [select_row(r) if mode == "kernels" else deft_row(r) for r in results])
    if plot_path:
        (plot_select_sweep if mode == "kernels" else plot_deft_select)(plot_path, results)
        echo(f"plot written to {plot_path}")
