"""The ``mpisparse`` group and the console entry point: errors, and ending the whole MPI job on failure.

Options are validated before MPI starts, so a bad value is one line on
stderr and exit code 2, before any collective runs.  :func:`main` ends
the whole MPI job when any rank raises (never a hang).  The commands are
added to :data:`cli` by :mod:`mpisparse.cli`.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback

import click

from .. import __version__
from ..mpi.launch import abort_job, env_rank, report_started, under_mpi_launcher, under_torchrun
from . import session

__all__ = ["LazyGroup", "cli", "main"]


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command runs (or ``--help`` lists it).

    ``lazy`` maps a command's name to ``"module:attribute"``, so that
    ``mpisparse train`` does not import what ``bench`` or ``advise`` need
    (numba's compiled loops, the cost model) before its first step.
    """

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, attr = self.lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mpisparse")
def cli() -> None:
    """Sparsified gradient communication over MPI: schemes, benchmarks, training.

    Run any command on W ranks with `-n W` (spawns mpiexec) or under your own
    launcher: `mpiexec -n W mpisparse ...`, `srun mpisparse ...`.
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI; any failure ends the whole MPI job."""
    session.ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    if under_mpi_launcher():
        _as_rank()
    try:
        code = cli.main(args=list(session.ARGV), prog_name="mpisparse", standalone_mode=False)
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
        elif under_torchrun():
            # every worker finds the same error: give rank 0 a moment to print it before this exit
            # makes torchrun stop the others
            time.sleep(1.0)
        _fail(e.exit_code)
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # noqa: BLE001 - every failure must end all ranks
        rank = _mpi_rank()
        msg = f"mpisparse: error on rank {rank}: {_one_line(e)}"
        if os.environ.get("MPISPARSE_TRACEBACK"):
            traceback.print_exc()
        _fail(1, msg)
    if session.ARGV[:1] == ["train"]:
        from ..mpi import signals

        signals.ignore_late_usr1()
    code = code if isinstance(code, int) else 0
    if session.END_WITHOUT_TEARDOWN and code == 0:  # a torchrun job, done and written (session.py says why)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)


def _one_line(e: BaseException) -> str:
    """``TYPE: MESSAGE`` of a failure; an MPI error's multi-line error stack shortened to its first line.

    A rank that dies (a parameter server killed, a node lost) makes its peers'
    next call fail with such a stack; the launcher reports the dead rank.
    """
    text = f"{type(e).__name__}: {e}"
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(e, mpi.Exception):
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        text = (f"MPI error: {lines[0] if lines else e.Get_error_string()} (another rank of the job may have "
                "died; see the launcher's report)")
    return text


def _as_rank() -> None:
    """A rank: tell a ``-n`` wrapper it started, stop when the launcher goes, keep an early SIGUSR1."""
    from ..mpi import signals

    report_started()
    signals.watch_launcher()
    if session.ARGV[:1] == ["train"]:
        signals.install_early_usr1()


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
        abort_job(sys.modules["mpi4py.MPI"].COMM_WORLD, code)
    sys.exit(code)
