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
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

LATEST = "LATEST"


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
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


def load(directory: str | os.PathLike, comm) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(common, per_rank)``; ``per_rank`` is None when the world size changed."""
    root = Path(directory)
    if not exists(root):
        raise FileNotFoundError(f"no checkpoint in {root} (no {LATEST} file); run without --resume first")
    target = root / (root / LATEST).read_text().strip()
    common = torch.load(target / "common.pt", weights_only=False)
    saved = int(common["world_size"])
    if saved != comm.size:
        if comm.rank == 0:
            warnings.warn(
                f"checkpoint {target.name} was written by {saved} ranks, this job has {comm.size}: "
                "model and optimizer are restored, per-rank scheme state (residuals) is reset",
                stacklevel=2)
        return common, None
    per_rank = torch.load(target / f"rank-{comm.rank}.pt", weights_only=False)
    return common, per_rank
