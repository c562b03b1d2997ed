"""``mpisparse jobs list|render|examples``: SLURM job scripts from the bundled templates.

The templates, their parameters and the rendering are :mod:`mpisparse.jobs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..jobs import LAUNCHERS, RenderError, format_list, render, render_examples

__all__ = ["JobsUsageError", "jobs"]


class JobsUsageError(click.ClickException):
    """One line on stderr, exit code 2 (like every other invalid option of the CLI)."""

    exit_code = 2


@click.group("jobs")
def jobs() -> None:
    """SLURM job scripts: `list` the templates, `render` one, write the `examples`."""


@jobs.command("list")
def jobs_list() -> None:
    """Templates with a one-line description and their parameters."""
    click.echo(format_list())


def _option(name: str, **kw):
    return click.option("--" + name.replace("_", "-"), name, default=None, **kw)


@jobs.command("render")
@click.argument("name", metavar="NAME")
@_option("nodes", metavar="N", help="Number of nodes (required).")
@_option("time", metavar="TIME", help="Time limit, SLURM format, e.g. 04:00:00 (required).")
@_option("account", help="#SBATCH --account (omitted when not given).")
@_option("partition", help="#SBATCH --partition (omitted when not given).")
@_option("tasks_per_node", metavar="T",
         help="Ranks per node [default: the GPUs per node (--gpus-per-node or --gres), else 1].")
@_option("gpus_per_node", metavar="G", help="GPUs per node, one per rank [default: 0].")
@_option("gres", metavar="GRES", help="#SBATCH --gres instead of --gpus-per-node, e.g. gpu:4 or gpu:a100:4.")
@click.option("--sbatch", "sbatch", multiple=True, metavar="LINE",
              help="An extra #SBATCH line, '--option[=value]' (e.g. --sbatch=--constraint=a100); repeatable.")
@click.option("--requeue", is_flag=True, default=False,
              help="#SBATCH --requeue (bench; train and sweep requeue themselves and always have it).")
@click.option("--setup", "setup", multiple=True, metavar="LINE",
              help="Environment set-up line (module load ..., source .../activate); repeatable.")
@_option("launcher", type=click.Choice(LAUNCHERS), help="srun [default] or mpirun.")
@_option("srun_mpi", metavar="TYPE", help="srun --mpi=TYPE [default: pmix; 'default': leave it out].")
@_option("launcher_args", metavar="ARGS", help="Extra srun/mpirun options.")
@_option("args", metavar="ARGS", help="The mpisparse arguments (required for train).")
@_option("job_name", metavar="NAME", help="#SBATCH --job-name [default: mpisparse-NAME].")
@_option("output", metavar="PATTERN", help="#SBATCH --output [default: %x-%j.out].")
@_option("signal_before", metavar="S", help="USR1 this many seconds before the time limit [default: 120].")
@_option("checkpoint_dir", metavar="DIR", help="train: checkpoint directory.")
@_option("results", metavar="DIR", help="bench, sweep: directory for the JSON results.")
@_option("densities", metavar="'D ...'", help="sweep: densities, space-separated.")
def jobs_render(name: str, **given: Any) -> None:
    """Print the job script of template NAME (`mpisparse jobs list` shows them).

    \b
    mpisparse jobs render train --nodes 2 --time 04:00:00 --gpus-per-node 4 \\
        --setup 'source ~/venv/bin/activate' --args '--model resnet18 --scheme deft' > train.sbatch
    """
    try:
        click.echo(render(name, given), nl=False)
    except RenderError as e:
        raise JobsUsageError(str(e)) from None


@jobs.command("examples")
@click.argument("directory", type=click.Path(file_okay=False), default="jobs")
def jobs_examples(directory: str) -> None:
    """Write an example script of each template into DIRECTORY (the repository's jobs/)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for fname, text in render_examples().items():
        (out / fname).write_text(text)
        click.echo(f"wrote {out / fname}")
