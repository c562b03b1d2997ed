"""Faults of data files: a corrupt CIFAR-10 batch or text corpus is one line that names the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

#: MPI here is one process at a time (a command without ``-n``): the unit lane (tests/conftest.py lane_of)
ONE_PROCESS_MPI = True

ROOT = Path(__file__).resolve().parents[2]
RECORD = 1 + 3 * 32 * 32


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpisparse", "train", "--epochs", "1", *args], capture_output=True,
                          text=True, timeout=150, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


def _cifar_batch(path: Path, n: int, label: int = 3) -> None:
    rec = np.zeros((n, RECORD), np.uint8)
    rec[:, 0] = label
    rec[:, 1:] = np.arange(RECORD - 1, dtype=np.uint8)
    rec.tofile(path)


@pytest.mark.timeout(180)
def test_a_truncated_cifar_batch_is_named(tmp_path):
    _cifar_batch(tmp_path / "test_batch.bin", 4)
    _cifar_batch(tmp_path / "data_batch_1.bin", 8)
    bad = tmp_path / "data_batch_1.bin"
    bad.write_bytes(bad.read_bytes()[:-100])
    line = _one_error_line(_train("--model", "mlp", "--data", "cifar10", "--data-dir", str(tmp_path)))
    assert f"CIFAR-10 batch file {bad}: size" in line and "truncated" in line


@pytest.mark.timeout(180)
def test_a_cifar_batch_with_a_bad_label_is_named(tmp_path):
    _cifar_batch(tmp_path / "data_batch_1.bin", 8)
    _cifar_batch(tmp_path / "test_batch.bin", 4, label=200)
    line = _one_error_line(_train("--model", "mlp", "--data", "cifar10", "--data-dir", str(tmp_path)))
    assert f"CIFAR-10 batch file {tmp_path / 'test_batch.bin'}: record 0 has label byte 200" in line


@pytest.mark.timeout(180)
def test_a_binary_text_corpus_is_named(tmp_path):
    (tmp_path / "train.txt").write_text("the cat sat on the mat\n" * 50)
    (tmp_path / "test.txt").write_bytes(b"the cat\n\xff\xfe\x00binary\n")
    line = _one_error_line(_train("--model", "lstm", "--data", "text", "--data-dir", str(tmp_path)))
    assert f"text corpus file {tmp_path / 'test.txt'} is not UTF-8 text" in line


@pytest.mark.timeout(180)
def test_an_empty_training_text_is_named(tmp_path):
    (tmp_path / "train.txt").write_text("\n\n")
    (tmp_path / "test.txt").write_text("the cat\n")
    line = _one_error_line(_train("--model", "lstm", "--data", "text", "--data-dir", str(tmp_path)))
    assert f"text corpus file {tmp_path / 'train.txt'} holds no words" in line
