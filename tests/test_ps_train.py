"""``mpisparse train`` with parameter-server schemes: result object, printed tables, accuracy on digits."""

import json

import pytest

pytest.importorskip("torch")

from conftest import mpi_run  # noqa: E402

pytestmark = pytest.mark.mpi

QUICK = ["--model", "mlp", "--data", "digits"]


def train(tmp_path, name, ranks, *args):
    out = tmp_path / f"{name}.json"
    p = mpi_run(ranks, ["train", *QUICK, "--json", str(out), *args], module=True)
    return p, json.loads(out.read_text())


def test_train_json_contract_tables_and_plumpdp_equals_data_parallel_sgd(tmp_path):
    p, (plump, slim) = train(tmp_path, "ps", 3, "--servers", "1", "--scheme", "plumpdp", "--scheme", "slimdp",
                             "--density", "0.3", "--core", "0.15", "--epochs", "2", "--batch-size", "64")
    for r in (plump, slim):
        for key in ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank", "phases",
                    "step_seconds", "config", "metrics", "bytes_up_per_communication",
                    "bytes_down_per_communication", "staleness_histogram", "phases_worker", "phases_server"):
            assert key in r, key
        assert {"forward", "backward", "select", "push", "wait", "pull", "update", "server_apply"} <= set(r["phases"])
        assert r["servers"] == 1 and r["workers"] == 2 and r["ps_mode"] == "sync"
        assert r["staleness_histogram"] == {"0": r["communications"]}
        assert len(r["metrics"]["per_epoch"]) == 2 and "test_accuracy" in r["metrics"]["final"]
        assert r["config"]["servers"] == 1
    n = plump["n"]
    assert plump["bytes_sent_per_rank"] == plump["bytes_up_per_communication"] == 4 * n
    assert slim["config"]["scheme.core"] == 0.15 and slim["density_target"] == 0.3
    assert 4 * (2 * 0.3 - 0.15) * n <= slim["bytes_up_per_communication"] < 4 * 0.6 * n
    for word in ("push", "pull", "server_apply", "wait", "forward", "backward", "select",
                 "server phases per push served", "staleness"):
        assert word in p.stdout, word
    # p = 1 local step of plain SGD: Plump-DP is synchronous SGD on the mean gradient, as `dense` on 2 ranks
    _, dense = train(tmp_path, "dense", 2, "--scheme", "dense", "--epochs", "2", "--batch-size", "64")
    for a, b in zip(plump["metrics"]["per_epoch"], dense["metrics"]["per_epoch"]):
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-3)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)


def test_train_with_two_servers_and_dgs_secondary_compression(tmp_path):
    p, r = train(tmp_path, "dgs", 4, "--servers", "2", "--scheme", "dgs", "--density", "0.05",
                 "--server-density", "0.05", "--epochs", "1", "--batch-size", "64", "--lr", "0.02")
    assert r["servers"] == 2 and r["ps_mode"] == "async" and len(r["shards"]) == 2
    assert r["bytes_down_per_communication"] < 0.2 * 4 * r["n"]  # the downlink stays sparse
    assert max(e["final_gap"] for e in r["worker_extra"]) < 1e-4
    assert sum(r["staleness_histogram"].values()) == 2 * r["communications"]  # each push, on each server
    assert "final model gap" in p.stdout


@pytest.mark.slow
def test_sparse_ps_schemes_reach_their_dense_baselines_on_digits(tmp_path):
    """README table: slimdp (0.3, 0.15) vs plumpdp, dgs (0.01) vs asgd, within 2 points (20 epochs)."""
    epochs = "20"
    _, (plump, slim) = train(tmp_path, "slim", 3, "--servers", "1", "--scheme", "plumpdp", "--scheme", "slimdp",
                             "--density", "0.3", "--core", "0.15", "--epochs", epochs)
    _, (asgd, dgs) = train(tmp_path, "dgs", 3, "--servers", "1", "--scheme", "asgd", "--scheme", "dgs",
                           "--density", "0.01", "--epochs", epochs, "--lr", "0.02")
    acc = {r["scheme"]: 100 * r["metrics"]["final"]["test_accuracy"] for r in (plump, slim, asgd, dgs)}
    assert acc["slimdp"] >= acc["plumpdp"] - 2.0, acc
    assert acc["dgs"] >= acc["asgd"] - 2.0, acc
    assert acc["plumpdp"] > 95 and acc["asgd"] > 95, acc


def test_ps_checkpoints_resume_exactly_where_synchronous_runs_end():
    """tests/mpi/check_ps_resume.py on 3 ranks (2 workers, 1 server): slimdp resumed at an epoch's end and dgs
    --round-robin stopped by SIGUSR1 mid-epoch end exactly as uninterrupted; asgd (arrival order) in the band;
    another configuration or other ranks refused."""
    from conftest import TORCH_CASES, rank_case

    rank_case("ps_resume", 3, family=TORCH_CASES)
