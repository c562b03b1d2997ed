"""Results as files: JSON (atomic), CSV rows, the per-step CSV log of ``train``."""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

from .timing import PHASES
from .schema import RunResult

__all__ = ["CSV_STEP_COLUMNS", "CsvLog", "Fallback", "columns_of", "json_ready", "path_problem", "result_row",
           "write_csv", "write_json"]

_CONTRACT_SCALARS = ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank")

#: the columns of ``train --csv`` (one row per step).  Units are in the names: times in
#: milliseconds (``_ms``), sizes in bytes (``bytes_``); the rest are counts or fractions.
CSV_STEP_COLUMNS = ("scheme", "epoch", "batch", "iteration", "loss", "step_ms", "wall_ms", "bytes_sent",
                    "density", "skipped")

#: the log record's key -> (CSV column, factor) of the columns that change unit or name
_STEP_RENAMES = {"step_seconds": ("step_ms", 1e3), "wall_seconds": ("wall_ms", 1e3), "bytes": ("bytes_sent", 1)}


def json_ready(obj: Any) -> Any:
    """``obj`` with every :class:`RunResult` (also inside lists) replaced by its dict."""
    if isinstance(obj, RunResult):
        return obj.to_dict()
    if isinstance(obj, (list, tuple)):
        return [json_ready(o) for o in obj]
    return obj


def write_json(path: str | os.PathLike | None, obj: Any) -> None:
    """Write ``obj`` (results, or any JSON value) to ``path`` atomically; nothing when ``path`` is None."""
    if path is None:
        return
    tmp = Path(path).with_suffix(Path(path).suffix + ".tmp")
    tmp.write_text(json.dumps(json_ready(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def result_row(res: RunResult | dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One flat row of a result (``extra`` keys after the contract's).

    Units are in the column names, one per kind: times in milliseconds
    (``step_ms``, ``step_mean_over_ranks_ms``, ``phase_<name>_ms``: max over
    ranks, in the order of the phase vocabulary), sizes in bytes
    (``bytes_sent_per_rank``); ``n`` and ``k`` count elements.
    """
    res = json_ready(res)
    row: dict[str, Any] = {}
    cfg = res.get("config", {})
    if "model" in cfg and "model" not in extra:
        row["model"] = cfg["model"]
    for k in _CONTRACT_SCALARS:
        row[k] = res.get(k)
    row["step_ms"] = None if res.get("step_seconds") is None else res["step_seconds"] * 1e3
    if res.get("step_seconds_mean_over_ranks") is not None:
        row["step_mean_over_ranks_ms"] = res["step_seconds_mean_over_ranks"] * 1e3
    if "n" in res:
        row["n"] = res["n"]
    if "k" in res:
        row["k"] = res["k"]
    row.update(extra)
    phases = res.get("phases", {})
    for p in PHASES:
        if p in phases:
            row[f"phase_{p}_ms"] = phases[p] * 1e3
    return row


def columns_of(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The union of the rows' keys: first-seen order, ``phase_*_ms`` last in vocabulary order."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    phase_cols = [f"phase_{p}_ms" for p in PHASES if f"phase_{p}_ms" in seen]
    return [k for k in seen if k not in phase_cols] + phase_cols


def write_csv(path: str | os.PathLike, rows: Iterable[dict[str, Any]],
              columns: Sequence[str] | None = None) -> None:
    """Write ``rows`` with a header (atomically); nested values (lists, dicts) are left out."""
    rows = [{k: v for k, v in r.items() if not isinstance(v, (list, dict, tuple))} for r in rows]
    if columns is None:
        columns = columns_of(rows)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(tmp, path)


class CsvLog:
    """``train --csv``: one row per step (rank 0's view), flushed per row so a kill loses nothing."""

    def __init__(self, path: str | Path, append: bool = False):
        self.path = Path(path)
        new = not (append and self.path.exists())
        self._f = open(self.path, "a" if not new else "w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=CSV_STEP_COLUMNS, extrasaction="ignore")
        if new:
            self._w.writeheader()

    def row(self, scheme: str, rec: dict[str, Any]) -> None:
        """Write one step's log record (``step_seconds``, ``wall_seconds``, ``bytes`` become ms / bytes columns)."""
        out = {"scheme": scheme}
        for k, v in rec.items():
            if k in _STEP_RENAMES:
                name, factor = _STEP_RENAMES[k]
                out[name] = v * factor if v is not None else None
            else:
                out[k] = v
        self._w.writerow(out)
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# --------------------------------------------------------------------------- output paths
def _why(e: OSError) -> str:
    return (e.strerror or str(e)).lower()


def _try_create_in(directory: Path) -> str | None:
    """Create and remove a file in ``directory``: None when that works, else why not."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".mpisparse-write-check-")
    except OSError as e:
        return f"cannot create a file in {directory}: {_why(e)}"
    os.close(fd)
    os.unlink(name)
    return None


def path_problem(path: str | os.PathLike, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be written, in a few words (None: it can).

    Tried, not guessed from permission bits (root may write where the bits
    say no, and nobody writes on a read-only file system): a file is
    created and removed where the output will go.  A file's directory must
    exist; a directory (``directory=True``) may be missing, as long as it can
    be created (its nearest existing ancestor takes new files).  Nothing is
    left behind.
    """
    p = Path(path)
    if directory:
        if p.exists():
            if not p.is_dir():
                return "it exists and is not a directory"
            return _try_create_in(p)
        a = p.parent
        while not a.exists() and a != a.parent:
            a = a.parent
        if not a.is_dir():
            return f"{a} is not a directory"
        return _try_create_in(a)
    if p.is_dir():
        return "it is a directory"
    parent = p.parent
    if not parent.exists():
        anc = parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        if anc.exists() and not anc.is_dir():
            return f"{anc} is not a directory"
        return f"directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if p.exists():
        try:
            with open(p, "ab"):
                pass
        except OSError as e:
            return _why(e)
    return _try_create_in(parent)


class Fallback:
    """Writes the output files of a run; when one cannot be written, the results go to stdout instead.

    ``attempt(option, path, write)`` runs ``write()``; an ``OSError`` becomes
    one warning line on ``err`` naming the option, the path and why, and the
    results (``obj``, as JSON) are printed on ``out`` once, however many
    files failed, so a run's results are never lost to an unwritable path.
    """

    def __init__(self, obj: Any, *, out: TextIO | None = None, err: TextIO | None = None):
        self.obj = obj
        self.out = out
        self.err = err
        self.failed: list[str] = []

    def attempt(self, option: str, path: str | os.PathLike | None, write: Callable[[], Any]) -> bool:
        if not path:
            return True
        try:
            write()
            return True
        except OSError as e:
            err = self.err or sys.stderr
            out = self.out or sys.stdout
            first = not self.failed
            self.failed.append(option)
            then = "the results are printed to stdout as JSON instead" if first else "see the JSON on stdout"
            err.write(f"mpisparse: warning: {option} {path}: cannot write it ({_why(e)}); {then}\n")
            err.flush()
            if first:
                out.write(json.dumps(json_ready(self.obj), indent=2, sort_keys=True, default=str) + "\n")
                out.flush()
            return False
