"""``mpisparse bench exchange``: each scheme's collective pattern, timed alone, against density.

For every scheme and every density the scheme runs ``warmup + iters`` steps
on the model-shaped synthetic gradients of ``bench step``
(:func:`mpisparse.bench.step.run_step_bench`; parameter-server schemes:
:func:`mpisparse.ps.bench.run_ps_step_bench`), and of each step only the
exchange is reported: the phases that move data between ranks
(:data:`EXCHANGE_PHASES`: ``exchange_indices`` + ``exchange_values`` for the
collective schemes, ``push`` + ``pull`` for a parameter server; ``wait``,
the time a worker waits for its answer, is left out) and the bytes each rank
sent.  The world size is the job's: a sweep over W is ``bench scaling`` (or
several ``-n``).  Ranks reach the first exchange of a step at different
times, so the first exchange phase also holds the wait for the slowest
rank's selection (as in every scheme's per-phase table).

Every result is ``bench step``'s :class:`~mpisparse.results.RunResult` (as a dict)
with these keys added:

``exchange_seconds``
    sum over :data:`EXCHANGE_PHASES` of the phase's max over ranks (mean
    seconds per step);
``exchange_seconds_mean_over_ranks``
    the same sum of the mean over ranks;
``exchange_phases``
    the exchange phases alone (max over ranks);
``bytes_per_selected``
    ``bytes_sent_per_rank / k``: bytes a rank sends per element a rank
    selects (the pattern's cost per element: ~8 (W-1) for an Allgatherv of
    indices and values, ~4 + 8 (W-1)/W for CLT-k's Bcast + Allreduce,
    8 (W-1)/W / density for dense).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..results import Column, Panel, Series, format_rows, plot_panels, result_row

__all__ = ["EXCHANGE_PHASES", "exchange_keys", "run_exchange_bench", "format_exchange", "exchange_row",
           "plot_exchange"]

#: the phases that move data between ranks
EXCHANGE_PHASES = ("exchange_indices", "exchange_values", "push", "pull")


def exchange_keys(res: dict[str, Any]) -> dict[str, Any]:
    """The keys this suite adds to a per-run result (see the module docstring)."""
    ph = res.get("phases", {})
    mean = res.get("phases_mean_over_ranks", {})
    k = res.get("k") or 0
    return {
        "exchange_seconds": float(sum(ph.get(p, 0.0) for p in EXCHANGE_PHASES)),
        "exchange_seconds_mean_over_ranks": float(sum(mean.get(p, 0.0) for p in EXCHANGE_PHASES)),
        "exchange_phases": {p: ph[p] for p in EXCHANGE_PHASES if p in ph},
        "bytes_per_selected": (res["bytes_sent_per_rank"] / k) if k else float("nan"),
    }


def run_exchange_bench(comm, *, model: str, schemes: Sequence[str], densities: Sequence[float], iters: int,
                       warmup: int, seed: int = 0, memory: bool = True,
                       scheme_options: dict[str, dict[str, Any]] | None = None, servers: int | None = None,
                       progress: Callable[[str, int, int], None] | None = None) -> list[dict[str, Any]]:
    """One result per (scheme, density), schemes outermost, as JSON dicts; every rank calls it (collective)."""
    from ..config import BenchConfig
    from ..runtimes import bench_step

    scheme_options = scheme_options or {}
    out = []
    for s in schemes:
        for d in densities:
            label = f"{s} d={d:g}"
            step_progress = None if progress is None else (lambda i, n, _l=label: progress(_l, i, n))
            cfg = BenchConfig(model=model, scheme=s, density=d, iters=iters, warmup=warmup, seed=seed,
                              memory=memory, scheme_options=dict(scheme_options.get(s, {})), servers=servers or 1)
            res = bench_step(comm, cfg, progress=step_progress)
            res.exchange = exchange_keys(res.to_dict())
            res.config["bench"] = "exchange"
            out.append(res.to_dict())
    return out


def exchange_row(res: dict[str, Any]) -> dict[str, Any]:
    """A CSV row: the contract's scalars and phases plus the exchange keys (ms)."""
    row = result_row(res)
    row["exchange_ms"] = res["exchange_seconds"] * 1e3
    row["exchange_ms_mean_over_ranks"] = res["exchange_seconds_mean_over_ranks"] * 1e3
    row["bytes_per_selected"] = res["bytes_per_selected"]
    return row


def format_exchange(results: Sequence[dict[str, Any]]) -> str:
    """The table the command prints: one row per (scheme, density)."""
    rows = []
    for r in results:
        ph = r["exchange_phases"]
        rows.append({"scheme": r["scheme"], "W": r["world_size"], "density": r["density_target"], "k": r["k"],
                     "density_actual": r["density_actual"], "exchange": r["exchange_seconds"] * 1e3,
                     "first": (ph.get("exchange_indices", ph.get("push"))),
                     "second": (ph.get("exchange_values", ph.get("pull"))),
                     "bytes": r["bytes_sent_per_rank"], "per_k": r["bytes_per_selected"],
                     "step": r["step_seconds"] * 1e3})
    ms = lambda v: f"{v * 1e3:.3f}"  # noqa: E731
    cols = [Column("scheme", "scheme", align="<"), Column("W", "W"), Column("density", "density", "{:g}"),
            Column("k", "k", "{:,}"), Column("density_actual", "density_actual", "{:.5f}"),
            Column("exchange", "exchange ms", "{:.3f}"), Column("first", "indices|push ms", ms),
            Column("second", "values|pull ms", ms), Column("bytes", "bytes/rank/step", "{:,.0f}"),
            Column("per_k", "bytes/k", "{:.2f}"), Column("step", "step ms", "{:.3f}")]
    r0 = results[0]
    title = (f"exchange of each scheme on {r0['config'].get('model')} gradients ({r0['n']:,} elements), "
             f"W={r0['world_size']}; times: max over ranks, mean per step")
    return format_rows(rows, cols, title=title)


def plot_exchange(path, results: Sequence[dict[str, Any]]) -> None:
    """Exchange time and bytes per rank against density, one line per scheme."""
    schemes = list(dict.fromkeys(r["scheme"] for r in results))
    t, b = [], []
    for s in schemes:
        pts = sorted((r for r in results if r["scheme"] == s), key=lambda r: r["density_target"])
        x = [r["density_target"] for r in pts]
        t.append(Series(s, x, [r["exchange_seconds"] * 1e3 for r in pts]))
        b.append(Series(s, x, [r["bytes_sent_per_rank"] for r in pts]))  # a zero is drawn at the axis bottom
    multi = len({r["density_target"] for r in results}) > 1
    r0 = results[0]
    plot_panels(path, [Panel("exchange time (indices + values | push + pull)", "density", "ms per step",
                             series=t, logx=multi, logy=True),
                       Panel("bytes sent per rank per step", "density", "bytes", series=b, logx=multi, logy=True)],
                title=f"bench exchange: {r0['config'].get('model')}, W={r0['world_size']}")
