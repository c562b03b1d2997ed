"""``mpisparse advise-steps`` on 2 ranks (one bounded launch, two-level collectives): every way's median step,
each timed turn's time and their range, the bytes per step of turns of several steps, and ``advise --measured``
reading them (the gap to the measured best; only against two-level advice)."""

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
    # --hierarchical on 2 emulated hosts of 1 rank (MPISPARSE_RANKS_PER_HOST): the two-level communicator, whose
    # bytes equal the flat one's here
    p = mpi_run(2, ["advise-steps", "--model", "mlp", "--batch", "4", "--iters", "3", "--warmup", "1",
                    "--steps-per-turn", "3", "--hierarchical", "--json", str(j)], module=True, timeout=180,
                env={"MPISPARSE_RANKS_PER_HOST": "1"})
    assert "fastest ms" in p.stdout and "slowest ms" in p.stdout
    assert "a turn: 3 steps, the mean of the last 2" in p.stdout
    res = json.loads(j.read_text())
    assert res["world_size"] == 2 and 0 <= res["hidden_share"] <= 1 and res["steps_per_turn"] == 3
    assert res["hierarchical"] is True and res["device"] == "cpu"
    # bytes per step, not per turn: W = 2's ring Allreduce sends each rank's half of the gradient out and back
    # (n values of 4 or 2 bytes), beside a few bytes of the step's finite check
    from mpisparse.bench.overlap import INPUT_SHAPE
    from mpisparse.models.nets import build_model

    n = sum(q.numel() for q in build_model("mlp", input_shape=INPUT_SHAPE, num_classes=10).parameters())
    by = {r["scheme"]: r["bytes_per_step"] for r in res["rows"]}
    assert by["dense"] - by["dense-16"] == 2 * n and by["dense-16"] == by["dense-opt"] and by["compute"] == 0
    assert 0 <= by["dense-16"] - 2 * n <= 64
    labels = [r["scheme"] for r in res["rows"]]
    assert labels == ["compute", "dense", "dense-16", "dense-opt", "topk", "cltk", "deft", "gtopk", "powersgd",
                      "oktopk"]
    for r in res["rows"]:
        s = r["step_samples_seconds"]
        assert len(s) == 3 and r["step_min_seconds"] == min(s) and r["step_max_seconds"] == max(s)
        assert min(s) <= r["step_seconds"] <= max(s)  # the slowest rank's median lies within the steps' range
    a = tmp_path / "advise.json"
    base = ["advise", "--model", "mlp", "-W", "2", "--rate", "1gbit", "--latency-us", "0", "--measured", str(j)]
    r = CliRunner().invoke(cli, base)  # flat advice against two-level steps: refused
    assert r.exit_code == 2 and "ran two-level (--hierarchical) collectives" in r.output, r.output
    r = CliRunner().invoke(cli, [*base, "--hierarchical", "--json", str(a)])
    assert r.exit_code == 0, r.output
    v = json.loads(a.read_text())["validation"]
    assert {x["scheme"] for x in v["rows"]} == set(labels) - {"compute", "dense-16"}
    assert v["gap"] >= 0 and (v["gap"] == 0) == v["winner_agrees"]
    assert v["within_noise"] in (True, False)


def test_advise_steps_refuses_a_device_it_cannot_use():
    from mpisparse.mpi.device import cuda_unusable_reason

    if cuda_unusable_reason(need_torch=True) is None:
        pytest.skip("a usable GPU: --device cuda is allowed here")
    r = CliRunner().invoke(cli, ["advise-steps", "--device", "cuda"])
    assert r.exit_code == 2 and "--device cuda is not usable here" in r.output, r.output
