"""The click commands ``mpisparse bench exchange`` and ``mpisparse bench scaling``.

Registered on the ``bench`` group at the end of :mod:`mpisparse.cli` (this
module imports the CLI's shared option helpers, so it is imported after
them).  The work is in :mod:`mpisparse.bench.exchange` and
:mod:`mpisparse.bench.scaling`; heavy imports stay inside the commands.
"""

from __future__ import annotations

import tempfile

import click

from ..cli import (_check_plot, _density_list, _int_list, _progress, agree_on_config, cuda_aware_option,
                   maybe_relaunch, mpi_options, open_comm, pick_scheme_options, scheme_options, write_json)
from ..models.shapes import model_names
from ..schemes import SCHEMES

__all__ = ["bench_exchange", "bench_scaling"]


def _not_mp(schemes) -> None:
    for s in schemes:
        if SCHEMES[s].family == "mp":
            raise click.UsageError(f"scheme {s!r} sparsifies activations between pipeline stages, not gradients: "
                                   f"run it with `mpisparse train --scheme {s} --mp-stages S`")


@click.command("exchange")
@mpi_options
@click.option("--model", type=click.Choice(model_names()), default="resnet18", show_default=True,
              help="Gradients shaped like this model's layers.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True,
              default=("dense", "topk", "cltk", "deft"), show_default=True,
              help="Scheme whose exchange is timed; repeat for several.")
@click.option("--densities", default="0.001,0.01,0.1", show_default=True, callback=_density_list,
              metavar="D[,D...]", help="Densities to run each scheme at.")
@click.option("--iters", type=click.IntRange(min=1), default=5, show_default=True, help="Timed steps per point.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True, help="Untimed steps first.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic gradients.")
@click.option("--no-memory", is_flag=True, help="Disable error feedback (drop what is not sent).")
@click.option("--check-collectives", is_flag=True,
              help="Debug: verify every collective's counts and dtypes agree across ranks.")
@click.option("--servers", type=click.IntRange(min=1), default=None, metavar="S",
              help="Parameter-server schemes: the last S ranks serve, the others are workers [1].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="The per-run result objects (a list), with the exchange keys added.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="One row per scheme and density.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="PNG: exchange time and bytes per rank against density, a line per scheme.")
@scheme_options
@cuda_aware_option
def bench_exchange(nprocs, timeout, model, schemes, densities, iters, warmup, seed, no_memory, check_collectives,
                   servers, json_path, csv_path, plot_path, cuda_aware=None, **scheme_opts) -> None:
    """Time each scheme's exchange alone (indices + values, or push + pull) against density, at this W.

    The scheme runs its steps on bench-step gradients; only the phases that
    move data between ranks and the bytes are reported.  Sweep W with
    `bench scaling`, or run this under several -n.
    """
    from ..cli import _check_ps

    schemes = tuple(dict.fromkeys(schemes))
    per_scheme = pick_scheme_options(schemes, scheme_opts)
    _not_mp(schemes)
    if nprocs is not None:
        for s in schemes:
            if nprocs < SCHEMES[s].min_world_size:
                raise click.UsageError(f"scheme {s!r} needs at least {SCHEMES[s].min_world_size} ranks; "
                                       f"-n is {nprocs}")
    for d in densities:
        servers_n = _check_ps(schemes, servers, nprocs, d, per_scheme)
    _check_plot(plot_path)
    maybe_relaunch(nprocs, timeout)

    from .exchange import exchange_row, format_exchange, plot_exchange, run_exchange_bench
    from .report import write_csv

    comm = open_comm(nprocs, check=check_collectives, cuda_aware=cuda_aware)
    agree_on_config(comm, {"model": model, "schemes": list(schemes), "densities": list(densities), "iters": iters,
                           "warmup": warmup, "seed": seed, "memory": not no_memory, "options": per_scheme})
    progress = _progress(comm, "exchange")
    results = run_exchange_bench(
        comm, model=model, schemes=schemes, densities=densities, iters=iters, warmup=warmup, seed=seed,
        memory=not no_memory, scheme_options=per_scheme, servers=servers_n,
        progress=None if progress is None else (lambda label, i, n: progress(i, n)))
    if comm.rank == 0:
        click.echo(format_exchange(results))
        write_json(json_path, results)
        if csv_path:
            write_csv(csv_path, [exchange_row(r) for r in results])
        if plot_path:
            plot_exchange(plot_path, results)
            click.echo(f"plot written to {plot_path}")


@click.command("scaling")
@click.option("--worlds", default="1,2,4", show_default=True, callback=_int_list, metavar="W[,W...]",
              help="World sizes: one `mpiexec -n W` job per W (and density and model).")
@click.option("--densities", default="0.01,0.001", show_default=True, callback=_density_list,
              metavar="D[,D...]", help="Densities.")
@click.option("--model", "models", type=click.Choice(model_names()), multiple=True, default=("resnet50",),
              show_default=True, help="Gradient shapes; repeat for several.")
@click.option("--scheme", "schemes", type=click.Choice(sorted(SCHEMES)), multiple=True,
              default=("topk", "cltk", "deft"), show_default=True,
              help="Schemes; repeat for several (the baseline, dense or plumpdp, is added).")
@click.option("--no-baseline", is_flag=True, help="Do not add dense/plumpdp to each job (no speedup column).")
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True, help="Timed steps per job.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed steps first.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-memory", is_flag=True, help="Disable error feedback.")
@click.option("--servers", type=click.IntRange(min=1), default=None, metavar="S",
              help="Parameter-server schemes: the last S ranks of each job serve [1].")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True, metavar="SECONDS",
              help="Bound each job (MPIEXEC_TIMEOUT), and the subprocess 60 s later.")
@click.option("--emucluster", "emucluster_rate", default=None, metavar="RATE",
              help="Run each job on an emulated cluster of W hosts linked at RATE (e.g. 1gbit; bin/emucluster, "
                   "needs root).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Keep each job's JSON here [a temporary directory].")
@click.option("--verbose", is_flag=True, help="Show each job's own output.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Every job's per-run result objects (a list), with baseline and speedup added.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="One row per model, scheme, W and density.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="PNG: step time, speedup and bytes per rank against W.")
@scheme_options
def bench_scaling(worlds, densities, models, schemes, no_baseline, iters, warmup, seed, no_memory, servers,
                  timeout, emucluster_rate, out_dir, verbose, json_path, csv_path, plot_path, **scheme_opts) -> None:
    """Sweep W and density: runs `mpisparse bench step -n W` per point, then one table and one plot.

    Not an MPI job itself: run it as a plain command (in a SLURM batch
    script too); each point is its own mpiexec job, bounded by --timeout.
    """
    from ..launch import under_mpi_launcher
    from .report import write_csv
    from .runs import RunFailed, emucluster_status, scheme_option_args
    from .scaling import format_scaling, plan_scaling, plot_scaling, run_scaling, scaling_row

    if under_mpi_launcher():
        raise click.UsageError("bench scaling starts its own mpiexec jobs: run it as a plain command, "
                               "not under mpiexec/srun")
    schemes = tuple(dict.fromkeys(schemes))
    pick_scheme_options(schemes, scheme_opts)  # validates; only the options given are passed on
    _not_mp(schemes)
    _check_plot(plot_path)
    if emucluster_rate:
        ok, why = emucluster_status()
        if not ok:
            raise click.UsageError(f"--emucluster: {why}")
    given = {k: v for k, v in scheme_opts.items() if v is not None}
    extra = scheme_option_args({"given": given}) + (["--no-memory"] if no_memory else [])
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mpisparse-scaling-")
        out_dir = tmp.name
    try:
        points = plan_scaling(models=models, schemes=schemes, worlds=worlds, densities=densities, iters=iters,
                              warmup=warmup, seed=seed, servers=servers, extra_options=extra, out_dir=out_dir,
                              baseline=not no_baseline, emucluster_rate=emucluster_rate)
        if not points:
            raise click.UsageError("no point to run: every scheme needs more ranks than --worlds offers")
        try:
            results = run_scaling(points, timeout=timeout, echo=click.echo, stream=verbose)
        except RunFailed as e:
            raise click.ClickException(str(e)) from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    click.echo("")
    click.echo(format_scaling(results))
    write_json(json_path, results)
    if csv_path:
        write_csv(csv_path, [scaling_row(r) for r in results])
    if plot_path:
        plot_scaling(plot_path, results)
        click.echo(f"plot written to {plot_path}")
