"""The Horovod-shaped examples run under MPI on 2 ranks (dense and DEFT) and end with equal parameters."""

import re

import pytest

from conftest import HERE, mpi_run


def _checksums(out: str) -> dict[int, str]:
    # the two ranks' lines can interleave on the shared stdout: match the numbers, not whole lines
    num = r"[-+0-9.e]+"
    return {int(r): f"{a} {b}" for r, a, b in re.findall(rf"rank (\d+) checksum ({num}) ({num})", out)}


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script,args", [
    ("pytorch_mnist.py", ["--epochs", "1"]),
    # each example's other form (the default suite runs one of each; extended: CI runs these)
    pytest.param("pytorch_mnist.py", ["--epochs", "1", "--scheme", "deft", "--density", "0.1"],
                 marks=pytest.mark.extended),
    pytest.param("pytorch_synthetic_benchmark.py", ["--num-iters", "1", "--num-batches-per-iter", "2"],
                 marks=pytest.mark.extended),
    ("pytorch_synthetic_benchmark.py", ["--num-iters", "1", "--num-batches-per-iter", "2", "--scheme", "deft",
                                        "--density", "0.05", "--fp16-allreduce"]),
])
def test_example_runs_and_ranks_agree(script, args):
    out = mpi_run(2, [str(HERE.parent / "examples" / script), *args, "--checksum"], timeout=120).stdout
    sums = _checksums(out)
    assert set(sums) == {0, 1}, out[-2000:]
    assert sums[0] == sums[1], sums
