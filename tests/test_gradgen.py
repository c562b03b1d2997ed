"""The synthetic gradient generator: seeded windows of a pool shorter than the vector.

The pool is what the generator holds besides the gradient buffer it writes, so its length is bounded by the largest
layer (not the vector's length) and every step is a deterministic function of (seed, rank, step).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from mpisparse.backend.fusion import FusionLayout
from mpisparse.bench.gradgen import POOL_MIN, SyntheticGradients, default_pool_size
from mpisparse.models.shapes import layer_shapes


def reference(gen: SyntheticGradients, iteration: int) -> np.ndarray:
    """The gradient written out element by element: each layer is two wrapped windows of the pool, scaled."""
    shared, private = gen.offsets(iteration)
    m = gen.pool.shape[0]
    parts = []
    for i, s in enumerate(gen.layout.layers):
        j = np.arange(s.size)
        parts.append((gen.pool[(shared[i] + j) % m] + gen.pool[(private[i] + j) % m]) * gen.layer_scale[i])
    return np.concatenate(parts).astype(np.float32)


def test_fill_is_the_wrapped_windows_of_the_pool_and_writes_every_element():
    lay = FusionLayout([("a", (7, 13)), ("b", (250,)), ("c", (3,))])
    gen = SyntheticGradients(lay, 1, seed=4, pool_size=40)  # layers longer than the pool: windows wrap (twice for b)
    out = np.full(lay.n, np.nan, dtype=np.float32)
    gen.fill(out, 3)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, reference(gen, 3))


def test_same_seed_rank_and_step_give_the_same_gradient_whatever_the_buffer_held():
    lay = FusionLayout([("a", (1000,)), ("b", (30, 100))])
    first = SyntheticGradients(lay, 2, seed=9).fill(np.zeros(lay.n, np.float32), 7)
    again = SyntheticGradients(lay, 2, seed=9).fill(np.full(lay.n, 5.0, np.float32), 7)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, SyntheticGradients(lay, 3, seed=9).fill(lay.empty(), 7))  # another rank
    assert not np.array_equal(first, SyntheticGradients(lay, 2, seed=10).fill(lay.empty(), 7))  # another seed


def test_pool_is_as_long_as_the_largest_layer_not_the_vector():
    many_small = FusionLayout([(f"l{i}", (1000,)) for i in range(5000)])  # 5 M elements in small layers
    assert default_pool_size(many_small) == POOL_MIN
    one_large = FusionLayout([("big", (3_000_000,)), ("small", (2_000_000,))])
    assert default_pool_size(one_large) == 3_000_000
    short = FusionLayout([("a", (100,))])
    assert default_pool_size(short) == 100  # never longer than the vector
    resnet50 = FusionLayout(layer_shapes("resnet50"))
    gen = SyntheticGradients(resnet50, 0)
    assert gen.pool.shape[0] == max(s.size for s in resnet50.layers) < resnet50.n // 10
    assert gen.pool.dtype == np.float32


@pytest.mark.parametrize("size", [0, -1, 101])
def test_pool_size_out_of_range_is_refused(size):
    lay = FusionLayout([("a", (100,))])
    with pytest.raises(ValueError, match=rf"pool_size {size} must be in \[1, 100\]"):
        SyntheticGradients(lay, 0, pool_size=size)


@pytest.mark.mpi  # a singleton MPI process
def test_bench_step_path_imports_no_torch():
    """``bench step`` on synthetic gradients runs without torch in the process (about 190 MB per rank)."""
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from mpisparse.cli import cli\n"
            "r = CliRunner().invoke(cli, ['bench', 'step', '--model', 'ncf', '--scheme', 'topk', '--iters', '1',\n"
            "                             '--warmup', '0', '--no-progress'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
