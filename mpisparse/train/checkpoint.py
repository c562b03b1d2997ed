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
another world size the error-feedback state is redistributed so that the
pending update is kept (:mod:`mpisparse.train.reshard`: every new rank takes
the old ranks' mean; each reads only its share of the old rank files).

Data only: the files hold tensors, NumPy arrays (stored as tensors with a
marker, see :func:`encode`), numbers, strings and containers, and are read
with ``torch.load(weights_only=True)``, which refuses anything else.  A
file that names code to run (a planted pickle) or cannot be read is an
error naming the file (:class:`CheckpointError`); nothing in it runs.

A step directory without ``LATEST`` pointing at it (a save killed half-way)
and ``*.tmp`` files are removed at the next start (:func:`clean`).  A save
that fails with an OS error (a full device: ENOSPC, a quota, an I/O error)
is undone at once: the ranks agree, rank 0 removes the step directory, and
every rank raises :class:`CheckpointSaveError`, one line naming the file and
the reason; ``LATEST`` still names the previous complete checkpoint.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import re
import shutil
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CheckpointError", "CheckpointSaveError", "LATEST", "clean", "decode", "encode", "exists", "load", "read", "save"]

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
    """``obj`` as data in ``path``: serialized in memory first, so that a write error is the OS's own
    (``OSError`` with its errno, e.g. ENOSPC), not the archive writer's "unexpected pos"; then written
    to a temporary name, flushed, ``fsync``ed and renamed."""
    buf = io.BytesIO()
    torch.save(encode(obj), buf)
    _atomic_write_bytes(path, buf.getbuffer())


def _atomic_write_bytes(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode())


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (a full device, a quota, an I/O error): one line naming the file
    and the OS's reason; the half-written step directory is already removed (``errno`` is the OS's)."""

    def __init__(self, errno_: int | None, message: str):
        super().__init__(errno_, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


#: how an OS error of a save is named in its one line
_REASONS = {errno.ENOSPC: "no space left on the device: it is full (ENOSPC)",
            getattr(errno, "EDQUOT", -1): "the disk quota is exceeded (EDQUOT)"}


def _attempt(path: Path, write) -> tuple[str, int | None, str] | None:
    """Run ``write()``; None, or ``(path, errno, reason)`` of the OS error it raised."""
    try:
        write()
    except OSError as e:
        code = e.errno
        reason = _REASONS.get(code) or (f"{e.strerror or e} ({errno.errorcode.get(code, code)})" if code
                                        else str(e))
        return str(path), code, reason
    return None


def _agree(comm, failure):
    """Every rank's failure (None where its part was written), on every rank: the save's barriers."""
    if comm.size == 1:
        return [failure]
    return comm.allgather_obj(failure)


def _abandon(root: Path, target: Path, comm, failures: list) -> None:
    """Collective end of a failed save: rank 0 removes the step directory and the temporary files at once
    (``LATEST`` was not moved, so it still names the previous complete checkpoint); every rank raises
    :class:`CheckpointSaveError` naming the first failed file, rank 0 at once, the others a moment later
    (under the CLI rank 0's report ends the job before: one line)."""
    rank, (path, code, reason) = next((r, f) for r, f in enumerate(failures) if f is not None)
    if comm.rank == 0:
        shutil.rmtree(target, ignore_errors=True)
        for tmp in root.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
    try:
        latest = (root / LATEST).read_text().strip()
        kept = f"{LATEST} still names the previous checkpoint {latest} (free space, then continue with --resume)"
    except OSError:
        kept = f"there is no earlier checkpoint ({LATEST} was never written)"
    who = f" (rank {rank})" if comm.size > 1 else ""
    message = (f"checkpoint file {path} could not be written{who}: {reason}; the incomplete checkpoint "
               f"{target} was removed, {kept}")
    if comm.rank != 0:
        time.sleep(3.0)
    raise CheckpointSaveError(code, message)


def save(directory: str | os.PathLike, comm, tag: int, common: dict[str, Any], per_rank: dict[str, Any]) -> Path:
    """Collective: every rank writes its part; rank 0 then moves ``LATEST``.

    A part that cannot be written (an ``OSError``: a full device, a quota) ends the save on every rank
    with :class:`CheckpointSaveError` once the ranks agree: the step directory is removed at once and
    ``LATEST`` keeps naming the previous complete checkpoint.
    """
    root = Path(directory)
    name = f"step-{tag:09d}"
    target = root / name
    failure = None
    if comm.rank == 0:
        failure = _attempt(target, lambda: target.mkdir(parents=True, exist_ok=True))
    failures = _agree(comm, failure)
    if any(failures):
        _abandon(root, target, comm, failures)
    mine = target / f"rank-{comm.rank}.pt"
    failure = _attempt(mine, lambda: _atomic_save(per_rank, mine))
    if comm.rank == 0 and failure is None:
        failure = _attempt(target / "common.pt",
                           lambda: _atomic_save({**common, "world_size": comm.size}, target / "common.pt"))
    failures = _agree(comm, failure)  # every part is on disk before LATEST may point here
    if any(failures):
        _abandon(root, target, comm, failures)
    failure = None
    if comm.rank == 0:
        failure = _attempt(root / LATEST, lambda: _atomic_write_text(root / LATEST, name))
        if failure is None:
            for old in root.glob("step-*"):
                if old.name != name and old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
    failures = _agree(comm, failure)
    if any(failures):
        _abandon(root, target, comm, failures)
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


def load(directory: str | os.PathLike, comm, *, reshard: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(common, per_rank)``; at another world size ``per_rank`` is this rank's share of the old ranks'
    parts (:func:`mpisparse.train.reshard.gather_parts`, collective), without ``torch_rng``; with
    ``reshard`` False another world size is a :class:`CheckpointError` (ranks with roles: servers).

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
    if saved != comm.size and not reshard:
        raise CheckpointError(f"checkpoint {target} was written by {saved} ranks, this job has {comm.size}: a "
                              "parameter-server checkpoint resumes on as many ranks (-n) and --servers as wrote it")
    if saved != comm.size:
        from .reshard import gather_parts

        part = gather_parts(comm, saved, lambda i: _rank_part(target, i))
        if comm.rank == 0:
            warnings.warn(
                f"checkpoint {target.name} was written by {saved} ranks, this job has {comm.size}: model and "
                "optimizer are restored, the error-feedback residuals redistributed (every rank takes the "
                "ranks' mean: the pending update is kept)", stacklevel=2)
        return common, part
    return common, _rank_part(target, comm.rank)


def _rank_part(target: Path, rank: int) -> dict[str, Any]:
    part = read(target / f"rank-{rank}.pt")
    if not isinstance(part, dict):
        raise CheckpointError(f"checkpoint file {target / f'rank-{rank}.pt'} does not hold a rank's part")
    return part
