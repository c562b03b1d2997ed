"""``bench step --torch-peer``: the plain-PyTorch top-k step computes the toolkit's update (CPU tensors here;
on a GPU ``bin/gpu-check`` runs it with ``--device cuda``), and its table sits beside the toolkit's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import SelfComm
from mpisparse.bench import torch_peer
from mpisparse.results.timing import PhaseTimer

torch = pytest.importorskip("torch")


def test_the_peer_step_is_top_k_with_error_feedback():
    rng = np.random.default_rng(0)
    n, k, steps = 5000, 37, 3
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]
    timer = PhaseTimer()
    peer = torch_peer.TorchTopkPeer(SelfComm(), n, k, "cpu", timer)
    for g in grads:
        with timer.step():
            out = peer.step(torch.from_numpy(g))
    want_out, want_e = torch_peer.numpy_reference(grads, k, steps)
    np.testing.assert_array_equal(out.numpy(), want_out)
    np.testing.assert_array_equal(peer.e.numpy(), want_e)
    assert peer.last_gathered.dtype == np.int32 and peer.last_gathered.size == k
    assert set(timer.means()) == {"compensate", "select", "exchange_indices", "exchange_values", "update", "step"}


def test_the_table_puts_the_peer_beside_the_toolkit():
    def res(name, step, sel):
        return SimpleNamespace(scheme=name, step_seconds=step, phases={"select": sel, "compensate": 0.001})

    text = torch_peer.format_peer_table([res("dense", 1.0, 0.0), res("topk", 0.004, 0.002),
                                         res(torch_peer.NAME, 0.010, 0.008)])
    lines = text.splitlines()
    assert lines[0].split()[-2:] == ["topk", torch_peer.NAME]
    assert any(line.startswith("select") and line.split()[-2:] == ["2.000", "8.000"] for line in lines)
    assert lines[-1] == "plain PyTorch step / toolkit step: 2.50x"
    assert torch_peer.format_peer_table([res("topk", 0.004, 0.002)]) == ""


def test_bench_step_offers_the_peer():
    from mpisparse.cli.bench import bench_step

    assert any(p.name == "torch_peer" for p in bench_step.params)
