"""The crossover plot of docs/choosing.md: the advisor's predicted step and time to target against the link.

Uses :mod:`mpisparse.bench.advise` as a library (``Setting``, ``step_time``, ``steps_to_target``,
``crossover_bandwidth``; nothing of it is changed here).  Every input of the prediction is read from the
committed time-to-accuracy run, docs/results/tta.md: W and the hosts, the density, each scheme's steps to
target, the compute step (the median of the ``compute ms`` column), the share of dense-opt's exchange that
overlap hid (``hidden / (hidden + exposed)`` of its row) and the model (resnet18 built for digits, as the
run trained it: its size and powersgd's factors).  The step overhead of each scheme comes from the cost
model's kernel rates (no ``--overhead-from``), which leave the library's own cost out and so favour the
sparse schemes (docs/advisor.md).

The measured points of the same table (step and seconds to target at its nominal link rate) are drawn on
top, so the reader sees how far the prediction is from the one measured rate.

``python -m docs_results.crossover_plot [--out PNG]`` (``tools/`` on ``sys.path``; ``bin/docs-plots`` runs it)
writes the PNG and, beside it, a ``.json`` with the inputs, the crossover and the provenance (command,
commit, date, machine).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TTA_MD = ROOT / "docs" / "results" / "tta.md"
OUT = ROOT / "docs" / "results" / "plots" / "crossover.png"
#: the advisor's labels drawn, in this order
LABELS = ("dense-opt", "dense", "topk", "cltk", "deft", "gtopk", "powersgd", "oktopk")
COMMAND = "PYTHONPATH=tools python -m docs_results.crossover_plot --out docs/results/plots/crossover.png"


def _num(cell: str) -> float | None:
    cell = cell.replace(",", "").replace("%", "").strip()
    try:
        return float(cell)
    except ValueError:
        return None


def read_tta(path: Path = TTA_MD) -> dict[str, Any]:
    """The run's setting and per-scheme rows from the generated tta.md (ValueError when it is not there)."""
    from .provenance import markdown_tables, parse_header

    text = path.read_text(encoding="utf-8")
    header = parse_header(text)
    cmd = header.get("commands", "")
    world = re.search(r"emucluster run (\d+)", cmd)
    rate = re.search(r"--rate (\S+)", cmd)
    density = re.search(r"--density (\S+)", cmd)
    model = re.search(r"--model (\S+)", cmd)
    data = re.search(r"--data (\S+)", cmd)
    if not (world and rate and density and model and data):
        raise ValueError(f"{path}: its command does not name the hosts, rate, density, model and data")
    table = next((t for t in markdown_tables(text) if t[1] and t[1][0] == "scheme"), None)
    if table is None:
        raise ValueError(f"{path}: no per-scheme table")
    _, cols, body = table
    ix = {c: i for i, c in enumerate(cols)}
    rows = {}
    for r in body:
        label = re.match(r"`([^`]+)`", r[0]).group(1)
        rows[label] = {"steps_to_target": _num(r[ix["steps to target"]]),
                       "seconds_to_target": _num(r[ix["s to target"]]),
                       "step_ms": _num(r[ix["step ms"]]), "compute_ms": _num(r[ix["compute ms"]]),
                       "exposed_ms": _num(r[ix["exposed exchange ms"]]),
                       "hidden_ms": _num(r[ix["hidden exchange ms"]])}
    return {"hosts": int(world.group(1)), "rate": rate.group(1), "density": float(density.group(1)),
            "model": model.group(1), "data": data.group(1), "rows": rows,
            "commit": header.get("commit", "?").strip("`"), "date": header.get("date (UTC)", "?"),
            "machine": header.get("machine", "?")}


def setting_from(tta: dict[str, Any]):
    """The advisor's :class:`~mpisparse.bench.advise.Setting` for the tta run (one rank per emulated host,
    the hosts sharing this machine's cores)."""
    from mpisparse.backend.fusion import FusionLayout
    from mpisparse.bench import advise as adv
    from mpisparse.data import load_dataset
    from mpisparse.models.nets import build_model
    from mpisparse.schemes.powersgd import powersgd_elements

    ds = load_dataset(tta["data"], image=True)
    net = build_model(tta["model"], input_shape=ds.input_shape, num_classes=ds.num_classes)
    layout = FusionLayout([(name, tuple(p.shape)) for name, p in net.named_parameters()])
    rows = tta["rows"]
    compute = statistics.median(r["compute_ms"] for r in rows.values() if r["compute_ms"] is not None) / 1e3
    base = rows[adv.BASELINE]
    hidden_share = base["hidden_ms"] / (base["hidden_ms"] + base["exposed_ms"])
    steps = {k: r["steps_to_target"] for k, r in rows.items()}
    return adv.Setting(n=layout.n, compute=compute, world=tta["hosts"], hosts=tta["hosts"], density=tta["density"],
                       hidden_share=hidden_share, latency=50e-6, shared_cores=2,
                       powersgd_elements=powersgd_elements(layout), steps=steps)


def curves(s, bandwidths: list[float]) -> dict[str, dict[str, list[float | None]]]:
    """Per label: predicted step seconds and time to target (None: not reached) at each bandwidth."""
    from mpisparse.bench import advise as adv
    from mpisparse.bench import costmodel as cm

    out: dict[str, dict[str, list[float | None]]] = {}
    for label in LABELS:
        steps = adv.steps_to_target(label, s)
        step = [adv.step_time(label, s, cm.Link(latency=s.latency, bandwidth=bw))["step"] for bw in bandwidths]
        out[label] = {"step": step, "time_to_target": [None if steps is None else t * steps for t in step],
                      "steps_to_target": steps, "steps_measured": label in s.steps}
    return out


def _mbit(bw: float) -> float:
    return bw * 8 / 1e6


def plot(out: Path = OUT, tta_md: Path = TTA_MD) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mpisparse.bench import advise as adv
    from mpisparse.bench.costmodel import parse_rate

    from .provenance import git_commit, machine_info

    tta = read_tta(tta_md)
    s = setting_from(tta)
    bws = [1e7 * 1e4 ** (i / 120) / 8 for i in range(121)]  # 10 Mbit/s .. 100 Gbit/s, in bytes/s
    c = curves(s, bws)
    cross_step = adv.crossover_bandwidth(s.__class__(**{**s.__dict__, "steps": {}}), s.latency, LABELS)
    measured = tuple(label for label in LABELS if label in s.steps)  # the others would take dense's steps
    cross_tta = adv.crossover_bandwidth(s, s.latency, measured)
    rate = parse_rate(tta["rate"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = dict(zip(LABELS, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    xs = [_mbit(b) for b in bws]
    for ax, key, title in ((axes[0], "step", "predicted step (equal steps to target)"),
                           (axes[1], "time_to_target", "predicted time to target (steps from tta.md)")):
        for label in LABELS:
            ys = c[label][key]
            if all(y is None for y in ys):
                continue
            if key == "time_to_target" and not c[label]["steps_measured"]:
                continue  # no measured steps: the advisor would assume dense's; left out of this panel
            style = "-" if label.startswith("dense") else "--"
            ax.plot(xs, ys, style, color=colours[label], label=label, linewidth=2 if label == "dense-opt" else 1.2)
            m = tta["rows"].get(label)
            if m is not None:
                y = m["step_ms"] / 1e3 if key == "step" else m["seconds_to_target"]
                if y is not None:
                    ax.plot([_mbit(rate)], [y], "o", color=colours[label], markersize=6)
        cross = cross_step if key == "step" else cross_tta
        if cross is not None and bws[0] < cross < bws[-1]:
            ax.axvline(_mbit(cross), color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"crossover {_mbit(cross):,.0f} Mbit/s", (_mbit(cross), 0.3), xycoords=("data", "axes fraction"),
                        ha="right", va="center", fontsize=8, rotation=90, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link bandwidth per host (Mbit/s)")
        ax.set_ylabel("seconds")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper right", ncol=2)
    axes[1].legend(fontsize=8, loc="upper right")
    commit, date = git_commit(ROOT), _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    machine = machine_info()
    fig.suptitle(f"{tta['model']} on {tta['data']}, W={s.world} on {s.hosts} hosts, density {s.density:g}, compute "
                 f"{s.compute * 1e3:.0f} ms (a 2-core CPU's); dots: measured at {tta['rate']} ({tta['commit']})",
                 fontsize=9)
    fig.text(0.01, 0.01, f"mpisparse advise model, inputs from docs/results/tta.md; commit {commit}, {date} UTC, "
                         f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.04, 1, 0.94))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    info = {"command": COMMAND, "commit": commit, "date_utc": date,
            "machine": f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores",
            "inputs": {"from": str(tta_md.relative_to(ROOT)), "tta_commit": tta["commit"], "tta_date": tta["date"],
                       "n": s.n, "compute_seconds": s.compute, "world": s.world, "hosts": s.hosts,
                       "density": s.density, "hidden_share": round(s.hidden_share, 4), "latency_seconds": s.latency,
                       "shared_cores": s.shared_cores, "dense_wire": s.dense_wire, "sparse_wire": s.sparse_wire,
                       "powersgd_elements": s.powersgd_elements, "steps_to_target": s.steps,
                       "overhead": "the cost model's kernel rates (library cost left out)"},
            "crossover_mbit_equal_steps": None if cross_step is None else round(_mbit(cross_step), 1),
            "crossover_mbit_measured_steps": None if cross_tta is None else round(_mbit(cross_tta), 1),
            "at_measured_rate": {label: {"predicted_step_s": round(adv.step_time(label, s, _link(s, rate))["step"], 4),
                                         "measured_step_s": None if label not in tta["rows"]
                                         else tta["rows"][label]["step_ms"] / 1e3}
                                 for label in LABELS}}
    out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def _link(s, bandwidth: float):
    from mpisparse.bench import costmodel as cm

    return cm.Link(latency=s.latency, bandwidth=bandwidth)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m docs_results.crossover_plot", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(OUT), help="the PNG (a .json beside it) [docs/results/plots/crossover.png]")
    p.add_argument("--tta", default=str(TTA_MD), help="the generated tta.md to read [docs/results/tta.md]")
    a = p.parse_args(argv)
    info = plot(Path(a.out).resolve(), Path(a.tta).resolve())
    print(json.dumps({k: info[k] for k in ("crossover_mbit_equal_steps", "crossover_mbit_measured_steps")}))
    print(json.dumps(info["at_measured_rate"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
