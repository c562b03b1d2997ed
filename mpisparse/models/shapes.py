"""Parameter-tensor shapes of the models used in the benchmarks.

Each builder returns ``[(name, shape), ...]`` in the order in which PyTorch's
``model.named_parameters()`` lists them for the corresponding module, so that a
benchmark can create gradient buffers shaped like the real layers without
importing torch (or torchvision) at all.  Only trainable parameters are
listed: BatchNorm running statistics are buffers and are left out.

The architectures follow their publications, with the layer naming of the
usual PyTorch implementations:

* ``resnet18``, ``resnet50`` -- He, Zhang, Ren, Sun, "Deep Residual Learning
  for Image Recognition", CVPR 2016; ImageNet variant (1000 classes), with the
  stride on the 3x3 convolution of the bottleneck ("ResNet v1.5") and a 1x1
  convolution plus BatchNorm as the projection shortcut (``downsample``).
  11,689,512 and 25,557,032 parameters.
* ``vgg16`` -- Simonyan, Zisserman, "Very Deep Convolutional Networks for
  Large-Scale Image Recognition", ICLR 2015; configuration D without batch
  normalisation, 7x7x512 -> 4096 -> 4096 -> 1000 classifier.
  138,357,544 parameters.
* ``lstm-wt2`` -- the 2-layer LSTM word language model of Zaremba, Sutskever,
  Vinyals, "Recurrent Neural Network Regularization" (2014), in its
  "medium" size (650 units), as popularised for WikiText-2 (Merity et al.,
  2017; vocabulary 33,278) with untied encoder and decoder.
  50,065,078 parameters.
* ``bert-base`` -- Devlin, Chang, Lee, Toutanova, "BERT: Pre-training of Deep
  Bidirectional Transformers for Language Understanding", NAACL 2019; the
  uncased base encoder (vocabulary 30,522, hidden 768, 12 layers, 12 heads,
  intermediate 3072, 512 positions, 2 token types) with the pooler and
  HuggingFace-style names.  109,482,240 parameters.
* ``gpt2-small`` -- Radford, Wu, Child, Luan, Amodei, Sutskever, "Language
  Models are Unsupervised Multitask Learners" (2019); the smallest GPT-2
  (vocabulary 50,257, 1,024 positions, width 768, 12 layers, 12 heads, MLP
  3072, output head tied to the token embedding), its tensors named and
  shaped as the reference GPT2Model lists them: ``wte``, ``wpe``, per block
  ``ln_1``, ``attn.c_attn`` (query, key and value fused), ``attn.c_proj``,
  ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``, then ``ln_f``; its projections are
  Conv1D layers, whose weights are stored ``(in, out)`` (the transpose of
  ``nn.Linear``'s).  The trainable ``gpt`` of :mod:`mpisparse.models.gpt` has
  the same names.  124,439,808 parameters.
* ``ncf`` -- He, Liao, Zhang, Nie, Hu, Chua, "Neural Collaborative
  Filtering", WWW 2017; NeuMF on MovieLens-1M (6,040 users, 3,706 items),
  GMF embeddings of size 8, MLP embeddings of size 32 per tower (MLP input
  64), MLP 64 -> 32 -> 16 -> 8 and a predict layer 16 -> 1.
  392,601 parameters.
"""

from __future__ import annotations

import math
from typing import Callable

Shape = tuple[int, ...]
Layers = list[tuple[str, Shape]]

__all__ = ["MODELS", "model_names", "layer_shapes", "num_params"]


# ---------------------------------------------------------------------------
# Small building blocks (each mirrors the parameters of one torch.nn module).
# ---------------------------------------------------------------------------

def _name(prefix: str, leaf: str) -> str:
    return f"{prefix}.{leaf}" if prefix else leaf


def _conv(prefix: str, c_in: int, c_out: int, k: int, bias: bool = False) -> Layers:
    """``nn.Conv2d(c_in, c_out, k)``: weight (c_out, c_in, k, k) [+ bias]."""
    out = [(_name(prefix, "weight"), (c_out, c_in, k, k))]
    if bias:
        out.append((_name(prefix, "bias"), (c_out,)))
    return out


def _norm(prefix: str, n: int) -> Layers:
    """``nn.BatchNorm2d(n)`` or ``nn.LayerNorm(n)``: affine weight and bias."""
    return [(_name(prefix, "weight"), (n,)), (_name(prefix, "bias"), (n,))]


def _linear(prefix: str, n_in: int, n_out: int, bias: bool = True) -> Layers:
    """``nn.Linear(n_in, n_out)``: weight (n_out, n_in) [+ bias]."""
    out = [(_name(prefix, "weight"), (n_out, n_in))]
    if bias:
        out.append((_name(prefix, "bias"), (n_out,)))
    return out


def _embedding(prefix: str, num: int, dim: int) -> Layers:
    """``nn.Embedding(num, dim)``: weight (num, dim)."""
    return [(_name(prefix, "weight"), (num, dim))]


def _lstm(prefix: str, n_in: int, hidden: int, num_layers: int) -> Layers:
    """``nn.LSTM(n_in, hidden, num_layers)``: four gates stacked per matrix."""
    out: Layers = []
    for layer in range(num_layers):
        width = n_in if layer == 0 else hidden
        out += [
            (_name(prefix, f"weight_ih_l{layer}"), (4 * hidden, width)),
            (_name(prefix, f"weight_hh_l{layer}"), (4 * hidden, hidden)),
            (_name(prefix, f"bias_ih_l{layer}"), (4 * hidden,)),
            (_name(prefix, f"bias_hh_l{layer}"), (4 * hidden,)),
        ]
    return out


# ---------------------------------------------------------------------------
# ResNet (He et al. 2016)
# ---------------------------------------------------------------------------

def _basic_block(prefix: str, c_in: int, planes: int, downsample: bool) -> Layers:
    """Two 3x3 convolutions; output width ``planes`` (expansion 1)."""
    out = _conv(f"{prefix}.conv1", c_in, planes, 3) + _norm(f"{prefix}.bn1", planes)
    out += _conv(f"{prefix}.conv2", planes, planes, 3) + _norm(f"{prefix}.bn2", planes)
    if downsample:
        out += _conv(f"{prefix}.downsample.0", c_in, planes, 1)
        out += _norm(f"{prefix}.downsample.1", planes)
    return out


def _bottleneck(prefix: str, c_in: int, planes: int, downsample: bool) -> Layers:
    """1x1 reduce, 3x3, 1x1 expand; output width ``4 * planes``."""
    width = 4 * planes
    out = _conv(f"{prefix}.conv1", c_in, planes, 1) + _norm(f"{prefix}.bn1", planes)
    out += _conv(f"{prefix}.conv2", planes, planes, 3) + _norm(f"{prefix}.bn2", planes)
    out += _conv(f"{prefix}.conv3", planes, width, 1) + _norm(f"{prefix}.bn3", width)
    if downsample:
        out += _conv(f"{prefix}.downsample.0", c_in, width, 1)
        out += _norm(f"{prefix}.downsample.1", width)
    return out


def _resnet(block: Callable[[str, int, int, bool], Layers], expansion: int,
            depths: tuple[int, int, int, int], num_classes: int = 1000) -> Layers:
    out = _conv("conv1", 3, 64, 7) + _norm("bn1", 64)
    c_in = 64
    for stage, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths), start=1):
        for i in range(depth):
            # The first block of a stage needs a projection shortcut whenever
            # the stride (stages 2-4) or the channel count changes.
            needs_proj = i == 0 and (stage > 1 or c_in != planes * expansion)
            out += block(f"layer{stage}.{i}", c_in, planes, needs_proj)
            c_in = planes * expansion
    return out + _linear("fc", c_in, num_classes)


def resnet18() -> Layers:
    return _resnet(_basic_block, 1, (2, 2, 2, 2))


def resnet50() -> Layers:
    return _resnet(_bottleneck, 4, (3, 4, 6, 3))


# ---------------------------------------------------------------------------
# VGG (Simonyan & Zisserman 2015)
# ---------------------------------------------------------------------------

# Configuration D; "M" is a 2x2 max-pool (no parameters, but it takes an index
# in the ``features`` Sequential, as does the ReLU after each convolution).
_VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
              512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(num_classes: int = 1000) -> Layers:
    out: Layers = []
    index, c_in = 0, 3
    for item in _VGG16_CFG:
        if item == "M":
            index += 1
            continue
        out += _conv(f"features.{index}", c_in, int(item), 3, bias=True)
        index += 2  # conv, relu
        c_in = int(item)
    # classifier: Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear
    out += _linear("classifier.0", c_in * 7 * 7, 4096)
    out += _linear("classifier.3", 4096, 4096)
    out += _linear("classifier.6", 4096, num_classes)
    return out


# ---------------------------------------------------------------------------
# LSTM word language model (Zaremba et al. 2014; WikiText-2, Merity et al.)
# ---------------------------------------------------------------------------

def lstm_wt2(vocab: int = 33278, emb: int = 650, hidden: int = 650,
             num_layers: int = 2) -> Layers:
    # Registration order of the usual RNNModel: encoder, rnn, decoder.
    return (_embedding("encoder", vocab, emb)
            + _lstm("rnn", emb, hidden, num_layers)
            + _linear("decoder", hidden, vocab))


# ---------------------------------------------------------------------------
# BERT (Devlin et al. 2019)
# ---------------------------------------------------------------------------

def _bert_layer(prefix: str, hidden: int, intermediate: int) -> Layers:
    attn = f"{prefix}.attention"
    out: Layers = []
    for proj in ("query", "key", "value"):
        out += _linear(f"{attn}.self.{proj}", hidden, hidden)
    out += _linear(f"{attn}.output.dense", hidden, hidden)
    out += _norm(f"{attn}.output.LayerNorm", hidden)
    out += _linear(f"{prefix}.intermediate.dense", hidden, intermediate)
    out += _linear(f"{prefix}.output.dense", intermediate, hidden)
    out += _norm(f"{prefix}.output.LayerNorm", hidden)
    return out


def bert_base(vocab: int = 30522, hidden: int = 768, num_layers: int = 12,
              num_heads: int = 12, intermediate: int = 3072,
              max_positions: int = 512, type_vocab: int = 2) -> Layers:
    if hidden % num_heads:
        raise ValueError("hidden size must be divisible by the number of heads")
    # The heads split the hidden dimension; they add no parameters of their own.
    out = (_embedding("embeddings.word_embeddings", vocab, hidden)
           + _embedding("embeddings.position_embeddings", max_positions, hidden)
           + _embedding("embeddings.token_type_embeddings", type_vocab, hidden)
           + _norm("embeddings.LayerNorm", hidden))
    for i in range(num_layers):
        out += _bert_layer(f"encoder.layer.{i}", hidden, intermediate)
    return out + _linear("pooler.dense", hidden, hidden)


# ---------------------------------------------------------------------------
# GPT-2 (Radford et al. 2019)
# ---------------------------------------------------------------------------

def _conv1d(prefix: str, n_in: int, n_out: int) -> Layers:
    """GPT-2's ``Conv1D(n_out, n_in)``: weight (n_in, n_out), bias (n_out,)."""
    return [(_name(prefix, "weight"), (n_in, n_out)), (_name(prefix, "bias"), (n_out,))]


def gpt2(vocab: int = 50257, context: int = 1024, width: int = 768, num_layers: int = 12,
         num_heads: int = 12) -> Layers:
    if width % num_heads:
        raise ValueError("width must be divisible by the number of heads")
    # The heads split the width; they add no parameters.  The output head is wte (tied): no tensor of its own.
    out = _embedding("wte", vocab, width) + _embedding("wpe", context, width)
    for i in range(num_layers):
        block = f"h.{i}"
        out += _norm(f"{block}.ln_1", width)
        out += _conv1d(f"{block}.attn.c_attn", width, 3 * width) + _conv1d(f"{block}.attn.c_proj", width, width)
        out += _norm(f"{block}.ln_2", width)
        out += _conv1d(f"{block}.mlp.c_fc", width, 4 * width) + _conv1d(f"{block}.mlp.c_proj", 4 * width, width)
    return out + _norm("ln_f", width)


# ---------------------------------------------------------------------------
# NeuMF (He et al. 2017)
# ---------------------------------------------------------------------------

def ncf(num_users: int = 6040, num_items: int = 3706, mf_dim: int = 8,
        mlp_layers: tuple[int, ...] = (64, 32, 16, 8)) -> Layers:
    # Each MLP tower embedding is half of the MLP input (64 -> 32 + 32).
    mlp_emb = mlp_layers[0] // 2
    out = (_embedding("mf_user_embed", num_users, mf_dim)
           + _embedding("mf_item_embed", num_items, mf_dim)
           + _embedding("mlp_user_embed", num_users, mlp_emb)
           + _embedding("mlp_item_embed", num_items, mlp_emb))
    for i, (n_in, n_out) in enumerate(zip(mlp_layers[:-1], mlp_layers[1:])):
        out += _linear(f"mlp.{i}", n_in, n_out)
    return out + _linear("final", mf_dim + mlp_layers[-1], 1)


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

MODELS: dict[str, Callable[[], Layers]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": vgg16,
    "lstm-wt2": lstm_wt2,
    "bert-base": bert_base,
    "gpt2-small": gpt2,
    "ncf": ncf,
}


def model_names() -> list[str]:
    """Registered model names, sorted."""
    return sorted(MODELS)


def layer_shapes(name: str) -> Layers:
    """``[(parameter name, shape), ...]`` of model ``name``, in module order."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; choose one of: {', '.join(model_names())}"
        ) from None
    return builder()


def num_params(name: str) -> int:
    """Total number of trainable parameters of model ``name``."""
    return sum(math.prod(shape) for _, shape in layer_shapes(name))
