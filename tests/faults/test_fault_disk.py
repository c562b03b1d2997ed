"""A full disk: a checkpoint save that runs out of space ends the job with one line naming the file and
ENOSPC, removes the half-written step directory at once, and leaves ``LATEST`` on the previous complete
checkpoint, from which ``--resume`` continues.

The real case runs on a small tmpfs (root, and a kernel that lets this process mount one; skipped with
the reason otherwise); the unit cases simulate ENOSPC by patching the writer, so they run everywhere.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import SelfComm, mpi_run  # noqa: E402

torch = pytest.importorskip("torch")

BASE = ["train", "--model", "mlp", "--data", "digits", "--batch-size", "128", "--scheme", "topk", "--seed", "3"]


def _full_disk_after(monkeypatch, writes: int):
    """The checkpoint writer raises ENOSPC from its ``writes + 1``-th file on (as a full device does)."""
    from mpisparse.train import checkpoint

    real, count = checkpoint._atomic_write_bytes, []

    def writer(path, data):
        count.append(path)
        if len(count) > writes:
            path.with_name(path.name + ".tmp").write_bytes(bytes(data)[:100])  # what a full device leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(checkpoint, "_atomic_write_bytes", writer)


@pytest.mark.parametrize("writes", [0, 1, 2], ids=["rank-file", "common-file", "latest"])
def test_a_full_disk_is_one_error_naming_the_file_and_the_save_is_undone(tmp_path, monkeypatch, writes):
    from mpisparse.train import checkpoint

    checkpoint.save(tmp_path, SelfComm(), 1, {"x": 1}, {"r": np.arange(3)})
    _full_disk_after(monkeypatch, writes)
    with pytest.raises(checkpoint.CheckpointSaveError) as e:
        checkpoint.save(tmp_path, SelfComm(), 2, {"x": 2}, {"r": np.arange(4)})
    failed = ["step-000000002/rank-0.pt", "step-000000002/common.pt", "LATEST"][writes]
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and "\n" not in msg
    assert f"checkpoint file {tmp_path / failed} could not be written" in msg and "(ENOSPC)" in msg, msg
    assert "LATEST still names the previous checkpoint step-000000001" in msg
    assert not (tmp_path / "step-000000002").exists() and not list(tmp_path.rglob("*.tmp"))
    monkeypatch.undo()
    common, mine = checkpoint.load(tmp_path, SelfComm())
    assert common["x"] == 1 and mine["r"].tolist() == [0, 1, 2]


def test_another_ranks_full_disk_is_reported_and_undone_by_rank_0(tmp_path):
    """Rank 0 wrote its part; rank 1's failed: rank 0 names rank 1's file and removes the step at once."""
    from mpisparse.train import checkpoint

    class TwoRanks(SelfComm):
        size = 2

        def allgather_obj(self, obj):
            theirs = None
            if obj is not None or not (tmp_path / "step-000000005").is_dir():
                return [obj, None]
            if any((tmp_path / "step-000000005").glob("common.pt")):  # the parts are written: rank 1 failed
                theirs = (str(tmp_path / "step-000000005" / "rank-1.pt"), errno.ENOSPC, "no space (ENOSPC)")
            return [obj, theirs]

    with pytest.raises(checkpoint.CheckpointSaveError, match=r"rank-1\.pt could not be written \(rank 1\)") as e:
        checkpoint.save(tmp_path, TwoRanks(), 5, {"x": 1}, {"r": np.arange(3)})
    assert "there is no earlier checkpoint" in str(e.value)
    assert not (tmp_path / "step-000000005").exists() and not (tmp_path / "LATEST").exists()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 700 KB tmpfs: room for one checkpoint of the 2-rank mlp run (437 KB), not for the next beside it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=700k", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()[:200]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.timeout(300)
def test_a_full_tmpfs_ends_the_job_with_one_line_and_leaves_a_checkpoint_to_resume(tiny_tmpfs):
    """One launch (the resume itself is tested in tests/test_train.py): the checkpoint LATEST names is
    complete, every rank's part reads back."""
    from mpisparse.train import checkpoint

    ck = tiny_tmpfs / "ck"
    p = mpi_run(2, [*BASE, "--epochs", "3", "--checkpoint", str(ck)], module=True, check=False)
    assert p.returncode == 1, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("mpisparse:")]
    assert len(lines) == 1, p.stderr[-2000:]
    assert "CheckpointSaveError: checkpoint file " + str(ck / "step-000000012") in lines[0], lines[0]
    assert "it is full (ENOSPC)" in lines[0] and "Traceback" not in p.stderr
    assert (ck / "LATEST").read_text() == "step-000000006"
    assert sorted(x.name for x in ck.iterdir()) == ["LATEST", "step-000000006"]  # nothing half-written left
    for rank in (0, 1):
        comm = SelfComm()
        comm.rank, comm.size = rank, 2
        common, mine = checkpoint.load(ck, comm)
        assert common["loop"]["iteration"] == 6 and "scheme" in mine
