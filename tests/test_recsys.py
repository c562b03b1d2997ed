"""Recommendation data, models and metrics (no MPI): generated clicks and ratings, the Criteo and MovieLens
readers on a few lines written here, AUC and hit rate against brute force, DLRM with tables and NCF, and the
options' checks (one line, exit 2)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mpisparse.cli.main import cli
from mpisparse.config import TrainConfig
from mpisparse.data import load_dataset
from mpisparse.data.recsys import auc, hit_rate, read_click_file, read_ratings_file
from mpisparse.models.nets import build_model
from mpisparse.mp.stages import pipeline_layers


def test_generated_clicks_and_ratings_are_seeded_zipf_and_planted():
    a, b = load_dataset("clicks", seed=3, tables=3, rows=200), load_dataset("clicks", seed=3, tables=3, rows=200)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, load_dataset("clicks", seed=4, tables=3, rows=200).train_x)
    assert a.input_shape == (13 + 3,) and a.num_classes == 2 and a.meta["tables"] == [200] * 3
    ids = a.train_x[:, 13:].numpy().astype(np.int64)
    assert ids.min() >= 0 and ids.max() < 200 and np.array_equal(ids, a.train_x[:, 13:].numpy())
    freq = np.sort(np.bincount(ids[:, 0], minlength=200))[::-1] / len(ids)
    assert freq[0] > 0.1 and freq[:20].sum() > 0.5  # Zipf: a few rows take most lookups
    assert 0.2 < a.meta["click_rate"] < 0.45 and a.meta["teacher_auc"] > 0.8

    r = load_dataset("ratings", seed=1, rows=150)
    assert r.meta["tables"] == [150, 150] and r.train_x.shape[1] == 2 and r.test_x.shape == (150, 101)
    x, y, test = r.train_x.numpy().astype(np.int64), r.train_y.numpy(), r.test_x.numpy().astype(np.int64)
    assert (y == 0).sum() == 4 * (y == 1).sum()
    had = {(u, i) for (u, i), lab in zip(x, y) if lab == 1}
    for u, held, *negs in test[:20]:  # leave-one-out: the held-out item is no training positive, nor a negative
        assert (u, held) not in had and not any((u, n) in had or n == held for n in negs)
    assert r.meta["teacher_hit_rate"] > 0.8


def _criteo(path, rows):
    path.write_text("".join("\t".join(r) + "\n" for r in rows))
    return str(path)


def test_the_click_and_ratings_readers_on_a_few_lines(tmp_path):
    cats = ["68fd1e64", "", "1f89b562"]
    lines = [[str(i % 2)] + [str(i), "", "-3"] + [""] * 10 + cats for i in range(7)]
    ds = read_click_file(_criteo(tmp_path / "train.txt", lines), rows=100)
    assert ds.meta["tables"] == [100] * 3 and ds.n_train == 6 and ds.n_test == 1
    x = ds.train_x.numpy()
    assert x[3, 0] == np.float32(np.log1p(3)) and x[3, 1] == 0 and x[3, 2] == 0  # log(1 + max(v, 0)), empty 0
    assert list(x[0, 13:]) == [0x68FD1E64 % 100, 0, 0x1F89B562 % 100]
    with pytest.raises(ValueError, match="has 3 categorical columns but --emb-tables is 26"):
        read_click_file(str(tmp_path / "train.txt"), tables=26)
    bad = _criteo(tmp_path / "bad.txt", lines[:2] + [lines[2][:-1]])
    with pytest.raises(ValueError, match=r"bad.txt line 3 has 16 columns; expected 17"):
        read_click_file(bad)

    (tmp_path / "ratings.dat").write_text("".join(
        f"{u}::{i}::5::{t}\n" for u, i, t in [(10, 3, 1), (10, 7, 5), (10, 9, 2), (20, 3, 4), (20, 8, 1), (30, 9, 1)]))
    ml = read_ratings_file(str(tmp_path / "ratings.dat"), candidates=3)
    assert ml.meta["tables"] == [2, 4]  # user 30 (one rating) dropped; items 3, 7, 8, 9
    assert ml.test_x.numpy().astype(int)[:, :2].tolist() == [[0, 1], [1, 0]]  # the latest: items 7 and 3
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,5,4.0,9\n1,6,3.5,2\n2,7,1,1\n2,5,2,3\n")
    assert read_ratings_file(str(tmp_path / "ratings.csv"), candidates=2).meta["tables"] == [2, 3]
    (tmp_path / "x.dat").write_text("1::2::3::4\n1::2::3\n")
    with pytest.raises(ValueError, match=r"x.dat line 2 has 3 fields; expected 4"):
        read_ratings_file(str(tmp_path / "x.dat"))


def test_auc_and_hit_rate_against_brute_force():
    rng = np.random.default_rng(0)
    s, y = rng.integers(0, 5, 60).astype(float), rng.integers(0, 2, 60)
    pairs = [(a, b) for a, b in itertools.product(s[y == 1], s[y == 0])]
    assert auc(s, y) == pytest.approx(np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs]))
    assert auc([1, 2], [1, 1]) == 0.5
    scores = np.array([[5.0, 1, 2, 3], [1.0, 2, 3, 4], [2.0, 2, 0, 0]])
    hit, ndcg = hit_rate(scores, k=2)
    assert hit.tolist() == [True, False, True]  # ranks 0, 3, 1 (a tie counts against the held-out item)
    assert ndcg == pytest.approx([1.0, 0.0, 1 / np.log2(3)])


def test_dlrm_with_tables_and_ncf():
    torch.manual_seed(0)
    ds = load_dataset("clicks", tables=4, rows=50, seed=0)
    net = build_model("dlrm", input_shape=ds.input_shape, num_classes=2, tables=ds.meta["tables"], dim=8,
                      sparse=True)
    x = ds.train_x[:5]
    out = net(x)
    assert out.shape == (5, 2) and torch.all(out[:, 0] == 0)
    chain = torch.nn.Sequential(*[m for _, m in pipeline_layers(net)])
    torch.testing.assert_close(chain(x), out, rtol=0, atol=0)
    names = [n for n, _ in pipeline_layers(net)]
    assert names[9] == "interact" and names[-1] == "top.7" and "bottom.4" in names and "top.3" in names
    assert net.interact.out_features == 8 + 10  # the bottom output and (4 + 1) * 4 / 2 dot products
    out.sum().backward()
    assert net.interact.emb[0].weight.grad.is_sparse
    torch.manual_seed(0)
    ncf = build_model("ncf", input_shape=(2,), num_classes=2, tables=[7, 9], dim=4)
    pairs = torch.tensor([[1.0, 2.0], [6.0, 8.0]])
    z = ncf(pairs)[:, 1]
    cand = ncf.score_candidates(torch.tensor([[1.0, 2.0, 5.0], [6.0, 8.0, 0.0]]))
    torch.testing.assert_close(cand[:, 0], z)
    with pytest.raises(ValueError, match="embedding table 1 has 0 rows; allowed: an integer >= 1"):
        build_model("ncf", input_shape=(2,), num_classes=2, tables=[7, 0])
    with pytest.raises(ValueError, match="embedding dimension is 0"):
        build_model("dlrm", input_shape=(15,), num_classes=2, tables=[3, 3], dim=0)


@pytest.mark.parametrize("kw, message", [
    ({"model": "ncf", "data": "digits"}, "--model ncf does not fit --data digits"),
    ({"model": "mlp", "data": "clicks"}, "--data clicks is recommendation data for --model dlrm"),
    ({"model": "dlrm", "data": "digits", "emb_dim": 8}, "--emb-dim sets the embedding tables"),
    ({"model": "dlrm", "data": "digits", "row_sparse": False}, "--no-row-sparse sets the embedding tables"),
    ({"model": "dlrm", "emb_rows": 0}, "--emb-rows is 0; allowed range is an integer >= 1"),
    ({"model": "dlrm", "emb_rows": 2 ** 24 + 1}, "allowed range is 1..16777216"),
    ({"model": "ncf", "emb_tables": 3}, "--emb-tables is 3; --data ratings has 2 tables"),
    ({"model": "ncf", "data": "movielens", "data_dir": ".", "emb_rows": 9}, "drop --emb-rows"),
])
def test_bad_table_options_are_one_line(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kw).validate(2)


def test_the_command_line_refuses_before_mpi(tmp_path):
    (tmp_path / "train.txt").write_text("1\t" + "\t".join(["0"] * 13 + ["a1"] * 5) + "\n")
    for args, message in [(["--model", "dlrm", "--emb-dim", "0"], "0 is not in the range x>=1"),
                          (["--model", "dlrm", "--data", "criteo", "--data-dir", str(tmp_path), "--emb-tables", "8"],
                           "has 5 categorical columns but --emb-tables is 8"),
                          (["--model", "ncf", "--data", "movielens", "--data-dir", str(tmp_path)],
                           "ratings not found in")]:
        res = CliRunner().invoke(cli, ["train", *args])
        assert res.exit_code == 2 and message in res.output, res.output
