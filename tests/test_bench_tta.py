"""``bench tta``: time to accuracy on 2 ranks (quick form) and on 2 emulated hosts, its JSON, table, plot and
refusals (one line, exit 2, before MPI starts)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess

import pytest
from click.testing import CliRunner

from conftest import mpi_run
from mpisparse.bench.tta import BASELINE, NOT_REACHED, format_tta, plot_tta
from mpisparse.cli import cli
from test_emucluster import WHY_NOT, emu

#: the emulated cluster of these tests (the engineers' own clusters use other instances)
INSTANCE = "11"
SPLIT = ("compute", "exposed_exchange", "hidden_exchange")


def _check_rows(res: dict, labels: list[str]) -> None:
    assert [r["label"] for r in res["rows"]] == labels
    for r in res["rows"]:
        assert 0 <= r["final_accuracy"] <= 1 and 1 <= r["steps"] <= res["max_steps"]
        if r["reached"]:
            assert r["steps_to_target"] <= r["steps"] and r["seconds_to_target"] > 0
            assert r["final_accuracy"] >= res["target"]
        else:
            assert r["steps_to_target"] == r["seconds_to_target"] == NOT_REACHED and r["steps"] == res["max_steps"]
        assert r["bytes_per_step"] > 0 and set(r["step_split"]) == set(SPLIT)
        assert all(r["step_split"][k] >= 0 for k in SPLIT)
        assert r["step_seconds"] == pytest.approx(r["step_split"]["compute"] + r["step_split"]["exposed_exchange"])
    base, dense = res["rows"][0], res["rows"][1]
    assert base["overlap"] and base["wire_dtype"] == "float16" and dense["wire_dtype"] == "float32"
    assert base["bytes_per_step"] == pytest.approx(dense["bytes_per_step"] / 2, rel=0.01)  # the 16-bit wire
    assert dense["step_split"]["hidden_exchange"] == 0


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_quick_form_on_two_ranks(tmp_path):
    j = tmp_path / "tta.json"
    p = mpi_run(2, ["bench", "tta", "--quick", "--scheme", BASELINE, "--scheme", "dense", "--scheme", "topk",
                    "--scheme", "localsgd", "--local-steps", "4", "--no-progress", "--json", str(j)], module=True,
                env={"MPISPARSE_QUICK": "1"}, timeout=180)
    assert "steps to target" in p.stdout and "compute is this machine's CPU" in p.stdout
    res = json.loads(j.read_text())
    assert res["world_size"] == 2 and res["model"] == "mlp" and res["provenance"]["world_size"] == 2
    _check_rows(res, [BASELINE, "dense", "topk", "localsgd"])
    dense, local = res["rows"][1], res["rows"][3]  # evaluated every 4 steps: right after each sync
    assert local["options"] == {"local_steps": 4} and local["density"] == 0.25  # one step in 4 communicates
    assert local["bytes_per_step"] < dense["bytes_per_step"] / 3  # a parameter Allreduce every 4 steps, and flags


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_language_model_trains_to_a_held_out_loss(tmp_path):
    """gpt on the bundled text (no --data): its target is a held-out loss, each row says so, and what it reports
    is the held-out loss and perplexity of its evaluations."""
    j = tmp_path / "tta.json"
    p = mpi_run(2, ["bench", "tta", "--model", "gpt", "--quick", "--scheme", BASELINE, "--scheme", "topk",
                    "--max-steps", "6", "--eval-every", "3", "--batch-size", "16", "--no-progress", "--json", str(j)],
                module=True, env={"MPISPARSE_QUICK": "1"}, timeout=180)
    assert "target held-out loss 4.5" in p.stdout and "final loss" in p.stdout
    res = json.loads(j.read_text())
    assert res["data"] == "pydoc" and res["target_metric"] == "loss" and res["target"] == 4.5
    for r in res["rows"]:
        assert r["target"] == {"metric": "loss", "value": 4.5} and "final_accuracy" not in r
        assert [c["step"] for c in r["curve"]][:1] == [3] and r["steps"] <= 6
        for c in r["curve"]:
            assert c["perplexity"] == pytest.approx(math.exp(c["loss"])) and "accuracy" not in c
        assert r["final_loss"] == r["curve"][-1]["loss"] and r["final_perplexity"] == r["curve"][-1]["perplexity"]
        first_met = next((c["step"] for c in r["curve"] if c["loss"] <= 4.5), None)
        assert r["reached"] == (first_met is not None)
        assert r["steps_to_target"] == (first_met if r["reached"] else NOT_REACHED)
        assert r["bytes_per_step"] > 0


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated cluster: {WHY_NOT}")
def test_quick_form_on_two_emulated_hosts(tmp_path):
    j = tmp_path / "tta.json"
    p = emu("run", "2", "--rate", "100mbit", "--instance", INSTANCE, "--timeout", "240", "--", "mpisparse", "bench",
            "tta", "--quick", "--scheme", BASELINE, "--scheme", "dense", "--scheme", "topk", "--no-progress",
            "--json", str(j), timeout=300, env={"MPISPARSE_QUICK": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(j.read_text())
    assert res["world_size"] == 2 and res["hosts"] == 2
    _check_rows(res, [BASELINE, "dense", "topk"])
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"mh{INSTANCE}-" not in ns  # torn down


@pytest.mark.parametrize("args, message", [
    (["--target", "0"], "--target is 0.0; allowed: a test accuracy in (0, 1]"),
    (["--target", "1.5"], "--target is 1.5; allowed: a test accuracy in (0, 1]"),
    (["--quick", "--target", "-0.2"], "--target is -0.2; allowed: a test accuracy in (0, 1]"),
    (["--scheme", "nope"], "'nope' is not one of 'dense-opt'"),
    (["--scheme", "powersgd", "--wire-dtype", "float16"], "scheme 'powersgd' sends float32 values only"),
    (["--scheme", "dense", "--matrix-approximation-rank", "2"], "is an option of powersgd"),
    (["--density", "0"], "--density"),
    (["--model", "gpt", "--target-loss", "0"], "--target-loss is 0.0; allowed: a held-out loss > 0"),
    (["--model", "gpt", "--target-loss", "-1.5"], "--target-loss is -1.5; allowed: a held-out loss > 0"),
    (["--model", "lstm", "--target-ppl", "1"], "--target-ppl is 1.0; allowed: a held-out perplexity > 1"),
    (["--model", "gpt", "--target", "0.9"], "--target 0.9 is a test accuracy; a language model's target is"),
    (["--model", "mlp", "--target-ppl", "20"], "--target-ppl is a language model's target"),
    (["--target", "0.9", "--target-loss", "1"], "--target and --target-loss: give one target"),
    (["--model", "gpt", "--data", "digits"], "--model gpt does not fit --data digits"),
    (["--device", "cuda"] if importlib.util.find_spec("cupy") is None else ["--device", "tpu"],
     "--device cuda is not usable here" if importlib.util.find_spec("cupy") is None else "'tpu' is not one of"),
])
def test_bad_input_is_one_line_before_mpi(args, message):
    r = CliRunner().invoke(cli, ["bench", "tta", *args])
    assert r.exit_code == 2 and message in r.output, r.output
    assert len([line for line in r.output.splitlines() if line.startswith("Error")]) == 1


def _res(reached: bool) -> dict:
    split = {"compute": 0.01, "exposed_exchange": 0.004, "hidden_exchange": 0.002}
    curve = [{"step": 5, "seconds": 0.1, "accuracy": 0.5, "loss": 1.0},
             {"step": 10, "seconds": 0.2, "accuracy": 0.9 if reached else 0.6, "loss": 0.5}]
    row = {"label": "topk", "reached": reached, "steps_to_target": 10 if reached else NOT_REACHED,
           "seconds_to_target": 0.2 if reached else NOT_REACHED, "final_accuracy": curve[-1]["accuracy"],
           "steps": 10, "step_seconds": 0.014, "step_split": split, "bytes_per_step": 2120.0, "curve": curve}
    base = {**row, "label": BASELINE, "reached": True, "steps_to_target": 10, "seconds_to_target": 0.1,
            "final_accuracy": 0.9, "bytes_per_step": 52268.0}
    return {"model": "mlp", "data": "digits", "world_size": 2, "target": 0.8, "max_steps": 10, "eval_every": 5,
            "batch_size": 32, "density": 0.01, "baseline_wire_dtype": "float16", "rows": [base, row]}


def test_table_and_plot(tmp_path):
    text = format_tta(_res(False))
    assert NOT_REACHED in text and "52,268" in text and "hidden exch ms" in text and "1.00x" in text
    assert "compute is this machine's CPU" in text
    on_gpu = format_tta({**_res(False), "device": "cuda"})
    assert "compute is each rank's GPU" in on_gpu and "this machine's CPU" not in on_gpu
    assert "0.50x" in format_tta(_res(True))  # dense-opt 0.1 s to target, topk 0.2 s
    png = tmp_path / "tta.png"
    plot_tta(_res(True), str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert not math.isnan(_res(True)["rows"][1]["final_accuracy"])


def test_a_language_models_table_and_plot_show_its_target(tmp_path):
    res = _res(True)
    res.update(model="gpt", data="pydoc", target=30.0, target_metric="perplexity")
    for r in res["rows"]:
        r["curve"] = [{"step": c["step"], "seconds": c["seconds"], "loss": c["loss"],
                       "perplexity": math.exp(c["loss"])} for c in r.pop("curve")]
        r.pop("final_accuracy")
        r.update(final_loss=0.5, final_perplexity=math.exp(0.5))
    text = format_tta(res)
    assert "target held-out perplexity 30" in text and "final ppl" in text and "1.65" in text  # e^0.5
    assert "accuracy" not in text and "final acc" not in text
    png = tmp_path / "lm.png"
    plot_tta(res, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_targets():
    from mpisparse.bench.tta import Target, pick_target

    assert pick_target(False) == Target("accuracy", 0.9) and pick_target(True) == Target("loss", 2.5)
    assert pick_target(True, defaults={"loss": 4.5}) == Target("loss", 4.5)
    assert pick_target(False, loss=0.3) == Target("loss", 0.3)  # a classifier may run to a test loss
    assert pick_target(True, ppl=20) == Target("perplexity", 20.0)
    assert Target("loss", 2.0).met({"loss": 2.0}) and not Target("loss", 2.0).met({"loss": 2.01})
    assert Target("perplexity", 9.0).met({"perplexity": 8.0}) and not Target("accuracy", 0.9).met({"accuracy": 0.8})
    with pytest.raises(ValueError, match=r"--target-loss is nan; allowed: a held-out loss > 0"):
        pick_target(True, loss=float("nan"))


def test_the_loop_stops_where_the_step_asks():
    """TrainStep.stop_requested (what bench tta's target uses): the loop ends after that step, the epoch's
    evaluation and the result still done."""
    from conftest import SelfComm
    from mpisparse.config import TrainConfig
    from mpisparse.train.core import run_loop
    from test_loop_core import ToyStep

    class Stopping(ToyStep):
        def stop_requested(self):
            return self.seen >= 4

    loop = run_loop(SelfComm(), TrainConfig(epochs=5), Stopping())
    assert loop.iteration == 4 and len(loop.step_bytes) == 4
    assert [r["epoch"] for r in loop.history] == [1] and loop.history[0]["iteration"] == 4
