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
                    "--no-progress", "--json", str(j)], module=True, env={"MPISPARSE_QUICK": "1"}, timeout=180)
    assert "steps to target" in p.stdout and "compute is this machine's CPU" in p.stdout
    res = json.loads(j.read_text())
    assert res["world_size"] == 2 and res["model"] == "mlp" and res["provenance"]["world_size"] == 2
    _check_rows(res, [BASELINE, "dense", "topk"])


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
