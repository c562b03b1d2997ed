"""Printed views of results: the per-phase table of a run, comparisons, text tables.

Rendered with rich: on a terminal with a bold header and box-drawing
characters, elsewhere (logs, pipes, files, tests) in plain ASCII without
colour: a header, a dashed line under it, columns separated by two spaces.
"""

from __future__ import annotations

import io
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .schema import RunResult

__all__ = ["Column", "TRAIN_PHASES", "format_comparison", "format_ps_report", "format_rows", "format_run",
           "format_table", "format_train_comparison", "mp_summary"]

#: the phases ``train`` prints, in this order (those of the parameter server: as measured)
TRAIN_PHASES = ("forward", "backward", "send_activations", "send_gradients", "wait", "compensate", "select",
                "exchange_indices", "exchange_values", "update")
_OPTIONAL_TRAIN_PHASES = ("wait", "send_activations", "send_gradients")  # printed when measured


# --------------------------------------------------------------------------- rendering (rich)
def _terminal() -> bool:
    """Colour and box-drawing characters only on a terminal; plain ASCII in logs, pipes and tests."""
    try:
        return sys.stdout.isatty() and "NO_COLOR" not in os.environ
    except (AttributeError, ValueError):
        return False


def _ascii_box():
    from rich.box import Box

    # a dashed line under the header, columns separated by spaces, nothing else
    return Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)


def _table(headers: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]):
    """A rich table: ``headers`` as ``(text, "<" or ">")``, cells already formatted."""
    from rich import box
    from rich.table import Table

    term = _terminal()
    t = Table(box=box.SIMPLE_HEAD if term else _ascii_box(), show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
              header_style="bold" if term else "", highlight=False, expand=False)
    for text, align in headers:
        t.add_column(text, justify="left" if align == "<" else "right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    return t


def _pairs(pairs: dict[str, str]):
    """``label value`` lines, labels padded to 18 characters (the rows after a phase table)."""
    from rich.table import Table

    g = Table.grid(padding=0)
    g.add_column(min_width=18, no_wrap=True)
    g.add_column(no_wrap=True)
    for k, v in pairs.items():
        g.add_row(k, v)
    return g


def _render(*parts: Any) -> str:
    """Text of rich renderables and plain lines, one after another; no trailing spaces."""
    from rich.console import Console

    term = _terminal()
    buf = io.StringIO()
    con = Console(file=buf, width=400, force_terminal=term, color_system="standard" if term else None,
                  no_color=not term, highlight=False, emoji=False, markup=False, legacy_windows=False)
    for p in parts:
        if p is None:
            continue
        if isinstance(p, str):
            buf.write(p + "\n")
        else:
            con.print(p)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").split("\n"))


def simple_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain table: the first column left-aligned, the others right-aligned, cells already formatted."""
    return _render(_table([(h, "<" if i == 0 else ">") for i, h in enumerate(headers)], rows))


def format_table(title: str, reduced: dict[str, dict[str, float]], extra: dict[str, str] | None = None) -> str:
    """The per-phase table rank 0 prints: ms per step, mean and max over ranks."""
    step_max = reduced.get("step", {}).get("max", 0.0) or 1.0
    rows = [[name, f"{v['mean'] * 1e3:.3f}", f"{v['max'] * 1e3:.3f}", f"{100 * v['max'] / step_max:.1f}%"]
            for name, v in reduced.items() if name != "step"]
    if "step" in reduced:
        s = reduced["step"]
        rows.append(["step", f"{s['mean'] * 1e3:.3f}", f"{s['max'] * 1e3:.3f}", "100.0%"])
    table = _table([("phase", "<"), ("mean ms", ">"), ("max ms", ">"), ("% of step", ">")], rows)
    return _render(title, table, _pairs(extra) if extra else None)


def format_run(res: RunResult, command: str) -> str:
    """What rank 0 prints after one run of ``command`` (``"train"`` or ``"bench step"``)."""
    if command == "train":
        text = _train_table(res)
    elif command == "bench step":
        text = _bench_table(res)
    else:
        raise ValueError(f"command {command!r} is not one of train, bench step")
    if res.ps is not None:
        text += "\n" + format_ps_report(res)
    return text


#: the phases of a data-parallel step's own work (no exchange): what ``bench step --floor`` compares
COMPUTE_PHASES = ("compensate", "select", "update")


def compute_seconds(res: RunResult) -> float:
    """A data-parallel step's compute: ``compensate + select + update``, each the max over ranks."""
    return sum(res.phases.get(p, 0.0) for p in COMPUTE_PHASES)


def _bench_table(res: RunResult) -> str:
    model = res.config.get("model", "")
    extra = {}
    if res.floor:
        fl = res.floor["seconds"]
        extra["floor e += g"] = (f"{fl * 1e3:.3f} ms; compute {compute_seconds(res) * 1e3:.3f} ms = "
                                 f"{compute_seconds(res) / fl:.2f}x floor" if fl > 0 else "0 ms")
    return format_table(
        f"\n{res.label} on {model} ({res.n:,} elements, {res.layers} layers), "
        f"W={res.world_size}, density {res.density_target:g}",
        res.phase_table(),
        {"density_actual": f"{res.density_actual:.6f}",
         "bytes/rank/step": f"{res.bytes_sent_per_rank:,.0f}",
         "peak RSS/rank": f"{res.peak_rss_bytes_per_rank / 2**20:,.0f} MiB "
                          f"({res.peak_rss_bytes_per_rank / res.gradient_buffer_bytes:.1f}x buffer)", **extra})


def _train_table(res: RunResult) -> str:
    final = res.final_metrics
    extra = {"density_actual": f"{res.density_actual:.6f}",
             "bytes/rank/step": f"{res.bytes_sent_per_rank:,.0f}",
             "skipped steps": str(res.skipped_steps),
             "train loss": f"{final.get('train_loss', float('nan')):.4f}",
             "test loss": f"{final.get('test_loss', float('nan')):.4f}"}
    if "test_accuracy" in final:
        extra["test accuracy"] = f"{100 * final['test_accuracy']:.2f}%"
    if "test_perplexity" in final:
        extra["test perplexity"] = f"{final['test_perplexity']:.2f}"
    for key, label in (("test_auc", "test AUC"), ("test_hit_rate", "test HR@10")):
        if key in final:
            extra[label] = f"{final[key]:.4f}" if key == "test_auc" else f"{100 * final[key]:.2f}%"
    emb = res.extra.get("embeddings")
    if emb:  # the tables' row-sparse exchange (mpisparse.torch.rows)
        extra["table rows/step"] = f"{emb['rows_touched_per_step']:,.0f} of {sum(emb['rows']):,}"
        extra["table bytes/step"] = (f"{emb['bytes_per_step']:,.0f} (dense tables: "
                                              f"{emb['table_bytes']:,}; the rest of the step: "
                                              f"{emb.get('dense_bytes_per_step', 0):,.0f})")
    if res.mp is not None:
        extra.update(mp_summary(res))
    names = [k for k in (TRAIN_PHASES if res.ps is None else tuple(res.phases))
             if k in res.phases or (res.mp is None and k not in _OPTIONAL_TRAIN_PHASES)]
    return format_table(f"{res.label}: per-phase time per step (ms), {res.n:,} parameters",
                        res.phase_table(names), extra)


def format_comparison(results: Sequence[RunResult]) -> str:
    """``bench step`` with several schemes: step time, speedup over the first, bytes, density, peak memory."""
    base = results[0]
    rows = [[r.label, f"{r.step_seconds * 1e3:.2f}", f"{base.step_seconds / r.step_seconds:.2f}x",
             f"{r.bytes_sent_per_rank:,.0f}", f"{r.density_actual:.5f}", _rss_cell(r)] for r in results]
    table = _table([("scheme", "<"), ("step ms", ">"), ("speedup", ">"), ("bytes/rank", ">"), ("density", ">"),
                    ("peak RSS/rank", ">")], rows)
    return _render(table, f"(speedup relative to {base.label}; times are the slowest rank's)")


def _rss_cell(r: RunResult) -> str:
    """``268 MiB (6.0x)``: peak resident memory per rank and its multiple of the gradient buffer."""
    if r.peak_rss_bytes_per_rank is None:
        return "—"
    cell = f"{r.peak_rss_bytes_per_rank / 2**20:,.0f} MiB"
    if r.gradient_buffer_bytes:
        cell += f" ({r.peak_rss_bytes_per_rank / r.gradient_buffer_bytes:.1f}x)"
    return cell


def format_train_comparison(results: Sequence[RunResult]) -> str:
    """``train`` with several schemes: final test metrics, step time, bytes, density."""
    rows = []
    for r in results:
        f = r.final_metrics
        acc = (f"AUC {f['test_auc']:.4f}" if "test_auc" in f else f"HR {100 * f['test_hit_rate']:.2f}%"
               if "test_hit_rate" in f else f"{100 * f['test_accuracy']:.2f}%" if "test_accuracy" in f
               else f"ppl {f.get('test_perplexity', 0):.1f}")
        rows.append([r.label, acc, f"{f.get('test_loss', float('nan')):.4f}", f"{r.step_seconds * 1e3:.2f}",
                     f"{r.bytes_sent_per_rank:,.0f}", f"{r.density_actual:.5f}"])
    metric = "test acc" if all("test_accuracy" in r.final_metrics and "test_auc" not in r.final_metrics
                               for r in results) else "test metric"
    return _render(_table([("scheme", "<"), (metric, ">"), ("test loss", ">"), ("step ms", ">"),
                           ("bytes/rank", ">"), ("density", ">")], rows))


def format_ps_report(res: RunResult) -> str:
    """What rank 0 prints after a parameter-server run's table: server phases, bytes each way, staleness."""
    ps = res.ps
    title = (f"{res.scheme}: server phases per push served (ms); {ps['servers']} server(s), "
             f"{ps['workers']} worker(s), mode {ps['ps_mode']}")
    table = _table([("phase", "<"), ("mean ms", ">"), ("max ms", ">")],
                   [[name, f"{v['mean'] * 1e3:.3f}", f"{v['max'] * 1e3:.3f}"]
                    for name, v in ps["phases_server"].items()])
    extra = {"bytes up/comm": f"{ps['bytes_up_per_communication']:,.0f}",
             "bytes down/comm": f"{ps['bytes_down_per_communication']:,.0f}",
             "communications": f"{ps['communications']:,}"}
    hist = ps["staleness_histogram"]
    if hist:
        shown = list(hist.items())
        text = "  ".join(f"{k}:{v}" for k, v in shown[:12]) + ("  ..." if len(shown) > 12 else "")
        extra["staleness"] = f"mean {ps['staleness_mean']:.2f}; histogram {text}"
    gaps = [e["final_gap"] for e in ps.get("worker_extra", []) if "final_gap" in e]
    if gaps:
        extra["final model gap"] = f"{max(gaps):.3g} (max |worker - server| after the last difference)"
    return _render(title, table, _pairs(extra))


def mp_summary(res: RunResult) -> dict[str, str]:
    """A pipeline run's ``label -> text`` rows: layout, per split bytes forward / backward and compression."""
    mp = res.mp
    rows = {"pipeline": f"{mp['stages']} stages x {mp['replicas']} replica(s), "
                        f"{mp['micro_batches']} micro-batch(es), dp-scheme {mp['dp_scheme']}"}
    rows["stage params"] = ", ".join(f"{p:,}" for p in mp["stage_parameters"])
    for j, s in enumerate(mp["splits"]):
        shape = "x".join(str(v) for v in s["activation_shape"])
        enc = ", ".join(f"{k} {v}" for k, v in sorted(s["mask_encodings"].items()))
        rows[f"split {j} fwd B"] = (f"{s['bytes_forward']:,.0f}/step (dense {s['dense_bytes_forward']:,.0f}, "
                                    f"{s['compression_forward']:.2f}x) after {s['after']} [{shape}]")
        rows[f"split {j} bwd B"] = (f"{s['bytes_backward']:,.0f}/step (dense {s['dense_bytes_backward']:,.0f}, "
                                    f"{s['compression_backward']:.2f}x)")
        tau = f", tau {s['tau_last']:.4g}" if "tau_last" in s else ""
        rows[f"split {j} occupancy"] = f"{s['occupancy']:.4f}{tau}" + (f"; messages: {enc}" if enc else "")
    rows["compression"] = f"{mp['compression_factor']:.2f}x of the dense activation + gradient bytes"
    if mp["replicas"] > 1 or mp["dp_scheme"] != "dense":
        dens = mp["dp_density_actual"]
        rows["dp bytes/rank"] = (f"{mp['dp_bytes_sent_per_rank']:,.0f} per step"
                                 + (f", density {dens:.5f}" if dens is not None else ""))
    return rows


# --------------------------------------------------------------------------- generic text tables
@dataclass(frozen=True)
class Column:
    """A text-table column: ``key`` of the row, header, and how to show the value."""

    key: str
    header: str
    fmt: str | Callable[[Any], str] = "{}"
    align: str = ">"

    def cell(self, row: dict[str, Any]) -> str:
        v = row.get(self.key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if callable(self.fmt):
            return self.fmt(v)
        try:
            return self.fmt.format(v)
        except (ValueError, TypeError):
            return str(v)


def format_rows(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None = None) -> str:
    """A text table (rich); columns are as wide as their widest cell, a missing value is ``-``."""
    table = _table([(c.header, "<" if c.align == "<" else ">") for c in columns],
                   [[c.cell(r) for c in columns] for r in rows])
    return _render(title, table)
