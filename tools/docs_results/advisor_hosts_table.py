"""The advisor against measured training steps on 2 emulated hosts of 2 ranks, flat and two-level, at three
links (issue 45 item 5): ``docs/results/advisor-hosts.md``.

It needs the emulated cluster (root) and a quiet machine for about half an hour: ``bin/docs-results --only
advisor-hosts``.

What is measured, per link rate (one emulated NIC per host, the token bucket of ``bin/emucluster``): the link as
dense's exchange carried it with one rank a host (``bench exchange``), and each way's step on 2 hosts x 2 ranks
(``advise-steps``, flat and ``--hierarchical``); once: the two ranks of one host over its loopback (``bench
exchange`` on 1 host of 2 ranks: ``--intra-from``) and each scheme's overhead on one rank (``advise-steps -n
1``).  The advice (``advise -W 4 --ranks-per-host 2 --shared-cores 2``) is given those, the bytes of the flat run
at the fastest link (``--bytes-from``: a two-level run counts its ranks' bytes unevenly) and the share overlap
hid at the slowest (``--hidden-from``), and compared with the steps of its own exchange (``--measured``).
"""

from __future__ import annotations

from typing import Any

from .advisor_table import EMU_BURST, _block
from .framework import Run, Table, _emucluster_unavailable, _table, md_table

#: the emulated NIC rates, fastest first
RATES = ("1gbit", "300mbit", "30mbit")
QUICK_RATES = ("300mbit", "30mbit")
MODEL, BATCH = "resnet18", "16"
#: timed turns per way at each rate (the slow links' dense steps take seconds)
ITERS = {"1gbit": "6", "300mbit": "5", "30mbit": "4"}
HOWS = (("flat", []), ("hier", ["--hierarchical"]))


def _runs(quick: bool) -> list[Run]:
    rates = QUICK_RATES if quick else RATES
    model, iters = ("cnn", {r: "2" for r in rates}) if quick else (MODEL, ITERS)
    batch = "4" if quick else BATCH
    exchange = ["bench", "exchange", "--model", "resnet18", "--scheme", "dense", "--densities", "1", "--iters", "3",
                "--warmup", "1"]
    runs = [Run("overhead", ["advise-steps", "-n", "1", "--model", model, "--batch", batch, "--iters",
                             "2" if quick else "6", "--warmup", "1"]),
            Run("intra", exchange, emucluster=(1, rates[0]), ranks_per_host=2)]
    for r in rates:
        runs.append(Run(f"link-{r}", exchange, emucluster=(2, r)))
        for how, extra in HOWS:
            runs.append(Run(f"{how}-steps-{r}", ["advise-steps", "--model", model, "--batch", batch, "--iters", iters[r],
                                                 "--warmup", "1", *extra], emucluster=(2, r), ranks_per_host=2))
    for how, extra in HOWS:
        for r in rates:
            runs.append(Run(f"{how}-advise-{r}", ["advise", "--model", model, "-W", "4", "--ranks-per-host", "2",
                                                  "--shared-cores", "2", "--latency-us", "0", "--burst", EMU_BURST,
                                                  *extra],
                            out_options={"--overhead-from": "overhead.json", "--link-from": f"link-{r}.json",
                                         "--intra-from": "intra.json", "--measured": f"{how}-steps-{r}.json",
                                         "--hidden-from": f"flat-steps-{rates[-1]}.json",
                                         "--bytes-from": f"flat-steps-{rates[0]}.json"}))
    return runs


def _render(res: dict[str, Any], quick: bool) -> str:
    rates = QUICK_RATES if quick else RATES
    model = "cnn" if quick else MODEL
    intra = res["flat-advise-" + rates[0]]["setting"]["intra"]["bandwidth"]
    out = [f"W = 4: 2 emulated hosts of 2 ranks; the ranks of a host reach each other over its loopback, which "
           f"carried dense's exchange at {8 * intra / 1e9:.2f} Gbit/s (`--intra-from`).", ""]
    for how, label in (("flat", "Flat collectives"), ("hier", "Two-level collectives (`--hierarchical`)")):
        out += [f"### {label}, {model}", "", _block(res, rates, model, f"{how}-"), ""]
    models = []
    for how, _ in HOWS:
        a = res[f"{how}-advise-{rates[0]}"]
        models.append([how, ", ".join(f"`{r['scheme']}`: {r['exchange_model']}" for r in a["rows"])])
    out += ["Each way's exchange model in the advice:", "", md_table(["collectives", "models"], models, right=[]), ""]
    return "\n".join(out)


TABLE = _table(Table(
    name="advisor-hosts",
    title="The advisor against measured steps on 2 emulated hosts of 2 ranks, flat and two-level",
    about=("`mpisparse advise` with several ranks a host (`--ranks-per-host 2`): each exchange modelled as the code "
           "runs it (flat: the bytes that really cross each host's NIC; two-level: `--hierarchical`), against every "
           "scheme's training step measured by `advise-steps` on 2 emulated hosts of 2 ranks at three link rates. "
           "Its inputs and the comparison as in [advisor.md](../advisor.md) (paired by turn, the sign test, ties)."),
    runs=_runs,
    render=_render,
    unavailable=lambda: _emucluster_unavailable(),
))
