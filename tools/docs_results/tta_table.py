"""The time-to-accuracy table (``bench tta`` on the emulated cluster): docs/results/tta.md."""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _emucluster_unavailable, _table, md_table

#: hosts and link rate of the default (committed) measurement, and of the quick form
HOSTS, RATE = 2, "200mbit"
QUICK_HOSTS, QUICK_RATE = 2, "100mbit"


def _runs(quick: bool) -> list[Run]:
    if quick:
        args = ["bench", "tta", "--quick", "--scheme", "dense-opt", "--scheme", "dense", "--scheme", "topk",
                "--no-progress"]
        return [Run("tta", args, emucluster=(QUICK_HOSTS, QUICK_RATE), plot=None)]
    args = ["bench", "tta", "--model", "resnet18", "--data", "digits", "--scheme", "dense-opt", "--scheme", "dense",
            "--scheme", "topk", "--scheme", "cltk", "--scheme", "powersgd", "--density", "0.01",
            "--target", "0.9", "--max-steps", "120", "--eval-every", "10", "--batch-size", "32", "--lr", "0.05",
            "--no-progress"]
    return [Run("tta", args, emucluster=(HOSTS, RATE), plot="tta.png")]


def _to_target(row: dict[str, Any], key: str, fmt: str) -> str:
    return "not reached" if not row["reached"] else fmt.format(row[key])


def _render(res: dict[str, Any], quick: bool) -> str:
    r = res.get("tta")
    if not r:
        return "(no result)"
    base = next((x for x in r["rows"] if x["label"] == r["baseline"]), None)
    rows = []
    for x in r["rows"]:
        sp = x["step_split"]
        speed = (f"{base['seconds_to_target'] / x['seconds_to_target']:.2f}x"
                 if base is not None and base["reached"] and x["reached"] else "—")
        opts = "".join(f" --{k.replace('_', '-')} {v}" for k, v in x["options"].items())
        label = f"`{x['label']}`" + (f" (`{x['scheme']}{opts}`, overlap)" if x["overlap"] else "")
        rows.append([label, _to_target(x, "steps_to_target", "{}"), _to_target(x, "seconds_to_target", "{:.1f}"),
                     speed, f"{100 * x['final_accuracy']:.1f} %", str(x["steps"]), f"{1e3 * x['step_seconds']:.0f}",
                     f"{1e3 * sp['compute']:.0f}", f"{1e3 * sp['exposed_exchange']:.0f}",
                     f"{1e3 * sp['hidden_exchange']:.0f}", f"{x['bytes_per_step']:,.0f}"])
    hosts, rate = (QUICK_HOSTS, QUICK_RATE) if quick else (HOSTS, RATE)
    rate = rate.replace("mbit", " Mbit/s").replace("gbit", " Gbit/s")
    head = (f"{r['model']} on {r['data']}, W = {r['world_size']} (one rank per emulated host, {hosts} hosts, links "
            f"of {rate}), batch {r['batch_size']} per rank, SGD lr {r['lr']} momentum "
            f"{r['momentum']}, density {r['density']} for the sparse schemes; target {100 * r['target']:.0f} % test "
            f"accuracy, at most {r['max_steps']} steps, the whole test set evaluated every {r['eval_every']} steps "
            f"(untimed). `{r['baseline']}` is the optimized dense baseline: dense, {r['baseline_wire_dtype']} on "
            f"the wire, exchanged from gradient hooks while backward runs; `dense` is float32, after backward.\n\n")
    notes = (
        "\n\nSteps and seconds to target: the first evaluation at or above the target (evaluations every "
        "interval and at each epoch's end) and the training "
        "wall-clock up to it, evaluations excluded. Step ms is the mean "
        "step after the first, mean over ranks: compute (forward, backward, the optimizer's update and the "
        "library's copies) + exposed exchange (the scheme's phases left in the step); hidden exchange is the "
        "communication thread's time in the buckets' exchanges minus the step's wait for them "
        "([performance.md](../performance.md#time-to-accuracy)). **Compute is a CPU's**: every emulated host "
        "shares this machine's cores (one thread per rank), so compute is far slower than a GPU's and the "
        "exchange weighs less here than it would on a GPU cluster; the machine was shared with other jobs.")
    plot = "" if quick else "\n\n![test accuracy against wall-clock](plots/tta.png)"
    return head + md_table(["scheme", "steps to target", "s to target", f"speedup vs {r['baseline']}",
                            "final accuracy", "steps run", "step ms", "compute ms", "exposed exchange ms",
                            "hidden exchange ms", "bytes/rank/step"], rows) + notes + plot


_table(Table(
    name="tta",
    title="Time to accuracy on an emulated cluster (`bench tta`)",
    about=("One model trained with each scheme through `DistributedOptimizer` until a target test accuracy or a "
           "step budget, on the emulated cluster: the optimized dense baseline (16-bit wire, overlap) beside "
           "float32 dense, the sparse schemes and PowerSGD. What `mpisparse advise` reads its steps-to-target "
           "ratios from."),
    runs=_runs,
    render=_render,
    unavailable=_emucluster_unavailable,
))
