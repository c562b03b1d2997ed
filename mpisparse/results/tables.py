"""Printed views of results: the per-phase table of a run, comparisons, fixed-width tables."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .schema import RunResult

__all__ = ["Column", "TRAIN_PHASES", "format_comparison", "format_ps_report", "format_rows", "format_run",
           "format_table", "format_train_comparison", "mp_summary"]

#: the phases ``train`` prints, in this order (those of the parameter server: as measured)
TRAIN_PHASES = ("forward", "backward", "send_activations", "send_gradients", "wait", "compensate", "select",
                "exchange_indices", "exchange_values", "update")
_OPTIONAL_TRAIN_PHASES = ("wait", "send_activations", "send_gradients")  # printed when measured


def format_table(title: str, reduced: dict[str, dict[str, float]], extra: dict[str, str] | None = None) -> str:
    """The per-phase table rank 0 prints: ms per step, mean and max over ranks."""
    step_max = reduced.get("step", {}).get("max", 0.0) or 1.0
    lines = [title, f"{'phase':<18}{'mean ms':>12}{'max ms':>12}{'% of step':>11}"]
    for name, v in reduced.items():
        if name == "step":
            continue
        lines.append(f"{name:<18}{v['mean'] * 1e3:>12.3f}{v['max'] * 1e3:>12.3f}{100 * v['max'] / step_max:>10.1f}%")
    if "step" in reduced:
        s = reduced["step"]
        lines.append(f"{'step':<18}{s['mean'] * 1e3:>12.3f}{s['max'] * 1e3:>12.3f}{100.0:>10.1f}%")
    for k, v in (extra or {}).items():
        lines.append(f"{k:<18}{v}")
    return "\n".join(lines)


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


def _bench_table(res: RunResult) -> str:
    model = res.config.get("model", "")
    return format_table(
        f"\n{res.scheme} on {model} ({res.n:,} elements, {res.layers} layers), "
        f"W={res.world_size}, density {res.density_target:g}",
        res.phase_table(),
        {"density_actual": f"{res.density_actual:.6f}",
         "bytes/rank/step": f"{res.bytes_sent_per_rank:,.0f}",
         "peak RSS/rank": f"{res.peak_rss_bytes_per_rank / 2**20:,.0f} MiB "
                          f"({res.peak_rss_bytes_per_rank / res.gradient_buffer_bytes:.1f}x buffer)"})


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
    if res.mp is not None:
        extra.update(mp_summary(res))
    names = [k for k in (TRAIN_PHASES if res.ps is None else tuple(res.phases))
             if k in res.phases or (res.mp is None and k not in _OPTIONAL_TRAIN_PHASES)]
    return format_table(f"{res.scheme}: per-phase time per step (ms), {res.n:,} parameters",
                        res.phase_table(names), extra)


def format_comparison(results: Sequence[RunResult]) -> str:
    """``bench step`` with several schemes: step time, speedup over the first, bytes, density."""
    base = results[0]
    lines = [f"{'scheme':<12}{'step ms':>10}{'speedup':>9}{'bytes/rank':>14}{'density':>10}"]
    for r in results:
        lines.append(f"{r.scheme:<12}{r.step_seconds * 1e3:>10.2f}"
                     f"{base.step_seconds / r.step_seconds:>8.2f}x"
                     f"{r.bytes_sent_per_rank:>14,.0f}{r.density_actual:>10.5f}")
    lines.append(f"(speedup relative to {base.scheme}; times are the slowest rank's)")
    return "\n".join(lines)


def format_train_comparison(results: Sequence[RunResult]) -> str:
    """``train`` with several schemes: final test metrics, step time, bytes, density."""
    lines = [f"{'scheme':<12}{'test acc':>10}{'test loss':>11}{'step ms':>10}{'bytes/rank':>14}{'density':>10}"]
    for r in results:
        f = r.final_metrics
        acc = f"{100 * f['test_accuracy']:.2f}%" if "test_accuracy" in f else f"ppl {f.get('test_perplexity', 0):.1f}"
        lines.append(f"{r.scheme:<12}{acc:>10}{f.get('test_loss', float('nan')):>11.4f}"
                     f"{r.step_seconds * 1e3:>10.2f}{r.bytes_sent_per_rank:>14,.0f}{r.density_actual:>10.5f}")
    return "\n".join(lines)


def format_ps_report(res: RunResult) -> str:
    """What rank 0 prints after a parameter-server run's table: server phases, bytes each way, staleness."""
    ps = res.ps
    lines = [f"{res.scheme}: server phases per push served (ms); {ps['servers']} server(s), "
             f"{ps['workers']} worker(s), mode {ps['ps_mode']}",
             f"{'phase':<18}{'mean ms':>12}{'max ms':>12}"]
    for name, v in ps["phases_server"].items():
        lines.append(f"{name:<18}{v['mean'] * 1e3:>12.3f}{v['max'] * 1e3:>12.3f}")
    lines.append(f"{'bytes up/comm':<18}{ps['bytes_up_per_communication']:,.0f}")
    lines.append(f"{'bytes down/comm':<18}{ps['bytes_down_per_communication']:,.0f}")
    lines.append(f"{'communications':<18}{ps['communications']:,}")
    hist = ps["staleness_histogram"]
    if hist:
        shown = list(hist.items())
        text = "  ".join(f"{k}:{v}" for k, v in shown[:12]) + ("  ..." if len(shown) > 12 else "")
        lines.append(f"{'staleness':<18}mean {ps['staleness_mean']:.2f}; histogram {text}")
    gaps = [e["final_gap"] for e in ps.get("worker_extra", []) if "final_gap" in e]
    if gaps:
        lines.append(f"{'final model gap':<18}{max(gaps):.3g} (max |worker - server| after the last difference)")
    return "\n".join(lines)


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


# --------------------------------------------------------------------------- fixed-width tables
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
    """A fixed-width text table; columns are as wide as their widest cell."""
    cells = [[c.header for c in columns]] + [[c.cell(r) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = [title] if title else []
    for j, line in enumerate(cells):
        parts = []
        for i, (c, text) in enumerate(zip(columns, line)):
            align = "<" if (c.align == "<") else ">"
            parts.append(f"{text:{align}{widths[i]}}")
        out.append("  ".join(parts).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
