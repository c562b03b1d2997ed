"""Time to target for the recommendation models (``bench tta --model dlrm|ncf``) on 2 emulated hosts, with the
embedding tables row-sparse (only the rows a rank touched cross the wire, beside the scheme) and as dense
tables in the scheme's vector: docs/results/tta-recsys.md.

``dlrm`` trains to a held-out AUC on the generated clicks, ``ncf`` to a hit rate @10 on the generated ratings
(the data's defaults: 8 tables of 1,000 rows, dimension 16; 1,000 users and items).  Each row gives the bytes a
rank sent per step, split (row-sparse runs) into the tables' rows and the rest (the scheme's dense layers and
the 4-byte agreements).
"""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _emucluster_unavailable, _table, md_table

#: hosts and link rate of the committed measurement and of the quick form
HOSTS, RATE = 2, "100mbit"
SCHEMES = ("dense-opt", "topk", "deft", "cltk", "dct")
QUICK_SCHEMES = ("dense-opt", "topk")
BATCH, LR, DENSITY = 32, 0.1, 0.01
#: per model: the target of ``--target`` (dlrm: AUC, ncf: hit rate @10), the step budget, the evaluation interval
MODELS = {"dlrm": (0.72, 600, 25), "ncf": (0.3, 1500, 50)}
QUICK_MODELS = {"dlrm": (0.55, 60, 20), "ncf": (0.12, 60, 20)}
METRIC = {"dlrm": ("AUC", "final_auc", "{:.4f}"), "ncf": ("HR@10", "final_hit_rate", "{:.2%}")}
WAYS = (("rows", ()), ("dense-tables", ("--no-row-sparse",)))


def _runs(quick: bool) -> list[Run]:
    runs = []
    for model, (target, steps, every) in (QUICK_MODELS if quick else MODELS).items():
        for way, extra in WAYS:
            args = ["bench", "tta", "--model", model, *[a for s in (QUICK_SCHEMES if quick else SCHEMES)
                                                        for a in ("--scheme", s)],
                    "--density", str(DENSITY), "--target", str(target), "--max-steps", str(steps),
                    "--eval-every", str(every), "--batch-size", str(BATCH), "--lr", str(LR), *extra, "--no-progress"]
            runs.append(Run(f"{model}-{way}", args, emucluster=(HOSTS, RATE)))
    return runs


def _rows(model: str, results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """A row per scheme and way (tables row-sparse, dense tables), speedups against dense-opt with dense tables."""
    _, key, fmt = METRIC[model]
    dense = results.get("dense-tables") or {}
    base = next((x for x in dense.get("rows", []) if x["label"] == dense.get("baseline")), None)
    out = []
    for way, what in (("rows", "row-sparse"), ("dense-tables", "dense, in the scheme")):
        res = results.get(way)
        for x in (res or {}).get("rows", []):
            reached = x["reached"]
            seconds = x["seconds_to_target"] if reached else None
            speed = (f"{base['seconds_to_target'] / seconds:.2f}x"
                     if base is not None and base["reached"] and seconds else "—")
            sp = x["step_split"]
            emb = x.get("embedding_bytes_per_step")
            out.append([f"`{x['label']}`", what, str(x["steps_to_target"]) if reached else "not reached",
                        f"{seconds:.1f}" if seconds else "not reached", speed, fmt.format(x[key]), str(x["steps"]),
                        f"{1e3 * x['step_seconds']:.0f}", f"{1e3 * sp['compute']:.0f}",
                        f"{1e3 * sp['exposed_exchange']:.0f}", f"{x['bytes_per_step']:,.0f}",
                        f"{emb:,.0f}" if emb is not None else "—",
                        f"{x['dense_bytes_per_step']:,.0f}" if emb is not None else "—",
                        f"{x['rows_touched_per_step']:,.0f}" if emb is not None else "—"])
    return out


def _render(res: dict[str, Any], quick: bool) -> str:
    parts = []
    rate = RATE.replace("mbit", " Mbit/s").replace("gbit", " Gbit/s")
    for model, (target, steps, every) in (QUICK_MODELS if quick else MODELS).items():
        results = {way: res.get(f"{model}-{way}") for way, _ in WAYS}
        first = next((r for r in results.values() if r), None)
        if first is None:
            parts.append(f"### {model}\n\n(no result)")
            continue
        name, _, fmt = METRIC[model]
        parts.append(
            f"### `{model}` on {first['data']}, to a held-out {name} of {fmt.format(target)}\n\n"
            f"W = {first['world_size']} (one rank per emulated host, {HOSTS} hosts, links of {rate}), batch "
            f"{first['batch_size']} per rank, SGD lr {first['lr']} momentum {first['momentum']}, density "
            f"{first['density']} for the sparse schemes, at most {steps} steps, the held-out set evaluated every "
            f"{every} steps (untimed).\n\n"
            + md_table(["scheme", "tables", "steps to target", "s to target", "speedup vs dense-opt, dense tables",
                        f"final {name}", "steps run", "step ms", "compute ms", "exposed exchange ms",
                        "bytes/rank/step", "of which table rows", "the rest", "rows touched/rank/step"],
                       _rows(model, results)))
    notes = (
        "\n\n`dense-opt` is dense with a float16 wire, exchanged from gradient hooks while backward runs; with "
        "row-sparse tables only its dense layers go that way. Row-sparse: the tables are `nn.Embedding(sparse=True)`"
        " and each step a rank sends the indices and rows it touched (two Allgathervs; no selection, no error "
        "feedback), summed exactly; the scheme takes the dense layers. Dense tables: the tables' gradient is part "
        "of the scheme's vector (a sparse scheme selects among its entries, with error feedback; their bytes "
        "cannot be told apart, hence —). Steps and seconds to target: the first evaluation at or above the target "
        "and the training wall-clock up to it, evaluations excluded; step ms: the mean step after the first, mean "
        "over ranks, compute + exposed exchange. **Compute is a CPU's**: every emulated host shares this machine's "
        "cores (one thread per rank); the machine may have been shared with other jobs.")
    return "\n\n".join(parts) + notes


TABLE = Table(
    name="tta-recsys",
    title="Time to target for DLRM and NCF, embedding tables row-sparse or dense (`bench tta`)",
    about=("DLRM (held-out AUC on generated clicks) and NCF (hit rate @10 on generated ratings) trained with each "
           "scheme through `DistributedOptimizer` on 2 emulated hosts, once with the tables row-sparse (only the "
           "touched rows cross the wire, beside the scheme) and once as dense tables in the scheme's vector; the "
           "bytes per step split into the tables' rows and the rest."),
    runs=_runs,
    render=_render,
    unavailable=_emucluster_unavailable,
)
# registered in tools/docs_results/__init__.py (``from . import tta_recsys_table``) with its first committed run
_table(TABLE)
