"""A SIGUSR1 that reaches a finished ``train`` rank (SLURM's warning after the last step) must not kill it.

Python's teardown resets the handlers it installed to the default action, and
the default action of SIGUSR1 ends the process (exit status 138: the job would
end FAILED after its results were written). ``signals.ignore_late_usr1`` (called
by the CLI when ``train`` returns) ignores it instead; here a sibling process
signals a rank-like process every millisecond while it exits. Without the
call such a process died of the signal in 4 of 5 runs on this machine.
"""

import subprocess
import sys

from conftest import HERE

SCRIPT = """
import os, signal, subprocess, sys, time
from mpisparse.mpi import signals
signals.install_early_usr1()   # as a train rank has it
signals.ignore_late_usr1()     # as the CLI does when train returns
subprocess.Popen([sys.executable, "-c", '''
import os, signal, time
for _ in range(5000):
    try:
        os.kill(%d, signal.SIGUSR1)
    except ProcessLookupError:
        break
    time.sleep(0.001)
''' % os.getpid()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(0.2)
"""


def test_a_late_usr1_does_not_kill_a_finished_rank():
    for _ in range(5):
        p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=HERE.parent, capture_output=True, text=True,
                           timeout=60, env={"PYTHONPATH": str(HERE.parent), "PATH": ""})
        assert p.returncode == 0, (p.returncode, p.stderr[-500:])


def test_the_cli_ignores_it_once_train_returns(monkeypatch):
    import importlib

    from mpisparse.mpi import signals

    cli_main = importlib.import_module("mpisparse.cli.main")
    called = []
    monkeypatch.setattr(signals, "ignore_late_usr1", lambda: called.append(True))
    try:
        cli_main.main(["train", "--help"])
    except SystemExit as e:
        assert e.code in (0, None)
    assert called == [True]
