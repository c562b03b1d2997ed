"""``gpt``: a decoder-only transformer language model in the layout of GPT-2.

The architecture of Radford et al., "Language Models are Unsupervised
Multitask Learners" (2019): learned token (``wte``) and position (``wpe``)
embeddings, ``layers`` pre-norm blocks, each ``x + attn(ln_1(x))`` then
``x + mlp(ln_2(x))`` -- causal multi-head self-attention (one fused
query/key/value projection ``c_attn``, an output projection ``c_proj``) and
an MLP of width ``4 * width`` with GELU (its exact, erf form; GPT-2 used the
tanh approximation) -- a final LayerNorm
``ln_f``, and an output head that is the token embedding itself (tied: no
tensor of its own).  Parameter names follow GPT-2's reference module
(``wte``, ``wpe``, ``h.{i}.ln_1``, ``h.{i}.attn.c_attn``, ...), so
:mod:`mpisparse.models.shapes`' ``gpt2-small`` lists the same tensors.

Initialisation as GPT-2: weights normal with std 0.02, the two projections
that write into the residual stream (``attn.c_proj``, ``mlp.c_proj``) with
std ``0.02 / sqrt(2 * layers)``, biases zero, LayerNorms one and zero; all
through torch's global generator, so a model is reproducible given
``torch.manual_seed``.  No dropout: a resumed run continues exactly as an
uninterrupted one.

Inputs are ``(T, batch)`` int64 token ids, time-major as
:func:`mpisparse.data.lm_batches` lays them out (``T <= context``);
``forward(x, hidden=None)`` returns ``(logits (T, batch, vocab), None)``,
the signature of the lstm model, so the training loop treats both alike
(a transformer carries no state from one window to the next).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "Block", "CausalSelfAttention", "gpt_num_params", "check_gpt_size"]


def check_gpt_size(*, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
    """Raise ValueError (one line naming the value) unless every size is >= 1 and ``heads`` divides ``width``."""
    for name, v in (("vocab", vocab), ("context", context), ("width", width), ("layers", layers),
                    ("heads", heads)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"gpt {name} is {v!r}; allowed: an integer >= 1")
    if width % heads:
        raise ValueError(f"gpt width {width} is not divisible by heads {heads}; allowed: a width that is a "
                         "multiple of the number of heads")


def gpt_num_params(*, vocab: int, context: int, width: int, layers: int) -> int:
    """Trainable parameters: embeddings ``(vocab + context) * width``, per block ``12 width^2 + 13 width``
    (two LayerNorms 4w, c_attn 3w^2 + 3w, attn.c_proj w^2 + w, c_fc 4w^2 + 4w, mlp.c_proj 4w^2 + w), the
    final LayerNorm ``2 width``; the tied head adds none."""
    w = width
    return (vocab + context) * w + layers * (12 * w * w + 13 * w) + 2 * w


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position ``t`` attends to positions ``<= t`` only."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """See the module docstring; ``vocab`` tokens, windows of at most ``context`` tokens."""

    def __init__(self, vocab: int, *, context: int = 64, width: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        check_gpt_size(vocab=vocab, context=context, width=width, layers=layers, heads=heads)
        self.vocab, self.context = vocab, context
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        residual_std = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=residual_std)
            elif name.endswith("weight") and p.dim() == 2:  # embeddings and the other projections
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x: torch.Tensor, hidden=None):
        """``x``: ``(T, batch)`` token ids; returns ``(logits (T, batch, vocab), None)``."""
        t = x.shape[0]
        if t > self.context:
            raise ValueError(f"a window of {t} tokens is longer than the model's context {self.context}")
        tokens = x.t()  # (batch, T)
        pos = torch.arange(t, device=x.device)
        h = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            h = block(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)  # the tied head
        return logits.transpose(0, 1), None
