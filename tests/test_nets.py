"""Trainable models (one process, CPU, small inputs)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpisparse.data import lm_batches, load_dataset
from mpisparse.models.nets import NETS, build_model, detach_hidden, is_lm, needs_image


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _train_steps(model, x, y, steps, lr, momentum=0.9):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_registry_and_errors():
    assert NETS == {"mlp", "cnn", "resnet18", "lstm", "gpt", "dlrm", "ncf"}
    assert [needs_image(n) for n in ("mlp", "cnn", "resnet18", "lstm", "gpt")] == [False, True, True, False, False]
    assert [is_lm(n) for n in ("mlp", "cnn", "resnet18", "lstm", "gpt")] == [False, False, False, True, True]
    with pytest.raises(ValueError, match=r"unknown model 'x'; choose one of: cnn, dlrm, gpt, lstm, mlp, ncf, resnet18"):
        build_model("x", input_shape=(64,), num_classes=10)
    with pytest.raises(ValueError, match="unknown model"):
        needs_image("x")
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        build_model("cnn", input_shape=(64,), num_classes=10)
    with pytest.raises(ValueError, match="language model"):
        build_model("lstm", input_shape=(64,), num_classes=10)
    with pytest.raises(ValueError, match="classifier"):
        build_model("mlp", input_shape=(), num_classes=10)


@pytest.mark.parametrize("name,shape", [("mlp", (64,)), ("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)),
                                        ("cnn", (3, 32, 32)), ("resnet18", (3, 32, 32)),
                                        ("resnet18", (1, 8, 8))])
def test_classifier_forward_shapes(name, shape):
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=7)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7) and torch.isfinite(out).all()


def test_parameter_counts():
    # mlp: 64*128+128 + 128*128+128 + 128*10+10
    assert n_params(build_model("mlp", input_shape=(64,), num_classes=10)) == 26_122
    assert n_params(build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=32)) == (
        64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10)
    # cnn: conv(C,32) + conv(32,64) + conv(64,64) + fc(64,10)
    tail = 32 * 64 * 9 + 64 + 64 * 64 * 9 + 64 + 64 * 10 + 10
    assert n_params(build_model("cnn", input_shape=(1, 8, 8), num_classes=10)) == 1 * 32 * 9 + 32 + tail
    assert n_params(build_model("cnn", input_shape=(3, 32, 32), num_classes=10)) == 3 * 32 * 9 + 32 + tail
    assert n_params(build_model("resnet18", input_shape=(3, 32, 32), num_classes=10)) == 11_173_962
    # lstm: embedding + 2 LSTM layers (4 gates, two biases) + decoder
    v, e, h = 50, 200, 200
    lstm = 4 * h * (e + h) + 8 * h + 4 * h * (h + h) + 8 * h
    assert n_params(build_model("lstm", input_shape=(), num_classes=v)) == v * e + lstm + h * v + v
    assert n_params(build_model("lstm", input_shape=(), num_classes=v, emb=16, hidden=8)) == (
        v * 16 + 4 * 8 * (16 + 8) + 64 + 4 * 8 * 16 + 64 + 8 * v + v)


def test_cnn_has_no_batchnorm_or_dropout():
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    kinds = {type(m) for m in model.modules()}
    assert not kinds & {nn.BatchNorm2d, nn.Dropout}
    assert len(list(model.buffers())) == 0


@pytest.mark.parametrize("name,shape", [("mlp", (64,)), ("cnn", (1, 8, 8)), ("resnet18", (3, 8, 8)),
                                        ("lstm", ())])
def test_deterministic_init(name, shape):
    def params():
        torch.manual_seed(123)
        return [p.detach().clone() for p in build_model(name, input_shape=shape, num_classes=10).parameters()]
    a, b = params(), params()
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    torch.manual_seed(124)
    c = list(build_model(name, input_shape=shape, num_classes=10).parameters())
    assert not all(torch.equal(p, q) for p, q in zip(a, c))


def test_mlp_learns_digits():
    ds = load_dataset("digits", seed=0)
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=ds.input_shape, num_classes=ds.num_classes)
    losses = _train_steps(model, ds.train_x, ds.train_y, steps=60, lr=0.1)
    assert losses[-1] < 0.5 * losses[0]
    with torch.no_grad():
        train_acc = (model(ds.train_x).argmax(1) == ds.train_y).float().mean().item()
        test_acc = (model(ds.test_x).argmax(1) == ds.test_y).float().mean().item()
    assert train_acc > 0.9 and test_acc > 0.88


def test_cnn_learns_digits_images():
    ds = load_dataset("digits", seed=0, image=True)
    torch.manual_seed(0)
    model = build_model("cnn", input_shape=ds.input_shape, num_classes=ds.num_classes)
    losses = _train_steps(model, ds.train_x[:64], ds.train_y[:64], steps=30, lr=0.1)
    assert losses[-1] < 0.85 * losses[0]


def test_resnet18_trains_on_tiny_batch():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 8, 8)
    y = torch.arange(8) % 4
    model = build_model("resnet18", input_shape=(3, 8, 8), num_classes=4)
    model.train()
    losses = _train_steps(model, x, y, steps=5, lr=0.01, momentum=0.0)
    assert losses[-1] < 0.5 * losses[0]


def test_lstm_forward_hidden_and_training():
    torch.manual_seed(0)
    vocab, batch, bptt = 20, 4, 6
    model = build_model("lstm", input_shape=(), num_classes=vocab, emb=32, hidden=32)
    h = model.init_hidden(batch)
    assert [t.shape for t in h] == [(2, batch, 32), (2, batch, 32)]
    x = torch.randint(0, vocab, (bptt, batch))
    logits, h2 = model(x)
    assert logits.shape == (bptt, batch, vocab)
    logits_h, _ = model(x, h)  # zero state == no state
    assert torch.allclose(logits, logits_h)
    assert h2[0].requires_grad and not any(t.requires_grad for t in detach_hidden(h2))
    assert model.detach_hidden is detach_hidden

    # a periodic token stream is learnable: loss falls over a few truncated-BPTT passes
    stream = torch.arange(300) % 7
    pairs = lm_batches(stream, batch, bptt)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    epoch_loss = []
    for _ in range(8):
        hidden, total = model.init_hidden(batch), 0.0
        for xb, yb in pairs:
            hidden = detach_hidden(hidden)
            opt.zero_grad()
            out, hidden = model(xb, hidden)
            loss = nn.functional.cross_entropy(out.reshape(-1, vocab), yb.reshape(-1))
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            total += loss.item()
        epoch_loss.append(total / len(pairs))
    assert epoch_loss[-1] < 0.5 * epoch_loss[0]


def test_lstm_dropout_option():
    model = build_model("lstm", input_shape=(), num_classes=10, dropout=0.3)
    assert model.rnn.dropout == 0.3 and model.drop.p == 0.3
    assert build_model("lstm", input_shape=(), num_classes=10).drop.p == 0.0
