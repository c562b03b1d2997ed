"""The advisor (``mpisparse advise``) against measured training steps at three links, the fastest this machine
has (no emulation: 2 ranks on one host, shared memory) and two emulated ones a decade apart."""

from __future__ import annotations

from typing import Any

from mpisparse.bench.advise_measured import sign_test_p

from .framework import Run, Table, _table, md_table, _emucluster_unavailable

#: no emulation: the 2 ranks on this host, over shared memory (the fastest link here; the emulated links top out
#: near 4 Gbit/s, where the 16-bit dense baseline still cannot win)
NONE = "none"
#: the links, fastest first: ``none``, then nominal rates of the emulated cluster (tc syntax)
ADVISOR_RATES = (NONE, "300mbit", "30mbit")
QUICK_RATES = (NONE, "30mbit")
#: ``(model, label prefix, batch, timed turns per way at each link, steps per turn)`` of each block of the table:
#: resnet18 (the slow links' dense steps take seconds each, so fewer there; its 0.6 s of compute refills the
#: emulated links' token bucket, 128 kB, before every step, so one step a turn is its steady state), and the
#: small cnn (57 K parameters) at batch 4, whose steps (about 15 ms of compute) are short enough that the bucket
#: does not refill during one, so that its crossover lies between the links; its ways run 8 steps a turn, the
#: last 4 timed, so that a way has drained what the bucket refilled during the other ways' turns (one scheme
#: training alone would have)
BLOCKS = (("resnet18", "", "16", {NONE: "8", "300mbit": "6", "30mbit": "4"}, "1"),
          ("cnn", "cnn-", "4", {NONE: "24", "300mbit": "24", "30mbit": "24"}, "8"))
QUICK_BLOCKS = (("cnn", "", "4", {NONE: "1", "30mbit": "1"}, "2"),)
#: bin/emucluster's token bucket on each link (its --burst default): the advisor is told (``--burst``); the
#: one-host run (``none``) has none
EMU_BURST = "128kb"


def _runs(quick: bool) -> list[Run]:
    rates = QUICK_RATES if quick else ADVISOR_RATES
    blocks = QUICK_BLOCKS if quick else BLOCKS
    runs = []
    for model, pre, batch, iters, per_turn in blocks:
        # each scheme's step overhead (library + scheme compute) on one rank alone, a share of its compute
        runs.append(Run(f"{pre}overhead", ["advise-steps", "-n", "1", "--model", model, "--batch", batch,
                                           "--iters", "1" if quick else "6" if model == "resnet18" else "24",
                                           "--warmup", "1", "--steps-per-turn", per_turn]))
    for r in rates:
        # the link is measured once, with resnet18's exchange, for every model (bench exchange has no cnn)
        link = ["bench", "exchange", "--model", "resnet18", "--scheme", "dense", "--densities", "1", "--iters",
                blocks[0][3][r], "--warmup", "1"]
        runs.append(Run(f"link-{r}", link[:2] + ["-n", "2"] + link[2:]) if r == NONE else
                    Run(f"link-{r}", link, emucluster=(2, r)))
        for model, pre, batch, iters, per_turn in blocks:
            steps = ["advise-steps", "--model", model, "--batch", batch, "--iters", iters[r], "--warmup", "1",
                     "--steps-per-turn", per_turn]
            runs.append(Run(f"{pre}steps-{r}", steps[:1] + ["-n", "2"] + steps[1:]) if r == NONE else  # one host
                        Run(f"{pre}steps-{r}", steps, emucluster=(2, r)))
    for model, pre, batch, _iters, _per_turn in blocks:
        for r in rates:
            # --hosts 2: each rank's link is what its own share of dense's exchange carried (--link-from), one
            # host or two
            # the bytes each scheme sent per step: measured once, at the fastest link, for every link
            # the share overlap hides: measured once, at the slowest link, where the exchange is most of the
            # step (on the fastest, dense-16's casts cost more than its halved bytes save: a share of noise)
            runs.append(Run(f"{pre}advise-{r}", ["advise", "--model", model, "-W", "2", "--hosts", "2",
                                                 "--shared-cores", "2", "--latency-us", "0",
                                                 "--burst", "0" if r == NONE else EMU_BURST],
                            out_options={"--overhead-from": f"{pre}overhead.json", "--link-from": f"link-{r}.json",
                                         "--measured": f"{pre}steps-{r}.json",
                                         "--hidden-from": f"{pre}steps-{rates[-1]}.json",
                                         "--bytes-from": f"{pre}steps-{rates[0]}.json"}))
    return runs


def _others(names, winner) -> str:
    """The ways tied with ``winner`` (the winner left out), or ``-``."""
    return ", ".join(f"`{t}`" for t in names or [] if t != winner) or "-"


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
    out = []
    for model, pre, batch, _iters, _per_turn in (QUICK_BLOCKS if quick else BLOCKS):
        out += [f"### {model}, batch {batch}, W = 2", "", _block(res, rates, model, pre), ""]
    return "\n".join(out).rstrip() + "\n"


def _block(res: dict[str, Any], rates, model: str, pre: str) -> str:
    summary, detail, loads = [], [], []
    val = {r: res[f"{pre}advise-{r}"]["validation"] for r in rates}
    for r in rates:
        a, st, v = res[f"{pre}advise-{r}"], res[f"{pre}steps-{r}"], val[r]
        noise = v.get("within_noise")
        summary.append([_link_name(r), _gbit(a["bandwidth"]), f"{1e3 * a['setting']['compute']:,.0f}",
                        f"{100 * a['setting']['hidden_share']:.0f}%", f"`{v['predicted_winner']}`",
                        _others(v.get("predicted_ties"), v["predicted_winner"]),
                        f"`{v['measured_winner']}`", _others(v.get("tied"), v["measured_winner"]),
                        "yes" if v["winner_agrees"] else "at resolution" if v.get("agrees_at_resolution")
                        else "**no**",
                        "-" if v["winner_agrees"] else _pct(v.get("gap"), sign=True) + (
                            "" if noise is None else f", slower in {v['slower_turns']} of {v['turns']} turns"
                            + f" (p = {sign_test_p(v['slower_turns'], v['turns']):.2g})"),
                        f"{v['predicted_kind']} / {v['measured_kind']}",
                        f"{100 * v['max_abs_error']:.0f}%", _gbit(a["crossover_bandwidth"])])
        for row in v["rows"]:
            lo, hi = row.get("over_compute_min_seconds"), row.get("over_compute_max_seconds")
            span = "-" if lo is None else f"{1e3 * lo:+,.1f} to {1e3 * hi:+,.1f}"
            detail.append([_link_name(r), f"`{row['scheme']}`", f"{1e3 * row['predicted_seconds']:,.1f}",
                           f"{1e3 * row['measured_seconds']:,.1f}", f"{1e3 * row['measured_median_seconds']:,.1f}",
                           span, f"{100 * row['error']:+.0f}%"])
        la = st.get("load_average") or {}
        if la:
            loads.append(f"{_link_name(r)}: {la['before'][0]:.1f} before, {la['after'][0]:.1f} after")
    agree = sum(1 for r in rates if val[r]["winner_agrees"])
    resolution = sum(1 for r in rates if not val[r]["winner_agrees"] and val[r].get("agrees_at_resolution"))
    noise = sum(1 for r in rates if not val[r]["winner_agrees"] and not val[r].get("agrees_at_resolution")
                and val[r].get("within_noise"))
    kinds = sum(1 for r in rates if val[r]["kind_agrees"])
    within = sum(1 for r in rates for row in val[r]["rows"] if abs(row["error"]) <= 0.25)
    total = sum(len(val[r]["rows"]) for r in rates)
    winners = [val[r]["measured_winner"] for r in rates]
    kinds_measured = [val[r]["measured_kind"] for r in rates]
    turns = sorted({v["turns"] for v in val.values() if v.get("turns")})
    out = [md_table(["link", "link carried", "compute ms", "overlap hides", "predicted winner",
                     "its ties (the overheads' 95% interval)", "measured winner",
                     "its ties (sign test)", "agree", "predicted winner's measured step against the best",
                     "decision predicted / measured", "largest error", "predicted crossover"], summary),
           "",
           f"{model}: the predicted winner is the measured one at {agree} of {len(rates)} links (strictly, by the "
           f"paired step), and at the resolution of both sides at {resolution} more (the measured winner among "
           "the advice's ties, the predicted winner within the measurement's noise)"
           + (f", within the noise but not among the ties at {noise} more" if noise else "")
           + f"; the decision dense or sparse agrees at {kinds} of {len(rates)}; {within} of {total} "
           "predicted steps are within 25% of the measured. The measured winner "
           + ("changes between the links (" + ", ".join(f"`{w}`" for w in winners) + "), and the decision "
              + ("changes too" if len(set(kinds_measured)) > 1 else "does not: it is "
                 + f"`{kinds_measured[0]}` at every link") if len(set(winners)) > 1
              else f"is `{winners[0]}` at every link") + ". "
           f"Timed turns per way: {', '.join(map(str, turns))}. Load average (1 min) of the 2-core machine "
           "during the measured steps: " + "; ".join(loads) + ".",
           "",
           md_table(["link", "scheme", "predicted ms", "measured ms (paired)", "plain median ms",
                     "over compute, least to most ms", "error"], detail)]
    return "\n".join(out)


_table(Table(
    name="advisor",
    title="The advisor (`mpisparse advise`) against measured training steps at three links",
    about=("`mpisparse advise` predicts each scheme's training step (compute + the scheme's own compute + the "
           "exposed exchange; the optimized dense baseline `dense-opt` is dense with a float16 wire, overlapped "
           "with backward), the winner and the crossover link bandwidth. Its inputs, measured in the same session "
           "as the steps it is checked against: the link's bandwidth as dense's exchange really carried it "
           "(`bench exchange` of resnet18's gradient, `--link-from`, used for both models), the compute step (the "
           "`compute` way of `advise-steps`), the share of the exchange overlap hides (measured once, at the "
           "slowest link, where the exchange is most of the step, `--hidden-from`), and each scheme's step "
           "overhead (the library's and the scheme's own "
           "compute, a 16-bit wire's casts) measured on one rank alone as a share of its compute step "
           "(`advise-steps -n 1`, `--overhead-from`), and the bytes each scheme sent per step (measured once, at "
           "the fastest link, `--bytes-from`: oktopk's reused thresholds let its count drift far above k); the "
           "exchange is the cost model's at the link carried, its bandwidth term scaled to those bytes, less what "
           "the emulated links' token bucket (tc tbf, 128 kB, refilled while the ranks compute: `--burst 128kb`) "
           "lets through at once. The measured steps are `advise-steps`: the model (CIFAR-shaped random batches) "
           "forward, "
           "backward, the exchange and the update through `DistributedOptimizer`, on 2 ranks: on one host without "
           "emulation (`none`: shared memory, the fastest link this machine has; the emulated links top out near "
           "4 Gbit/s) and on 2 emulated hosts at 300 and 30 Mbit/s; compute is this machine's CPU (2 cores, "
           "shared with other jobs). The ways take turns (resnet18: a step each; the cnn: 8 steps each, the mean of "
           "the last 4 the turn's step, so that each way has drained the token bucket the other ways' turns "
           "let refill, as one scheme training alone would), so a measured step is *paired by turn*: "
           "the compute way's median step plus the median over the timed turns of (the way's step - the compute "
           "way's step in the same turn), which cancels the other jobs' load that changes from turn to turn; the "
           "overheads, the compute and the hidden share are read the same way. The plain median of the way's own "
           "steps stands beside it, and the range of its excess over compute across the turns. Where the "
           "predicted and the measured winner differ, the gap column is how much slower the predicted winner's "
           "measured step was than the measured best's and in how many turns it was the slower of the two, with "
           "a one-sided sign test's p over the turns: *within noise* when p >= 0.05 (with 4 turns even 4 of 4 is "
           "p = 0.0625); the ways the same test cannot tell from the measured best are listed. The advice "
           "names the winner and its *ties*: the schemes whose measured overheads cannot separate them from it "
           "(the distribution-free 95% interval of the median of their per-turn difference in the one-rank run "
           "closes the predicted gap); the two sides agree *at resolution* when the measured winner is among "
           "those ties and the predicted winner is within the measurement's noise of the measured best. Steps "
           "to target are not given (no `--tta`): every scheme is assumed to need as many steps as dense, so the "
           "winner is the fastest step."),
    runs=_runs,
    render=_advisor_render,
    unavailable=lambda: _emucluster_unavailable(),
))
