"""Trainable PyTorch models for the training front end.

* ``mlp`` -- flatten -> Linear(in, 128) -> ReLU -> Linear(128, 128) -> ReLU
  -> Linear(128, classes) (``hidden`` sets the width).  Any input shape.
* ``cnn`` -- a small convolutional net for ``(C, H, W)`` inputs of 8x8
  (digits) up to 32x32 (CIFAR-10): conv3x3(C, 32) + ReLU, conv3x3(32, 64) +
  ReLU, maxpool 2, conv3x3(64, 64) + ReLU, global average pool,
  Linear(64, classes).  Deliberately without BatchNorm (and dropout): it has
  no running statistics, so the model state is a function of the parameters
  alone and data-parallel runs reproduce a one-process run exactly.
* ``resnet18`` -- the CIFAR-style ResNet-18 (He et al., 2016): 3x3 stem
  convolution, no max pool, four stages of two BasicBlocks with 64, 128, 256,
  512 channels (strides 1, 2, 2, 2; 1x1 conv + BatchNorm projection
  shortcuts), BatchNorm, global average pool, fc.  11,173,962 parameters for
  3 input channels and 10 classes; 32x32 inputs end at 4x4, 8x8 at 1x1.
* ``dlrm`` -- DLRM as in the DCT paper, Sec. 3.1: bottom MLP (FC + ReLU,
  512-256-64-16), embedding tables (``tables``: rows of each; ``dim``) and the
  dot interaction, top MLP (512-256-128-1), a click logit; without ``tables``
  its dense part (top MLP to ``classes``), see :mod:`mpisparse.models.dlrm`
  (``bottom``/``top`` set the widths).
* ``ncf`` -- NeuMF (He et al., 2017): GMF and MLP towers over user and item
  embeddings (``tables = [users, items]``, ``dim``), :mod:`mpisparse.models.ncf`.
* ``lstm`` -- word language model: Embedding(vocab, 200) -> 2-layer LSTM
  (200 units) -> Linear(200, vocab); ``forward(x, hidden=None)`` returns
  ``(logits (bptt, batch, vocab), hidden)``.  ``num_classes`` is the vocabulary size.
* ``gpt`` -- decoder-only transformer language model in GPT-2's layout (token and
  position embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a
  head tied to the token embedding), :mod:`mpisparse.models.gpt`; ``context``,
  ``width``, ``layers``, ``heads`` set its size (default 64, 64, 2, 4); the same
  ``forward(x, hidden=None) -> (logits, None)`` as ``lstm``.

:func:`bench_net` builds any of them with one random batch, for the step-timing
benchmarks (``bench overlap``, ``advise-steps``).

All initialisation goes through torch's global generator, so a model is
reproducible given ``torch.manual_seed``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .dlrm import DLRM
from .gpt import GPT
from .ncf import NCF

__all__ = ["NETS", "build_model", "bench_net", "needs_image", "is_lm", "MLP", "SmallCNN", "ResNet18",
           "BasicBlock", "LSTMLM", "GPT", "DLRM", "NCF", "FlatLM", "detach_hidden"]

NETS = {"mlp", "cnn", "resnet18", "lstm", "gpt", "dlrm", "ncf"}
_IMAGE_NETS = {"cnn", "resnet18"}
_LM_NETS = {"lstm", "gpt"}


def _check(name: str) -> None:
    if name not in NETS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(sorted(NETS))}")


def needs_image(name: str) -> bool:
    """True for models that take ``(C, H, W)`` inputs (load the dataset with ``image=True``)."""
    _check(name)
    return name in _IMAGE_NETS


def is_lm(name: str) -> bool:
    """True for language models (token streams, ``forward(x, hidden)``)."""
    _check(name)
    return name in _LM_NETS


# --------------------------------------------------------------------------- MLP / CNN

class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    """No BatchNorm, no dropout: see the module docstring."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


# --------------------------------------------------------------------------- ResNet-18

class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        else:
            self.shortcut = nn.Sequential()

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride),
                                        BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(torch.flatten(self.pool(out), 1))


# --------------------------------------------------------------------------- LSTM LM

def detach_hidden(h):
    """Cut the autograd history of an LSTM state (a tensor or nested tuple of tensors),
    for truncated back-propagation through time between ``bptt`` windows."""
    if h is None:
        return None
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(detach_hidden(v) for v in h)


class LSTMLM(nn.Module):
    """Embedding -> multi-layer LSTM -> Linear decoder over the vocabulary.

    Inputs are ``(bptt, batch)`` int64 token ids (sequence-first, as laid
    out by :func:`mpisparse.data.lm_batches`).  Embedding and decoder weights
    are initialised uniform in [-0.1, 0.1] and the decoder bias at 0, as in
    the usual word-LM recipe; the LSTM keeps torch's default init.
    """

    def __init__(self, vocab: int, emb: int = 200, hidden: int = 200, layers: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        self.vocab, self.hidden_size, self.num_layers = vocab, hidden, layers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, num_layers=layers, dropout=dropout if layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def init_hidden(self, batch: int):
        """Zero ``(h, c)``, each ``(layers, batch, hidden)``, on the model's device and dtype."""
        w = self.decoder.weight
        shape = (self.num_layers, batch, self.hidden_size)
        return (w.new_zeros(shape), w.new_zeros(shape))

    detach_hidden = staticmethod(detach_hidden)

    def forward(self, x, hidden=None):
        emb = self.drop(self.encoder(x))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden


# --------------------------------------------------------------------------- factory

def build_model(name: str, *, input_shape: tuple, num_classes: int, **kw) -> nn.Module:
    """Build model ``name`` for samples of ``input_shape`` and ``num_classes`` outputs.

    Keywords: ``mlp``: ``hidden=128``; ``dlrm``: ``bottom``, ``top``, ``tables``, ``dim``, ``sparse``; ``ncf``:
    ``tables`` (``[users, items]``, required), ``dim``, ``sparse``; ``lstm``: ``emb=200``, ``hidden=200``,
    ``layers=2``, ``dropout=0.0``; ``gpt``: ``context=64``, ``width=64``, ``layers=2``, ``heads=4``;
    ``cnn`` and ``resnet18`` take none.
    Image models need ``input_shape == (C, H, W)``; the language models
    (``lstm``, ``gpt``) need ``input_shape == ()`` (a token stream) and take
    ``num_classes`` as the vocabulary size.
    """
    _check(name)
    input_shape = tuple(input_shape)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if name in _LM_NETS:
        if input_shape != ():
            raise ValueError(f"model {name!r} is a language model: it needs a token-stream dataset "
                             f"(input_shape ()), got input_shape {input_shape}")
        return LSTMLM(num_classes, **kw) if name == "lstm" else GPT(num_classes, **kw)
    if input_shape == ():
        raise ValueError(f"model {name!r} is a classifier: it cannot take a token-stream dataset")
    if name == "mlp":
        return MLP(math.prod(input_shape), num_classes, **kw)
    if name == "dlrm":
        return DLRM(math.prod(input_shape), num_classes, **kw)
    if name == "ncf":
        tables = kw.pop("tables", None)
        if tables is None or len(tables) != 2 or input_shape != (2,):
            raise ValueError(f"model 'ncf' needs (user, item) inputs and tables=[users, items]; got input_shape "
                             f"{input_shape}, tables {tables}: train it on --data ratings or movielens")
        return NCF(*tables, **kw)
    if len(input_shape) != 3:
        raise ValueError(f"model {name!r} needs (C, H, W) inputs, got input_shape {input_shape}; "
                         f"load the dataset with image=True")
    if kw:
        raise TypeError(f"model {name!r} takes no options, got {', '.join(sorted(kw))}")
    if name == "cnn":
        return SmallCNN(input_shape[0], num_classes)
    return ResNet18(input_shape[0], num_classes)


# --------------------------------------------------------------------------- benchmark nets

class FlatLM(nn.Module):
    """A language model seen as a classifier of tokens: ``forward(x)`` returns the logits flattened to
    ``(T * batch, vocab)``, so that ``cross_entropy(net(x), y.reshape(-1))`` is its loss."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, x):
        out, _ = self.lm(x)
        return out.reshape(-1, out.shape[-1])


def bench_net(name: str, batch: int, *, generator: torch.Generator, input_shape: tuple = (3, 32, 32),
              num_classes: int = 10, vocab: int = 256, seq_len: int = 64) -> tuple[nn.Module, torch.Tensor,
                                                                                   torch.Tensor]:
    """Net ``name`` and one random batch ``(net, x, y)`` for the step-timing benchmarks: the loss of a step is
    ``cross_entropy(net(x), y)`` for every model.

    Classifiers take ``batch`` samples of ``input_shape`` (normal) with labels in ``[0, num_classes)``;
    ``dlrm`` and ``ncf`` the tables of the generated click and rating data (dense, 1,000 rows each) and a batch
    of random ids (and normal dense features) with random clicks;
    the language models (``lstm``, ``gpt`` at their default sizes, ``vocab`` tokens: 256, the byte
    vocabulary of the ``pydoc`` text) take ``batch`` windows of ``seq_len`` random tokens, each target the
    next token, wrapped in :class:`FlatLM`.  The net's parameters come from torch's global generator (seed
    it first), the batch from ``generator``.
    """
    _check(name)
    if name in ("dlrm", "ncf"):  # dense tables (sparse=False): the benchmarks' gradient is one dense vector
        from ..data.recsys import DEFAULT_ROWS, DEFAULT_TABLES, DENSE_FEATURES

        tables = [DEFAULT_ROWS] * (DEFAULT_TABLES if name == "dlrm" else 2)
        ids = torch.randint(0, DEFAULT_ROWS, (batch, len(tables)), generator=generator).float()
        x = torch.cat([torch.randn(batch, DENSE_FEATURES, generator=generator), ids], 1) if name == "dlrm" else ids
        net = build_model(name, input_shape=(x.shape[1],), num_classes=2, tables=tables)
        return net, x, torch.randint(0, 2, (batch,), generator=generator)
    if name in _LM_NETS:
        net = FlatLM(build_model(name, input_shape=(), num_classes=vocab))
        stream = torch.randint(0, vocab, (seq_len + 1, batch), generator=generator)
        return net, stream[:-1], stream[1:].reshape(-1)
    net = build_model(name, input_shape=input_shape, num_classes=num_classes)
    x = torch.randn(batch, *input_shape, generator=generator)
    y = torch.randint(0, num_classes, (batch,), generator=generator)
    return net, x, y
