"""Datasets for the training front end, and their sharding over ranks.

Everything is held in memory as torch tensors (pure torch/numpy, no MPI):

* ``digits`` -- scikit-learn's bundled 8x8 handwritten digits (1,797 images,
  10 classes; no download), a seeded stratified 80/20 split.
* ``synthetic`` -- seeded Gaussian clusters (10 classes in 64 dimensions by
  default), learnable to high accuracy.
* ``cifar10`` -- the CIFAR-10 *binary* batches read from ``--data-dir``.
* ``text`` -- a word-level language-modelling corpus (plain ``train.txt`` /
  ``valid.txt`` / ``test.txt`` or WikiText-2's ``wiki.*.tokens``) read from
  ``--data-dir``.
* ``pydoc`` -- the English reference prose that ships inside CPython
  (``pydoc_data.topics``, about 465 KB), as a stream of UTF-8 bytes; the last
  10% held out (no download).
* ``clicks``, ``ratings`` (generated), ``criteo``, ``movielens`` (read from
  ``--data-dir``) -- recommendation data for ``dlrm`` and ``ncf``:
  :mod:`mpisparse.data.recsys`.

Sharding: :func:`shard_indices` gives each rank a disjoint slice of one
permutation that every rank computes identically from ``(seed, epoch)``;
:func:`iterate_batches` walks a shard in order.  Language-model streams are
sharded and batchified by :func:`lm_batches`.
"""

from __future__ import annotations

import math
import os
from typing import Iterator

import numpy as np
import torch

from .dataset import Dataset

__all__ = [
    "DATASETS", "Dataset", "load_dataset", "shard_indices", "iterate_batches", "lm_batches",
    "read_cifar_batch", "CIFAR_TRAIN_FILES", "CIFAR_TEST_FILE", "EOS", "UNK", "LM_DATASETS", "load_pydoc",
]

DATASETS = {"digits", "synthetic", "cifar10", "text", "pydoc", "clicks", "ratings", "criteo", "movielens"}
#: the token-stream datasets (``kind == "lm"``): what the language models train on
LM_DATASETS = {"text", "pydoc"}

EOS = "<eos>"
UNK = "<unk>"

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"
CIFAR_SUBDIR = "cifar-10-batches-bin"
_CIFAR_RECORD = 1 + 3 * 32 * 32

_TEXT_NAMES = (
    ("train.txt", "valid.txt", "test.txt"),
    ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
)


# --------------------------------------------------------------------------- entry point

def load_dataset(name: str, *, data_dir: str | None = None, seed: int = 0, image: bool = False,
                 **kw) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`).

    ``seed`` fixes the split (digits) or the generated problem (synthetic);
    ``image=True`` returns digits/synthetic samples as ``(1, H, W)`` images for
    the convolutional models (CIFAR-10 is always ``(3, 32, 32)``: the MLP
    flattens its input itself).  ``cifar10`` and ``text`` read files from
    ``data_dir``.  Extra keywords go to the individual loader (see
    :func:`load_synthetic`, :func:`load_digits`); unknown ones raise TypeError.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(sorted(DATASETS))}")
    if name in ("cifar10", "text") and data_dir is None:
        raise ValueError(f"--data-dir is required for dataset {name!r}")
    if name in ("clicks", "ratings", "criteo", "movielens"):  # keywords: tables, rows
        from .recsys import load_recsys

        return load_recsys(name, data_dir=data_dir, seed=seed, **kw)
    if name == "digits":
        return load_digits(seed=seed, image=image, **kw)
    if name == "synthetic":
        return load_synthetic(seed=seed, image=image, **kw)
    if name == "cifar10":
        return load_cifar10(data_dir, **kw)
    if name == "pydoc":
        return load_pydoc(**kw)
    return load_text(data_dir, **kw)


# --------------------------------------------------------------------------- helpers

def _standardise(train: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Standardise per feature (axis 0) with the train split's statistics; std 0 -> 1."""
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return tuple(((a - mean) / std).astype(np.float32) for a in (train, *others))


def _as_image(x: np.ndarray, image: bool) -> tuple[np.ndarray, tuple]:
    """``(N, D)`` -> ``(N, 1, s, s)`` when ``image`` (``D = s * s``), else unchanged."""
    n, d = x.shape
    if not image:
        return x, (d,)
    s = math.isqrt(d)
    if s * s != d:
        raise ValueError(f"image=True needs a square number of features, got {d}")
    return x.reshape(n, 1, s, s), (1, s, s)


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split: per class, a shuffled ``round(test_fraction * n_c)`` go to test."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5D1]))
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(test_fraction * len(idx)))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    # shuffle across classes so the splits are not ordered by label
    train_idx = rng.permutation(np.concatenate(train))
    test_idx = rng.permutation(np.concatenate(test))
    return train_idx, test_idx


# --------------------------------------------------------------------------- digits / synthetic

def _digits_csv() -> str | None:
    """The file scikit-learn's ``load_digits`` reads (``sklearn/datasets/data/digits.csv.gz``), found
    without importing scikit-learn (whose import takes seconds a rank; the file is its own package data),
    or None where the installed scikit-learn keeps it elsewhere."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    roots = spec.submodule_search_locations if spec is not None else None
    for root in roots or []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            return path
    return None


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits: pixels (float64, 0..16) and labels (int64), as ``sklearn.datasets.load_digits``
    gives them (its CSV, 64 pixel columns then the label, read directly when it is where scikit-learn
    keeps it; else through scikit-learn)."""
    path = _digits_csv()
    if path is not None:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
        if table.shape == (1797, 65):
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as _sk_digits

    raw = _sk_digits()
    return raw.data.astype(np.float64), raw.target.astype(np.int64)


def load_digits(*, seed: int = 0, image: bool = False, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's bundled 8x8 digits, split 80/20 (stratified, seeded by ``seed``).

    Pixels (0..16) are scaled to [0, 1], then standardised per feature with the
    train split's mean and std (features with std 0 are only centred).
    """
    x, y = _digits_arrays()
    x = x / 16.0
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    xtr, xte = _standardise(x[train_idx], x[test_idx])
    xtr, shape = _as_image(xtr, image)
    xte, _ = _as_image(xte, image)
    return Dataset(
        name="digits", kind="classification",
        train_x=torch.from_numpy(np.ascontiguousarray(xtr)), train_y=torch.from_numpy(y[train_idx]),
        test_x=torch.from_numpy(np.ascontiguousarray(xte)), test_y=torch.from_numpy(y[test_idx]),
        num_classes=10, input_shape=shape,
        meta={"train_index": train_idx, "test_index": test_idx},
    )


def load_synthetic(*, seed: int = 0, image: bool = False, n_train: int = 4096, n_test: int = 1024,
                   dim: int = 64, classes: int = 10, separation: float = 0.5) -> Dataset:
    """Seeded Gaussian clusters: ``classes`` centres ~ N(0, separation^2 I) in ``dim`` dimensions,
    samples = centre + N(0, I), labels uniform.  With the defaults two centres are about 5.7
    noise standard deviations apart, so a linear model reaches ~99% accuracy.
    ``image=True`` needs ``dim`` to be a square (64 -> (1, 8, 8)).
    """
    if n_train < 1 or n_test < 1 or dim < 1 or classes < 2:
        raise ValueError("synthetic: need n_train, n_test, dim >= 1 and classes >= 2")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E7]))
    centres = rng.normal(0.0, separation, size=(classes, dim))

    def draw(n):
        y = rng.integers(0, classes, size=n).astype(np.int64)
        x = (centres[y] + rng.normal(size=(n, dim))).astype(np.float32)
        return x, y

    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    xtr, shape = _as_image(xtr, image)
    xte, _ = _as_image(xte, image)
    return Dataset(
        name="synthetic", kind="classification",
        train_x=torch.from_numpy(np.ascontiguousarray(xtr)), train_y=torch.from_numpy(ytr),
        test_x=torch.from_numpy(np.ascontiguousarray(xte)), test_y=torch.from_numpy(yte),
        num_classes=classes, input_shape=shape,
    )


# --------------------------------------------------------------------------- CIFAR-10

def read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch: ``(uint8 images (N, 3, 32, 32), int64 labels (N,))``.

    Each record is 1 label byte followed by 3,072 pixel bytes: the red, green
    and blue 32x32 planes in turn, each row-major.
    """
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise OSError(f"CIFAR-10 batch file {path} cannot be read: {e.strerror or e}") from None
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise ValueError(f"CIFAR-10 batch file {path}: size {raw.size} is not a positive multiple of the "
                         f"{_CIFAR_RECORD}-byte CIFAR-10 record (truncated or not a CIFAR-10 binary batch)")
    rec = raw.reshape(-1, _CIFAR_RECORD)
    labels = rec[:, 0].astype(np.int64)
    if labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise ValueError(f"CIFAR-10 batch file {path}: record {bad} has label byte {labels[bad]}, out of "
                         "range 0..9 (corrupt or not a CIFAR-10 binary batch)")
    return rec[:, 1:].reshape(-1, 3, 32, 32), labels


def _cifar_dir(data_dir: str) -> str | None:
    """The folder holding the batches: ``data_dir`` or its ``cifar-10-batches-bin/``."""
    for d in (data_dir, os.path.join(data_dir, CIFAR_SUBDIR)):
        if os.path.isfile(os.path.join(d, CIFAR_TEST_FILE)) and any(
                os.path.isfile(os.path.join(d, f)) for f in CIFAR_TRAIN_FILES):
            return d
    return None


def _no_cifar(data_dir: str) -> str:
    return (f"CIFAR-10 binary batches not found in {data_dir!r} (nor in its {CIFAR_SUBDIR}/ "
            f"subfolder): expected {CIFAR_TEST_FILE} and at least one of {', '.join(CIFAR_TRAIN_FILES)}.")


def check_data_dir(data: str, data_dir: str | None, tables: int | None = None) -> None:
    """Raise FileNotFoundError (one line) if ``data_dir`` lacks the files ``--data`` reads (a click file: ValueError
    when its columns do not match ``tables``, from its first line); reads nothing else."""
    if data == "cifar10" and data_dir and _cifar_dir(data_dir) is None:
        raise FileNotFoundError(_no_cifar(data_dir))
    if data == "text" and data_dir:
        _text_files(data_dir)
    if data in ("criteo", "movielens") and data_dir:
        from .recsys import check_recsys_files

        check_recsys_files(data, data_dir, tables)


def load_cifar10(data_dir: str) -> Dataset:
    """CIFAR-10 from its binary batches in ``data_dir`` (or ``data_dir/cifar-10-batches-bin/``).

    Any subset of ``data_batch_1.bin`` .. ``data_batch_5.bin`` is used, as
    long as at least one of them and ``test_batch.bin`` are present; they are
    concatenated in file order.  Pixels are scaled to [0, 1] and normalised
    with the per-channel mean and std of the loaded train set (kept in
    ``meta["mean"]``, ``meta["std"]``, shape ``(3,)``).  Samples are
    ``(3, 32, 32)`` float32, labels int64.
    """
    d = _cifar_dir(data_dir)
    if d is None:
        raise FileNotFoundError(_no_cifar(data_dir))
    parts = [read_cifar_batch(os.path.join(d, f)) for f in CIFAR_TRAIN_FILES
             if os.path.isfile(os.path.join(d, f))]
    xtr = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    ytr = np.concatenate([p[1] for p in parts])
    xte_raw, yte = read_cifar_batch(os.path.join(d, CIFAR_TEST_FILE))
    xte = xte_raw.astype(np.float32) / 255.0
    mean = xtr.mean(axis=(0, 2, 3), dtype=np.float64)
    std = xtr.std(axis=(0, 2, 3), dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    m = mean.reshape(1, 3, 1, 1).astype(np.float32)
    s = std.reshape(1, 3, 1, 1).astype(np.float32)
    xtr = (xtr - m) / s
    xte = (xte - m) / s
    return Dataset(
        name="cifar10", kind="classification",
        train_x=torch.from_numpy(xtr), train_y=torch.from_numpy(ytr),
        test_x=torch.from_numpy(xte), test_y=torch.from_numpy(yte),
        num_classes=10, input_shape=(3, 32, 32),
        meta={"mean": mean, "std": std, "dir": d},
    )


# --------------------------------------------------------------------------- text

def _text_files(data_dir: str) -> tuple[str, str | None, str]:
    for names in _TEXT_NAMES:
        paths = [os.path.join(data_dir, n) for n in names]
        if os.path.isfile(paths[0]) and os.path.isfile(paths[2]):
            return paths[0], (paths[1] if os.path.isfile(paths[1]) else None), paths[2]
    expected = " or ".join("/".join(n) for n in _TEXT_NAMES)
    raise FileNotFoundError(f"text corpus not found in {data_dir!r}: expected {expected}.")


def _read_words(path: str) -> list[str]:
    """Whitespace tokens of every line, each line (blank ones included) ended by ``<eos>``."""
    words: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                words.extend(line.split())
                words.append(EOS)
    except UnicodeDecodeError as e:
        raise ValueError(f"text corpus file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                         f"{e.start} of a line)") from None
    return words


def load_text(data_dir: str) -> Dataset:
    """Word-level language-modelling corpus from ``data_dir``.

    Files: ``train.txt``, ``valid.txt``, ``test.txt`` or WikiText-2's
    ``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens``
    (train and test required, valid optional: ``valid_x`` is then None).
    Lines are split on whitespace and ended with ``<eos>`` (as in the usual
    PyTorch word-LM example, so a blank line gives a lone ``<eos>``).  The
    vocabulary is the training words in order of first appearance, plus
    ``<unk>`` (appended when the training text lacks it); valid/test words
    not in it map to ``<unk>``.  ``train_x``/``valid_x``/``test_x`` are 1-D
    int64 token streams; ``num_classes`` is the vocabulary size.
    """
    train_p, valid_p, test_p = _text_files(data_dir)
    train_words = _read_words(train_p)
    if len(train_words) - train_words.count(EOS) == 0:
        raise ValueError(f"text corpus file {train_p} holds no words")
    word2idx: dict[str, int] = {}
    for w in train_words:
        if w not in word2idx:
            word2idx[w] = len(word2idx)
    if UNK not in word2idx:
        word2idx[UNK] = len(word2idx)
    unk = word2idx[UNK]

    def encode(words):
        return torch.tensor([word2idx.get(w, unk) for w in words], dtype=torch.int64)

    vocab = list(word2idx)
    return Dataset(
        name="text", kind="lm",
        train_x=encode(train_words), train_y=None,
        test_x=encode(_read_words(test_p)), test_y=None,
        valid_x=encode(_read_words(valid_p)) if valid_p else None,
        num_classes=len(vocab), input_shape=(), vocab=vocab,
        meta={"word2idx": word2idx, "files": (train_p, valid_p, test_p)},
    )


def load_pydoc(*, held_out: float = 0.1) -> Dataset:
    """CPython's own reference prose, byte-level: no download, no tokenizer.

    ``pydoc_data.topics.topics`` (the text ``help()`` shows for statements,
    operators and types; about 465 KB in Python 3.11, and a little different in
    each Python version) joined in sorted topic order, one blank line between
    topics, encoded as UTF-8: every byte is a token (vocabulary 256, the same
    for every Python).  The last ``held_out`` of the bytes is the held-out
    (``test``) stream, the rest the training stream; no ``valid`` split.
    ``meta`` holds the Python version the text came from and the byte counts.
    """
    import platform

    from pydoc_data.topics import topics

    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out must be in (0, 1), got {held_out}")
    raw = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    stream = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.int64))
    cut = len(raw) - int(round(held_out * len(raw)))
    return Dataset(
        name="pydoc", kind="lm",
        train_x=stream[:cut], train_y=None, test_x=stream[cut:], test_y=None,
        num_classes=256, input_shape=(), vocab=None,
        meta={"python": platform.python_version(), "bytes": len(raw), "train_bytes": cut,
              "held_out_bytes": len(raw) - cut, "topics": len(topics)},
    )


def lm_batches(tokens: torch.Tensor, batch_size: int, bptt: int, *, rank: int = 0,
               world: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut a 1-D token stream into ``(x, y)`` pairs for rank ``rank`` of ``world``.

    The stream is split into ``world`` contiguous shards of ``len // world``
    tokens (the remainder is dropped); this rank's shard is trimmed to a
    multiple of ``batch_size`` and laid out as ``batch_size`` columns
    (column ``b`` holds the ``b``-th contiguous piece), giving a
    ``(steps, batch_size)`` matrix.  Consecutive windows of ``bptt`` rows give
    ``x = data[i:i+L]`` and ``y = data[i+1:i+1+L]`` (``L = min(bptt,
    steps - 1 - i)``, so the last window may be shorter), both of shape
    ``(L, batch_size)``, so that ``y[t] = x[t+1]`` along the stream.
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D stream, got shape {tuple(tokens.shape)}")
    if batch_size < 1 or bptt < 1:
        raise ValueError("batch_size and bptt must be >= 1")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank}, world={world}")
    shard_len = tokens.numel() // world
    shard = tokens[rank * shard_len:(rank + 1) * shard_len]
    steps = shard_len // batch_size
    if steps < 2:
        raise ValueError(f"token stream too short: {tokens.numel()} tokens over {world} rank(s) "
                         f"give fewer than 2 rows of {batch_size} columns")
    data = shard[:steps * batch_size].view(batch_size, steps).t().contiguous()
    out = []
    for i in range(0, steps - 1, bptt):
        n = min(bptt, steps - 1 - i)
        out.append((data[i:i + n], data[i + 1:i + 1 + n]))
    return out


# --------------------------------------------------------------------------- sharding

def shard_indices(n: int, rank: int, world: int, *, seed: int, epoch: int) -> np.ndarray:
    """This rank's sample indices for ``epoch``.

    Every rank draws the same permutation of ``range(n)`` from ``(seed,
    epoch)`` and takes positions ``rank::world``: the shards are disjoint and
    together cover ``range(n)``; their sizes differ by at most one (the last
    ranks get one fewer).  Returns int64.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank={rank}, world={world}")
    if seed < 0 or epoch < 0:
        raise ValueError("seed and epoch must be >= 0")
    perm = np.random.default_rng(np.random.SeedSequence([seed, epoch])).permutation(n)
    return perm[rank::world].astype(np.int64)


def iterate_batches(ds_x: torch.Tensor, ds_y: torch.Tensor, indices, batch_size: int
                    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` batches of ``ds_x[indices]``, ``ds_y[indices]`` in the order of
    ``indices``, ``batch_size`` at a time; the last partial batch is kept."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    for start in range(0, idx.numel(), batch_size):
        b = idx[start:start + batch_size]
        yield ds_x[b], ds_y[b]
