"""``bench step --gradients model``: gradients from real backward passes (``mpisparse/bench/model_grads.py``)."""

from __future__ import annotations

import json

import pytest

from conftest import mpi_run
from mpisparse.config import BenchConfig
from mpisparse.runtimes import validate

def test_gradients_model_is_checked():
    with pytest.raises(ValueError, match="--gradients model needs a --model with a trainable net; --model is "
                                         "'resnet50', allowed: resnet18"):
        validate(BenchConfig(model="resnet50", gradients="model"), 2)
    with pytest.raises(ValueError, match="--gradients"):
        validate(BenchConfig(gradients="drawn"), 2)


def test_gradients_model_trains_on_real_backward_passes(tmp_path):
    """Two ranks, real ResNet-18 gradients: the ranks' top-k sets differ (build-up), DEFT's do not."""
    args = ["bench", "step", "--model", "resnet18", "--scheme", "topk", "--scheme", "deft", "--density", "0.01",
            "--gradients", "model", "--iters", "2", "--warmup", "0", "--json", str(tmp_path / "r.json")]
    mpi_run(2, args, module=True)
    topk, deft = json.loads((tmp_path / "r.json").read_text())
    assert topk["config"]["gradients"] == "model" and topk["n"] == 11_172_810  # CIFAR-style ResNet-18, 1 input channel
    assert 0.01 < topk["density_actual"] <= 0.02 + 1e-6
    assert deft["density_actual"] == pytest.approx(0.01, rel=0.05)
