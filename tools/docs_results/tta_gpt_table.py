"""Time to a held-out loss for the gpt language model (``bench tta --model gpt``) on 2 emulated hosts at two
link rates, each measurement beside the advisor's prediction (``advise --tta``): docs/results/tta-gpt.md."""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _emucluster_unavailable, _table, md_table

#: the link rates of the committed measurement (a slow link, a fast one) and of the quick form
RATES = ("100mbit", "1gbit")
QUICK_RATES = ("100mbit",)
HOSTS = 2
SCHEMES = ("dense-opt", "dense", "topk", "cltk", "deft", "powersgd")
QUICK_SCHEMES = ("dense-opt", "topk")
#: the training run of every scheme (the tiny default gpt on the bundled pydoc text)
BATCH, DENSITY, TARGET_LOSS, MAX_STEPS, EVAL_EVERY = 16, 0.01, 2.7, 300, 20
QUICK = {"target": 3.5, "max_steps": 40, "eval_every": 10}


def _runs(quick: bool) -> list[Run]:
    runs = []
    schemes = QUICK_SCHEMES if quick else SCHEMES
    target, max_steps, every = ((QUICK["target"], QUICK["max_steps"], QUICK["eval_every"]) if quick
                                else (TARGET_LOSS, MAX_STEPS, EVAL_EVERY))
    for rate in (QUICK_RATES if quick else RATES):
        args = ["bench", "tta", "--model", "gpt", *[a for s in schemes for a in ("--scheme", s)],
                "--density", str(DENSITY), "--target-loss", str(target), "--max-steps", str(max_steps),
                "--eval-every", str(every), "--batch-size", str(BATCH), "--no-progress"]
        runs.append(Run(f"tta-{rate}", args, emucluster=(HOSTS, rate)))
        # the advisor, told each scheme's measured steps to target, predicts the seconds: its compute is
        # measured here on one rank (the same net and batch), the link is the emulated one (a token bucket
        # of 128 kB, no latency), both ranks share this machine's 2 cores
        runs.append(Run(f"advise-{rate}", ["advise", "--model", "gpt", "--batch", str(BATCH), "-W", str(HOSTS),
                                           "--hosts", str(HOSTS), "--rate", rate, "--density", str(DENSITY),
                                           "--shared-cores", "2", "--latency-us", "0", "--burst", "128kb"],
                        out_options={"--tta": f"tta-{rate}.json"}))
    return runs


def _rows(tta: dict[str, Any], adv: dict[str, Any]) -> list[list[str]]:
    predicted = {r["scheme"]: r for r in adv.get("rows", [])}
    base = next((x for x in tta["rows"] if x["label"] == tta["baseline"]), None)
    out = []
    for x in tta["rows"]:
        p = predicted.get(x["label"])
        reached = x["reached"]
        seconds = x["seconds_to_target"] if reached else None
        pred = p["time_to_target"] if p is not None and reached else None
        err = f"{100 * (pred - seconds) / seconds:+.0f} %" if pred is not None and seconds else "—"
        speed = (f"{base['seconds_to_target'] / seconds:.2f}x" if base is not None and base["reached"] and seconds
                 else "—")
        out.append([f"`{x['label']}`", str(x["steps_to_target"]) if reached else "not reached",
                    f"{seconds:.1f}" if seconds else "not reached", f"{pred:.1f}" if pred is not None else "—", err,
                    speed, f"{x['final_loss']:.3f}", f"{1e3 * x['step_seconds']:.0f}",
                    f"{1e3 * p['step_seconds']:.0f}" if p is not None else "—", f"{x['bytes_per_step']:,.0f}"])
    return out


def _render(res: dict[str, Any], quick: bool) -> str:
    parts = []
    for rate in (QUICK_RATES if quick else RATES):
        tta, adv = res.get(f"tta-{rate}"), res.get(f"advise-{rate}")
        if not tta or not adv:
            parts.append(f"(no result at {rate})")
            continue
        speed = rate.replace("mbit", " Mbit/s").replace("gbit", " Gbit/s")
        ran = {x["label"] for x in tta["rows"]}
        predicted = [r for r in adv.get("rows", []) if r["scheme"] in ran and r["time_to_target"] is not None]
        winner = min(predicted, key=lambda r: r["time_to_target"])["scheme"] if predicted else None
        measured = min((x for x in tta["rows"] if x["reached"]), key=lambda x: x["seconds_to_target"], default=None)
        parts.append(
            f"### Links of {speed}\n\n"
            + md_table(["scheme", "steps to target", "s to target (measured)", "s to target (advisor)",
                        "advisor's error", f"speedup vs {tta['baseline']}", "final held-out loss", "step ms (measured)",
                        "step ms (advisor)", "bytes/rank/step"], _rows(tta, adv))
            + f"\n\nAdvisor's winner among these schemes: `{winner}`; measured winner: "
            + (f"`{measured['label']}`" if measured else "none reached the target")
            + f"; the advisor's compute step: {1e3 * adv['setting']['compute']:.0f} ms ({adv.get('compute_from')}).")
    t = res.get(f"tta-{(QUICK_RATES if quick else RATES)[0]}") or {}
    head = (f"gpt (the default tiny size) on the bundled pydoc text, W = {HOSTS} (one rank per emulated host), batch "
            f"{BATCH} windows per rank, density {DENSITY} for the sparse schemes; target: held-out "
            f"{t.get('target_metric', 'loss')} {t.get('target', '')}, at most "
            f"{QUICK['max_steps'] if quick else MAX_STEPS} steps, the held-out text evaluated every "
            f"{QUICK['eval_every'] if quick else EVAL_EVERY} steps (untimed). `dense-opt` is the optimized dense "
            "baseline (a 16-bit wire, overlapped with backward), `dense` float32 after backward.\n\n")
    notes = ("\n\nThe advisor's seconds to target are its predicted step (`mpisparse advise`, the compute measured "
             "on one rank here, the emulated link's rate as a 128 kB token bucket, the ranks sharing 2 cores) times "
             "the measured steps to target (`--tta`): it is the step time that is predicted, the steps are "
             "measured. **Compute is a CPU's**: both emulated hosts share this machine's cores, so the exchange "
             "weighs far less than on a GPU cluster.")
    return head + "\n\n".join(parts) + notes


_table(Table(
    name="tta-gpt",
    title="Time to a held-out loss for a transformer language model (`bench tta --model gpt`), with the advisor's "
          "prediction",
    about=("The gpt language model trained with each scheme until a held-out loss, on 2 emulated hosts at a slow "
           "and a fast link, each time to target beside the advisor's prediction from the same measured steps."),
    runs=_runs,
    render=_render,
    unavailable=_emucluster_unavailable,
))
