"""Checkpoints that survive a kill, one file per rank plus a common one.

Layout of a checkpoint directory::

    DIR/step-000000120/common.pt    model, optimizer, loop position, metrics, world size (rank 0)
    DIR/step-000000120/rank-0.pt    rank 0's scheme state: residual, thresholds, leader cycle, ...
    DIR/step-000000120/rank-1.pt    ...
    DIR/LATEST                      "step-000000120"

Every file is written to a temporary name and renamed; ``LATEST`` is
replaced (atomically) only after every rank has written its file, so a kill
at any moment leaves ``LATEST`` naming a complete checkpoint.  Older
checkpoint directories are removed after ``LATEST`` moves on.

Resuming at the saved world size gives each rank its own state back.  At
another world size the residuals (and other per-rank scheme state) cannot be
redistributed meaningfully: they are reset with a warning, and no rank ever
loads another rank's residual.

Data only: the files hold tensors, NumPy arrays (stored as tensors with a
marker, see :func:`encode`), numbers, strings and containers, and are read
with ``torch.load(weights_only=True)``, which refuses anything else.  A
file that names code to run (a planted pickle) or cannot be read is an
error naming the file (:class:`CheckpointError`); nothing in it runs.

A step directory without ``LATEST`` pointing at it (a save killed half-way)
and ``*.tmp`` files are removed at the next start (:func:`clean`).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CheckpointError", "LATEST", "clean", "decode", "encode", "exists", "load", "read", "save"]

LATEST = "LATEST"

#: the key of a dict that stands for a NumPy array (the tensor) or a NumPy scalar (a 0-d tensor)
_NDARRAY, _NPSCALAR = "__mpisparse_ndarray__", "__mpisparse_npscalar__"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, is not data only, or does not fit this run (names the file)."""


def encode(obj: Any, where: str = "state") -> Any:
    """``obj`` with NumPy arrays and scalars replaced by marked tensors (what ``weights_only`` reads).

    Tensors, numbers, strings, bytes, None, torch dtypes and dicts, lists
    and tuples of these pass through; anything else is a TypeError naming
    where in the state it is (it could not be read back as data).
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError(f"checkpoint state {where}: an object array cannot be stored as data")
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return {_NPSCALAR: torch.from_numpy(np.asarray(obj).reshape(1).copy())}
    if isinstance(obj, dict):
        return _like(obj, {k: encode(v, f"{where}[{k!r}]") for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        out = [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return out if isinstance(obj, list) else tuple(out)
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, torch.Tensor, torch.dtype,
                                       torch.Size)):
        return obj
    raise TypeError(f"checkpoint state {where}: a {type(obj).__name__} cannot be stored as data")


def _like(original: dict, items: dict) -> dict:
    """``items`` as an OrderedDict with ``original``'s ``_metadata`` when ``original`` is one (a module's
    ``state_dict``), else as a dict."""
    if not isinstance(original, OrderedDict):
        return items
    out = OrderedDict(items)
    meta = getattr(original, "_metadata", None)
    if meta is not None:
        out._metadata = meta  # type: ignore[attr-defined]
    return out


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(obj, dict):
        if len(obj) == 1 and _NDARRAY in obj:
            return obj[_NDARRAY].numpy()
        if len(obj) == 1 and _NPSCALAR in obj:
            return obj[_NPSCALAR].numpy()[0]
        return _like(obj, {k: decode(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


def read(path: str | os.PathLike) -> Any:
    """One checkpoint file, data only; :class:`CheckpointError` (one line naming the file) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing (the checkpoint is incomplete)")
    try:
        return decode(torch.load(path, map_location="cpu", weights_only=True))
    except pickle.UnpicklingError as e:
        m = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"code ({m.group(1)})" if m else "something other than data"
        raise CheckpointError(f"checkpoint file {path} asks to load {what}: refused, nothing was run (a "
                              "checkpoint holds data only; this file was not written by this mpisparse or "
                              "was altered)") from None
    except Exception as e:  # noqa: BLE001 - truncated, not a zip archive, ...: all name the file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint file {path} cannot be read ({first[:200]}); it is corrupt or "
                              "incomplete") from None


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    data = encode(obj)
    with open(tmp, "wb") as f:
        torch.save(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(directory: str | os.PathLike, comm, tag: int, common: dict[str, Any], per_rank: dict[str, Any]) -> Path:
    """Collective: every rank writes its part; rank 0 then moves ``LATEST``."""
    root = Path(directory)
    name = f"step-{tag:09d}"
    target = root / name
    if comm.rank == 0:
        target.mkdir(parents=True, exist_ok=True)
    comm.barrier()
    _atomic_save(per_rank, target / f"rank-{comm.rank}.pt")
    if comm.rank == 0:
        _atomic_save({**common, "world_size": comm.size}, target / "common.pt")
    comm.barrier()  # every part is on disk before LATEST may point here
    if comm.rank == 0:
        _atomic_write_text(root / LATEST, name)
        for old in root.glob("step-*"):
            if old.name != name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    return target


def exists(directory: str | os.PathLike) -> bool:
    return (Path(directory) / LATEST).is_file()


def clean(directory: str | os.PathLike, comm) -> list[Path]:
    """Collective: rank 0 removes what a killed save left (``*.tmp``, step directories ``LATEST``
    does not name); returns what it removed (rank 0) or ``[]``."""
    root = Path(directory)
    removed: list[Path] = []
    if comm.rank == 0 and root.is_dir():
        keep = (root / LATEST).read_text().strip() if exists(root) else None
        for p in sorted(root.glob("*.tmp")) + sorted(root.glob("step-*/*.tmp")):
            if p.is_file():
                p.unlink(missing_ok=True)
                removed.append(p)
        for d in sorted(root.glob("step-*")):
            if d.is_dir() and d.name != keep:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    comm.barrier()
    return removed


def load(directory: str | os.PathLike, comm) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(common, per_rank)``; ``per_rank`` is None when the world size changed.

    Every error is a :class:`CheckpointError` naming the file.
    """
    root = Path(directory)
    if not exists(root):
        raise FileNotFoundError(f"no checkpoint in {root} (no {LATEST} file); run without --resume first")
    name = (root / LATEST).read_text().strip()
    target = root / name
    if not re.fullmatch(r"step-\d+", name) or not target.is_dir():
        raise CheckpointError(f"checkpoint file {root / LATEST} names {name!r}, which is not a step directory "
                              f"in {root}")
    common = read(target / "common.pt")
    if not isinstance(common, dict) or "world_size" not in common:
        raise CheckpointError(f"checkpoint file {target / 'common.pt'} does not hold a checkpoint's common part")
    saved = int(common["world_size"])
    if saved != comm.size:
        if comm.rank == 0:
            warnings.warn(
                f"checkpoint {target.name} was written by {saved} ranks, this job has {comm.size}: "
                "model and optimizer are restored, per-rank scheme state (residuals) is reset",
                stacklevel=2)
        return common, None
    per_rank = read(target / f"rank-{comm.rank}.pt")
    if not isinstance(per_rank, dict):
        raise CheckpointError(f"checkpoint file {target / f'rank-{comm.rank}.pt'} does not hold a rank's part")
    return common, per_rank
