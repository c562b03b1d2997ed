"""The fault-injection suite: each case runs the way a user meets it.

Real subprocesses, real ``mpiexec``, real signals and real files; every
case is bounded in time and asserts what must hold afterwards (exit code,
the one-line message, no process of the job left, checkpoint and result
files intact).  Every test here carries the ``faults`` marker and runs in
the default suite; ``pytest -m faults`` runs only these.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
