"""The ``gpt`` language model and the ``pydoc`` text it trains on by default (one process, CPU, no MPI)."""

from __future__ import annotations

import math
import socket

import pytest
import torch
import torch.nn.functional as F

from mpisparse.data import lm_batches, load_dataset
from mpisparse.models.gpt import GPT, check_gpt_size, gpt_num_params
from mpisparse.models.nets import bench_net, build_model, is_lm
from mpisparse.models.shapes import layer_shapes, num_params


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny(vocab=50, **kw):
    torch.manual_seed(0)
    model = GPT(vocab, **{"context": 16, "width": 32, "layers": 2, "heads": 4, **kw})
    model.eval()
    return model


def test_a_token_changes_no_logit_before_it():
    model = _tiny()
    x = torch.randint(0, 50, (12, 3), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[7, 1] = (x[7, 1] + 1) % 50
    with torch.no_grad():
        a, ha = model(x)
        b, _ = model(y)
    assert a.shape == (12, 3, 50) and ha is None
    torch.testing.assert_close(a[:7], b[:7], rtol=0, atol=1e-6)  # positions before t = 7: unchanged
    torch.testing.assert_close(a[:, [0, 2]], b[:, [0, 2]], rtol=0, atol=1e-6)  # the other sequences: unchanged
    assert (a[7:, 1] - b[7:, 1]).abs().amax(dim=-1).min() > 1e-4  # t and every position after it: changed


def test_the_head_is_the_token_embedding():
    model = _tiny()
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == ["wte.weight", "wpe.weight"] and names[-2:] == ["ln_f.weight", "ln_f.bias"]
    assert not any("head" in n for n in names)  # no tensor of its own
    x = torch.randint(0, 40, (10, 2), generator=torch.Generator().manual_seed(2))  # token 45 is not in the input
    with torch.no_grad():
        before, _ = model(x)
        model.wte.weight[45] += torch.randn(32, generator=torch.Generator().manual_seed(3))
        after, _ = model(x)
    changed = (after - before).abs().amax(dim=(0, 1))
    assert changed[45] > 1e-3 and changed[torch.arange(50) != 45].max() == 0  # only token 45's logit moved


@pytest.mark.parametrize("vocab, context, width, layers, heads", [(50, 16, 32, 2, 4), (256, 64, 64, 2, 4),
                                                                  (7, 3, 12, 1, 3)])
def test_parameter_count_formula(vocab, context, width, layers, heads):
    torch.manual_seed(0)
    model = GPT(vocab, context=context, width=width, layers=layers, heads=heads)
    assert sum(p.numel() for p in model.parameters()) == gpt_num_params(vocab=vocab, context=context, width=width,
                                                                       layers=layers)


def test_gpt2_small_shapes_are_the_torch_module_of_the_same_size():
    """``gpt2-small`` (shapes.py) against the trainable module of GPT-2 small's sizes, built on the meta device
    (no memory, no time): the same tensors in the same order, the Conv1D weights transposed."""
    with torch.device("meta"):
        model = GPT(50257, context=1024, width=768, layers=12, heads=12)
    mine = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    listed = layer_shapes("gpt2-small")
    assert [n for n, _ in mine] == [n for n, _ in listed]
    for (name, shape), (_, gpt2) in zip(mine, listed):
        conv1d = name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        assert shape == (gpt2[::-1] if conv1d else gpt2), name
    assert num_params("gpt2-small") == gpt_num_params(vocab=50257, context=1024, width=768, layers=12) \
        == 124_439_808


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="gpt width 30 is not divisible by heads 4"):
        check_gpt_size(vocab=10, context=8, width=30, layers=1, heads=4)
    with pytest.raises(ValueError, match="gpt layers is 0; allowed: an integer >= 1"):
        GPT(10, layers=0)
    with pytest.raises(ValueError, match="a window of 9 tokens is longer than the model's context 8"):
        GPT(10, context=8, width=8, heads=2)(torch.zeros(9, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="'gpt' is a language model"):
        build_model("gpt", input_shape=(64,), num_classes=10)
    assert is_lm("gpt") and isinstance(build_model("gpt", input_shape=(), num_classes=256), GPT)


def test_pydoc_is_cpythons_own_text_split_at_the_end_without_a_download(monkeypatch):
    def no_network(*a, **kw):
        raise AssertionError("the pydoc data set must not touch the network")

    monkeypatch.setattr(socket, "socket", no_network)
    from pydoc_data.topics import topics

    a, b = load_dataset("pydoc"), load_dataset("pydoc", seed=5)
    raw = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    whole = torch.cat([a.train_x, a.test_x])
    assert a.kind == "lm" and a.num_classes == 256 and a.input_shape == () and a.train_y is None
    assert bytes(whole.to(torch.uint8).tolist()) == raw  # every byte a token, in order
    assert a.test_x.numel() == round(0.1 * len(raw)) and a.meta["held_out_bytes"] == a.test_x.numel()
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_x, b.test_x)  # deterministic, seed-free
    assert a.train_x.dtype == torch.int64 and int(whole.min()) >= 0 and int(whole.max()) < 256


def test_gpt_and_lstm_take_a_word_level_text_corpus_too(tmp_path):
    """--data text --data-dir: the vocabulary (and so the embedding and the tied head) from the files."""
    from mpisparse.config import TrainConfig
    from mpisparse.train.loop import seeded_setup

    for name, text in (("train.txt", "the cat sat on the mat\nthe dog sat\n" * 20), ("test.txt", "the cat sat\n")):
        (tmp_path / name).write_text(text)
    with torch.random.fork_rng():
        for model in ("gpt", "lstm"):
            cfg = TrainConfig(model=model, data="text", data_dir=str(tmp_path), gpt_context=8)
            lm, ds, net = seeded_setup(cfg)
            assert lm and ds.num_classes == 8  # 6 words, <eos>, <unk>
            x, y = lm_batches(ds.train_x, 2, cfg.seq_len)[0]
            out, _ = net(x)
            assert x.shape[0] == cfg.seq_len == (8 if model == "gpt" else 35)  # gpt: --gpt-context, lstm: --bptt
            assert out.shape == (*x.shape, 8)
    torch.set_num_threads(1)


def test_a_step_on_pydoc_windows_and_the_bench_net():
    ds = load_dataset("pydoc")
    model = build_model("gpt", input_shape=(), num_classes=ds.num_classes, context=32, width=32, heads=2)
    x, y = lm_batches(ds.train_x, 4, 32)[0]
    out, _ = model(x)
    loss = F.cross_entropy(out.reshape(-1, 256), y.reshape(-1))
    assert out.shape == (32, 4, 256) and abs(loss.item() - math.log(256)) < 0.5  # near uniform at the start
    loss.backward()
    assert model.wte.weight.grad is not None and model.wpe.weight.grad.abs().sum() > 0
    for name in ("gpt", "lstm", "mlp"):
        torch.manual_seed(0)
        net, bx, by = bench_net(name, 3, generator=torch.Generator().manual_seed(1))
        F.cross_entropy(net(bx), by).backward()
        assert by.shape == ((3 * 64,) if name != "mlp" else (3,))
