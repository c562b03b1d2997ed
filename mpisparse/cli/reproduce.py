"""``mpisparse reproduce``: run a seed paper's claim as jobs, print the claim beside the measurement.

The targets and their reports are :mod:`mpisparse.reproduce`.
"""

from __future__ import annotations

import os
import time

import click

from .options import emucluster_rate, int_list, out_dir_or_default, writable_dir, writable_file

__all__ = ["reproduce"]


@click.command("reproduce")
@click.argument("names", nargs=-1, metavar="[NAME ...|all]")
@click.option("--list", "list_targets", is_flag=True, help="List the targets and exit.")
@click.option("--quick", is_flag=True,
              help="Small models and few iterations: a few minutes per target on 2 cores "
                   "(MPISPARSE_QUICK=1 makes it smaller still, for CI).")
@click.option("-n", "--np", "max_world", type=click.IntRange(min=1), default=None, metavar="W",
              help="Largest world size of the underlying runs (the target's own sweep up to W, then W).")
@click.option("--worlds", default=None, callback=lambda c, p, v: None if v is None else int_list(c, p, v),
              metavar="W[,W...]", help="World sizes of the underlying runs (servers included), replacing the "
                                       "target's own.")
@click.option("--timeout", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="Bound each underlying job [900 with --quick, else 3600].")
@click.option("--emucluster", default="auto", show_default=True, callback=emucluster_rate, metavar="auto|off|RATE",
              help="Network of the underlying MPI jobs: RATE runs every job on an emulated cluster at that link "
                   "rate (bin/emucluster, root); auto runs the jobs whose claims are about communication time "
                   "(deft-breakdown, dct-threshold's Fig. 8a, slimdp-traffic at 1gbit; dgs-speedup at 100mbit) on "
                   "it when it is available; off never.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, callback=writable_dir,
              metavar="DIR", help="Keep every underlying run's JSON here, one directory per target "
                                  "[mpisparse-results/reproduce-<UTC time> in the working directory].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="Write the claim-vs-measured table (and the measured numbers) to this file.")
@click.option("--markdown", is_flag=True, help="Also print the claim-vs-measured table as Markdown.")
@click.option("--no-timing", "no_timing", is_flag=True,
              help="For a shared or busy machine: leave out the runs whose claims are only timings (dct-threshold's "
                   "Fig. 8a) and judge no time claim of the others (n/a); the other claims are judged as usual.")
@click.option("--verbose", is_flag=True, help="Show the underlying runs' own output.")
def reproduce(names, list_targets, quick, max_world, worlds, timeout, emucluster, out_dir, json_path, markdown,
              no_timing, verbose) -> None:
    """Reproduce a claim of a seed paper: run its jobs, print the paper's claim beside the measurement.

    Each target runs `mpisparse bench ...` / `mpisparse train ...` jobs as
    subprocesses (each command line printed first) and ends with a
    claim-vs-measured table.  `all` runs every target.  Run it as a plain
    command (in a SLURM batch script too), not under mpiexec/srun: it starts
    its own MPI jobs.
    """
    from ..bench.runs import RunFailed
    from ..mpi.launch import under_mpi_launcher
    from ..reproduce.base import (Context, Report, Skip, busy_note, busy_now, claims_markdown, claims_summary,
                                  format_report, write_report_json)
    from ..reproduce.registry import TARGETS, get_target

    if list_targets:
        width = max(len(n) for n in TARGETS)
        for name, t in TARGETS.items():
            click.echo(f"{name:<{width}}  {t.seed}, {t.sources}: {t.title}")
        return
    if not names:
        raise click.UsageError("name a target (see --list), or `all`")
    if "all" in names:
        names = tuple(TARGETS)
    try:
        targets = [get_target(n) for n in dict.fromkeys(names)]
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if under_mpi_launcher() and int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        raise click.UsageError("reproduce starts its own MPI jobs: run it as a plain command, not under "
                               "mpiexec/srun with several ranks")
    size = "full"
    if quick:
        size = "tiny" if os.environ.get("MPISPARSE_QUICK") == "1" else "quick"
    timeout = timeout or (900 if quick else 3600)
    base_dir = out_dir_or_default(out_dir, "reproduce")  # kept: the printed paths exist afterwards
    reports: list[Report] = []
    failed = []
    for t in targets:
        click.echo(f"== {t.name}: {t.seed}, {t.sources} ({size})")
        ctx = Context(size=size, out_dir=os.path.join(base_dir, t.name), timeout=timeout, worlds=worlds,
                      max_world=max_world, emucluster=emucluster, stream=verbose, echo=click.echo,
                      timing=not no_timing)
        t0 = time.perf_counter()
        load = busy_now()  # what runs besides us now, not a previous target's finished jobs
        try:
            t.check()
            rep = t.run(ctx)
            busy = busy_note(load, os.cpu_count() or 1, rep.claims)
            if busy:
                rep.notes.append(busy)
        except Skip as e:
            rep = t.report(ctx, skipped=str(e), commands=list(ctx.commands))
        except RunFailed as e:  # a failed run ends this target, the others go on
            failed.append(t.name)
            click.echo(f"{t.name}: {e}", err=True)
            continue
        rep.seconds = time.perf_counter() - t0
        reports.append(rep)
        click.echo(format_report(rep))
        if markdown and not rep.skipped:
            click.echo("\n" + claims_markdown(rep.claims))
    if reports:
        click.echo("\n" + claims_summary(reports))
    if os.path.isdir(base_dir):
        click.echo(f"the underlying runs' JSON is in {base_dir}")
    if json_path and reports:
        from ..results import Fallback

        Fallback(reports[0].to_json() if len(reports) == 1 else [r.to_json() for r in reports]).attempt(
            "--json", json_path, lambda: write_report_json(json_path, reports))
    if failed:
        raise click.ClickException(f"run failed for {', '.join(failed)}")
