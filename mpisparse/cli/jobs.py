"""``mpisparse jobs list|render|examples``: SLURM job scripts from the bundled templates.

The templates, their parameters and the rendering are :mod:`mpisparse.jobs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from ..jobs import LAUNCHERS, RenderError, format_list, render, render_examples

__all__ = ["JobsUsageError", "args_checker", "jobs"]


class JobsUsageError(click.ClickException):
    """One line on stderr, exit code 2 (like every other invalid option of the CLI)."""

    exit_code = 2


def args_checker(root: click.Group) -> Callable[[str, list[str]], None]:
    """``check(command, words)``: ``--args`` against ``mpisparse COMMAND`` of ``root``, with click's own parser.

    An unknown option, an option without its value, a value given to a
    flag, a choice that is not one of the option's choices, and a stray
    argument are errors (:class:`~mpisparse.jobs.RenderError`, one line).
    Other values are not converted and no callback runs: ``$VARIABLES``
    expand only when the job runs, and its output paths exist only there.
    """
    def check(command: str, words: list[str]) -> None:
        cmd: Any = root
        for word in command.split():
            cmd = cmd.get_command(None, word)
        ctx = click.Context(cmd, info_name=f"mpisparse {command}")
        try:
            opts, extra, _ = cmd.make_parser(ctx).parse_args(list(words))
        except click.UsageError as e:
            raise RenderError(f"--args: {e.format_message()} (mpisparse {command})") from None
        if extra:
            raise RenderError(f"--args: unexpected argument {extra[0]!r} (mpisparse {command} takes options only)")
        params = {p.name: p for p in cmd.params}
        for name, value in opts.items():
            p = params.get(name)
            if p is None or not isinstance(p.type, click.Choice):
                continue
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, str) and "$" not in item and item not in p.type.choices:
                    raise RenderError(f"--args: {max(p.opts, key=len)} {item!r} is not one of "
                                      f"{', '.join(map(str, p.type.choices))} (mpisparse {command})")

    return check


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
    check = args_checker(click.get_current_context().find_root().command)
    try:
        click.echo(render(name, given, check_args=check), nl=False)
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
