"""The reproduce tables: each ``mpisparse reproduce`` target in its ``--quick`` form, the targets recorded
at full size too, and the timing targets recorded at a larger W on the emulated cluster.
"""

from __future__ import annotations

import re
from typing import Any

from .framework import Renderer, Run, Table, _as_list, _emucluster_unavailable, _scrub, _table, md_table


REPRODUCE_TARGETS = ("deft-buildup", "deft-breakdown", "deft-speedup", "scalecom-similarity", "dct-threshold",
                     "slimdp-traffic", "dgs-speedup")


def _paper(seed: str) -> str:
    """A paper reference without the project's internal numbering (``"001 DEFT (...)"`` -> ``"DEFT (...)"``)."""
    return re.sub(r"^\s*\d+\s+", "", seed or "")


def _reproduce_render(target: str) -> Renderer:
    def render(res: dict[str, Any], quick: bool) -> str:
        reps = [r for r in _as_list(res[target]) if r.get("target") == target] or _as_list(res[target])
        rep = reps[0]
        if rep.get("skipped"):
            return f"Skipped: {rep['skipped']}"
        out = [f"Paper: {_paper(rep.get('seed', ''))}. Size: `{rep.get('size')}`. Network: {rep.get('network')}. "
               f"The target's own runs (`{target}` prints and runs them):",
               "```console\n" + "\n".join("$ " + _scrub(c) for c in rep.get("commands", [])) + "\n```"]
        for d in rep.get("details", []):
            out.append(f"### {d.get('title', '')}\n\n```text\n{_scrub(d.get('table', '')).rstrip()}\n```")
        rows = []
        for c in rep.get("claims", []):
            measured = c.get("measured", "") + (f" ({c['note']})" if c.get("note") else "")
            holds = "noise" if c.get("within_noise") else {True: "yes", False: "no", None: "n/a"}.get(
                c.get("holds"), str(c.get("holds")))
            rows.append([c.get("source", ""), c.get("claim", ""), c.get("paper", ""), measured, holds])
        out.append("### Claims against measurements\n\n"
                   + md_table(["source", "paper's claim", "paper", "measured", "holds"], rows, right=()))
        if rep.get("notes"):
            out.append("\n".join(f"* {_scrub(n)}" for n in rep["notes"]))
        return "\n\n".join(out)

    return render


#: the targets whose full-size form (no --quick) is recorded too: their claims are not timings, or (dgs-speedup)
#: their accuracy claim is not; run with --no-timing, so no time claim is judged on a shared machine
REPRODUCE_FULL = ("scalecom-similarity", "deft-buildup", "dct-threshold", "dgs-speedup")
#: timing targets whose full size fits this machine (one process, no network): recorded as they are, times judged
REPRODUCE_FULL_TIMED = ("deft-speedup",)

for _t in REPRODUCE_TARGETS:
    _table(Table(
        name=f"reproduce-{_t}",
        title=f"Reproducing a paper's claim: `reproduce {_t}`",
        about=("One `mpisparse reproduce` target in its `--quick` form (a few minutes on two cores): the "
               "measurements it runs, its detail tables, and each claim of the paper beside the measured value. "
               "`holds` says whether the measurement agrees; `n/a` where it cannot be compared (for example "
               "another W than the paper's); `noise` where two times are closer than the noise margin."),
        runs=(lambda t: lambda quick: [Run(t, ["reproduce", t, "--quick"], out_options={"--out": "runs"})])(_t),
        render=_reproduce_render(_t),
        env=lambda quick: {"MPISPARSE_QUICK": "1"} if quick else {},
    ))

for _t, _timed in [(t, False) for t in REPRODUCE_FULL] + [(t, True) for t in REPRODUCE_FULL_TIMED]:
    _table(Table(
        name=f"reproduce-full-{_t}",
        title=(f"Reproducing a paper's claim at full size: `reproduce {_t}"
               + ("`" if _timed else " --no-timing`")),
        about=(("One timing `mpisparse reproduce` target in its full-size form (no `--quick`: its full W sweep, "
                "more repeats), which fits this machine because it times every rank's share in one process: "
                "each claim beside the measured value, with its rule and, for a `no`, its cause. ") if _timed else
               ("One `mpisparse reproduce` target in its full-size form (no `--quick`: more ranks, longer runs), "
                "with `--no-timing`: run on a shared machine, so the runs whose claims are only timings are left "
                "out and no time claim is judged (`n/a`). `holds` says whether the measurement agrees; `n/a` "
                "where it cannot be compared. "))
              + f"The `--quick` form is in [reproduce-{_t}.md](reproduce-{_t}.md).",
        runs=(lambda t, timed: lambda quick: [Run(t, ["reproduce", t] + ([] if timed else ["--no-timing"])
                                                  + (["--quick"] if quick else []),
                                                  out_options={"--out": "runs"})])(_t, _timed),
        render=_reproduce_render(_t),
        env=lambda quick: {"MPISPARSE_QUICK": "1"} if quick else {},
    ))

#: timing targets recorded at a larger size than --quick (their full W does not fit this machine's memory and
#: cores): target -> ``--worlds``; run on the emulated cluster (``--emucluster auto``)
REPRODUCE_LARGE = {"deft-breakdown": "8", "slimdp-traffic": "5"}

for _t, _w in REPRODUCE_LARGE.items():
    _table(Table(
        name=f"reproduce-w{_w}-{_t}",
        title=f"Reproducing a paper's claim at W={_w}: `reproduce {_t} --worlds {_w}`",
        about=("One timing `mpisparse reproduce` target at its full-size model and step count with "
               f"`--worlds {_w}` (the paper's largest W does not fit this machine's memory and cores), on the "
               "emulated cluster: each "
               "claim beside the measured value, with its rule and, for a `no`, its cause. The `--quick` form "
               f"is in [reproduce-{_t}.md](reproduce-{_t}.md)."),
        runs=(lambda t, w: lambda quick: [Run(t, ["reproduce", t, "--worlds", "2" if quick else w]
                                              + (["--quick"] if quick else []),
                                              out_options={"--out": "runs"})])(_t, _w),
        render=_reproduce_render(_t),
        unavailable=_emucluster_unavailable,
        env=lambda quick: {"MPISPARSE_QUICK": "1"} if quick else {},
    ))
