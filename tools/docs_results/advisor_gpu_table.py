"""The advisor's predictions for a GPU cluster: 16 nodes of 8 GPUs at 25 and 100 Gbit/s, three models
(``docs/results/advisor-gpu-cluster.md``; docs/choosing.md opens with it).  Nothing here is measured on a GPU
cluster: ``mpisparse advise`` runs its model with the H200's rate table; the runs take seconds, no MPI job."""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _table, md_table

#: the cluster of the worked example: nodes, GPUs a node, NIC rates
NODES, GPUS = 16, 8
RATES = ("25gbit", "100gbit")
#: the models (their shapes: mpisparse/models/shapes.py)
MODELS = ("resnet50", "bert-base", "gpt2-small")
#: one rank's forward + backward + optimizer step, seconds: an input the user gives, not a measurement
COMPUTE = "0.2"
#: the exchange models of each block: the schemes flat, then two-level (--hierarchical)
EXCHANGES = (("flat", []), ("hier", ["--hierarchical"]))


def _label(model: str, rate: str, how: str) -> str:
    return f"{model}-{rate}-{how}"


def _runs(quick: bool) -> list[Run]:
    models = MODELS[:1] if quick else MODELS
    rates = RATES[:1] if quick else RATES
    return [Run(_label(m, r, how), ["advise", "--device", "cuda", "--model", m, "-W", str(NODES * GPUS),
                                    "--ranks-per-host", str(GPUS), "--rate", r, "--compute-seconds", COMPUTE, *extra])
            for m in models for r in rates for how, extra in EXCHANGES]


def _gbit(bw: float | None) -> str:
    if bw is None:
        return "none (a sparse scheme wins on every NIC)"
    bits = 8 * float(bw)
    return f"{bits / 1e9:,.0f} Gbit/s" if bits >= 1e10 else f"{bits / 1e9:.1f} Gbit/s"


#: the measured link bytes the exchange model's are set against (2 emulated hosts of 2 ranks, resnet18)
LINK_BYTES = "docs/results/hierarchical.md"


def _nic_check() -> str:
    """The model's bytes through the busiest host's NIC against the link counters of :data:`LINK_BYTES`."""
    from mpisparse.bench import advise as adv
    from mpisparse.bench import costmodel as cm
    from mpisparse.bench.model import model_size

    from .framework import REPO
    from .provenance import markdown_tables, parse_header

    text = (REPO / LINK_BYTES).read_text()
    head = parse_header(text)
    _, cols, rows = next(t for t in markdown_tables(text) if "flat: busiest link B/step" in t[1])
    at = {c: i for i, c in enumerate(cols)}
    n = model_size("resnet18")
    out = []
    for r in rows:
        scheme = r[at["scheme"]].strip("`")
        for how, col in (("flat", "flat: busiest link B/step"), ("two-level", "hierarchical: busiest link B/step")):
            s = adv.Setting(n=n, compute=0.1, world=4, hosts=2, density=0.01, hierarchical=how == "two-level",
                            intra=cm.Link(latency=0.0, bandwidth=1e9))
            model, measured = adv.nic_bytes(scheme, s), float(r[at[col]].replace(",", ""))
            out.append([f"`{scheme}`", how, f"{model:,.0f}", f"{measured:,.0f}", f"{100 * (model / measured - 1):+.1f}%"])
    return (f"The exchange model's bytes through a host's NIC (`advise`'s `nic_bytes`: resnet18, density 0.01, 2 hosts "
            f"of 2 ranks) against what the busiest emulated host link carried per step in [hierarchical.md]"
            f"(hierarchical.md) (commit `{head.get('commit', '?').strip('`')}`, {head.get('date (UTC)', '?')} UTC, "
            f"{head.get('machine', '?')}; link counters include headers and start-up). cltk's leader, whose host "
            "sends most of its Bcast, changes every step; the model counts the leader's host at every step.\n\n"
            + md_table(["scheme", "exchange", "model B/step", "measured B/step", "model against measured"], out,
                       right=[2, 3, 4]))


def _render(res: dict[str, Any], quick: bool) -> str:
    models = MODELS[:1] if quick else MODELS
    rates = RATES[:1] if quick else RATES
    first = res[_label(models[0], rates[0], "flat")]
    summary, detail = [], []
    for m in models:
        for r in rates:
            for how, _ in EXCHANGES:
                a = res[_label(m, r, how)]
                rows = {x["scheme"]: x for x in a["rows"]}
                base = rows["dense-opt"]
                win = rows[a["winner"]]
                best = rows[a["best_sparse"]] if a.get("best_sparse") else None
                summary.append([f"`{m}`", f"{a['setting']['n']:,}", r.replace("gbit", " Gbit/s"),
                                "two-level (`--hierarchical`)" if how == "hier" else "flat",
                                f"{1e3 * base['step_seconds']:,.1f}", f"`{a['winner']}`",
                                f"{1e3 * win['step_seconds']:,.1f}",
                                "—" if best is None else f"`{best['scheme']}` "
                                f"{base['time_to_target'] / best['time_to_target']:.2f}x",
                                _gbit(a["crossover_bandwidth"])])
                if how == "flat":
                    for x in a["rows"]:
                        detail.append([f"`{m}`", r.replace("gbit", " Gbit/s"), f"`{x['scheme']}`",
                                       x["exchange_model"], f"{1e3 * x['step_seconds']:,.1f}",
                                       f"{1e3 * x['overhead_seconds']:,.2f}", f"{1e3 * x['exchange_seconds']:,.1f}",
                                       f"{1e3 * x['hidden_seconds']:,.1f}"])
    s = first["setting"]
    out = [f"{NODES} nodes of {GPUS} GPUs (W = {NODES * GPUS}, `--ranks-per-host {GPUS}`), each node's NIC at the "
           f"rate named, the GPUs of a node linked at {_gbit(s['intra']['bandwidth'])} each way (NVLink 4's nominal "
           f"450 GB/s a GPU, `--intra-rate`'s default with `--device cuda`); density {s['density']}, one rank's "
           f"compute step {1e3 * s['compute']:.0f} ms (**an input, not a measurement**: forward, backward and "
           f"the optimizer step of one GPU, `--compute-seconds`), overlap hiding {100 * s['hidden_share']:.0f}% of "
           "the dense exchange (`--hidden-share`'s default); every scheme assumed to need as many steps as dense "
           "(no `--tta`). Scheme compute: the H200's rate table "
           "(`mpisparse/bench/rate_tables/nvidia-h200.json`, built from docs/results/gpu/). The dense ways "
           "as NCCL runs them (`--dense-exchange nccl`, the default with `--device cuda`).",
           "",
           md_table(["model", "parameters", "NIC", "schemes' exchange", "`dense-opt` step ms", "winner",
                     "winner's step ms", "best sparse against `dense-opt`", "crossover (NIC)"], summary,
                    right=[1, 4, 6]),
           "",
           "Every scheme's predicted step, flat exchange (ms; scheme compute: the H200 table's kernels and its "
           "fixed cost per step; hidden: what overlap hides of `dense-opt`'s exchange):",
           "",
           md_table(["model", "NIC", "scheme", "exchange model", "step", "scheme compute", "exchange", "hidden"],
                    detail, right=[4, 5, 6, 7]),
           "",
           "### The bytes that cross a NIC, against measured link bytes",
           "",
           _nic_check()]
    return "\n".join(out) + "\n"


_table(Table(
    name="advisor-gpu-cluster",
    title="The advisor's predictions for 16 nodes of 8 GPUs (`advise --device cuda`)",
    about=("`mpisparse advise` for three models on 16 nodes of 8 GPUs at two NIC rates, with the NVIDIA H200's rate "
           "table, the schemes' exchanges flat and two-level, the dense baseline as NCCL runs it. Predictions of a "
           "model, not measurements: nothing here ran on a GPU cluster. What the model was validated against: "
           "[advisor.md](../advisor.md) (the emulated CPU cluster, one rank a host)."),
    runs=_runs,
    render=_render,
))
