"""The NVIDIA H200 rate table (``mpisparse/bench/rate_tables/nvidia-h200.json``), built from the kernel and step
measurements committed in ``docs/results/gpu/`` (no GPU needed).

``PYTHONPATH=tools python -m docs_results.rate_table_h200 --write`` rewrites the file;
``tests/test_rates.py`` fails when the committed file differs from :func:`build`.

Where each number comes from (every source a file of ``docs/results/gpu/`` with its commit and date):

* the kernels' per-element rates and per-call costs: the kernel sweep (``bench select --backend cupy``, best of
  10 calls, :data:`SWEEP`) at 65,536 and 25,000,000 elements (:func:`mpisparse.bench.rates.fit_two_sizes`):
  ``stream`` from the copy (scaled from its 8 bytes an element to ``e += g``'s 12), ``topk`` from ``radix2``
  (what ``auto`` picks at these sizes since df1e504) at density 0.001, ``pick`` from its growth with k at
  25,000,000 elements (density 0.001 to 0.01), ``fused`` as a device runs it (``e += g``, then the top-k);
* ``segmented`` (DEFT's pass): the DEFT selection's slowest simulated rank at W = 1 and W = 4
  (:data:`DEFT`), a line through the rank's share of the elements (``n min(1, 1.1 / W)``), plus ``e += g``;
* ``scatter`` and ``merge`` were never timed alone on a GPU: their rates stand in from the nearest measured
  kernels, and the file says so (``threshold_select_values``'s cost per written entry; the top-k's per selected
  element); ``mpisparse advise --measure-rates FILE --device cuda`` on a GPU measures them;
* ``step_fixed``: each scheme's whole step measured on the H200 (``bench step -n 2 --device cuda --model
  resnet50 --density 0.01``, :data:`STEPS`) less what the advisor's own model gives for that step with these
  kernel rates and a link that carries what dense's step carried (its 102 MB Allreduce, staged through host
  memory between two ranks on the one GPU): the launches, read backs and host work of a step that the
  kernels' rates leave out (none below 0).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "docs" / "results" / "gpu"
OUT = ROOT / "mpisparse" / "bench" / "rate_tables" / "nvidia-h200.json"
MACHINE = ("one NVIDIA H200 (143771 MiB), driver 580.159.04, CuPy 14.2.0 (CUDA 13.0), torch 2.11.0+cu130, "
           "Open MPI 4.1.6 (not CUDA-aware)")
#: the kernel sweep: file, commit, date (UTC)
SWEEP = ("docs/results/gpu/select-sweep-h200-e0a43f3.csv", "e0a43f3", "2026-11-28 19:55")
#: the report holding the DEFT selection and the steps of every scheme
DEFT = ("docs/results/gpu/gpu-check-6f1a385.md", "6f1a385", "2026-11-28 19:34")
STEPS = DEFT
#: the model whose steps were measured (bench step --model resnet50 --density 0.01, W = 2)
STEP_MODEL, STEP_DENSITY, STEP_WORLD = "resnet50", 0.01, 2
SMALL, BIG = 65536, 25_000_000


def _sweep() -> dict[tuple[int, float], dict[str, float]]:
    rows = {}
    with open(ROOT / SWEEP[0], newline="") as f:
        for r in csv.DictReader(f):
            rows[(int(r["n"]), float(r["density"]))] = {k: float(v) for k, v in r.items()
                                                        if k.endswith("_best_ms") and v}
    return rows


def _report_row(path: str, prefix: str) -> str:
    for line in (ROOT / path).read_text().splitlines():
        if line.startswith(f"| {prefix}"):
            return line
    raise ValueError(f"{path}: no row starting {prefix!r}")


def _deft_times() -> dict[int, float]:
    """The DEFT selection's slowest simulated rank (ms) at W = 1 and W = 4, from the report's targets."""
    out = {}
    for w in (1, 4):
        line = _report_row(DEFT[0], f"deft: selection W={w}")
        out[w] = float(re.search(r"\| ([0-9.]+) ms", line).group(1))
    return out


def _step_times() -> dict[str, float]:
    """Each scheme's measured step (ms), from the report's "every scheme ran on the device" row."""
    line = _report_row(STEPS[0], "step: every scheme ran on the device")
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"([a-z]+) ([0-9.]+) ms", line)}


def _src(what: str, where: tuple[str, str, str]) -> str:
    return f"{what} ({where[0]}, commit {where[1]}, {where[2]} UTC)"


def build() -> dict[str, Any]:
    """The table's file form (:func:`mpisparse.bench.rates.table_json`)."""
    from mpisparse.bench import advise as adv
    from mpisparse.bench import costmodel as cm
    from mpisparse.bench.model import model_size
    from mpisparse.bench.rates import RateTable, fit_two_sizes, table_json

    sw = _sweep()
    ms = 1e-3

    def at(n: int, d: float, col: str) -> float:
        return sw[(n, d)][f"{col}_best_ms"] * ms

    copy_small = min(at(SMALL, d, "copy") for (n, d) in sw if n == SMALL)
    copy_big = min(at(BIG, d, "copy") for (n, d) in sw if n == BIG)
    copy_el, copy_call = fit_two_sizes((SMALL, copy_small), (BIG, copy_big))
    stream = (1.5 * copy_el, copy_call)
    topk = fit_two_sizes((SMALL, at(SMALL, 0.001, "topk_abs_radix2")), (BIG, at(BIG, 0.001, "topk_abs_radix2")))
    k_lo, k_hi = int(0.001 * BIG), int(0.01 * BIG)
    pick = max(0.0, (at(BIG, 0.01, "topk_abs_radix2") - at(BIG, 0.001, "topk_abs_radix2")) / (k_hi - k_lo))
    written = max(0.0, (at(BIG, 0.1, "threshold_select_values") - at(BIG, 0.001, "threshold_select_values"))
                  / (int(0.1 * BIG) - k_lo))
    deft = _deft_times()
    n = model_size(STEP_MODEL)
    share = {w: n * min(1.0, 1.1 / w) for w in deft}
    seg_el, seg_call = fit_two_sizes((share[4], deft[4] * ms), (share[1], deft[1] * ms))
    per_el = {"stream": stream[0], "topk": topk[0], "fused": stream[0] + topk[0], "pick": pick,
              "scatter": written, "segmented": seg_el + stream[0], "merge": pick}
    per_call = {"stream": stream[1], "topk": topk[1], "fused": stream[1] + topk[1], "pick": 0.0,
                "scatter": at(SMALL, 0.001, "threshold_select_values"), "segmented": seg_call + stream[1],
                "merge": topk[1]}
    sweep = lambda what: _src(what, SWEEP)  # noqa: E731
    sources = {
        "stream": sweep("the copy (read + write of a float32 vector, 8 bytes an element) at 65,536 and 25M "
                        "elements, the least over the densities, scaled by 12/8 for e += g"),
        "topk": sweep("topk_abs_radix2 at density 0.001, 65,536 and 25M elements"),
        "fused": "stream + topk: a device compensates, then selects (two calls)",
        "pick": sweep("topk_abs_radix2's growth from density 0.001 to 0.01 at 25M elements, per selected "
                      "element; its fixed cost is topk's"),
        "scatter": sweep("NOT MEASURED ON THE DEVICE: stands in from threshold_select_values, its growth from "
                         "density 0.001 to 0.1 at 25M elements per written (index, value), and its call at 65,536 "
                         "elements (one scattered write per entry, as the scatter-add's)"),
        "segmented": _src(f"DEFT's selection (bench select --mode deft, resnet50, density 0.01), slowest simulated "
                          f"rank: W=1 {deft[1]} ms, W=4 {deft[4]} ms, a line through the rank's share of the "
                          "elements, n min(1, 1.1/W); plus stream (its e += g)", DEFT),
        "merge": sweep("NOT MEASURED ON THE DEVICE: stands in from pick (the top-k's cost per selected element) "
                       "per merged entry, and topk's call"),
    }
    kernel_only = cm.Rates(**per_el, per_call={k: v for k, v in per_call.items() if v})
    steps = _step_times()
    from mpisparse.cli.advise import _layout
    from mpisparse.schemes.powersgd import powersgd_elements

    dense_compute = cm.compute_phases("dense", n, STEP_DENSITY, STEP_WORLD, kernel_only)["update"]
    carried = 4.0 * n / (steps["dense"] * ms - dense_compute)  # W = 2: the Allreduce moves n * 4 bytes each way
    setting = adv.Setting(n=n, compute=0.0, world=STEP_WORLD, hosts=STEP_WORLD, density=STEP_DENSITY,
                          rates=kernel_only, powersgd_elements=powersgd_elements(_layout(STEP_MODEL)))
    link = cm.Link(latency=0.0, bandwidth=carried)
    step_fixed, step_sources = {}, {}
    for scheme in ("dense", "topk", "cltk", "deft", "gtopk", "powersgd", "oktopk"):
        ph = adv.scheme_phases(scheme, setting, link)
        model = sum(ph.values())
        step_fixed[scheme] = max(0.0, steps[scheme] * ms - model)
        if scheme == "dense":  # its step gave the link: nothing left over by construction
            step_sources[scheme] = _src("0 by construction: dense's measured step gave the link the others' "
                                        "exchanges are modelled at", STEPS)
            continue
        step_sources[scheme] = _src(
            f"the measured step {steps[scheme]} ms (bench step -n 2 --device cuda --model resnet50 --density 0.01) "
            f"less the model's {1e3 * model:.3f} ms (these kernel rates; its exchange at {8 * carried / 1e9:.2f} "
            "Gbit/s, what dense's step carried, staged through host memory, two ranks on one GPU)", STEPS)
    table = RateTable(
        device="NVIDIA H200", rates=kernel_only, step_fixed=step_fixed, kernel_sources=sources,
        step_sources=step_sources,
        about=("An NVIDIA H200's kernel rates, built by tools/docs_results/rate_table_h200.py from the "
               "measurements committed in docs/results/gpu/ (no GPU was lent when it was built). Two kernels "
               "(scatter, merge) were never timed alone on a GPU and stand in from the nearest measured ones; "
               "the steps behind step_fixed ran two ranks on one GPU with host-staged MPI. Measure your own: "
               "mpisparse advise --measure-rates FILE --device cuda."),
        sources=({"file": SWEEP[0], "commit": SWEEP[1], "date": SWEEP[2] + " UTC", "machine": MACHINE,
                  "what": "bench select --backend cupy --sizes 65536,...,25000000 --densities 0.0001,...,0.3 "
                          "--repeats 10: best ms of each kernel"},
                 {"file": DEFT[0], "commit": DEFT[1], "date": DEFT[2] + " UTC", "machine": MACHINE,
                  "what": "bin/gpu-check: bench select --backend cupy --mode deft (DEFT's selection) and bench step "
                          "-n 2 --device cuda --model resnet50 --density 0.01 (every scheme's step)"}))
    return table_json(table)


def main(argv: list[str]) -> int:
    text = json.dumps(build(), indent=1) + "\n"
    if "--write" in argv:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
