"""What the commands print and write about their results: tables, comparisons, JSON, CSV, plots, progress.

The one module of the CLI that knows the result objects' keys; the
commands hand it their results and the output paths.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

__all__ = ["TRAIN_PHASES", "exchange_outputs", "finish_step", "finish_train", "format_comparison",
           "format_train_comparison", "info_outputs", "print_step_result", "print_train_header",
           "print_train_result", "progress", "scaling_outputs", "select_outputs", "train_log", "train_progress",
           "train_step_log", "write_json"]

TRAIN_PHASES = ("forward", "backward", "send_activations", "send_gradients", "wait", "compensate", "select",
                "exchange_indices", "exchange_values", "update")
_OPTIONAL_TRAIN_PHASES = ("wait", "send_activations", "send_gradients")  # printed when measured


def write_json(path: str | None, obj: Any) -> None:
    if path is None:
        return
    tmp = Path(path).with_suffix(Path(path).suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- info
def info_outputs(report: dict[str, Any], json_path: str | None) -> None:
    """``info`` (rank 0)."""
    from ..info import format_info

    click.echo(format_info(report))
    write_json(json_path, report)


# --------------------------------------------------------------------------- bench step
def print_step_result(s: str, model: str, density: float, res: dict[str, Any]) -> None:
    """``bench step``: one scheme's per-phase table (rank 0)."""
    from ..timing import format_table

    click.echo(format_table(
        f"\n{s} on {model} ({res['n']:,} elements, {res['layers']} layers), "
        f"W={res['world_size']}, density {density:g}",
        {**{k: {"mean": res["phases_mean_over_ranks"][k], "max": v} for k, v in res["phases"].items()},
         "step": {"mean": res["step_seconds_mean_over_ranks"], "max": res["step_seconds"]}},
        {"density_actual": f"{res['density_actual']:.6f}",
         "bytes/rank/step": f"{res['bytes_sent_per_rank']:,.0f}",
         "peak RSS/rank": f"{res['peak_rss_bytes_per_rank'] / 2**20:,.0f} MiB "
                          f"({res['peak_rss_bytes_per_rank'] / res['gradient_buffer_bytes']:.1f}x buffer)"},
    ))
    if "ps_mode" in res:
        from ..ps.results import format_ps_report

        click.echo(format_ps_report(res))


def finish_step(results: list[dict[str, Any]], json_path: str | None, csv_path: str | None,
                plot_path: str | None) -> None:
    """``bench step``: the comparison of several schemes, --json, --csv, --plot (rank 0)."""
    if len(results) > 1:
        click.echo("\n" + format_comparison(results))
    write_json(json_path, results[0] if len(results) == 1 else results)
    _step_outputs(results, csv_path, plot_path)


def _step_outputs(results: list[dict[str, Any]], csv_path: str | None, plot_path: str | None) -> None:
    """``bench step --csv/--plot`` (rank 0)."""
    from ..bench.report import plot_phase_bars, result_row, write_csv

    if csv_path:
        write_csv(csv_path, [result_row(r) for r in results])
    if plot_path:
        r0 = results[0]
        plot_phase_bars(plot_path, results, title=f"{r0['config'].get('model', '')}, W={r0['world_size']}, "
                                                  f"density {r0['density_target']:g}")
        click.echo(f"plot written to {plot_path}")


def format_comparison(results: list[dict[str, Any]]) -> str:
    base = results[0]
    lines = [f"{'scheme':<12}{'step ms':>10}{'speedup':>9}{'bytes/rank':>14}{'density':>10}"]
    for r in results:
        lines.append(f"{r['scheme']:<12}{r['step_seconds'] * 1e3:>10.2f}"
                     f"{base['step_seconds'] / r['step_seconds']:>8.2f}x"
                     f"{r['bytes_sent_per_rank']:>14,.0f}{r['density_actual']:>10.5f}")
    lines.append(f"(speedup relative to {base['scheme']}; times are the slowest rank's)")
    return "\n".join(lines)


def progress(comm, label: str):
    """A progress callback printing to stderr on rank 0 when it is a terminal."""
    if comm.rank != 0 or not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        click.echo(f"\r{label} {done}/{total}", err=True, nl=done == total)

    return report


# --------------------------------------------------------------------------- bench exchange, scaling, select
def exchange_outputs(results: list[dict[str, Any]], json_path: str | None, csv_path: str | None,
                     plot_path: str | None) -> None:
    """``bench exchange`` (rank 0)."""
    from ..bench.exchange import exchange_row, format_exchange, plot_exchange
    from ..bench.report import write_csv

    click.echo(format_exchange(results))
    write_json(json_path, results)
    if csv_path:
        write_csv(csv_path, [exchange_row(r) for r in results])
    if plot_path:
        plot_exchange(plot_path, results)
        click.echo(f"plot written to {plot_path}")


def scaling_outputs(results: list[dict[str, Any]], json_path: str | None, csv_path: str | None,
                    plot_path: str | None) -> None:
    """``bench scaling``."""
    from ..bench.report import write_csv
    from ..bench.scaling import format_scaling, plot_scaling, scaling_row

    click.echo("")
    click.echo(format_scaling(results))
    write_json(json_path, results)
    if csv_path:
        write_csv(csv_path, [scaling_row(r) for r in results])
    if plot_path:
        plot_scaling(plot_path, results)
        click.echo(f"plot written to {plot_path}")


def select_outputs(mode: str, results: list[dict[str, Any]], json_path, csv_path, plot_path) -> None:
    """``bench select``'s --json (a single point stays one object), --csv and --plot."""
    from ..bench.select_sweep import select_outputs as _select_files

    write_json(json_path, results[0] if (mode == "kernels" and len(results) == 1) else results)
    _select_files(mode, results, csv_path, plot_path, echo=click.echo)


# --------------------------------------------------------------------------- train
def train_log(comm, csv_path: str | None, resume: bool):
    """``train --csv``: the per-step log (rank 0), or None."""
    from ..train.output import CsvLog

    return CsvLog(csv_path, append=resume) if (csv_path and comm.rank == 0) else None


def train_step_log(comm, steps: dict[str, list], log, s: str):
    """The per-step callback of scheme ``s`` (rank 0): keeps the record for --plot, writes --csv."""
    steps[s] = []

    def step_log(rec, _s=s):
        steps[_s].append(rec)
        if log is not None:
            log.row(_s, rec)

    return step_log if comm.rank == 0 else None


def print_train_header(comm, s: str, model: str, data: str, density: float, epochs: int) -> None:
    if comm.rank == 0:
        click.echo(f"\n{s}: {model} on {data}, W={comm.size}, density {density:g}, {epochs} epochs")


def print_train_result(s: str, res: dict[str, Any]) -> None:
    """``train``: one scheme's per-phase table and final metrics (rank 0)."""
    from ..timing import format_table

    final = res["metrics"]["final"]
    extra = {"density_actual": f"{res['density_actual']:.6f}",
             "bytes/rank/step": f"{res['bytes_sent_per_rank']:,.0f}",
             "skipped steps": str(res["skipped_steps"]),
             "train loss": f"{final.get('train_loss', float('nan')):.4f}",
             "test loss": f"{final.get('test_loss', float('nan')):.4f}"}
    if "test_accuracy" in final:
        extra["test accuracy"] = f"{100 * final['test_accuracy']:.2f}%"
    if "test_perplexity" in final:
        extra["test perplexity"] = f"{final['test_perplexity']:.2f}"
    if "mp" in res:
        from ..mp.report import mp_summary

        extra.update(mp_summary(res))
    click.echo(format_table(
        f"{s}: per-phase time per step (ms), {res['n']:,} parameters",
        {**{k: {"mean": res["phases_mean_over_ranks"].get(k, 0.0), "max": res["phases"].get(k, 0.0)}
            for k in (TRAIN_PHASES if "ps_mode" not in res else tuple(res["phases"]))
            if k in res["phases"] or ("mp" not in res and k not in _OPTIONAL_TRAIN_PHASES)},
         "step": {"mean": res["step_seconds_mean_over_ranks"], "max": res["step_seconds"]}},
        extra))
    if "ps_mode" in res:
        from ..ps.results import format_ps_report

        click.echo(format_ps_report(res))


def finish_train(results: list[dict[str, Any]], steps: dict[str, list], log, json_path: str | None,
                 plot_path: str | None) -> None:
    """``train``: the comparison of several schemes, --json, the --csv log, --plot (rank 0)."""
    from ..train.output import plot_history

    if len(results) > 1:
        click.echo("\n" + format_train_comparison(results))
    write_json(json_path, results[0] if len(results) == 1 else results)
    if log is not None:
        log.close()
    if plot_path:
        plot_history(results, steps, plot_path)
        click.echo(f"plot written to {plot_path}")


def format_train_comparison(results: list[dict[str, Any]]) -> str:
    lines = [f"{'scheme':<12}{'test acc':>10}{'test loss':>11}{'step ms':>10}{'bytes/rank':>14}{'density':>10}"]
    for r in results:
        f = r["metrics"]["final"]
        acc = f"{100 * f['test_accuracy']:.2f}%" if "test_accuracy" in f else f"ppl {f.get('test_perplexity', 0):.1f}"
        lines.append(f"{r['scheme']:<12}{acc:>10}{f.get('test_loss', float('nan')):>11.4f}"
                     f"{r['step_seconds'] * 1e3:>10.2f}{r['bytes_sent_per_rank']:>14,.0f}{r['density_actual']:>10.5f}")
    return "\n".join(lines)


def train_progress(comm):
    """Rank 0: a live status line on a terminal, epoch summaries always."""
    if comm.rank != 0:
        return None
    tty = sys.stderr.isatty()

    def report(msg: str | None) -> None:
        if msg is None:
            if tty:
                click.echo("\r\033[K", err=True, nl=False)
        elif msg.startswith("epoch") and " batch " in msg:
            if tty:
                click.echo("\r\033[K" + msg, err=True, nl=False)
        else:
            click.echo(msg)

    return report
