"""A CLI command that raises on one rank while the others wait in a collective.

Run with ``python -m mpi4py raise_on_rank.py R`` or plain python: the CLI's
entry point must end the whole job either way.
"""

import sys

import click

from mpisparse.cli import cli, main, open_comm


@cli.command("fail-test")
@click.argument("bad_rank", type=int)
def fail_test(bad_rank):
    comm = open_comm(None)
    if comm.rank == bad_rank:
        raise RuntimeError(f"injected failure on rank {bad_rank}")
    comm.barrier()  # the other ranks would wait here forever


if __name__ == "__main__":
    main(["fail-test", sys.argv[1]])
