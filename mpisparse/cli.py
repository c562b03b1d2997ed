"""The ``mpisparse`` command line (click).

Every command that runs ranks takes ``-n W``: outside MPI it re-runs itself
under ``mpiexec -n W``; under ``mpiexec``/``srun`` it checks the job size.
Options are validated before MPI starts, so a bad value is one line on
stderr and a non-zero exit, before any collective runs.  :func:`main` ends
the whole MPI job when any rank raises (never a hang).
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__
from .launch import env_rank, relaunch, under_mpi_launcher
from .models.shapes import model_names
from .results import write_json
from .schemes import SCHEMES, all_options, scheme_class

_ARGV: list[str] = []  # the command line this process was started with (re-used by -n)


class ConfigMismatch(RuntimeError):
    """Ranks were started with different configurations."""


# --------------------------------------------------------------------------- helpers
def rank0_echo(msg: str = "", err: bool = False) -> None:
    if env_rank() == 0:
        click.echo(msg, err=err)


def _density(ctx, param, value):
    if value is None:
        return value
    if not (isinstance(value, float) and math.isfinite(value) and 0.0 < value <= 1.0):
        raise click.BadParameter(f"{value!r} is not in the allowed range (0, 1]")
    return value


def mpi_options(f: Callable) -> Callable:
    """``-n`` and ``--timeout``, shared by every command that runs ranks."""
    f = click.option("--timeout", type=click.IntRange(min=1), default=None, metavar="SECONDS",
                     help="End the whole job after SECONDS (sets MPIEXEC_TIMEOUT / --timeout).")(f)
    f = click.option("-n", "--np", "nprocs", type=click.IntRange(min=1), default=None, metavar="W",
                     help="Run on W ranks: spawns `mpiexec -n W` unless already under MPI.")(f)
    return f


def scheme_options(f: Callable, exclude: tuple[str, ...] = ()) -> Callable:
    """One click option per scheme option in the registry (defaults: None = unset).

    Names in ``exclude`` belong to the command itself (``train --momentum``)
    and are handed to the schemes that declare them by the command.
    """
    for name, (opt, owners) in sorted(all_options().items(), reverse=True):
        if name in exclude:
            continue
        owner_text = ", ".join(owners)
        if opt.kind is bool:
            f = click.option(opt.flag, name, is_flag=True, default=None,
                             help=f"[{owner_text}] {opt.help.split(': ', 1)[-1]}")(f)
        else:
            f = click.option(opt.flag, name, type=click.Choice(opt.choices) if opt.choices else opt.kind,
                             default=None, help=f"[{owner_text}] {opt.help.split(': ', 1)[-1]}")(f)
    return f


def pick_scheme_options(schemes: tuple[str, ...], given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Split the set scheme options per scheme; an option no chosen scheme has is an error."""
    set_opts = {k: v for k, v in given.items() if v is not None}
    per_scheme: dict[str, dict[str, Any]] = {}
    for s in schemes:
        names = {o.name for o in SCHEMES[s].options}
        per_scheme[s] = {k: v for k, v in set_opts.items() if k in names}
    orphans = [k for k in set_opts if not any(k in per_scheme[s] for s in schemes)]
    if orphans:
        owners = all_options()
        k = orphans[0]
        raise click.UsageError(
            f"--{k.replace('_', '-')} is an option of {', '.join(owners[k][1])}, "
            f"not of the chosen scheme{'s' if len(schemes) > 1 else ''} ({', '.join(schemes)})"
        )
    for s in schemes:
        try:
            per_scheme[s] = scheme_class(s).validate_options(per_scheme[s])
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    return per_scheme


def maybe_relaunch(nprocs: int | None, timeout: int | None) -> bool:
    """Re-run this command under mpiexec when asked for W ranks outside MPI.

    Returns False when this process should go on and run as a rank.
    """
    if nprocs is None or under_mpi_launcher():
        return False
    code = relaunch(nprocs, _ARGV, timeout=timeout)
    raise SystemExit(code)


def cuda_aware_option(f: Callable) -> Callable:
    """``--cuda-aware/--no-cuda-aware``: override the run-time probe (default: decided once, see `info`)."""
    return click.option("--cuda-aware/--no-cuda-aware", "cuda_aware", default=None,
                        help="Hand device buffers to MPI directly / stage them through pinned host memory "
                             "[default: MPISPARSE_CUDA_AWARE, else the MPI library's answer checked by a probe].")(f)


def open_comm(nprocs: int | None, check: bool = False, cuda_aware: bool | None = None):
    from .comm import Communicator
    from .device import assign_device

    assign_device(Communicator(cuda_aware=False))  # GPU by local rank, before any probe allocates on one
    comm = Communicator(check=check, cuda_aware=cuda_aware)
    if nprocs is not None and comm.size != nprocs:
        raise click.UsageError(f"-n {nprocs} was given but the MPI job has {comm.size} ranks")
    return comm


def agree_on_config(comm, config: dict[str, Any]) -> None:
    """Fail on every rank, naming the differences, if ranks disagree on ``config``."""
    everyone = comm.allgather_obj(config)
    diffs = []
    for r, other in enumerate(everyone[1:], start=1):
        for k in sorted(set(config) | set(other)):
            if everyone[0].get(k) != other.get(k):
                diffs.append(f"{k}: rank 0 has {everyone[0].get(k)!r}, rank {r} has {other.get(k)!r}")
    if diffs:
        raise ConfigMismatch("ranks disagree on the configuration: " + "; ".join(diffs[:5]))


def _check_ps(schemes, servers, nprocs, density, per_scheme, checkpoint: bool = False) -> int:
    """``--servers`` and the parameter-server schemes' options, before MPI starts; returns S."""
    from .ps.options import check_ps_options

    try:
        return check_ps_options(schemes, servers=servers, world=nprocs, density=density, per_scheme=per_scheme,
                                checkpoint=checkpoint)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


# --------------------------------------------------------------------------- commands
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mpisparse")
def cli() -> None:
    """Sparsified gradient communication over MPI: schemes, benchmarks, training.

    Run any command on W ranks with `-n W` (spawns mpiexec) or under your own
    launcher: `mpiexec -n W mpisparse ...`, `srun mpisparse ...`.
    """


@cli.command()
@mpi_options
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the report as JSON to this file.")
@cuda_aware_option
def info(nprocs, timeout, json_path, cuda_aware) -> None:
    """MPI library, world size, CUDA-awareness, library versions, GPUs."""
    maybe_relaunch(nprocs, timeout)
    from .info import collect_info, format_info

    comm = open_comm(nprocs, cuda_aware=cuda_aware)
    report = collect_info(comm)
    if comm.rank == 0:
        click.echo(format_info(report))
        write_json(json_path, report)


@cli.group()
def bench() -> None:
    """Benchmarks: `step` (sparsified steps), `exchange` (collective patterns), `select` (kernels),
    `scaling` (sweeps of W and density)."""


@bench.command("step")
@mpi_options
@click.option("--model", type=click.Choice(model_names()), default="resnet18", show_default=True,
              help="Gradients shaped like this model's layers.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True,
              default=("dense", "topk"), show_default=True,
              help="Scheme to run; repeat to compare several in one job.")
@click.option("--density", type=float, default=0.01, show_default=True, callback=_density,
              help="Fraction of elements sent, in (0, 1].")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed steps first.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic gradients.")
@click.option("--no-memory", is_flag=True, help="Disable error feedback (drop what is not sent).")
@click.option("--check-collectives", is_flag=True,
              help="Debug: verify every collective's counts and dtypes agree across ranks.")
@click.option("--diagnostics", is_flag=True,
              help="Per-step diagnostics into the JSON (error norm, scheme-specific; extra communication).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the result object (a list with several --scheme) to this file.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="One row per scheme: the result's scalars and per-phase ms.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="PNG: per-phase time per step (stacked) and bytes per rank, one bar per scheme.")
@click.option("--servers", type=click.IntRange(min=1), default=None, metavar="S",
              help="Parameter-server schemes: the last S ranks serve, the others are workers [1].")
@scheme_options
@cuda_aware_option
def bench_step(nprocs, timeout, model, schemes, density, iters, warmup, seed, no_memory,
               check_collectives, diagnostics, json_path, csv_path, plot_path, servers, cuda_aware=None,
               **scheme_opts) -> None:
    """Time sparsified steps of one or more schemes; print the per-phase table."""
    schemes = tuple(dict.fromkeys(schemes))  # repeated names run once
    per_scheme = pick_scheme_options(schemes, scheme_opts)
    world = nprocs if nprocs is not None else None
    for s in schemes:
        if SCHEMES[s].family == "mp":
            raise click.UsageError(f"scheme {s!r} sparsifies activations between pipeline stages, not gradients: "
                                   f"run it with `mpisparse train --scheme {s} --mp-stages S`")
    if world is not None:
        for s in schemes:
            if world < SCHEMES[s].min_world_size:
                raise click.UsageError(
                    f"scheme {s!r} needs at least {SCHEMES[s].min_world_size} ranks; -n is {world}")
    servers = _check_ps(schemes, servers, nprocs, density, per_scheme)
    _check_plot(plot_path)
    maybe_relaunch(nprocs, timeout)

    from .config import BenchConfig
    from .results import format_comparison, format_run, write_results
    from .runtimes import bench_step

    comm = open_comm(nprocs, check=check_collectives, cuda_aware=cuda_aware)
    agree_on_config(comm, {"model": model, "schemes": list(schemes), "density": density, "iters": iters,
                           "warmup": warmup, "seed": seed, "memory": not no_memory,
                           "options": per_scheme})
    results = []
    for s in schemes:
        cfg = BenchConfig(model=model, scheme=s, density=density, iters=iters, warmup=warmup, seed=seed,
                          memory=not no_memory, scheme_options=dict(per_scheme[s]), diagnostics=diagnostics,
                          servers=servers)
        res = bench_step(comm, cfg, progress=_progress(comm, f"{s}: step"))
        results.append(res)
        if comm.rank == 0:
            click.echo(format_run(res, "bench step"))
    if comm.rank == 0:
        if len(results) > 1:
            click.echo("\n" + format_comparison(results))
        write_results(results, command="bench step", json_path=json_path, csv_path=csv_path, plot_path=plot_path,
                      echo=click.echo)


def _check_plot(plot_path: str | None) -> None:
    """``--plot`` needs matplotlib: say so before MPI starts."""
    if plot_path:
        from .bench.report import check_plot_support

        try:
            check_plot_support()
        except RuntimeError as e:
            raise click.UsageError(str(e)) from None


def _int_list(ctx, param, value):
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: every world size must be >= 1")
    return out


def _size_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [int(float(v)) if "e" in v.lower() else int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: every size must be >= 1")
    return out


def _density_list(ctx, param, value):
    if value is None:
        return None
    try:
        out = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    bad = [d for d in out if not (math.isfinite(d) and 0.0 < d <= 1.0)]
    if not out or bad:
        raise click.BadParameter(f"{value!r}: every density must be in the allowed range (0, 1]")
    return out


@bench.command("select")
@click.option("--mode", type=click.Choice(["kernels", "deft"]), default="kernels", show_default=True,
              help="kernels: top-k/threshold kernels vs torch.topk and one pass; "
                   "deft: DEFT's per-rank selection time vs whole-vector top-k for several W.")
@click.option("--size", type=click.IntRange(min=1), default=25_000_000, show_default=True,
              help="kernels: elements in the float32 vector.")
@click.option("--model", "models", type=click.Choice(model_names()), multiple=True,
              default=("resnet50", "lstm-wt2"), show_default=True, help="deft: gradient shapes.")
@click.option("--worlds", default="1,2,4,8,16", show_default=True, callback=_int_list,
              help="deft: world sizes; each rank's share is timed one after another in this process.")
@click.option("--density", type=float, default=None, callback=_density,
              help="Fraction selected, in (0, 1] [default: 0.001 for kernels, 0.01 for deft].")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed calls of each kernel (best and median reported).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch intra-op threads (NumPy kernels are single-threaded).")
@click.option("--distribution", type=click.Choice(["normal", "student-t"]), default="normal",
              show_default=True, help="Distribution of the vector's values.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the result object to this file (a list for a sweep).")
@click.option("--sizes", default=None, callback=_size_list, metavar="N[,N...]",
              help="kernels: sweep these vector sizes (replaces --size).")
@click.option("--densities", default=None, callback=_density_list, metavar="D[,D...]",
              help="kernels: sweep these densities (replaces --density).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="One row per point (kernels) or per model and W (deft).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="PNG: kernel time vs size/density (kernels), or selection speedup vs W (deft).")
@click.option("--backend", type=click.Choice(["numpy", "cupy"]), default="numpy", show_default=True,
              help="numpy: the CPU kernels; cupy: the GPU kernels on the current device (with the device's "
                   "measured copy bandwidth and torch.topk on the same device).")
def bench_select(mode, size, models, worlds, density, repeats, threads, distribution, seed, json_path,
                 sizes, densities, csv_path, plot_path, backend) -> None:
    """Time selection (one process): the kernels, or DEFT's per-rank share against whole-vector top-k.

    With several --sizes or --densities the kernels run once per point and
    one table (and --csv/--plot) covers the sweep.
    """
    _check_plot(plot_path)
    size = sizes[0] if sizes else size
    density = densities[0] if densities else density
    if mode == "kernels" and (len(sizes or ()) > 1 or len(densities or ()) > 1):
        from .bench.select_sweep import select_sweep_command

        try:
            select_sweep_command(backend, sizes or [size], densities or [0.001 if density is None else density],
                                 repeats=repeats, seed=seed, threads=threads, distribution=distribution,
                                 json_path=json_path, csv_path=csv_path, plot_path=plot_path, echo=click.echo)
        except RuntimeError as e:
            raise click.UsageError(str(e)) from None
        return
    if backend == "cupy":
        from .backend.cupy_kernels import available

        if not available():
            raise click.UsageError("--backend cupy: no GPU/CuPy available (needs CuPy, e.g. "
                                   "pip install cupy-cuda12x, and a CUDA device)")
        from .bench import select_gpu

        if mode == "deft":
            rows = select_gpu.run_deft_select_bench_gpu(models=tuple(models), worlds=tuple(worlds),
                                                        density=0.01 if density is None else density, seed=seed,
                                                        repeats=repeats)
            click.echo(select_gpu.format_deft_select_bench_gpu(rows))
            _select_outputs(mode, rows, json_path, csv_path, plot_path)
            return
        res = select_gpu.run_select_bench_gpu(n=size, density=0.001 if density is None else density,
                                              repeats=repeats, seed=seed, distribution=distribution)
        click.echo(select_gpu.format_select_bench_gpu(res))
        _select_outputs(mode, [res], json_path, csv_path, plot_path)
        return
    if mode == "deft":
        from .bench.select_deft import format_deft_select_bench, run_deft_select_bench

        rows = run_deft_select_bench(models=tuple(models), worlds=tuple(worlds),
                                     density=0.01 if density is None else density, seed=seed, repeats=repeats)
        click.echo(format_deft_select_bench(rows))
        _select_outputs(mode, rows, json_path, csv_path, plot_path)
        return
    density = 0.001 if density is None else density
    from .bench.select import format_select_bench, run_select_bench

    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.UsageError("bench select compares with torch.topk: install torch (pip install '.[train]')")
    res = run_select_bench(n=size, density=density, repeats=repeats, seed=seed, threads=threads,
                           distribution=distribution)
    click.echo(format_select_bench(res))
    _select_outputs(mode, [res], json_path, csv_path, plot_path)


def _select_outputs(mode: str, results: list[dict[str, Any]], json_path, csv_path, plot_path) -> None:
    """``bench select``'s --json (a single point stays one object), --csv and --plot."""
    from .bench.select_sweep import select_outputs

    write_json(json_path, results[0] if (mode == "kernels" and len(results) == 1) else results)
    select_outputs(mode, results, csv_path, plot_path, echo=click.echo)


@cli.command()
@mpi_options
@click.option("--model", type=click.Choice(["mlp", "cnn", "resnet18", "lstm", "dlrm"]), default="mlp",
              show_default=True, help="Network (lstm is a word language model for --data text).")
@click.option("--data", type=click.Choice(["digits", "synthetic", "cifar10", "text"]), default="digits",
              show_default=True, help="digits ships with scikit-learn (no download); cifar10/text read --data-dir.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="CIFAR-10 binary batches, or a text corpus (train.txt/valid.txt/test.txt or wiki.*.tokens).")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True, default=("dense",),
              show_default=True, help="Scheme; repeat to train once with each and compare.")
@click.option("--density", type=float, default=0.01, show_default=True, callback=_density,
              help="Fraction of elements sent, in (0, 1].")
@click.option("--epochs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True, help="Per rank.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.1, show_default=True)
@click.option("--momentum", type=click.FloatRange(0, 1, max_open=True), default=0.9, show_default=True,
              help="SGD momentum, applied to the aggregated update (DGC applies it itself).")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--bptt", type=click.IntRange(min=1), default=35, show_default=True, help="LM sequence length.")
@click.option("--clip", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Clip the local gradient norm before exchange (0: off).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-memory", is_flag=True, help="Disable error feedback.")
@click.option("--check-collectives", is_flag=True, help="Debug: verify every collective's counts and dtypes.")
@click.option("--diagnostics", is_flag=True,
              help="Per-step diagnostics into the JSON (error norm, scheme-specific; extra communication).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Result object (a list with several --scheme).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Per-step log (rank 0's loss, bytes, density, times).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="PNG of loss and accuracy against iterations and wall-clock time.")
@click.option("--checkpoint", "checkpoint_dir", type=click.Path(file_okay=False), default=None,
              help="Write a checkpoint here after every epoch (and on SIGUSR1).")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --checkpoint.")
@click.option("--mp-stages", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pipeline (model-parallel) stages S; -n W runs W/S data-parallel replicas of the pipeline.")
@click.option("--split-after", default=None, metavar="LAYER[,LAYER...]",
              help="Split after these layers (S-1 names, e.g. net.2); default: balance parameter counts.")
@click.option("--micro-batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pipeline micro-batches per batch (GPipe schedule).")
@click.option("--dp-scheme", type=click.Choice(sorted(n for n in SCHEMES if SCHEMES[n].family == "collective")),
              default=None, help="With --mp-stages: data-parallel scheme inside each stage's replica group [dense].")
@click.option("--dp-density", type=float, default=None, callback=_density,
              help="With --mp-stages: --density of the --dp-scheme [--density].")
@click.option("--servers", type=click.IntRange(min=1), default=None, metavar="S",
              help="Parameter-server schemes: the last S ranks serve, the others are workers [1].")
@(lambda f: scheme_options(f, exclude=("momentum",)))
@cuda_aware_option
def train(nprocs, timeout, model, data, data_dir, schemes, density, epochs, batch_size, lr, momentum,
          weight_decay, bptt, clip, seed, no_memory, check_collectives, diagnostics, json_path, csv_path, plot_path,
          checkpoint_dir, resume, mp_stages, split_after, micro_batches, dp_scheme, dp_density, servers,
          cuda_aware=None, **scheme_opts) -> None:
    """Train a model across ranks with one or more schemes; print where the time goes.

    With --mp-stages S the model is split into S pipeline stages; --scheme
    is then how activations cross them (dense, or dct-mp) and --dp-scheme
    runs inside each stage's group of W/S replicas.
    """
    from .config import MPConfig
    from .mp import check_mp_options, parse_split_after

    schemes = tuple(dict.fromkeys(schemes))
    per_scheme = pick_scheme_options(tuple(dict.fromkeys(schemes + ((dp_scheme,) if dp_scheme else ()))),
                                     scheme_opts)
    try:
        split_names = parse_split_after(split_after)
        pipeline = check_mp_options(model=model, data=data, schemes=schemes, stages=mp_stages,
                                    split_after=split_names, micro_batches=micro_batches, batch_size=batch_size,
                                    dp_scheme=dp_scheme, dp_density=dp_density, world=nprocs,
                                    checkpoint=bool(checkpoint_dir or resume), clip=clip)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    mp_cfg = (MPConfig(stages=mp_stages, split_after=split_names, micro_batches=micro_batches,
                       dp_scheme=dp_scheme or "dense", dp_density=dp_density,
                       dp_options=per_scheme.get(dp_scheme or "dense", {})) if pipeline else None)
    if (model == "lstm") != (data == "text"):
        raise click.UsageError(f"--model {model} does not fit --data {data}: "
                               "the lstm model trains on --data text, the classifiers on digits/synthetic/cifar10")
    if data in ("cifar10", "text") and not data_dir:
        raise click.UsageError(f"--data {data} needs --data-dir DIR")
    if resume and not checkpoint_dir:
        raise click.UsageError("--resume needs --checkpoint DIR")
    if nprocs is not None:
        for s in schemes:
            if nprocs < SCHEMES[s].min_world_size:
                raise click.UsageError(
                    f"scheme {s!r} needs at least {SCHEMES[s].min_world_size} ranks; -n is {nprocs}")
    servers = _check_ps(schemes, servers, nprocs, density, per_scheme, checkpoint=bool(checkpoint_dir or resume))
    maybe_relaunch(nprocs, timeout)

    from .config import TrainConfig
    from .results import CsvLog, format_run, format_train_comparison, write_results
    from .runtimes import train as run_train

    comm = open_comm(nprocs, check=check_collectives, cuda_aware=cuda_aware)
    agree_on_config(comm, {"model": model, "data": data, "schemes": list(schemes), "density": density,
                           "epochs": epochs, "batch_size": batch_size, "lr": lr, "momentum": momentum,
                           "seed": seed, "memory": not no_memory, "options": per_scheme,
                           "mp": None if mp_cfg is None else vars(mp_cfg), "servers": servers})
    log = CsvLog(csv_path, append=resume) if (csv_path and comm.rank == 0) else None
    steps: dict[str, list] = {}
    results = []
    for s in schemes:
        cfg = TrainConfig(model=model, data=data, data_dir=data_dir, scheme=s, density=density, epochs=epochs,
                          batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay, bptt=bptt,
                          clip=clip, seed=seed, memory=not no_memory,
                          checkpoint=None if checkpoint_dir is None else
                          (checkpoint_dir if len(schemes) == 1 else str(Path(checkpoint_dir) / s)),
                          resume=resume, scheme_options={k: v for k, v in per_scheme[s].items()},
                          diagnostics=diagnostics, servers=servers, mp=mp_cfg)
        steps[s] = []

        def step_log(rec, _s=s):
            steps[_s].append(rec)
            if log is not None:
                log.row(_s, rec)

        if comm.rank == 0:
            click.echo(f"\n{s}: {model} on {data}, W={comm.size}, density {density:g}, {epochs} epochs")
        res = run_train(comm, cfg, progress=_train_progress(comm), step_log=step_log if comm.rank == 0 else None)
        results.append(res)
        if comm.rank == 0:
            click.echo(format_run(res, "train"))
    if comm.rank == 0:
        if len(results) > 1:
            click.echo("\n" + format_train_comparison(results))
        if log is not None:
            log.close()
        write_results(results, command="train", json_path=json_path, plot_path=plot_path, steps=steps,
                      echo=click.echo)


def _train_progress(comm):
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


def _progress(comm, label: str):
    """A progress callback printing to stderr on rank 0 when it is a terminal."""
    if comm.rank != 0 or not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        click.echo(f"\r{label} {done}/{total}", err=True, nl=done == total)

    return report


from .jobs import jobs  # noqa: E402  (SLURM job scripts; imports no MPI)

cli.add_command(jobs)

from .bench.commands import bench_exchange, bench_scaling  # noqa: E402  (use the helpers above)

bench.add_command(bench_exchange)
bench.add_command(bench_scaling)

from .reproduce.command import reproduce  # noqa: E402  (the seed papers' claims, one command each)

cli.add_command(reproduce)


# --------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI; any failure ends the whole MPI job."""
    global _ARGV
    _ARGV = list(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(args=_ARGV, prog_name="mpisparse", standalone_mode=False)
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.Abort:
        _fail(130, "mpisparse: aborted")
    except click.ClickException as e:
        # Before MPI starts every rank parses the same options: rank 0 speaks.
        # Once MPI runs, the rank that raises speaks, then ends the job.
        if _mpi_running():
            # one write, so an abort from another rank cannot cut it in half;
            # ranks other than 0 give rank 0 a moment to print and abort first
            click.echo(f"mpisparse: rank {_mpi_rank()}: Error: {e.format_message()}", err=True)
            if _mpi_rank() != 0:
                time.sleep(1.0)
        elif env_rank() == 0:
            e.show()
        _fail(e.exit_code)
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # noqa: BLE001 - every failure must end all ranks
        rank = _mpi_rank()
        msg = f"mpisparse: error on rank {rank}: {type(e).__name__}: {e}"
        if os.environ.get("MPISPARSE_TRACEBACK"):
            traceback.print_exc()
        _fail(1, msg)
    sys.exit(code if isinstance(code, int) else 0)


def _mpi_running() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def _mpi_rank() -> int:
    return sys.modules["mpi4py.MPI"].COMM_WORLD.Get_rank() if _mpi_running() else env_rank()


def _fail(code: int, msg: str | None = None) -> None:
    """Print ``msg`` and exit; abort the whole MPI job if MPI is running."""
    if msg:
        click.echo(msg, err=True)
    sys.stderr.flush()
    sys.stdout.flush()
    if _mpi_running() and sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() > 1:
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(code)
    sys.exit(code)
