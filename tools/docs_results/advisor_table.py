"""The advisor (``mpisparse advise``) against measured training steps at three links, the fastest this machine
has (no emulation: 2 ranks on one host, shared memory) and two emulated ones a decade apart."""

from __future__ import annotations

from typing import Any

from .framework import Run, Table, _table, md_table, _emucluster_unavailable

#: no emulation: the 2 ranks on this host, over shared memory (the fastest link here; the emulated links top out
#: near 4 Gbit/s, where the 16-bit dense baseline still cannot win)
NONE = "none"
#: the links, fastest first: ``none``, then nominal rates of the emulated cluster (tc syntax)
ADVISOR_RATES = (NONE, "300mbit", "30mbit")
QUICK_RATES = (NONE, "30mbit")
#: timed steps per way at each link (the slow links' dense steps take seconds each)
ITERS = {NONE: "8", "300mbit": "6", "30mbit": "4"}


def _runs(quick: bool) -> list[Run]:
    model = "cnn" if quick else "resnet18"
    rates = QUICK_RATES if quick else ADVISOR_RATES
    batch = "4" if quick else "16"
    it = (lambda r: "1") if quick else (lambda r: ITERS[r])
    # each scheme's step overhead (library + scheme compute) on one rank alone, a share of its compute
    runs = [Run("overhead", ["advise-steps", "-n", "1", "--model", model, "--batch", batch, "--iters",
                             "1" if quick else "6", "--warmup", "1"])]
    for r in rates:
        # the link is measured with resnet18's exchange whatever the model (bench exchange has no cnn)
        link = ["bench", "exchange", "--model", "resnet18", "--scheme", "dense", "--densities", "1", "--iters", it(r),
                "--warmup", "1"]
        steps = ["advise-steps", "--model", model, "--batch", batch, "--iters", it(r), "--warmup", "1"]
        if r == NONE:  # one host: mpiexec -n 2 here
            runs += [Run(f"link-{r}", link[:2] + ["-n", "2"] + link[2:]),
                     Run(f"steps-{r}", steps[:1] + ["-n", "2"] + steps[1:])]
        else:
            runs += [Run(f"link-{r}", link, emucluster=(2, r)), Run(f"steps-{r}", steps, emucluster=(2, r))]
    for r in rates:  # the share overlap hides: measured once, at the fastest link, for every link
        # --hosts 2: each rank's link is what its own share of dense's exchange carried (--link-from), one
        # host or two
        runs.append(Run(f"advise-{r}", ["advise", "--model", model, "-W", "2", "--hosts", "2", "--shared-cores", "2",
                                        "--latency-us", "0"],
                        out_options={"--overhead-from": "overhead.json", "--link-from": f"link-{r}.json",
                                     "--measured": f"steps-{r}.json", "--hidden-from": f"steps-{rates[0]}.json"}))
    return runs


def _link_name(r: str) -> str:
    return "none: one host, shared memory" if r == NONE else f"`{r}` emulated"


def _gbit(bw: float | None) -> str:
    if bw is None:
        return "none"
    bits = 8 * float(bw)
    return f"{bits / 1e9:.2f} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.0f} Mbit/s"


def _pct(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else (f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%")


def _advisor_render(res: dict[str, Any], quick: bool) -> str:
    rates = QUICK_RATES if quick else ADVISOR_RATES
    summary, detail, loads = [], [], []
    for r in rates:
        a, st = res[f"advise-{r}"], res[f"steps-{r}"]
        v = a["validation"]
        noise = v.get("within_noise")
        summary.append([_link_name(r), _gbit(a["bandwidth"]), f"{1e3 * a['setting']['compute']:,.0f}",
                        f"{100 * a['setting']['hidden_share']:.0f}%", f"`{v['predicted_winner']}`",
                        f"`{v['measured_winner']}`", "yes" if v["winner_agrees"] else "**no**",
                        "-" if v["winner_agrees"] else _pct(v.get("gap"), sign=True) + (
                            "" if noise is None else f", slower in {v['slower_turns']} of {v['turns']} turns"
                            + (" (within noise)" if noise else " (beyond noise)")),
                        f"{v['predicted_kind']} / {v['measured_kind']}",
                        f"{100 * v['max_abs_error']:.0f}%", _gbit(a["crossover_bandwidth"])])
        for row in v["rows"]:
            lo, hi = row.get("over_compute_min_seconds"), row.get("over_compute_max_seconds")
            span = "-" if lo is None else f"{1e3 * lo:+,.0f} to {1e3 * hi:+,.0f}"
            detail.append([_link_name(r), f"`{row['scheme']}`", f"{1e3 * row['predicted_seconds']:,.0f}",
                           f"{1e3 * row['measured_seconds']:,.0f}", f"{1e3 * row['measured_median_seconds']:,.0f}",
                           span, f"{100 * row['error']:+.0f}%"])
        la = st.get("load_average") or {}
        if la:
            loads.append(f"{_link_name(r)}: {la['before'][0]:.1f} before, {la['after'][0]:.1f} after")
    agree = sum(1 for r in rates if res[f"advise-{r}"]["validation"]["winner_agrees"])
    kinds = sum(1 for r in rates if res[f"advise-{r}"]["validation"]["kind_agrees"])
    within = sum(1 for r in rates for row in res[f"advise-{r}"]["validation"]["rows"] if abs(row["error"]) <= 0.25)
    total = sum(len(res[f"advise-{r}"]["validation"]["rows"]) for r in rates)
    winners = [res[f"advise-{r}"]["validation"]["measured_winner"] for r in rates]
    kinds_measured = [res[f"advise-{r}"]["validation"]["measured_kind"] for r in rates]
    out = [md_table(["link", "link carried", "compute ms", "overlap hides", "predicted winner",
                     "measured winner", "agree", "predicted winner's measured step against the best",
                     "decision predicted / measured", "largest error", "predicted crossover"], summary),
           "",
           f"The predicted winner is the measured one at {agree} of {len(rates)} links (strictly, by the paired "
           f"step); the decision dense or sparse agrees at {kinds} of {len(rates)}; {within} of {total} predicted "
           "steps are within 25% of the measured. The measured winner "
           + ("changes between the links (" + ", ".join(f"`{w}`" for w in winners) + "), and the decision "
              + ("changes too" if len(set(kinds_measured)) > 1 else "does not: it is "
                 + f"`{kinds_measured[0]}` at every link") if len(set(winners)) > 1
              else f"is `{winners[0]}` at every link") + ". "
           "A measured step is paired by turn: the ways take turns step by step, so each is the compute way's "
           "median step plus the median over the timed turns of (the way's step - the compute way's step in the "
           "same turn), which cancels the load of other jobs that changes from turn to turn (the plain median "
           "of the way's own steps is beside it, and the range of its excess over compute across the turns). "
           "Where the winners differ, the gap column is how much slower the predicted winner's measured step was "
           "than the measured best's, and in how many turns it was the slower of the two; *beyond noise* only "
           "when it was slower in every turn. Load average (1 min) of the 2-core "
           "machine during the measured steps: " + "; ".join(loads) + ". Steps to target are not given (no "
           "`--tta`): every scheme is assumed to need as many steps as dense, so the winner is the fastest step.",
           "",
           md_table(["link", "scheme", "predicted ms", "measured ms (paired)", "plain median ms",
                     "over compute, least to most ms", "error"], detail)]
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
           "model at the link carried (the compute step, the overheads and the hidden share are paired by "
           "turn with the compute way, as the measured steps below). The measured steps are `advise-steps`: "
           "resnet18 (CIFAR-shaped random batches of 16), forward, backward, the exchange and the update through "
           "`DistributedOptimizer`, on 2 ranks: on one host without emulation (shared memory, the fastest link this machine has) and on 2 emulated "
           "hosts; compute is this machine's CPU (2 shared cores)."),
    runs=_runs,
    render=_advisor_render,
    unavailable=lambda: _emucluster_unavailable(),
))
