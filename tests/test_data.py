"""Datasets and sharding (one process, no MPI)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpisparse.data import (CIFAR_TEST_FILE, DATASETS, EOS, UNK, iterate_batches, lm_batches,
                            load_dataset, read_cifar_batch, shard_indices)


# --------------------------------------------------------------------------- digits

@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def test_digits_shapes_and_dtypes(digits):
    ds = digits
    assert ds.kind == "classification" and ds.num_classes == 10 and ds.input_shape == (64,)
    assert ds.n_train + ds.n_test == 1797
    assert ds.n_test == pytest.approx(0.2 * 1797, abs=10)
    assert ds.train_x.dtype == torch.float32 and ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    assert ds.train_x.shape == (ds.n_train, 64) and ds.train_y.shape == (ds.n_train,)
    assert set(ds.train_y.tolist()) == set(range(10)) == set(ds.test_y.tolist())
    img = load_dataset("digits", seed=0, image=True)
    assert img.input_shape == (1, 8, 8) and img.train_x.shape == (ds.n_train, 1, 8, 8)
    assert torch.equal(img.train_x.reshape(ds.n_train, 64), ds.train_x)
    assert torch.equal(img.train_y, ds.train_y)


def test_digits_normalisation(digits):
    x = digits.train_x.double()
    assert x.mean(0).abs().max() < 1e-5
    std = x.std(0, unbiased=False)
    # constant pixels (always 0 in the train split) stay 0; all others have unit std
    assert torch.all(((std - 1).abs() < 1e-4) | (std < 1e-6))
    assert (std > 0.5).sum() > 55
    assert torch.isfinite(digits.test_x).all()


def test_digits_split_deterministic_and_disjoint(digits):
    again = load_dataset("digits", seed=0)
    assert torch.equal(again.train_x, digits.train_x) and torch.equal(again.test_y, digits.test_y)
    tr, te = digits.meta["train_index"], digits.meta["test_index"]
    assert len(set(tr) & set(te)) == 0
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(1797))
    other = load_dataset("digits", seed=1)
    assert not np.array_equal(np.sort(other.meta["test_index"]), np.sort(te))
    # stratified: each class has ~20% of its samples in test
    counts = np.bincount(digits.test_y.numpy(), minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38


def test_digits_read_without_importing_scikit_learn_equal_its_loader(monkeypatch):
    import subprocess
    import sys

    from mpisparse import data

    assert data._digits_csv() is not None  # the installed scikit-learn keeps its CSV where it is read
    code = ("import sys; from mpisparse.data import _digits_arrays; _digits_arrays(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
    from sklearn.datasets import load_digits

    ref = load_digits()
    x, y = data._digits_arrays()
    assert x.dtype == np.float64 and y.dtype == np.int64
    assert np.array_equal(x, ref.data) and np.array_equal(y, ref.target)
    monkeypatch.setattr(data, "_digits_csv", lambda: None)  # scikit-learn keeps it elsewhere: its loader
    x2, y2 = data._digits_arrays()
    assert np.array_equal(x2, ref.data) and np.array_equal(y2, ref.target)


def test_synthetic():
    a = load_dataset("synthetic", seed=3, n_train=512, n_test=128)
    b = load_dataset("synthetic", seed=3, n_train=512, n_test=128)
    c = load_dataset("synthetic", seed=4, n_train=512, n_test=128)
    assert a.train_x.shape == (512, 64) and a.test_x.shape == (128, 64) and a.input_shape == (64,)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)
    img = load_dataset("synthetic", seed=3, image=True, n_train=512, n_test=128)
    assert img.train_x.shape == (512, 1, 8, 8) and img.input_shape == (1, 8, 8)
    # learnable: nearest class mean (from train) classifies the test set well
    means = torch.stack([a.train_x[a.train_y == k].mean(0) for k in range(10)])
    pred = torch.cdist(a.test_x, means).argmin(1)
    assert (pred == a.test_y).float().mean() > 0.9


def test_dataset_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown dataset 'x'; choose one of: cifar10, clicks, criteo, digits, "
                                         r"movielens, pydoc, ratings, synthetic, text"):
        load_dataset("x")
    assert DATASETS == {"digits", "synthetic", "cifar10", "text", "pydoc", "clicks", "ratings", "criteo",
                        "movielens"}
    for name in ("cifar10", "text"):
        with pytest.raises(ValueError, match="--data-dir is required"):
            load_dataset(name)
    with pytest.raises(FileNotFoundError, match="train.txt"):
        load_dataset("text", data_dir=str(tmp_path))


# --------------------------------------------------------------------------- sharding

@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 17, 100])
def test_shard_indices(world, n):
    shards = [shard_indices(n, r, world, seed=7, epoch=2) for r in range(world)]
    allidx = np.concatenate(shards)
    assert allidx.dtype == np.int64
    assert len(allidx) == n and sorted(allidx.tolist()) == list(range(n))  # disjoint and covering
    sizes = [len(s) for s in shards]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
    # every rank derives the same permutation: interleaving the shards rebuilds it
    perm = np.empty(n, dtype=np.int64)
    for r, s in enumerate(shards):
        perm[r::world] = s
    assert np.array_equal(perm, shard_indices(n, 0, 1, seed=7, epoch=2))
    assert np.array_equal(shards[-1], shard_indices(n, world - 1, world, seed=7, epoch=2))


def test_shard_indices_epochs_and_seeds():
    a = shard_indices(100, 0, 1, seed=0, epoch=0)
    assert not np.array_equal(a, shard_indices(100, 0, 1, seed=0, epoch=1))
    assert not np.array_equal(a, shard_indices(100, 0, 1, seed=1, epoch=0))
    assert np.array_equal(a, shard_indices(100, 0, 1, seed=0, epoch=0))
    with pytest.raises(ValueError):
        shard_indices(10, 3, 3, seed=0, epoch=0)


def test_iterate_batches():
    x = torch.arange(10, dtype=torch.float32).unsqueeze(1) * 10
    y = torch.arange(10)
    idx = np.array([9, 0, 5, 3, 7, 1, 2])
    batches = list(iterate_batches(x, y, idx, 3))
    assert [len(b[1]) for b in batches] == [3, 3, 1]
    assert torch.cat([b[1] for b in batches]).tolist() == idx.tolist()
    assert torch.cat([b[0] for b in batches]).squeeze(1).tolist() == (idx * 10).tolist()
    assert list(iterate_batches(x, y, np.array([], dtype=np.int64), 4)) == []


# --------------------------------------------------------------------------- CIFAR-10

def _write_cifar(folder, n=20, train_batches=(1, 2), seed=0):
    """Fake CIFAR-10 binary batches; returns {file name: (uint8 images (n, 3, 32, 32), labels)}."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = {}
    for fname in [f"data_batch_{i}.bin" for i in train_batches] + [CIFAR_TEST_FILE]:
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        img = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
        rec = np.empty((n, 3073), dtype=np.uint8)
        for i in range(n):
            rec[i, 0] = labels[i]
            # channel-major: the 1024 red bytes, then green, then blue, each plane row-major
            for c in range(3):
                rec[i, 1 + 1024 * c:1 + 1024 * (c + 1)] = img[i, c].ravel()
        rec.tofile(folder / fname)
        out[fname] = (img, labels.astype(np.int64))
    return out


def test_cifar_raw_layout(tmp_path):
    files = _write_cifar(tmp_path, n=5, train_batches=(1,))
    path = tmp_path / "data_batch_1.bin"
    raw = np.fromfile(path, dtype=np.uint8).reshape(5, 3073)
    img, lab = read_cifar_batch(str(path))
    assert img.shape == (5, 3, 32, 32) and img.dtype == np.uint8 and lab.dtype == np.int64
    assert np.array_equal(lab, files["data_batch_1.bin"][1])
    assert np.array_equal(img, files["data_batch_1.bin"][0])
    # byte offset of (record 2, green, row 5, column 7)
    assert img[2, 1, 5, 7] == raw[2, 1 + 1024 + 5 * 32 + 7]


def test_cifar_loader(tmp_path):
    files = _write_cifar(tmp_path, n=20, train_batches=(1, 2))
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.kind == "classification" and ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert ds.train_x.shape == (40, 3, 32, 32) and ds.test_x.shape == (20, 3, 32, 32)
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    tr_img = np.concatenate([files["data_batch_1.bin"][0], files["data_batch_2.bin"][0]])
    tr_lab = np.concatenate([files["data_batch_1.bin"][1], files["data_batch_2.bin"][1]])
    assert ds.train_y.tolist() == tr_lab.tolist()
    assert ds.test_y.tolist() == files[CIFAR_TEST_FILE][1].tolist()
    # per-channel normalisation with train statistics
    ch_mean = ds.train_x.double().mean(dim=(0, 2, 3))
    ch_std = ds.train_x.double().std(dim=(0, 2, 3), unbiased=False)
    assert ch_mean.abs().max() < 1e-5 and (ch_std - 1).abs().max() < 1e-4
    # de-normalising gives back the raw bytes: one known pixel, then all of them
    mean = torch.tensor(ds.meta["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(ds.meta["std"]).view(1, 3, 1, 1)
    back = torch.round((ds.train_x.double() * std + mean) * 255)
    assert back[23, 2, 31, 0].item() == files["data_batch_2.bin"][0][3, 2, 31, 0]
    assert np.array_equal(back.numpy().astype(np.uint8), tr_img)
    back_te = torch.round((ds.test_x.double() * std + mean) * 255).numpy().astype(np.uint8)
    assert np.array_equal(back_te, files[CIFAR_TEST_FILE][0])


def test_cifar_subfolder_and_subset(tmp_path):
    _write_cifar(tmp_path / "cifar-10-batches-bin", n=4, train_batches=(3,))
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.train_x.shape == (4, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)


def test_cifar_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cifar10", data_dir=str(tmp_path))
    msg = str(err.value)
    assert str(tmp_path) in msg and "test_batch.bin" in msg and "data_batch_1.bin" in msg
    assert "data_batch_5.bin" in msg
    # train batches without the test batch is not enough
    _write_cifar(tmp_path, n=2, train_batches=(1,))
    (tmp_path / CIFAR_TEST_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="test_batch.bin"):
        load_dataset("cifar10", data_dir=str(tmp_path))


# --------------------------------------------------------------------------- text

TRAIN = "the cat sat on the mat\n\nthe dog sat\n"
VALID = "the cat ran\n"
TEST = "a dog sat on the rug\n"


@pytest.mark.parametrize("names", [("train.txt", "valid.txt", "test.txt"),
                                   ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")])
def test_text_loader(tmp_path, names):
    for fname, text in zip(names, (TRAIN, VALID, TEST)):
        (tmp_path / fname).write_text(text)
    ds = load_dataset("text", data_dir=str(tmp_path))
    assert ds.kind == "lm" and ds.input_shape == () and ds.train_y is None and ds.test_y is None
    assert ds.vocab == ["the", "cat", "sat", "on", "mat", EOS, "dog", UNK]
    assert ds.num_classes == 8
    w = {word: i for i, word in enumerate(ds.vocab)}
    # every line ends in <eos>, the blank one included
    assert ds.train_x.tolist() == [w[t] for t in "the cat sat on the mat <eos> <eos> the dog sat <eos>".split()]
    assert ds.train_x.dtype == torch.int64 and ds.train_x.dim() == 1
    # unseen test/valid words map to <unk>
    assert ds.test_x.tolist() == [w[t] for t in "<unk> dog sat on the <unk> <eos>".split()]
    assert ds.valid_x.tolist() == [w[t] for t in "the cat <unk> <eos>".split()]


def test_text_unk_already_in_vocab(tmp_path):
    (tmp_path / "train.txt").write_text("a <unk> b\n")
    (tmp_path / "test.txt").write_text("c\n")
    ds = load_dataset("text", data_dir=str(tmp_path))
    assert ds.vocab == ["a", UNK, "b", EOS] and ds.valid_x is None
    assert ds.test_x.tolist() == [1, 3]


def test_lm_batches_layout():
    tokens = torch.arange(103)
    pairs = lm_batches(tokens, batch_size=4, bptt=7)
    # 103 // 4 = 25 rows; windows over rows 0..24 -> 24 (x, y) rows: 7, 7, 7, 3
    assert [x.shape for x, _ in pairs] == [(7, 4), (7, 4), (7, 4), (3, 4)]
    for x, y in pairs:
        assert x.shape == y.shape and x.dtype == torch.int64
        assert torch.equal(y, x + 1)  # next-token target along each column
    x0 = pairs[0][0]
    assert x0[:, 0].tolist() == list(range(7)) and x0[0].tolist() == [0, 25, 50, 75]
    assert pairs[-1][1][-1].tolist() == [24, 49, 74, 99]
    with pytest.raises(ValueError):
        lm_batches(torch.arange(5), batch_size=4, bptt=2)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_lm_batches_rank_shards(world):
    n, batch = 250, 3
    tokens = torch.arange(n)
    seen = []
    for r in range(world):
        pairs = lm_batches(tokens, batch, 5, rank=r, world=world)
        xs = torch.cat([x for x, _ in pairs])
        ys = torch.cat([y for _, y in pairs])
        got = set(xs.flatten().tolist()) | set(ys.flatten().tolist())
        shard_len = n // world
        lo, hi = r * shard_len, r * shard_len + (shard_len // batch) * batch
        assert got == set(range(lo, hi))  # this rank's contiguous shard, trimmed to whole rows
        assert torch.equal(ys, xs + 1)
        seen.append(got)
    assert sum(len(s) for s in seen) == len(set().union(*seen))  # disjoint
    assert len(set().union(*seen)) >= n - world * (batch - 1) - (n % world)  # covers up to the tails
