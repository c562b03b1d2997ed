"""``--hierarchical``: two-level collectives equal to the flat ones (``mpisparse/mpi/hierarchy.py``)."""

from __future__ import annotations

import json

import pytest

from conftest import NUMPY_CASES, bench_step, mpi_run, rank_case
from mpisparse.config import BenchConfig
from mpisparse.mpi.hierarchy import host_colors
from mpisparse.runtimes import validate


def test_host_colors_by_name_and_by_count():
    assert host_colors(["b", "a", "b", "c"]) == [0, 1, 0, 2]
    assert host_colors(["x"] * 5, ranks_per_host=2) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="MPISPARSE_RANKS_PER_HOST=0"):
        host_colors(["x"], ranks_per_host=0)


def test_gtopk_refuses_hierarchical():
    with pytest.raises(ValueError, match="--hierarchical does not apply to scheme 'gtopk'.*allowed: .*cltk"):
        validate(BenchConfig(scheme="gtopk", hierarchical=True), 4)
    validate(BenchConfig(scheme="cltk", hierarchical=True), 4)


@pytest.mark.parametrize("ranks,grouping", [(1, "one"), (2, "one"), (3, "pairs"), (4, "pairs"), (4, "split")])
def test_two_level_collectives_and_schemes_match_flat(ranks, grouping):
    rank_case(("hierarchy", grouping), ranks, family=NUMPY_CASES)


def test_bench_step_hierarchical_reports_cross_host_bytes(tmp_path):
    """4 ranks as 2 emulated hosts: dense sends each host's vector across once (leaders' Allreduce of 2)."""
    args = ["bench", "step", "--model", "ncf", "--scheme", "dense", "--iters", "2", "--warmup", "0"]
    flat = bench_step(4, tmp_path, "--scheme", "dense", "--iters", "2", "--warmup", "0", name="flat")
    mpi_run(4, [*args, "--hierarchical", "--json", str(tmp_path / "two.json")], module=True,
            env={"MPISPARSE_RANKS_PER_HOST": "2"})
    two = json.loads((tmp_path / "two.json").read_text())
    assert "hierarchy" not in flat
    h = two["hierarchy"]
    assert h["hosts"] == 2 and h["ranks_per_host"] == [2, 2]
    nbytes = 4 * two["n"]
    # two leaders, a ring Allreduce of 2: each sends the vector once
    assert h["cross_host_bytes_per_step"] == pytest.approx(2 * nbytes)

