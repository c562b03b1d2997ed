"""The advisor (``mpisparse advise``) against measured training steps on the emulated cluster, at three link
rates that span its crossover."""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _table, md_table, _emucluster_unavailable

#: nominal rates (tc syntax), fastest first; the fastest is what the emulation delivers at most
ADVISOR_RATES = ("10gbit", "300mbit", "30mbit")
QUICK_RATES = ("1gbit", "30mbit")


def _runs(quick: bool) -> list[Run]:
    model = "cnn" if quick else "resnet18"
    rates = QUICK_RATES if quick else ADVISOR_RATES
    iters = "1" if quick else "4"
    batch = "4" if quick else "16"
    # each scheme's step overhead (library + scheme compute) on one rank alone, a share of its compute
    runs = [Run("overhead", ["advise-steps", "-n", "1", "--model", model, "--batch", batch, "--iters", iters,
                             "--warmup", "1"])]
    for r in rates:
        runs += [Run(f"link-{r}", ["bench", "exchange", "--model", model, "--scheme", "dense", "--densities", "1",
                                   "--iters", iters, "--warmup", "1"], emucluster=(2, r)),
                 Run(f"steps-{r}", ["advise-steps", "--model", model, "--batch", batch,
                                    "--iters", iters, "--warmup", "1"], emucluster=(2, r))]
    for r in rates:  # the share overlap hides: measured once, at the fastest rate, for every rate
        runs.append(Run(f"advise-{r}", ["advise", "--model", model, "-W", "2", "--hosts", "2", "--shared-cores", "2",
                                        "--latency-us", "0"],
                        out_options={"--overhead-from": "overhead.json", "--link-from": f"link-{r}.json", "--measured": f"steps-{r}.json",
                                     "--hidden-from": f"steps-{rates[0]}.json"}))
    return runs


def _gbit(bw: float | None) -> str:
    if bw is None:
        return "none"
    bits = 8 * float(bw)
    return f"{bits / 1e9:.2f} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.0f} Mbit/s"


def _advisor_render(res: dict[str, Any], quick: bool) -> str:
    rates = QUICK_RATES if quick else ADVISOR_RATES
    summary, detail, loads = [], [], []
    for r in rates:
        a, st = res[f"advise-{r}"], res[f"steps-{r}"]
        v = a["validation"]
        summary.append([f"`{r}`", _gbit(a["bandwidth"]), f"{1e3 * a['setting']['compute']:,.0f}",
                        f"{100 * a['setting']['hidden_share']:.0f}%", f"`{v['predicted_winner']}`",
                        f"`{v['measured_winner']}`", "yes" if v["winner_agrees"] else "**no**",
                        f"{100 * v['max_abs_error']:.0f}%", _gbit(a["crossover_bandwidth"])])
        for row in v["rows"]:
            detail.append([f"`{r}`", f"`{row['scheme']}`", f"{1e3 * row['predicted_seconds']:,.0f}",
                           f"{1e3 * row['measured_seconds']:,.0f}", f"{100 * row['error']:+.0f}%"])
        la = st.get("load_average") or {}
        if la:
            loads.append(f"`{r}`: {la['before'][0]:.1f} before, {la['after'][0]:.1f} after")
    agree = sum(1 for r in rates if res[f"advise-{r}"]["validation"]["winner_agrees"])
    within = sum(1 for r in rates for row in res[f"advise-{r}"]["validation"]["rows"] if abs(row["error"]) <= 0.25)
    total = sum(len(res[f"advise-{r}"]["validation"]["rows"]) for r in rates)
    out = [md_table(["link (nominal)", "link carried", "compute ms", "overlap hides", "predicted winner",
                     "measured winner", "agree", "largest error", "predicted crossover"], summary),
           "",
           f"The predicted winner is the measured one at {agree} of {len(rates)} rates; {within} of {total} "
           "predicted steps are within 25% of the measured. Load average (1 min) of the 2-core machine during "
           "the measured steps: " + "; ".join(loads) + ". Steps to target are not given (no `--tta`): every "
           "scheme is assumed to need as many steps as dense, so the winner is the fastest step.",
           "",
           md_table(["link (nominal)", "scheme", "predicted ms", "measured ms", "error"], detail)]
    return "\n".join(out)


_table(Table(
    name="advisor",
    title="The advisor (`mpisparse advise`) against measured training steps at three link rates",
    about=("`mpisparse advise` predicts each scheme's training step (compute + the scheme's own compute + the "
           "exposed exchange; the optimized dense baseline `dense-opt` is dense with a float16 wire, overlapped "
           "with backward), the winner and the crossover link bandwidth. Its inputs, measured in the same session "
           "as the steps it is checked against: the link's bandwidth as dense's exchange really carried it "
           "(`bench exchange`, `--link-from`), the compute step (the `compute` way of `advise-steps`), the share "
           "of the exchange overlap hides (measured once, at the fastest rate, `--hidden-from`), and each scheme's step overhead (the "
           "library's and the scheme's own compute, a 16-bit wire's casts) measured on one rank alone as a share "
           "of its compute step (`advise-steps -n 1`, `--overhead-from`); the exchange is the cost model's byte "
           "model at the link carried. The measured steps are `advise-steps`: "
           "resnet18 (CIFAR-shaped random batches of 16), forward, backward, the exchange and the update through "
           "`DistributedOptimizer`, on 2 emulated hosts; compute is this machine's CPU (2 shared cores)."),
    runs=_runs,
    render=_advisor_render,
    unavailable=lambda: _emucluster_unavailable(),
))
