"""The tables measured on the emulated cluster: the cost model against measured steps, steps on links of
1 Gbit/s, the hierarchical exchange and overlapping the exchange with backward (``bin/emucluster run``,
``bench model``, ``bench overlap``).
"""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _table, md_table, _as_list, _dens, _emucluster_unavailable, _int, _ms, _phase, _ratio


COST_SCHEMES = ("dense", "topk", "cltk", "deft", "gtopk")


def _cost_model_render(res: dict[str, Any], quick: bool) -> str:
    m = res.get("model") or {}
    if isinstance(m, list):
        m = m[0]
    link = m.get("link", {})
    rows = [[f"`{v['scheme']}`", v["density"], v["world_size"], _ms(v["predicted_seconds"], 1),
             _ms(v["measured_seconds"], 1), f"{100 * v['error']:+.0f}%",
             f"{v['floor_seconds_per_element'] * 1e9:.2f}" if v.get("error_floor") is not None else "—",
             _ms(v.get("predicted_seconds_floor"), 1),
             f"{100 * v['error_floor']:+.0f}%" if v.get("error_floor") is not None else "—"]
            for v in sorted(m.get("validation", []), key=lambda v: (v["density"], v["world_size"], v["scheme"]))]
    errs = [abs(v["error"]) for v in m.get("validation", []) if v.get("error") is not None]
    within = sum(e <= 0.2 for e in errs)
    errs_floor = [abs(v["error_floor"]) for v in m.get("validation", []) if v.get("error_floor") is not None]
    within_floor = sum(e <= 0.2 for e in errs_floor)
    cross = m.get("topk_slower_than_dense_at_world", {})
    rates = m.get("rates_seconds_per_element", {})
    at_once = m.get("rates_at_once_seconds_per_element") or {}
    split = _cost_model_split(m.get("validation", []))

    def ns(r: dict[str, float]) -> str:
        return ", ".join(f"{k} {v * 1e9:.2f}" for k, v in r.items())

    return (f"{m.get('model')} (n = {_int(m.get('n'))}); link fitted to `bench exchange` on the emulated cluster: "
            f"{link.get('bytes_per_second', 0) * 8 / 1e9:.3g} Gbit/s, latency "
            f"{link.get('latency_seconds', 0) * 1e6:.0f} us; kernel rates measured by the command, ns per element, "
            f"one process alone: {ns(rates)}"
            + "".join(f"; {p} processes at once (the slowest of them): {ns(r)}" for p, r in at_once.items())
            + f". Predictions of the measured points use the rates of min(W, {m.get('shared_cores')}) processes "
              f"at once and stretch compute by W / {m.get('shared_cores')} (every emulated host shares this "
              "machine's cores); the curves to W = 1,024 assume a core per rank and the rates alone.\n\n"
            + md_table(["scheme", "density", "W", "predicted ms", "measured ms", "error", "floor ns",
                        "at the floor ms", "error at the floor"], rows)
            + f"\n\n{within} of {len(errs)} predictions within 20% of the measured step with the rates the command "
              f"measured; {within_floor} of {len(errs_floor)} at the floor of the step's own job (floor ns: its "
              "`e += g` pass on every rank at once, `bench step --floor`, per element, each rank's turns on the "
              "cores taken out; the stream rate is then that floor, the fused pass the longer of the floor and "
              "its rate alone, the other kernels their rates at once: `costmodel.loaded_rates`). This machine is "
              "shared: its memory passes run up to twice as fast at one moment as at the next, and the rates "
              "are measured at another moment than the steps. Top-k's build-up makes its "
              "predicted step slower than dense's from W = "
            + ", ".join(f"{c if c else 'never (to 2^20)'} (density {d})" for d, c in cross.items())
            + " (a core per rank). Picture: [plots/cost-model.png](plots/cost-model.png) (predicted curves to "
              "W = 1,024, the measured points and their predictions on them)." + split)


def _cost_model_split(validation: list[dict[str, Any]]) -> str:
    """Where the error at the floor lies: per group of W, the range of measured minus predicted compute
    (compensate + select + update) and exchange (every other phase), ms, over the sparse schemes' points."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for v in validation:
        if v.get("scheme") != "dense" and v.get("split_floor") and v.get("split_measured"):
            groups.setdefault("W = 2" if v["world_size"] <= 2 else "W = 4 and 8", []).append(v)
    if not groups:
        return ""

    def span(vs: list[dict[str, Any]], part: str) -> str:
        d = [1e3 * (v["split_measured"][part] - v["split_floor"][part]) for v in vs]
        return f"{min(d):+.1f} to {max(d):+.1f}"

    return (" Where the error at the floor lies (the sparse schemes' points; measured minus predicted, ms, each "
            "measured phase its max over ranks): "
            + "; ".join(f"{g}: compute {span(vs, 'compute')}, exchange {span(vs, 'exchange')}"
                        for g, vs in sorted(groups.items())) + ".")


_table(Table(
    name="cost-model",
    title="The cost model against measured steps on the emulated cluster (`bench model`)",
    about=("`bench model` predicts each scheme's step from the link (fitted to a `bench exchange` run on the "
           "emulated cluster) and this machine's kernel rates; the measured steps are `bench step` on 2, 4 and 8 "
           "emulated hosts with 1 Gbit/s links ([design.md](../design.md))."),
    runs=lambda quick: (
        [Run("exchange", ["bench", "exchange", "--model", "ncf" if quick else "resnet50", "--scheme", "topk",
                          "--densities", "0.001,0.01,0.1", "--iters", "2", "--warmup", "1"], emucluster=(2, "1gbit"))]
        + [Run(f"step-h{h}-d{d}", ["bench", "step", "--model", "ncf" if quick else "resnet50"]
               + [a for s in COST_SCHEMES for a in ("--scheme", s)]
               + ["--density", d, "--iters", "1" if quick else "3", "--warmup", "1", "--floor"],
               emucluster=(h, "1gbit"))
           for h in ((2,) if quick else (2, 4, 8)) for d in ("0.01", "0.001")]
        + [Run("model", ["bench", "model", "--model", "ncf" if quick else "resnet50", "--shared-cores", "2",
                         "--densities", "0.01,0.001"], out_options={"--exchange": "exchange.json", "--measured": ""},
               plot=None if quick else "cost-model.png")]),
    render=_cost_model_render,
    unavailable=lambda: _emucluster_unavailable(),
))


EMU_SCHEMES = ("dense", "topk", "cltk", "deft", "dct", "gtopk")


def _emucluster_render(res: dict[str, Any], quick: bool) -> str:
    parts = []
    for label in sorted(k for k in res if not k.endswith("-links")):
        results = _as_list(res[label])
        if not results:
            continue
        dense = next((r for r in results if r["scheme"] == "dense"), None)
        rows = []
        for r in results:
            rows.append([f"`{r['scheme']}`", _ms(r["step_seconds"], 1),
                         _ratio(dense["step_seconds"] / r["step_seconds"]) if dense else "—"]
                        + [_ms(_phase(r, p), 1) for p in ("compensate", "select", "exchange_indices",
                                                          "exchange_values", "update")]
                        + [_int(r["bytes_sent_per_rank"]), _dens(r["density_actual"])])
        r0 = results[0]
        parts.append(f"### {r0.get('config', {}).get('model')}, density {r0['density_target']} "
                     f"(n = {_int(r0.get('n'))}, W = {r0['world_size']})\n\n"
                     + md_table(["scheme", "step ms", "vs dense", "compensate", "select", "exchange_indices",
                                 "exchange_values", "update", "bytes/rank/step", "density_actual"], rows))
        links = res.get(label + "-links")
        sent = _link_bytes_sent(links) if links else None
        if sent:
            steps = {r["scheme"]: int(r.get("config", {}).get("iters", 0)) + int(r.get("config", {}).get("warmup", 0))
                     for r in results}
            model = sum(r["bytes_sent_per_rank"] * steps[r["scheme"]] for r in results)
            if model:
                parts.append(f"On the wire: the busiest host's link sent {_int(max(sent))} bytes during this job, "
                             f"against {_int(model)} by the byte model (max over ranks, summed over every step of "
                             f"every scheme, warm-up included): {max(sent) / model:.3f}x. The link also carries "
                             "Ethernet, IP and TCP headers and the MPI start-up.")
    return "\n\n".join(p for p in parts if p) + (
        "\n\nColumns: ms per step, max over ranks; the step is the slowest rank's. Every emulated host shares "
        "this machine's cores, so compute phases are inflated and vary with the machine's load; the dense "
        "exchange is link-bound.")


def _link_bytes_sent(links: Any) -> list[float] | None:
    """Bytes each host's link sent (``bin/emucluster --stats-json``), or None if the layout is unknown."""
    hosts = links.get("hosts") if isinstance(links, dict) else None
    if not isinstance(hosts, list) or not hosts:
        return None
    try:
        return [float(h["sent_bytes"]) for h in hosts]
    except (KeyError, TypeError, ValueError):
        return None


_table(Table(
    name="emucluster",
    title="On an emulated cluster, links of 1 Gbit/s (`bin/emucluster run`)",
    about=("`bench step` on 4 and 8 emulated hosts (network namespaces on this machine, each with its own "
           "rate-limited link; see [cluster.md](../cluster.md)), where the dense exchange is link-bound."),
    runs=lambda quick: [Run(f"{m}-h{h}-d{d}", ["bench", "step", "--model", m]
                            + [a for s in (EMU_SCHEMES[:2] if quick else EMU_SCHEMES) for a in ("--scheme", s)]
                            + ["--density", d, "--iters", "2" if quick else "3", "--warmup", "1"],
                            emucluster=(h, "1gbit"), link_stats=True)
                        for h, m, d in (((2, "ncf", "0.01"),) if quick else
                                        [(h, "resnet50", d) for h in (4, 8) for d in ("0.01", "0.001")])],
    render=_emucluster_render,
    unavailable=_emucluster_unavailable,
))


HIER_SCHEMES = ("dense", "cltk", "topk", "deft")


def _hierarchical_render(res: dict[str, Any], quick: bool) -> str:
    rows = []
    for scheme in HIER_SCHEMES:
        pair = []
        for mode in ("flat", "hierarchical"):
            label = f"{scheme}-{mode}"
            if label not in res:
                break
            r = _as_list(res[label])[0]
            sent = _link_bytes_sent(res.get(label + "-links")) or []
            steps = int(r.get("config", {}).get("iters", 0)) + int(r.get("config", {}).get("warmup", 0))
            pair.append((r, max(sent) / steps if sent and steps else None))
        if len(pair) != 2:
            continue
        (f, fw), (h, hw) = pair
        rows.append([f"`{scheme}`", _ms(f["step_seconds"], 1), _ms(h["step_seconds"], 1),
                     _int(fw) if fw else "—", _int(hw) if hw else "—",
                     f"{hw / fw:.2f}" if fw and hw else "—",
                     _int(h.get("hierarchy", {}).get("cross_host_bytes_per_step"))])
    r0 = _as_list(res[f"{HIER_SCHEMES[0]}-flat"])[0] if f"{HIER_SCHEMES[0]}-flat" in res else {}
    head = (f"{r0.get('config', {}).get('model')}, density {r0.get('density_target')}, "
            f"W = {r0.get('world_size')} as 2 hosts x 2 ranks\n\n") if r0 else ""
    return head + md_table(["scheme", "flat step ms", "hierarchical step ms", "flat: busiest link B/step",
                            "hierarchical: busiest link B/step", "link bytes ratio",
                            "model: cross-host B/step (all hosts)"], rows) + (
        "\n\nLink bytes: what the busiest host's link sent during the job (`bin/emucluster --stats-json`, "
        "headers and start-up included) divided by the job's steps. Step times: the slowest rank; every "
        "emulated host shares this machine's cores, so compute phases vary with its load.")


_table(Table(
    name="hierarchical",
    title="Hierarchical exchange on 2 emulated hosts x 2 ranks (`--hierarchical`)",
    about=("`bench step` with and without `--hierarchical` on 2 emulated hosts of 2 ranks each (links of "
           "1 Gbit/s; ranks of one host talk over its loopback): the bytes that cross the host links and the "
           "step time ([schemes.md](../schemes.md#hierarchical-exchange))."),
    runs=lambda quick: [Run(f"{s}-{mode}", ["bench", "step", "--model", "ncf" if quick else "resnet18",
                                            "--scheme", s, "--density", "0.01", "--iters", "2" if quick else "6",
                                            "--warmup", "0"] + (["--hierarchical"] if mode == "hierarchical" else []),
                            emucluster=(2, "1gbit"), ranks_per_host=2, link_stats=True)
                        for s in HIER_SCHEMES for mode in ("flat", "hierarchical")],
    render=_hierarchical_render,
    unavailable=_emucluster_unavailable,
))


def _overlap_render(res: dict[str, Any], quick: bool) -> str:
    r = res.get("overlap")
    if not r:
        return "(no result)"
    rows = []
    for row in r["rows"]:
        opts = "".join(f" --{k}" if v is True else f" --{k} {v}" for k, v in row["options"].items())
        rows.append([f"`{row['scheme']}{opts}`", f"{row['compute_ms']:.1f}", f"{row['plain_ms']:.1f}",
                     f"{row['overlap_ms']:.1f}", f"{row['speedup']:.2f}x" if row["speedup"] else "—",
                     f"{100 * row['hidden']:.0f} %" if row["hidden"] is not None else "—", str(row["buckets"])])
    head = (f"{r['model']}, batch {r['batch']} per rank, W = {r['world_size']} (one rank per emulated host, "
            f"links of 1 Gbit/s), density {r['density']}, buckets of at least {r['bucket_cap_mb']:g} MB; "
            f"median of {r['iters']} steps after {r['warmup']} untimed, the slowest rank\n\n")
    return head + md_table(["scheme", "compute only ms", "exchange after backward ms", "overlapped ms", "speedup",
                            "exchange hidden", "buckets"], rows) + (
        "\n\n`exchange hidden` = (after backward - overlapped) / (after backward - compute only). Every "
        "emulated host shares this machine's cores: backward of 4 ranks runs on 2 cores, and the "
        "communication thread's MPI progress competes with it for them.")


_table(Table(
    name="overlap",
    title="Overlapping the exchange with backward (`bench overlap`, `DistributedOptimizer(overlap=True)`)",
    about=("A real training step of a net through `mpisparse.torch.DistributedOptimizer`, three ways in one "
           "job on the emulated cluster: no exchange, the exchange after backward, and buckets exchanged "
           "from gradient hooks while backward runs ([torch.md](../torch.md#overlapping-the-exchange-with-"
           "backward-overlap))."),
    runs=lambda quick: [Run("overlap", ["bench", "overlap", "--model", "cnn" if quick else "resnet18",
                                        "--scheme", "dense", "--scheme", "topk", "--layerwise", "--density", "0.01",
                                        "--batch", "8" if quick else "16", "--iters", "2" if quick else "10",
                                        "--warmup", "1" if quick else "2", "--bucket-cap-mb", "1" if quick else "5"],
                            emucluster=(2 if quick else 4, "1gbit"))],
    render=_overlap_render,
    unavailable=_emucluster_unavailable,
))
