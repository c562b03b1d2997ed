"""``mpisparse train --model gpt`` on 2 ranks with no ``--data`` (CPython's own prose): held-out loss and perplexity
per scheme, below the untrained model's held-out loss."""

from __future__ import annotations

import json
import math
import os

import pytest

torch = pytest.importorskip("torch")

from conftest import mpi_run  # noqa: E402

pytestmark = pytest.mark.mpi

#: a small step (16 windows of 32 tokens per rank) and few of them: seconds on two cores
SIZE = ["--batch-size", "16", "--gpt-context", "32"]


def start_loss(world: int = 2) -> float:
    """The held-out loss of the untrained model every scheme starts from (same seed), over every rank's held-out
    windows as the training job lays them out."""
    import torch.nn.functional as F

    from mpisparse.config import TrainConfig
    from mpisparse.data import lm_batches
    from mpisparse.train.loop import seeded_setup

    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        _, ds, model = seeded_setup(TrainConfig(model="gpt", batch_size=16, gpt_context=32))
        total = count = 0.0
        with torch.no_grad():
            for r in range(world):
                for x, y in lm_batches(ds.test_x, 16, 32, rank=r, world=world):
                    out, _ = model(x)
                    total += F.cross_entropy(out.reshape(-1, 256), y.reshape(-1), reduction="sum").item()
                    count += y.numel()
    torch.set_num_threads(threads)
    return total / count


def train_gpt(tmp_path, schemes, steps):
    out = tmp_path / "gpt.json"
    p = mpi_run(2, ["train", "--model", "gpt", *[a for s in schemes for a in ("--scheme", s)], "--epochs", "1",
                    "--steps-per-epoch", str(steps), *SIZE, "--no-progress", "--json", str(out)], module=True)
    res = json.loads(out.read_text())
    return p, (res if isinstance(res, list) else [res])


def check_held_out(p, results, schemes, start, *, falls=None):
    falls = schemes if falls is None else falls
    assert [r["scheme"] for r in results] == list(schemes)
    for r in results:
        final = r["metrics"]["final"]
        assert r["config"]["model"] == "gpt" and r["config"]["data"] == "pydoc" and r["world_size"] == 2
        assert math.isfinite(final["test_loss"]) and math.isfinite(final["train_loss"])
        assert final["test_perplexity"] == pytest.approx(math.exp(final["test_loss"]))
        if r["scheme"] in falls:
            assert final["test_loss"] < start - 0.5, (r["scheme"], final["test_loss"], start)
    # one epoch line per scheme, with the held-out loss and perplexity
    assert p.stdout.count("epoch 1/1") == len(schemes) and p.stdout.count("test ppl") == len(schemes)


def test_gpt_trains_on_the_bundled_text_with_three_schemes(tmp_path):
    start = start_loss()
    assert abs(start - math.log(256)) < 0.2  # the untrained model: about uniform over the 256 bytes
    schemes = ("dense", "topk", "deft")
    p, results = train_gpt(tmp_path, schemes, 20)
    check_held_out(p, results, schemes, start)


def test_advise_steps_times_the_gpt(tmp_path):
    """advise-steps with --model gpt: the net exchanged is the default gpt on byte tokens (its dense ways' bytes
    are its parameter count's)."""
    from mpisparse.models.gpt import gpt_num_params

    j = tmp_path / "steps.json"
    mpi_run(2, ["advise-steps", "--model", "gpt", "--scheme", "topk", "--batch", "2", "--iters", "1", "--warmup", "0",
                "--json", str(j)], module=True, timeout=180)
    res = json.loads(j.read_text())
    n = gpt_num_params(vocab=256, context=64, width=64, layers=2)
    by = {r["scheme"]: r["bytes_per_step"] for r in res["rows"]}
    assert res["model"] == "gpt" and list(by) == ["compute", "dense", "dense-16", "dense-opt", "topk"]
    assert by["dense"] - by["dense-16"] == 2 * n and 0 < by["topk"] < by["dense-16"] and by["compute"] == 0


QUICK = os.environ.get("MPISPARSE_QUICK") == "1"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_data_parallel_scheme_trains_gpt(tmp_path):
    """Every collective scheme, one short epoch each on 2 ranks; randomk at density 0.01 sends 1% of the
    coordinates chosen at random, with error feedback, and learns nothing in so few steps (on digits it stays at
    chance too): it is only required to finish with finite losses."""
    from mpisparse.runtimes import schemes_of

    schemes = tuple(schemes_of("collective"))
    p, results = train_gpt(tmp_path, schemes, 10 if QUICK else 40)
    check_held_out(p, results, schemes, start_loss(), falls=[s for s in schemes if s != "randomk"])
