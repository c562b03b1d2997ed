"""No leak over long runs: a rank's resident memory after many steps stays where it was early on.

``bench step --rss-at A,B`` records each rank's resident memory after steps
A and B (the result's ``rss_bytes_at_step``, max over ranks); steps between
them must not grow it by more than a small margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_bench_step_memory_does_not_grow_with_steps(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "mpisparse", "bench", "step", "-n", "2", "--model", "ncf",
                        "--scheme", "topk", "--scheme", "deft", "--scheme", "dense", "--iters", "400",
                        "--warmup", "0", "--rss-at", "100,400", "--json", str(out), "--timeout", "240"],
                       capture_output=True, text=True, timeout=280, cwd=ROOT,
                       env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-2000:]
    for r in json.loads(out.read_text()):
        rss = r["rss_bytes_at_step"]
        assert set(rss) == {"100", "400"} and r["config"]["rss_at"] == [100, 400]
        early, late = rss["100"], rss["400"]
        # 300 more steps of a 0.4 MB gradient: growth within 3% (plus 2 MiB for the allocator's pools)
        assert late <= early * 1.03 + 2 * 2**20, (r["scheme"], early, late)


def test_rss_at_is_checked_against_the_steps_run():
    from click.testing import CliRunner

    from mpisparse.cli import cli

    res = CliRunner().invoke(cli, ["bench", "step", "--model", "ncf", "--iters", "5", "--warmup", "1",
                                   "--rss-at", "3,7"])
    assert res.exit_code == 2 and "--rss-at is [3, 7]; allowed: steps in [1, 6]" in res.output
    res = CliRunner().invoke(cli, ["bench", "step", "--model", "ncf", "--rss-at", "x"])
    assert res.exit_code == 2 and "'x' is not a comma-separated list of step numbers" in res.output


@pytest.mark.timeout(300)
def test_train_memory_does_not_grow_with_epochs(tmp_path):
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "mpisparse", "train", "--model", "mlp", "--data", "digits",
                        "--scheme", "topk", "--batch-size", "32", "--epochs", "6", "--json", str(out)],
                       capture_output=True, text=True, timeout=280, cwd=ROOT,
                       env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    rss = r["rss_bytes_at_step"]
    steps = [e["iteration"] for e in r["metrics"]["per_epoch"]]
    assert sorted(map(int, rss)) == steps and len(steps) == 6
    early, late = rss[str(steps[1])], rss[str(steps[-1])]
    # epochs 3 to 6 (180 steps, 4 evaluations) add at most 3% (plus 2 MiB for the allocator's pools)
    assert late <= early * 1.03 + 2 * 2**20, (early, late)
