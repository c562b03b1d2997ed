"""``mpisparse train`` and the torch wrapper: references, determinism, resume, outputs."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import HERE, TORCH_CASES, mpi_run, mpiexec_prefix, rank_case  # noqa: E402

pytestmark = pytest.mark.mpi

QUICK = ["--model", "mlp", "--data", "digits", "--batch-size", "64"]


def train(tmp_path, name, *args, ranks=2, check=True):
    out = tmp_path / f"{name}.json"
    p = mpi_run(ranks, ["train", *QUICK, "--json", str(out), *args], module=True, check=check)
    return p, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("ranks", [1, 2])
def test_wrapper_update_equals_numpy_reference_and_skips_nan(ranks):
    rank_case("torch_wrapper", ranks, family=TORCH_CASES, label="wrapper")


@pytest.fixture(scope="module")
def topk_run(tmp_path_factory):
    """One run shared by the determinism and resume tests (each launch costs seconds of imports): topk for
    3 epochs with its per-step CSV, and its first epoch again with a checkpoint, which each test that
    resumes from it copies first.  -> (folder, the 3-epoch result, the checkpoint folder)."""
    d = tmp_path_factory.mktemp("topk")
    _, full = train(d, "full", "--scheme", "topk", "--epochs", "3", "--csv", str(d / "full.csv"))
    train(d, "part", "--scheme", "topk", "--epochs", "1", "--checkpoint", str(d / "ck"))
    assert (d / "ck" / "LATEST").read_text().startswith("step-")
    return d, full, d / "ck"


def checkpoint_copy(topk_run, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(topk_run[2], ck)
    return ck


def test_same_seed_gives_identical_losses(tmp_path, topk_run):
    shared, a, _ = topk_run
    _, b = train(tmp_path, "b", "--scheme", "topk", "--epochs", "3", "--csv", str(tmp_path / "b.csv"))
    la = [r["loss"] for r in csv.DictReader(open(shared / "full.csv"))]
    lb = [r["loss"] for r in csv.DictReader(open(tmp_path / "b.csv"))]
    assert len(la) > 10 and la == lb
    assert a["metrics"]["per_epoch"][-1]["test_loss"] == b["metrics"]["per_epoch"][-1]["test_loss"]
    _, c = train(tmp_path, "c", "--scheme", "topk", "--epochs", "1", "--seed", "1")
    assert c["metrics"]["final"]["test_loss"] != a["metrics"]["per_epoch"][0]["test_loss"]


@pytest.fixture(scope="module")
def two_scheme_run(tmp_path_factory):
    """One run shared by the JSON contract and the plot: dense then topk at density 0.05, 2 epochs, --plot
    (each launch costs seconds of imports). -> (the process, the results, the PNG's path)."""
    d = tmp_path_factory.mktemp("two")
    png = d / "p.png"
    p, runs = train(d, "r", "--scheme", "dense", "--scheme", "topk", "--epochs", "2", "--density", "0.05",
                    "--plot", str(png))
    return p, runs, png


def test_json_contract_and_metrics(two_scheme_run):
    p, runs, _ = two_scheme_run
    assert [x["scheme"] for x in runs] == ["dense", "topk"]
    r = runs[1]
    for key in ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank",
                "phases", "step_seconds", "config", "metrics"):
        assert key in r
    assert {"forward", "backward", "compensate", "select", "exchange_indices", "exchange_values",
            "update"} <= set(r["phases"])
    assert len(r["metrics"]["per_epoch"]) == 2 and "test_accuracy" in r["metrics"]["final"]
    assert r["config"]["density"] == 0.05 and r["config"]["model"] == "mlp"
    assert 0.05 <= r["density_actual"] <= 0.1  # build-up of topk at W = 2
    assert "per-phase time per step" in p.stdout and "test accuracy" in p.stdout


def test_resume_equals_uninterrupted_run(tmp_path, topk_run):
    full, ck = topk_run[1], checkpoint_copy(topk_run, tmp_path)
    _, resumed = train(tmp_path, "resumed", "--scheme", "topk", "--epochs", "3", "--checkpoint", str(ck), "--resume")
    assert resumed["metrics"]["per_epoch"] == full["metrics"]["per_epoch"] or all(
        a[k] == b[k] for a, b in zip(resumed["metrics"]["per_epoch"], full["metrics"]["per_epoch"])
        for k in ("epoch", "iteration", "train_loss", "test_loss", "test_accuracy"))


def test_amp_and_overlap_resume_equals_uninterrupted_run(tmp_path):
    """--amp fp16 (the GradScaler's state) and --overlap (each bucket's error feedback) are checkpointed: a run
    resumed after its first epoch ends as the uninterrupted one, for dense and topk --layerwise."""
    args = ["--amp", "fp16", "--overlap", "--scheme", "dense", "--scheme", "topk", "--layerwise",
            "--density", "0.05", "--steps-per-epoch", "6"]
    _, full = train(tmp_path, "full", *args, "--epochs", "2")
    train(tmp_path, "part", *args, "--epochs", "1", "--checkpoint", str(tmp_path / "ck"))
    _, resumed = train(tmp_path, "resumed", *args, "--epochs", "2", "--checkpoint", str(tmp_path / "ck"), "--resume")
    assert [r["scheme"] for r in resumed] == ["dense", "topk"]
    for a, b in zip(full, resumed):
        assert a["config"]["amp"] == "fp16" and a["config"]["overlap"] is True
        assert [e["train_loss"] for e in a["metrics"]["per_epoch"]] == [e["train_loss"] for e in b["metrics"]["per_epoch"]]
        assert a["metrics"]["final"]["test_loss"] == b["metrics"]["final"]["test_loss"], a["scheme"]


def test_kill_during_training_then_resume_equals_uninterrupted(tmp_path):
    """SIGKILL the whole job as soon as a checkpoint exists; the resumed run ends identically."""
    ck = tmp_path / "ck"
    args = [*QUICK, "--scheme", "topk", "--epochs", "6", "--batch-size", "16"]
    _, full = train(tmp_path, "full", *args[len(QUICK):])
    prefix, launch_env = mpiexec_prefix(120)
    env = dict(os.environ, **launch_env, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([*prefix, "-n", "2", sys.executable, "-m", "mpisparse", "train", *args,
                             "--checkpoint", str(ck)], cwd=HERE.parent, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (ck / "LATEST").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    saved = (ck / "LATEST").read_text()
    _, resumed = train(tmp_path, "resumed", *args[len(QUICK):], "--checkpoint", str(ck), "--resume")
    assert resumed["metrics"]["final"]["test_loss"] == full["metrics"]["final"]["test_loss"], saved
    assert resumed["metrics"]["final"]["iteration"] == full["metrics"]["final"]["iteration"]


def test_resume_at_another_world_size_redistributes_residuals_with_a_notice(tmp_path, topk_run):
    ck = checkpoint_copy(topk_run, tmp_path)  # written by 2 ranks
    p, r = train(tmp_path, "three", "--scheme", "topk", "--epochs", "2", "--checkpoint", str(ck), "--resume",
                 ranks=3)
    assert "written by 2 ranks, this job has 3" in p.stderr
    assert "residuals redistributed" in p.stderr and "is reset" not in p.stderr
    assert len(r["metrics"]["per_epoch"]) == 2 and r["world_size"] == 3


def test_save_at_4_resume_at_2_and_3_keeps_the_pending_mass_and_trains_on():
    """tests/mpi/check_reshard.py, in the 4-rank job of the torch cases: dgc, cltk, powersgd, oktopk
    saved by 4 ranks, resumed by 2 and by 3; (1/W') sum_j e'_j = (1/W) sum_i e_i per memory buffer after the resume;
    the second epoch trains."""
    rank_case("reshard", 4, family=TORCH_CASES)


def test_plot_writes_a_png(two_scheme_run):
    png = two_scheme_run[2]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_digits_accuracy_dense_and_sparse_schemes(tmp_path):
    """Acceptance: dense >= 95 %, sparse schemes at density 0.01 and localsgd (parameters averaged every 8 steps,
    its default) within 2 points, in the same epochs."""
    schemes = [s for s in ("topk", "cltk", "deft", "localsgd") if s in __import__("mpisparse.schemes").schemes.SCHEMES]
    args = ["--scheme", "dense", *sum((["--scheme", s] for s in schemes), []), "--density", "0.01",
            "--epochs", "20", "--batch-size", "32"]
    _, runs = train(tmp_path, "acc", *args)
    acc = {r["scheme"]: r["metrics"]["final"]["test_accuracy"] for r in runs}
    assert acc["dense"] >= 0.95, acc
    for s in schemes:
        assert acc[s] >= acc["dense"] - 0.02, acc


def test_a_scheme_that_stops_loses_none_of_the_others(tmp_path):
    """randomk diverges on digits at this learning rate (error feedback over 1 / density steps): with
    --max-skipped-steps 2 it stops; dense, after it, still trains and is written; the job fails naming it."""
    p, r = train(tmp_path, "stop", "--scheme", "randomk", "--scheme", "dense", "--density", "0.01", "--epochs", "12",
                 "--batch-size", "32", "--max-skipped-steps", "2", check=False)
    assert p.returncode != 0
    assert "NoProgress: randomk: 2 steps in a row were skipped" in p.stderr, p.stderr[-2000:]
    assert "randomk stopped (NoProgress); the other schemes go on" in p.stderr
    assert r["scheme"] == "dense" and r["metrics"]["final"]["test_accuracy"] >= 0.95


def test_atomic_checkpoint_survives_a_failed_save(tmp_path, monkeypatch):
    """A save that dies half-way leaves LATEST on the previous complete checkpoint."""
    from mpisparse.train import checkpoint

    class OneRank:
        rank, size = 0, 1

        def barrier(self):
            pass

    checkpoint.save(tmp_path, OneRank(), 1, {"x": 1}, {"r": np.arange(3)})
    real = torch.save
    calls = []

    def dying(obj, f, *a, **k):
        calls.append(1)
        if len(calls) == 2:  # the common file of the second save
            raise OSError("disk died")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", dying)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, OneRank(), 2, {"x": 2}, {"r": np.arange(4)})
    monkeypatch.setattr(torch, "save", real)
    common, mine = checkpoint.load(tmp_path, OneRank())
    assert common["x"] == 1 and mine["r"].tolist() == [0, 1, 2]


def test_train_option_errors():
    from click.testing import CliRunner

    from mpisparse.cli import cli

    for args, msg in ((["--model", "lstm", "--data", "digits"], "does not fit --data digits"),
                      (["--data", "cifar10"], "--data cifar10 needs --data-dir"),
                      (["--resume"], "--resume needs --checkpoint"),
                      (["--lr", "0"], "0.0 is not in the range x>0"),
                      (["--density", "2"], "2.0 is not in the allowed range (0, 1]")):
        res = CliRunner().invoke(cli, ["train", *args])
        assert res.exit_code == 2 and msg in res.output, res.output


def test_a_fresh_run_refuses_a_directory_that_holds_a_checkpoint(tmp_path, topk_run):
    """No silent deletion: --resume or --overwrite-checkpoint must say what happens to it."""
    from click.testing import CliRunner

    from mpisparse.cli import cli

    ck = checkpoint_copy(topk_run, tmp_path)
    saved = (ck / "LATEST").read_text()
    res = CliRunner().invoke(cli, ["train", *QUICK, "--epochs", "1", "--checkpoint", str(ck)])
    assert res.exit_code == 2
    assert f"--checkpoint {ck} already holds a checkpoint" in res.output
    assert "--resume" in res.output and "--overwrite-checkpoint" in res.output
    assert (ck / "LATEST").read_text() == saved
    _, again = train(tmp_path, "again", "--scheme", "topk", "--epochs", "1", "--checkpoint", str(ck),
                     "--overwrite-checkpoint", ranks=1)
    assert again["metrics"]["final"]["epoch"] == 1
