"""``mpisparse train --mp-stages S``: pipeline and hybrid runs against references (bounded MPI jobs)."""

import json
import math

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import TORCH_CASES, mpi_run, rank_case  # noqa: E402

pytestmark = pytest.mark.mpi

DIGITS_TRAIN = 1438  # digits: 1,797 images, 80 % train (stratified per class, rounded)
STABLE = ["--model", "mlp", "--data", "digits", "--lr", "0.05", "--batch-size", "64"]


def train(tmp_path, name, ranks, *args):
    out = tmp_path / f"{name}.json"
    p = mpi_run(ranks, ["train", *STABLE, "--json", str(out), *args], module=True)
    return p, json.loads(out.read_text())


def batch_rows(n, batch):
    return [batch] * (n // batch) + ([n % batch] if n % batch else [])


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_pipeline_equals_single_process_training(ranks):
    """mlp/cnn/dlrm at 2-3 stages (exact at density 1 and with the mask layer), micro-batches, hybrid."""
    rank_case("mp_pipeline", ranks, family=TORCH_CASES, label="mp pipeline")


def test_digits_two_stages_dct_mp_accuracy_and_exact_bytes(tmp_path):
    p, (dense, dct) = train(tmp_path, "mp", 2, "--mp-stages", "2", "--split-after", "net.2", "--scheme", "dense",
                            "--scheme", "dct-mp", "--density", "0.1", "--epochs", "8")
    # the JSON result's fixed keys, plus the pipeline's own keys
    for r in (dense, dct):
        for key in ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank", "phases",
                    "step_seconds", "config", "metrics", "mp"):
            assert key in r
        assert {"forward", "backward", "send_activations", "send_gradients", "wait", "update"} <= set(r["phases"])
        assert r["world_size"] == 2 and r["mp"]["stages"] == 2 and r["mp"]["replicas"] == 1
        assert r["mp"]["split_after"] == ["net.2"] and r["mp"]["splits"][0]["activation_shape"] == [128]
    acc_dense = dense["metrics"]["final"]["test_accuracy"]
    acc_dct = dct["metrics"]["final"]["test_accuracy"]
    assert acc_dense > 0.9 and abs(acc_dct - acc_dense) <= 0.02, (acc_dense, acc_dct)

    # bytes per step, exactly: d = 128, k = floor(0.1 d) = 12 kept per row, bitmap mask (rows d / 8 bytes)
    rows = batch_rows(DIGITS_TRAIN, 64)
    d, k = 128, 12
    dense_fwd = np.mean([4 * r * d for r in rows])
    s = dct["mp"]["splits"][0]
    assert s["mask_encodings"] == {"bitmap": len(rows) * 8}
    assert s["dense_bytes_forward"] == pytest.approx(dense_fwd, rel=1e-12)
    assert s["bytes_forward"] == pytest.approx(np.mean([24 + 4 * r * k + math.ceil(r * d / 8) for r in rows]),
                                               rel=1e-12)
    # = kept fraction x dense activation bytes + the mask encoding (a bitmap: dense / 32) + the 24-byte header
    assert s["bytes_forward"] == pytest.approx((k / d) * dense_fwd + dense_fwd / 32 + 24, rel=1e-12)
    assert s["bytes_backward"] == pytest.approx((k / d) * dense_fwd, rel=1e-12)
    assert s["occupancy"] == dct["density_actual"] == k / d
    assert s["compression_forward"] == pytest.approx(dense_fwd / s["bytes_forward"])
    assert dct["bytes_sent_per_rank"] == pytest.approx(s["bytes_forward"])
    sd = dense["mp"]["splits"][0]
    assert sd["bytes_forward"] == sd["bytes_backward"] == pytest.approx(dense_fwd, rel=1e-12)
    assert dense["density_actual"] == 1.0 and dense["mp"]["compression_factor"] == 1.0
    assert dct["mp"]["compression_factor"] > 7
    for text in ("send_activations", "send_gradients", "split 0 fwd B", "bitmap", "compression"):
        assert text in p.stdout

    # the uncompressed pipeline is single-process training: same epochs, same numbers
    _, single = train(tmp_path, "single", 1, "--scheme", "dense", "--epochs", "8")
    for a, b in zip(dense["metrics"]["per_epoch"], single["metrics"]["per_epoch"]):
        assert (a["train_loss"], a["test_loss"], a["test_accuracy"]) == \
               (b["train_loss"], b["test_loss"], b["test_accuracy"])


def test_hybrid_two_stages_by_two_replicas(tmp_path):
    """W = 4: dct-mp across the 2 stages, dct (DCT-DP) inside each stage's 2 replicas."""
    p, r = train(tmp_path, "hybrid", 4, "--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.1",
                 "--dp-scheme", "dct", "--dp-density", "0.1", "--lifespan", "10", "--epochs", "4")
    mp = r["mp"]
    assert r["world_size"] == 4 and mp["stages"] == 2 and mp["replicas"] == 2
    assert mp["dp_scheme"] == "dct" and mp["dp_density"] == 0.1 and r["config"]["mp"]["dp_options"] == {
        "lifespan": 10, "select_kernel": "native", "wire_dtype": "float32"}
    assert {"exchange_indices", "exchange_values", "compensate", "send_activations"} <= set(r["phases"])
    assert mp["dp_bytes_sent_per_rank"] > 0 and 0.1 <= mp["dp_density_actual"] <= 0.25
    assert r["metrics"]["final"]["test_accuracy"] > 0.85
    rows = batch_rows(DIGITS_TRAIN // 2, 64)  # each replica reads half the training set
    s = mp["splits"][0]
    assert s["bytes_forward"] == pytest.approx(np.mean([24 + 4 * n * 12 + n * 16 for n in rows]), rel=1e-12)
    assert "2 stages x 2 replica(s)" in p.stdout and "dp bytes/rank" in p.stdout


def test_laplace_threshold_reports_the_occupancy_it_reaches(tmp_path):
    p, r = train(tmp_path, "laplace", 2, "--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.1",
                 "--mp-threshold", "laplace", "--epochs", "2")
    s = r["mp"]["splits"][0]
    assert r["mp"]["threshold"] == "laplace" and r["config"]["scheme.mp_threshold"] == "laplace"
    assert 0 < s["occupancy"] < 1 and s["occupancy"] != pytest.approx(0.09375)  # it drifts from the target
    assert r["density_actual"] == s["occupancy"] and s["tau_last"] > 0
    assert s["bytes_backward"] == pytest.approx(s["occupancy"] * s["dense_bytes_backward"], rel=1e-9)
    assert r["metrics"]["final"]["test_accuracy"] > 0.8
    assert "tau" in p.stdout


def test_a_resumed_pipeline_ends_where_an_uninterrupted_one_does():
    """tests/mpi/check_mp_resume.py, in the 4-rank job of the torch cases: hybrid (2 replicas x 2 stages, dct-mp, --dp-scheme topk) and
    plain (2 stages, Laplace threshold): 2 epochs = 1 epoch with a checkpoint + a resume to 2, exactly;
    a resume with other pipeline options is refused."""
    rank_case("mp_resume", 4, family=TORCH_CASES)
