"""What a rank imports before its first step: each command only what it needs.

The CLI loads a command's module when that command runs (``LazyGroup`` in
mpisparse/cli/main.py), and the compiled loops (numba) load on a scheme's
first selection, so ``train`` with a scheme that selects nothing does not
pay for them, and ``bench``, ``info`` and ``jobs`` import no torch.  Each
case runs in a fresh interpreter (what is imported is process-wide).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: ``train``'s path as a rank takes it: the command resolved from the group, then a data-parallel step built as
#: ``train`` builds it (CollectiveStep, one rank without MPI: the tests' SelfComm) and run for two batches
TRAIN = """
import sys
from conftest import SelfComm
from mpisparse.cli import cli
cli.get_command(None, "train")
from mpisparse.config import TrainConfig
from mpisparse.train.loop import CollectiveStep
step = CollectiveStep(SelfComm(), TrainConfig(scheme="{scheme}", density=0.05, batch_size=64))
for b, batch in zip(range(2), step.batches(0)):
    assert step.train_batch(b, batch).stepped
print(" ".join(sorted(m for m in {watched} if m in sys.modules)) or "-")
"""

#: a command resolved as ``main`` resolves it (its module imported, its options built), nothing run
RESOLVE = """
import sys
from mpisparse.cli import cli
cmd = cli
for name in {path}:
    cmd = cmd.get_command(None, name)
assert cmd is not None
print(" ".join(sorted(m for m in {watched} if m in sys.modules)) or "-")
"""

WATCHED = ("numba", "torch", "torch._dynamo", "mpisparse.cli.bench", "mpisparse.cli.advise",
           "mpisparse.bench.costmodel")


def _loaded(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=HERE,
                         env={**os.environ, "PYTHONPATH": f"{HERE}:{HERE.parent}"})
    assert out.returncode == 0, out.stderr[-3000:]
    return set(out.stdout.split()) - {"-"}


def test_train_with_dense_loads_neither_other_commands_nor_the_compiled_loops():
    loaded = _loaded(TRAIN.format(scheme="dense", watched=WATCHED))
    assert "torch" in loaded  # the check can see a module that is there
    assert loaded == {"torch"}, loaded


def test_train_with_topk_loads_the_compiled_loops_when_it_selects():
    """The loops are deferred, not dropped: a selecting scheme still gets them (numba installed)."""
    pytest.importorskip("numba")
    loaded = _loaded(TRAIN.format(scheme="topk", watched=WATCHED))
    assert loaded == {"torch", "numba"}, loaded


@pytest.mark.parametrize("path", [("bench", "step"), ("bench", "exchange"), ("bench", "select"), ("info",),
                                  ("jobs", "render")])
def test_commands_that_train_nothing_import_no_torch(path):
    loaded = _loaded(RESOLVE.format(path=path, watched=WATCHED))
    assert "torch" not in loaded and "torch._dynamo" not in loaded, loaded
    if path[0] != "bench":
        assert "mpisparse.cli.bench" not in loaded, loaded


def test_help_lists_every_command_without_importing_it_first():
    from mpisparse.cli import cli

    names = cli.list_commands(None)
    assert names == sorted(names)
    assert {"advise", "advise-steps", "bench", "info", "jobs", "reproduce", "train"} <= set(names)
    assert all(cli.get_command(None, n) is not None for n in names)
    assert cli.get_command(None, "no-such-command") is None
