"""``mpisparse advise-steps`` on 2 ranks (one bounded launch): every way's median step, each timed step's
time and their range, and ``advise --measured`` reading them (the gap to the measured best)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import mpi_run
from mpisparse.cli import cli


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_steps_on_two_ranks_carry_their_spread_and_the_advice_reads_it(tmp_path):
    j = tmp_path / "steps.json"
    p = mpi_run(2, ["advise-steps", "--model", "mlp", "--batch", "4", "--iters", "3", "--warmup", "1",
                    "--json", str(j)], module=True, timeout=180)
    assert "fastest ms" in p.stdout and "slowest ms" in p.stdout
    res = json.loads(j.read_text())
    assert res["world_size"] == 2 and 0 <= res["hidden_share"] <= 1
    labels = [r["scheme"] for r in res["rows"]]
    assert labels == ["compute", "dense", "dense-16", "dense-opt", "topk", "cltk", "deft", "gtopk", "powersgd",
                      "oktopk"]
    for r in res["rows"]:
        s = r["step_samples_seconds"]
        assert len(s) == 3 and r["step_min_seconds"] == min(s) and r["step_max_seconds"] == max(s)
        assert min(s) <= r["step_seconds"] <= max(s)  # the slowest rank's median lies within the steps' range
    a = tmp_path / "advise.json"
    r = CliRunner().invoke(cli, ["advise", "--model", "mlp", "-W", "2", "--rate", "1gbit", "--latency-us", "0",
                                 "--measured", str(j), "--json", str(a)])
    assert r.exit_code == 0, r.output
    v = json.loads(a.read_text())["validation"]
    assert {x["scheme"] for x in v["rows"]} == set(labels) - {"compute", "dense-16"}
    assert v["gap"] >= 0 and (v["gap"] == 0) == v["winner_agrees"]
    assert v["within_noise"] in (True, False)
