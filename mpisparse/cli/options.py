"""Option groups, value parsers and checks shared by the commands (nothing here starts MPI).

Values are checked by the typed configurations (:mod:`mpisparse.config`);
this module only parses the command line into them: click types for
single values, the callbacks below for comma-separated lists, and the
checks that are about the command line itself (an option that no chosen
scheme takes).  :func:`validated` turns a configuration's ValueError into
a usage error (exit 2, one line, before MPI starts).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import click

from ..registry import SCHEMES, all_options, validate_density
from ..runtimes import validate

__all__ = ["SectionOption", "SectionedCommand", "check_plot", "progress_options", "trace_option", "cuda_aware_option", "density_list", "emucluster_rate",
           "gpt_size_options", "int_list", "table_options", "mpi_options", "pick_scheme_options", "scheme_options", "size_list", "usage", "validated",
           "out_dir_or_default", "writable_dir", "writable_file"]


# --------------------------------------------------------------------------- help in sections
class SectionOption(click.Option):
    """An option shown under its own heading in ``--help`` (``section``; None: the common options)."""

    def __init__(self, *args: Any, section: str | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.section = section


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists the common options first, then one section per ``section``."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str | None, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(getattr(param, "section", None), []).append(record)
        for name in [None] + sorted(k for k in sections if k is not None):
            if name in sections:
                with formatter.section(name or "Options"):
                    formatter.write_dl(sections[name])


# --------------------------------------------------------------------------- option groups
def mpi_options(f: Callable) -> Callable:
    """``-n`` and ``--timeout``, shared by every command that runs ranks."""
    f = click.option("--timeout", type=click.IntRange(min=1), default=None, metavar="SECONDS",
                     help="End the whole job after SECONDS (sets MPIEXEC_TIMEOUT / --timeout).")(f)
    f = click.option("-n", "--np", "nprocs", type=click.IntRange(min=1), default=None, metavar="W",
                     help="Run on W ranks: spawns `mpiexec -n W` unless already under MPI.")(f)
    return f


def output_options(json_help: str, csv_help: str, plot_help: str) -> Callable[[Callable], Callable]:
    """``--json``, ``--csv`` and ``--plot`` (each a file path), with the command's own help texts."""
    def deco(f: Callable) -> Callable:
        for flag, dest, text in reversed((("--json", "json_path", json_help), ("--csv", "csv_path", csv_help),
                                          ("--plot", "plot_path", plot_help))):
            f = click.option(flag, dest, type=click.Path(dir_okay=False), default=None, callback=writable_file,
                             help=text)(f)
        return f
    return deco


def step_options(f: Callable) -> Callable:
    """``--no-memory``, ``--hierarchical``, ``--check-collectives`` and ``--servers``: how the steps of any scheme run."""
    f = click.option("--servers", type=click.IntRange(min=1), default=None, metavar="S",
                     help="Parameter-server schemes: the last S ranks serve, the others are workers [1].")(f)
    f = click.option("--check-collectives", is_flag=True,
                     help="Debug: verify every collective's counts and dtypes agree across ranks.")(f)
    f = click.option("--hierarchical", is_flag=True,
                     help="Combine within each host first; one rank per host exchanges across hosts "
                          "(docs/schemes.md#hierarchical-exchange).")(f)
    f = click.option("--no-memory", is_flag=True, help="Disable error feedback (drop what is not sent).")(f)
    return f


def gpt_size_options(f: Callable) -> Callable:
    """``--gpt-layers``, ``--gpt-width``, ``--gpt-heads``, ``--gpt-context``: the size of ``--model gpt``."""
    from ..config import GPT_SIZE_DEFAULTS

    helps = {"gpt_layers": "gpt: transformer blocks.", "gpt_width": "gpt: embedding width (a multiple of --gpt-heads).",
             "gpt_heads": "gpt: attention heads per block.",
             "gpt_context": "gpt: tokens per window (its position table; the sequence length it trains on)."}
    for name in reversed(list(GPT_SIZE_DEFAULTS)):
        f = click.option("--" + name.replace("_", "-"), name, type=click.IntRange(min=1),
                         default=GPT_SIZE_DEFAULTS[name], show_default=True, help=helps[name])(f)
    return f


def table_options(f: Callable) -> Callable:
    """``--emb-tables``, ``--emb-rows``, ``--emb-dim``, ``--row-sparse/--no-row-sparse``: the embedding tables of
    ``dlrm`` and ``ncf`` on recommendation data (:class:`mpisparse.config.TrainConfig`)."""
    from ..config import EMB_DIM

    f = click.option("--row-sparse/--no-row-sparse", "row_sparse", default=True, show_default=True,
                     help="dlrm, ncf: tables as nn.Embedding(sparse=True), only the rows a rank touched exchanged "
                          "(indices and rows, summed exactly) beside the scheme; --no-row-sparse: dense tables "
                          "through the scheme.")(f)
    f = click.option("--emb-dim", type=click.IntRange(min=1), default=EMB_DIM, show_default=True,
                     help="dlrm, ncf: embedding dimension (dlrm: also the bottom MLP's last width).")(f)
    f = click.option("--emb-rows", type=click.IntRange(min=1), default=None,
                     help="dlrm, ncf: rows of each table (clicks, ratings: ids; criteo: hash buckets) [1000; "
                          "movielens: its users and items].")(f)
    f = click.option("--emb-tables", type=click.IntRange(min=1), default=None,
                     help="dlrm: embedding tables, one per categorical feature [clicks: 8; criteo: the file's "
                          "categorical columns].")(f)
    return f


def progress_options(f: Callable) -> Callable:
    """``--progress-interval SECONDS`` and ``--no-progress``: rank 0's progress (a live bar on a terminal,
    a status line every interval off one: under mpiexec, in a SLURM log)."""
    f = click.option("--no-progress", is_flag=True, help="Print no progress (the results are printed as usual).")(f)
    f = click.option("--progress-interval", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
                     metavar="SECONDS", help="Off a terminal (mpiexec, SLURM logs): one status line (step, rate, "
                                             "ETA, loss or phase) this often.")(f)
    return f


def trace_option(f: Callable) -> Callable:
    """``--trace FILE``: the per-rank, per-phase spans as a Chrome trace (``bench step``, ``train``)."""
    return click.option("--trace", "trace", type=click.Path(dir_okay=False), default=None, callback=writable_file,
                        help="Write every rank's phases of every timed step as a Chrome trace (JSON; open in "
                             "ui.perfetto.dev or chrome://tracing); with several --scheme, FILE-SCHEME.json each. "
                             "Data-parallel schemes.")(f)


def diagnostics_option(f: Callable) -> Callable:
    """``--diagnostics``: per-step measurements that cost extra communication (``bench step``, ``train``)."""
    return click.option("--diagnostics", is_flag=True,
                        help="Per-step diagnostics into the JSON (error norm, scheme-specific; extra "
                             "communication).")(f)


def cuda_aware_option(f: Callable) -> Callable:
    """``--cuda-aware/--no-cuda-aware``: override the run-time probe (default: decided once, see `info`)."""
    return click.option("--cuda-aware/--no-cuda-aware", "cuda_aware", default=None,
                        help="Hand device buffers to MPI directly / stage them through pinned host memory "
                             "[default: MPISPARSE_CUDA_AWARE, else the MPI library's answer checked by a probe].")(f)


def scheme_options(schemes: Sequence[str], exclude: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """One click option per option of the schemes a command accepts (defaults: None = unset).

    Only the options of ``schemes`` are added, each shown in ``--help``
    under those of ``schemes`` that declare it, so a command lists what
    applies to it and nothing else.  Names in ``exclude`` belong to the
    command itself (``train --momentum``) and are handed to the schemes
    that declare them by the command.
    """
    accepted = set(schemes)

    def deco(f: Callable) -> Callable:
        for name, (opt, owners) in sorted(all_options().items(), reverse=True):
            owners = [o for o in owners if o in accepted]
            if name in exclude or not owners:
                continue
            section = f"Options of {', '.join(owners)}"
            help_text = opt.help.split(": ", 1)[-1]
            if opt.kind is bool:
                f = click.option(opt.flag, name, cls=SectionOption, section=section, is_flag=True, default=None,
                                 help=help_text)(f)
            else:
                f = click.option(opt.flag, name, cls=SectionOption, section=section,
                                 type=click.Choice(opt.choices) if opt.choices else opt.kind, default=None,
                                 help=help_text)(f)
        return f

    return deco


# --------------------------------------------------------------------------- checks of the command line
def usage(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)``, its ValueError turned into a usage error (exit 2)."""
    try:
        return fn(*args, **kw)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def validated(cfg: Any, world: int | None) -> Any:
    """:func:`mpisparse.runtimes.validate` of ``cfg`` (a :mod:`mpisparse.config` dataclass), as a usage error."""
    return usage(validate, cfg, world)


def pick_scheme_options(schemes: tuple[str, ...], given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Split the set scheme options per scheme; an option no chosen scheme has is an error.

    The values are checked by the configurations the options go into.
    """
    set_opts = {k: v for k, v in given.items() if v is not None}
    per_scheme: dict[str, dict[str, Any]] = {}
    for s in schemes:
        names = {o.name for o in SCHEMES[s].options}
        if hasattr(SCHEMES[s], "wire_refusal"):  # a data-parallel scheme refuses a wire dtype it cannot carry
            names.add("wire_dtype")               # itself, naming the allowed value (its validate_options)
        per_scheme[s] = {k: v for k, v in set_opts.items() if k in names}
    orphans = [k for k in set_opts if not any(k in per_scheme[s] for s in schemes)]
    if orphans:
        owners = all_options()
        k = orphans[0]
        raise click.UsageError(
            f"--{k.replace('_', '-')} is an option of {', '.join(owners[k][1])}, "
            f"not of the chosen scheme{'s' if len(schemes) > 1 else ''} ({', '.join(schemes)})"
        )
    return per_scheme


def check_plot(plot_path: str | None) -> None:
    """``--plot`` needs matplotlib: say so before MPI starts."""
    if plot_path:
        from ..results import check_plot_support

        try:
            check_plot_support()
        except RuntimeError as e:
            raise click.UsageError(str(e)) from None


# --------------------------------------------------------------------------- output paths (click callbacks)
def writable_file(ctx, param, value):
    """An output file (``--json``, ``--csv``, ``--plot``): checked by writing there, before any MPI work.

    A path that cannot be written is a usage error naming it and why (exit
    2), not a run whose results are lost at the end.
    """
    if value is None:
        return None
    from ..results.files import path_problem

    why = path_problem(value)
    if why:
        raise click.BadParameter(f"{value} cannot be written: {why}", ctx=ctx, param=param)
    return value


def writable_dir(ctx, param, value):
    """An output directory (``--checkpoint``, ``--out``): it, or the directory it would be created in, takes files."""
    if value is None:
        return None
    from ..results.files import path_problem

    why = path_problem(value, directory=True)
    if why:
        raise click.BadParameter(f"{value} cannot be written: {why}", ctx=ctx, param=param)
    return value


def out_dir_or_default(value: str | None, command: str) -> str:
    """``--out DIR`` of a driver (``reproduce``, ``bench scaling``), or its default: a new
    ``mpisparse-results/<command>-<UTC time>`` in the working directory, kept after the run so
    that every path it prints exists; checked like :func:`writable_dir`."""
    if value is not None:
        return value
    import datetime as dt
    import os

    from ..results.files import path_problem

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    value = os.path.join("mpisparse-results", f"{command}-{stamp}")
    why = path_problem(value, directory=True)
    if why:
        raise click.BadParameter(f"the default {value} cannot be written: {why}; give --out DIR",
                                 param_hint="'--out'")
    return value


# --------------------------------------------------------------------------- list parsers (click callbacks)
def _positive_ints(value: str, parse, what: str) -> list[int]:
    try:
        out = [parse(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: every {what} must be >= 1")
    return out


def int_list(ctx, param, value):
    return _positive_ints(value, int, "world size")


def size_list(ctx, param, value):
    if value is None:
        return None
    return _positive_ints(value, lambda v: int(float(v)) if "e" in v.lower() else int(v), "size")


def density_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    try:
        if not out:
            raise ValueError("empty")
        for d in out:
            validate_density(d)
    except ValueError:
        raise click.BadParameter(f"{value!r}: every density must be in the allowed range (0, 1]") from None
    return out


def emucluster_rate(ctx, param, value: str) -> str:
    """``reproduce --emucluster``: auto, off, or a link rate in tc's syntax."""
    v = value.strip().lower()
    if v in ("auto", "off"):
        return v
    if not re.fullmatch(r"\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)", v):
        raise click.BadParameter(f"{value!r}: give auto, off, or a link rate in tc's syntax (e.g. 100mbit, 1gbit)")
    return v
