"""Recommendation data: click logs for ``dlrm``, implicit feedback for ``ncf`` (pure numpy/torch, no MPI).

Four datasets, two of them generated (no download):

* ``clicks`` -- synthetic click logs shaped like Criteo's: per sample
  :data:`DENSE_FEATURES` dense features and ``tables`` categorical ids, each
  id Zipf-distributed over ``rows`` values (:func:`zipf_ids`), the label drawn
  from a fixed random *teacher* (:func:`load_clicks`): a planted ground truth,
  so a model that learns raises the held-out AUC above 0.5.
* ``ratings`` -- synthetic implicit feedback: ``users`` users, each with
  ``per_user`` items drawn from a teacher's preferences and a Zipf
  popularity (:func:`load_ratings`); the last item of each user is held out
  and ranked among ``candidates - 1`` items the user never had (He et al.,
  2017, Sec. 4.1), so chance is a hit rate @10 of 10 / ``candidates``.
* ``criteo`` -- Criteo Kaggle's ``train.txt`` from ``--data-dir`` (tab-separated:
  the label, 13 integer and 26 categorical hex columns; :func:`read_click_file`).
* ``movielens`` -- MovieLens ratings from ``--data-dir`` (``ratings.dat``:
  ``user::item::rating::timestamp``, or ``ratings.csv`` with a header;
  :func:`read_ratings_file`), every rating a positive, as He et al. do.

Layout (a :class:`mpisparse.data.Dataset` of kind ``classification``, 2
classes, so every runtime shards and batches it as it does any other):

* clicks: ``x`` float32 ``(N, dense + tables)``: the dense features, then the
  ids as floats (exact below 2**24, :data:`MAX_ROWS`); ``y`` the click (0/1).
* ratings: training ``x`` ``(N, 2)`` = (user, item), ``y`` 1 for an item the
  user had and 0 for a sampled negative (``negatives`` per positive, drawn
  once at load); test ``x`` ``(users, 1 + candidates)`` = (user, the held-out
  item, then the negatives), ``y`` 0 (the held-out item is candidate 0).

``meta`` holds ``tables`` (the rows of each embedding table), ``dense`` (the
dense features; 0 for ratings), ``recsys`` (``clicks`` or ``ranking``) and
what the generator or the reader knows (the teacher's own AUC or hit rate on
the held-out set: the ceiling a model approaches).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .dataset import Dataset

__all__ = ["CLICK_DATASETS", "DENSE_FEATURES", "MAX_ROWS", "RATING_DATASETS", "RECSYS_DATASETS", "auc",
           "check_recsys_files", "click_file", "hit_rate", "load_clicks", "load_ratings", "load_recsys", "ratings_file",
           "read_click_file", "read_ratings_file", "zipf_ids"]

#: the click-log datasets (``dlrm`` with tables) and the implicit-feedback datasets (``ncf``)
CLICK_DATASETS = ("clicks", "criteo")
RATING_DATASETS = ("ratings", "movielens")
RECSYS_DATASETS = CLICK_DATASETS + RATING_DATASETS
#: Criteo's integer (dense) features per sample, and its categorical ones
DENSE_FEATURES = 13
CRITEO_TABLES = 26
#: ids travel in float32 columns of ``x``: every integer up to 2**24 is exact there
MAX_ROWS = 2 ** 24
#: the click file read from ``--data-dir`` (Criteo Kaggle's name), and the ratings files tried in order
CLICK_FILE = "train.txt"
RATING_FILES = ("ratings.dat", "ratings.csv")
#: the defaults of the generated data: rows of each table, categorical features, Zipf exponent
DEFAULT_ROWS = 1000
DEFAULT_TABLES = 8
ZIPF = 1.05


def zipf_ids(rng: np.random.Generator, rows: int, size, exponent: float = ZIPF) -> np.ndarray:
    """``size`` ids in ``[0, rows)`` with ``P(the r-th most frequent) ~ 1 / r**exponent``; which id is the r-th
    most frequent is a random permutation (drawn first from ``rng``), so hot ids are not the small ones."""
    order = rng.permutation(rows)
    p = 1.0 / np.arange(1, rows + 1, dtype=np.float64) ** exponent
    return order[rng.choice(rows, size=size, p=p / p.sum())]


def _check_sizes(**sizes: int) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} is {v!r}; allowed: an integer >= 1")
    rows = sizes.get("rows")
    if rows is not None and rows > MAX_ROWS:
        raise ValueError(f"rows is {rows}; allowed: 1..{MAX_ROWS} (ids travel as float32)")


def _standard(a: np.ndarray) -> np.ndarray:
    return (a - a.mean()) / a.std()


def _dataset(name: str, xtr, ytr, xte, yte, meta: dict):
    return Dataset(name=name, kind="classification", train_x=torch.from_numpy(np.ascontiguousarray(xtr, np.float32)),
                   train_y=torch.from_numpy(ytr.astype(np.int64)),
                   test_x=torch.from_numpy(np.ascontiguousarray(xte, np.float32)),
                   test_y=torch.from_numpy(yte.astype(np.int64)), num_classes=2, input_shape=(xtr.shape[1],),
                   meta=meta)


# --------------------------------------------------------------------------- metrics (pure)
def auc(scores, labels) -> float:
    """Area under the ROC curve: the probability that a random positive scores above a random negative,
    ties counting one half (Mann-Whitney U from mid-ranks); 0.5 when a class is missing."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return 0.5
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    mid = np.cumsum(counts) - (counts - 1) / 2.0  # the mean 1-based rank of each distinct score
    return float((mid[inverse][y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def hit_rate(scores, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``scores`` ``(users, candidates)`` (candidate 0 the held-out item): whether it ranks in the top
    ``k`` and its NDCG@k (``1 / log2(rank + 2)``, 0 outside the top k).  The rank counts the candidates scoring
    above it and those tying with it (a tie counts against the held-out item)."""
    s = np.asarray(scores, dtype=np.float64)
    rank = (s[:, 1:] >= s[:, :1]).sum(axis=1)
    hit = rank < k
    return hit, np.where(hit, 1.0 / np.log2(rank + 2.0), 0.0)


# --------------------------------------------------------------------------- clicks
def load_clicks(*, seed: int = 0, tables: int = DEFAULT_TABLES, rows: int = DEFAULT_ROWS, n_train: int = 16384,
                n_test: int = 4096, exponent: float = ZIPF, factors: int = 4):
    """Synthetic click logs with a planted ground truth (deterministic in ``seed``).

    The teacher: a vector of ``factors`` per row of every table, a projection
    of the 13 dense features to one more such vector, a bias per row, a
    weight per dense feature.  A sample's logit sums three terms, each
    standardised over the draws: 0.7 x its vectors' pairwise dot products
    summed (DLRM's interaction), 1.0 x its rows' biases summed, 1.5 x the
    dense features' weighted sum; minus 1.2, for a click rate near 30%
    (Criteo Kaggle's is about 26%).  The click is a Bernoulli draw of its
    sigmoid.  (The dense term dominates so that a model's AUC rises within
    an epoch; the rows' terms are what the tables add.)  Dense features are standard normal; each
    id is Zipf-distributed over its table's ``rows`` (:func:`zipf_ids`).
    ``meta["teacher_auc"]``: the teacher's own AUC on the held-out set.
    """
    _check_sizes(tables=tables, rows=rows, n_train=n_train, n_test=n_test, factors=factors)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC11C]))
    proj = rng.normal(size=(DENSE_FEATURES, factors)) / np.sqrt(DENSE_FEATURES)
    vec = rng.normal(size=(tables, rows, factors)) / np.sqrt(factors)
    bias = rng.normal(size=(tables, rows))
    weight = rng.normal(size=DENSE_FEATURES) / np.sqrt(DENSE_FEATURES)
    n = n_train + n_test
    dense = rng.normal(size=(n, DENSE_FEATURES))
    ids = np.stack([zipf_ids(rng, rows, n, exponent) for _ in range(tables)], axis=1)
    vectors = np.concatenate([(dense @ proj)[:, None, :], vec[np.arange(tables), ids]], axis=1)
    total = vectors.sum(axis=1)
    pairs = 0.5 * ((total ** 2).sum(axis=1) - (vectors ** 2).sum(axis=(1, 2)))
    logit = (0.7 * _standard(pairs) + 1.0 * _standard(bias[np.arange(tables), ids].sum(axis=1))
             + 1.5 * _standard(dense @ weight) - 1.2)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    x = np.concatenate([dense, ids], axis=1).astype(np.float32)
    return _dataset("clicks", x[:n_train], y[:n_train], x[n_train:], y[n_train:],
                    {"recsys": "clicks", "dense": DENSE_FEATURES, "tables": [rows] * tables, "zipf": exponent,
                     "click_rate": float(y.mean()), "teacher_auc": auc(logit[n_train:], y[n_train:])})


def click_file(data_dir: str) -> str:
    """The click file in ``data_dir`` (FileNotFoundError, one line, when it is not there)."""
    path = os.path.join(data_dir, CLICK_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"click log not found in {data_dir!r}: expected {CLICK_FILE} (Criteo Kaggle's: a "
                                f"label, {DENSE_FEATURES} integer and {CRITEO_TABLES} categorical columns, "
                                "tab-separated)")
    return path


def _click_columns(path: str, tables: int | None) -> int:
    """The categorical columns of the click file (from its first line); ValueError when ``tables`` disagrees."""
    with open(path, encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    found = len(first.split("\t")) - 1 - DENSE_FEATURES
    if found < 1:
        raise ValueError(f"click file {path}: its first line has {found + 1 + DENSE_FEATURES} columns; allowed: "
                         f"a label, {DENSE_FEATURES} integer columns and at least one categorical column")
    if tables is not None and tables != found:
        raise ValueError(f"click file {path} has {found} categorical columns but --emb-tables is {tables}; "
                         f"allowed: --emb-tables {found} (one table per categorical column)")
    return found


def read_click_file(path: str, *, tables: int | None = None, rows: int = DEFAULT_ROWS, held_out: float = 1 / 7):
    """A Criteo-style click log: per line a label, 13 integers and ``tables`` categorical hex values,
    tab-separated, empty fields allowed (missing: 0).

    As DLRM's reader does: an integer ``v`` becomes ``log(1 + max(v, 0))``;
    a categorical value is hashed into its table as ``int(value, 16) % rows``
    (``--emb-rows``).  The last ``held_out`` of the lines is the held-out
    set (the DCT paper trains on Criteo Kaggle's first 6 days and tests on
    the 7th).  A line whose column count differs from the first line's, or
    a field that does not parse, is a ValueError naming its line.
    """
    _check_sizes(rows=rows)
    tables = _click_columns(path, tables)
    width = 1 + DENSE_FEATURES + tables
    labels, dense, cats = [], [], []
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            if len(cols) != width:
                raise ValueError(f"click file {path} line {no} has {len(cols)} columns; expected {width} (a label, "
                                 f"{DENSE_FEATURES} integer and {tables} categorical: one per table)")
            try:
                labels.append(int(cols[0]))
                dense.append([math_log1p(c) for c in cols[1:1 + DENSE_FEATURES]])
                cats.append([int(c, 16) % rows if c else 0 for c in cols[1 + DENSE_FEATURES:]])
            except ValueError as e:
                raise ValueError(f"click file {path} line {no}: {e}") from None
    y = np.asarray(labels, dtype=np.int64)
    if len(y) < 2 or not set(np.unique(y)) <= {0, 1}:
        raise ValueError(f"click file {path}: needs at least 2 lines with labels 0 or 1; it has {len(y)} line(s) "
                         f"with labels {sorted(set(np.unique(y).tolist()))}")
    x = np.concatenate([np.asarray(dense, np.float64), np.asarray(cats, np.float64)], axis=1)
    cut = len(y) - max(1, int(round(held_out * len(y))))
    return _dataset("criteo", x[:cut], y[:cut], x[cut:], y[cut:],
                    {"recsys": "clicks", "dense": DENSE_FEATURES, "tables": [rows] * tables, "file": path,
                     "click_rate": float(y.mean())})


def math_log1p(field: str) -> float:
    """One integer field as DLRM reads it: ``log(1 + max(v, 0))``; empty is 0."""
    return float(np.log1p(max(int(field), 0))) if field else 0.0


# --------------------------------------------------------------------------- ratings
def _sample_negatives(rng, had: np.ndarray, users: np.ndarray, items: int, per: int) -> np.ndarray:
    """``per`` items for each of ``users`` drawn uniformly among those the user never had (``had``: the sorted
    keys ``user * items + item`` of every interaction), by rejection."""
    out = rng.integers(0, items, size=(len(users), per))
    bad = np.isin(users[:, None] * items + out, had)
    while bad.any():
        out[bad] = rng.integers(0, items, size=int(bad.sum()))
        bad = np.isin(users[:, None] * items + out, had)
    return out


def _ratings_dataset(name: str, rng, users: int, items: int, seen: list[np.ndarray], negatives: int,
                     candidates: int, meta: dict):
    """Leave-one-out: each user's last item held out and ranked among ``candidates - 1`` items the user never
    had; the others are training positives, each with ``negatives`` sampled negatives (drawn once, uniformly
    with replacement among the items the user never had)."""
    had = np.unique(np.concatenate([u * items + s for u, s in enumerate(seen)]))
    full = next((u for u, s in enumerate(seen) if len(s) >= items), None)
    if full is not None:
        raise ValueError(f"{name}: user {full} had every one of the {items} items: no negative to sample")
    pos_u = np.concatenate([np.full(len(s) - 1, u) for u, s in enumerate(seen)])
    pos_i = np.concatenate([s[:-1] for s in seen])
    neg_u = np.repeat(pos_u, negatives)
    neg_i = _sample_negatives(rng, had, pos_u, items, negatives).ravel()
    x = np.concatenate([np.stack([pos_u, pos_i], 1), np.stack([neg_u, neg_i], 1)])
    y = np.concatenate([np.ones(len(pos_u)), np.zeros(len(neg_u))])
    order = rng.permutation(len(y))
    test_u = np.arange(users)
    test = np.concatenate([test_u[:, None], np.array([s[-1] for s in seen])[:, None],
                           _sample_negatives(rng, had, test_u, items, candidates - 1)], axis=1)
    return _dataset(name, x[order], y[order], test, np.zeros(users),
                    {"recsys": "ranking", "dense": 0, "tables": [users, items], "negatives": negatives,
                     "candidates": candidates, **meta})


def load_ratings(*, seed: int = 0, users: int = DEFAULT_ROWS, items: int = DEFAULT_ROWS, per_user: int = 16,
                 negatives: int = 4, candidates: int = 100, exponent: float = ZIPF, factors: int = 8):
    """Synthetic implicit feedback with a planted ground truth (deterministic in ``seed``).

    The teacher: ``factors``-dimensional preferences per user and per item
    and a Zipf popularity of items (the r-th most popular item's log-weight
    ``-exponent * log r``, a random permutation deciding which item is r-th).
    Each user has ``per_user`` distinct items, drawn without replacement with
    probabilities proportional to ``exp(3 * preference + popularity)``
    (Gumbel top-k) in a random order of time; the last is held out.
    ``meta["teacher_hit_rate"]``: the teacher's own hit rate @10 on the held-out ranking.
    """
    _check_sizes(users=users, items=items, per_user=per_user, negatives=negatives, factors=factors)
    if per_user < 2 or candidates < 2:
        raise ValueError(f"per_user is {per_user} and candidates {candidates}; allowed: both >= 2")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x4A7E]))
    pu = rng.normal(size=(users, factors)) / np.sqrt(factors)
    qi = rng.normal(size=(items, factors))
    popularity = np.empty(items)
    popularity[rng.permutation(items)] = -exponent * np.log(np.arange(1, items + 1))
    seen = []
    for u in range(users):
        score = 3.0 * (qi @ pu[u]) + popularity
        pick = np.argpartition(-(score + rng.gumbel(size=items)), per_user - 1)[:per_user]
        seen.append(rng.permutation(pick))
    ds = _ratings_dataset("ratings", rng, users, items, seen, negatives, candidates,
                          {"zipf": exponent, "per_user": per_user})
    test = ds.test_x.numpy().astype(np.int64)
    teacher = 3.0 * np.einsum("uf,ucf->uc", pu[test[:, 0]], qi[test[:, 1:]]) + popularity[test[:, 1:]]
    ds.meta["teacher_hit_rate"] = float(hit_rate(teacher)[0].mean())
    return ds


def ratings_file(data_dir: str) -> str:
    """The ratings file in ``data_dir``: ``ratings.dat`` or ``ratings.csv`` (FileNotFoundError, one line)."""
    for name in RATING_FILES:
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"ratings not found in {data_dir!r}: expected {' or '.join(RATING_FILES)} (MovieLens': "
                            "user::item::rating::timestamp, or userId,movieId,rating,timestamp with a header)")


def read_ratings_file(path: str, *, seed: int = 0, negatives: int = 4, candidates: int = 100):
    """MovieLens-style ratings: ``user::item::rating::timestamp`` lines (``ratings.dat``) or CSV with the header
    ``userId,movieId,rating,timestamp`` (``ratings.csv``).  Every rating is a positive (implicit feedback, He et
    al.); users with fewer than 2 ratings are dropped; user and item ids are renumbered in sorted order (the
    tables have as many rows as there are users and items); each user's latest rating (ties: the later
    line) is held out.  A line without 4 fields, or a field that does not parse, is a ValueError naming its line.
    """
    sep = "," if path.endswith(".csv") else "::"
    rec = []
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            line = line.strip()
            if not line or (no == 1 and sep == "," and not line[0].isdigit()):
                continue  # blank lines, the CSV header
            cols = line.split(sep)
            if len(cols) != 4:
                raise ValueError(f"ratings file {path} line {no} has {len(cols)} fields; expected 4 "
                                 f"(user{sep}item{sep}rating{sep}timestamp)")
            try:
                rec.append((int(cols[0]), int(cols[1]), float(cols[3]), no))
            except ValueError as e:
                raise ValueError(f"ratings file {path} line {no}: {e}") from None
    a = np.array(rec, dtype=np.float64).reshape(-1, 4)
    user_ids, u = np.unique(a[:, 0].astype(np.int64), return_inverse=True)
    counts = np.bincount(u, minlength=len(user_ids))
    keep = counts[u] >= 2
    if not keep.any():
        raise ValueError(f"ratings file {path}: no user has 2 ratings (one to train on, one held out)")
    a = a[keep]
    user_ids, u = np.unique(a[:, 0].astype(np.int64), return_inverse=True)
    item_ids, i = np.unique(a[:, 1].astype(np.int64), return_inverse=True)
    order = np.lexsort((a[:, 3], a[:, 2], u))  # by user, then time, then line
    seen = np.split(i[order], np.cumsum(np.bincount(u, minlength=len(user_ids)))[:-1])
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x4A7F]))
    return _ratings_dataset("movielens", rng, len(user_ids), len(item_ids), seen, negatives, candidates,
                            {"file": path, "ratings": int(len(a))})


def check_recsys_files(data: str, data_dir: str, tables: int | None = None) -> None:
    """Raise FileNotFoundError / ValueError (one line) when ``data_dir`` lacks the file ``--data`` reads, or its
    columns do not match the tables; reads one line."""
    if data == "criteo":
        _click_columns(click_file(data_dir), tables)
    elif data == "movielens":
        ratings_file(data_dir)


def load_recsys(name: str, *, data_dir: str | None = None, seed: int = 0, tables: int | None = None,
                rows: int | None = None):
    """Dataset ``name`` of :data:`RECSYS_DATASETS` with the tables' options (``--emb-tables``, ``--emb-rows``;
    None: the data's own).  ``ratings`` has two tables (users and items, ``rows`` each); ``movielens`` as many
    rows as its file has users and items."""
    if name in RATING_DATASETS and tables not in (None, 2):
        raise ValueError(f"--emb-tables is {tables}; data {name!r} has 2 tables (users and items)")
    if name == "clicks":
        return load_clicks(seed=seed, tables=tables or DEFAULT_TABLES, rows=rows or DEFAULT_ROWS)
    if name == "ratings":
        return load_ratings(seed=seed, users=rows or DEFAULT_ROWS, items=rows or DEFAULT_ROWS)
    if data_dir is None:
        raise ValueError(f"--data-dir is required for dataset {name!r}")
    if name == "criteo":
        return read_click_file(click_file(data_dir), tables=tables, rows=rows or DEFAULT_ROWS)
    if rows is not None:
        raise ValueError(f"--emb-rows is {rows}; data {name!r} decides its tables' rows (its users and items)")
    return read_ratings_file(ratings_file(data_dir), seed=seed)
