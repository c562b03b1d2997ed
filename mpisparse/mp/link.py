"""One pipeline split seen from one of its two ranks: the point-to-point protocol.

Stage ``s`` sends its output activations to stage ``s + 1`` and receives
their gradient back; stage ``s + 1`` does the opposite.  Both hold an
:class:`ActivationLink` for the split between them (``peer`` is the other
stage's rank in the pipeline communicator).  With a sparsifier the link
runs DCT-MP (Gupta et al., Alg. 2; :mod:`mpisparse.mp.sparsify`), without one it
sends the dense matrices.

Per (micro-)batch, on the pipeline communicator:

==========  ==========  ====================================================
direction   tag         payload
==========  ==========  ====================================================
forward     ``DENSE``   float32 ``rows x d`` (uncompressed, or a full mask)
forward     ``SPARSE``  header, kept values, mask (Alg. 2 l.10-11)
backward    ``GRAD``    float32 gradient values under the mask (l.13-14),
                        or the dense ``rows x d`` gradient
==========  ==========  ====================================================

Messages between two ranks with one tag arrive in the order they were
sent, so micro-batch ``m``'s messages are matched by order; each side keeps
micro-batch ``m``'s mask until its backward message has gone.

Phases: the receiver first waits for the message (:meth:`Communicator.probe`,
timed ``wait``: the pipeline bubble), then receives and decodes it
(``send_activations`` / ``send_gradients``); the sender's mask selection,
encoding and send are timed ``send_activations`` / ``send_gradients``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..results.timing import PhaseTimer
from .sparsify import ActivationSparsifier, decode, densify, encode

__all__ = ["ActivationLink", "LinkStats", "TAG_DENSE", "TAG_SPARSE", "TAG_GRAD"]

TAG_DENSE = 71
TAG_SPARSE = 72
TAG_GRAD = 73


@dataclass
class LinkStats:
    """What this rank sent over one split in training (evaluation is not counted).

    The activation sender counts the forward direction, the gradient
    sender the backward one; ``dense_*`` is what an uncompressed pipeline
    would have sent (``4 rows d`` each way).
    """

    messages: int = 0
    bytes_forward: int = 0
    bytes_backward: int = 0
    dense_bytes_forward: int = 0
    dense_bytes_backward: int = 0
    kept: int = 0
    entries: int = 0
    encodings: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {**asdict(self), "encodings": dict(self.encodings)}


class ActivationLink:
    """The split between stage ``s`` (activation sender) and ``s + 1`` (receiver).

    Parameters
    ----------
    comm: the pipeline communicator (``send``, ``recv``, ``probe``).
    peer: the other stage's rank in ``comm``.
    sample_shape: shape of one sample's activation at this split (``d`` = its size).
    sparsifier: DCT-MP's selector (sender side), or None for dense messages.
    timer: the rank's phase timer.
    """

    def __init__(self, comm, peer: int, sample_shape: Sequence[int], sparsifier: ActivationSparsifier | None,
                 timer: PhaseTimer | None = None):
        self.comm = comm
        self.peer = int(peer)
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.d = math.prod(self.sample_shape)
        self.sparsifier = sparsifier
        self.timer = timer if timer is not None else PhaseTimer(enabled=False)
        self.stats = LinkStats()
        self._masks: dict[int, np.ndarray | None] = {}

    # ----------------------------------------------------------- forward
    def send_activations(self, out: torch.Tensor, mb: int = 0, *, training: bool = True) -> None:
        """Sender: select the mask of ``out`` (Alg. 2 l.3-9) and send ``out * M`` and ``M`` (l.10-11)."""
        with self.timer.phase("send_activations"):
            x = out.detach().reshape(out.shape[0], self.d).numpy()
            mask = None if self.sparsifier is None else self.sparsifier.select(x, training=training)
            enc, buf = encode(x, mask)
            self.comm.send(buf, self.peer, TAG_DENSE if enc == "dense" else TAG_SPARSE)
            if training:
                self._masks[mb] = None if enc == "dense" else mask
                st = self.stats
                st.messages += 1
                st.bytes_forward += int(buf.nbytes)
                st.dense_bytes_forward += 4 * x.size
                st.kept += x.size if mask is None else int(np.count_nonzero(mask))
                st.entries += x.size
                st.encodings[enc] += 1

    def recv_activations(self, mb: int = 0, *, training: bool = True) -> torch.Tensor:
        """Receiver: the dense activation ``X_act * M`` (zeros where not kept), a leaf that requires grad."""
        with self.timer.phase("wait"):
            _, tag, nbytes = self.comm.probe(self.peer)
        with self.timer.phase("send_activations"):
            if tag == TAG_DENSE:
                buf = np.empty(nbytes // 4, dtype=np.float32)
            elif tag == TAG_SPARSE:
                buf = np.empty(nbytes, dtype=np.uint8)
            else:
                raise RuntimeError(f"expected an activation message from pipeline rank {self.peer}, got tag {tag}")
            self.comm.recv(buf, self.peer, tag)
            mask, vals, _ = decode(buf, self.d, dense=tag == TAG_DENSE)
            x = vals if mask is None else densify(mask, vals)
            if training:
                self._masks[mb] = mask
            t = torch.from_numpy(x).reshape(x.shape[0], *self.sample_shape)
            return t.requires_grad_(training)

    # ---------------------------------------------------------- backward
    def send_gradients(self, grad: torch.Tensor, mb: int = 0) -> None:
        """Receiver of the activations: send ``X_grad * M`` as the values under ``M`` (Alg. 2 l.13-14)."""
        with self.timer.phase("send_gradients"):
            mask = self._masks.pop(mb)
            g = grad.detach().reshape(grad.shape[0], self.d).numpy()
            vals = np.ascontiguousarray(g if mask is None else g[mask], dtype=np.float32).reshape(-1)
            self.comm.send(vals, self.peer, TAG_GRAD)
            self.stats.bytes_backward += int(vals.nbytes)
            self.stats.dense_bytes_backward += 4 * g.size

    def recv_gradients(self, rows: int, mb: int = 0) -> torch.Tensor:
        """Sender of the activations: the gradient ``X_grad * M`` as a dense ``rows x ...`` tensor."""
        with self.timer.phase("wait"):
            _, tag, nbytes = self.comm.probe(self.peer, TAG_GRAD)
        with self.timer.phase("send_gradients"):
            mask = self._masks.pop(mb)
            expect = rows * self.d if mask is None else int(np.count_nonzero(mask))
            if nbytes != 4 * expect:
                raise RuntimeError(f"gradient message from pipeline rank {self.peer} has {nbytes} bytes, "
                                   f"expected {4 * expect} ({expect} float32 values)")
            vals = np.empty(expect, dtype=np.float32)
            self.comm.recv(vals, self.peer, TAG_GRAD)
            g = vals.reshape(rows, self.d) if mask is None else densify(mask, vals)
            return torch.from_numpy(g).reshape(rows, *self.sample_shape)

    def pending(self) -> int:
        """Micro-batches whose mask still waits for the backward pass."""
        return len(self._masks)
