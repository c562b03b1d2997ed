"""Error feedback: what a rank did not send is remembered and sent later.

A memory has two steps around a scheme's selection:

``acc = memory.compensate(grad)``
    the error-compensated vector (Alg. 1 line 5 of DEFT (Yoon & Oh):
    ``acc = e + g``);
``memory.update(acc, sent)``
    after the exchange, what was sent leaves the memory
    (Alg. 1 lines 11-12: ``acc[idx] = 0; e = acc``).

Mass is conserved: sent values plus the new residual equal ``acc``.

Buffers live on the array module of the gradients (the device for device
gradients).  ``state_dict`` copies them to the host explicitly (NumPy
arrays in a checkpoint); ``load_state_dict`` restores host arrays, and the
scheme then moves every buffer named in :attr:`Memory.buffers` to its
gradients' array module with :meth:`Memory.to` (one explicit copy each).  The
residual memory works in place (``acc`` *is* the residual buffer), so a
step allocates nothing.  Scheme-specific variants (ScaleCom's low-pass
filter, DGC's momentum correction) subclass :class:`Memory`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend


def accumulate(buf, grad):
    """``buf += grad`` in place (a copy of ``grad`` when there is no buffer yet); returns the buffer."""
    if buf is None:
        return grad.copy()
    buf += grad
    return buf


def saved(buf) -> np.ndarray | None:
    """A host copy of a memory buffer, for ``state_dict`` (None stays None)."""
    return None if buf is None else np.array(backend.to_host(buf), copy=True)


def restored(value) -> np.ndarray | None:
    """A float32 buffer from a ``state_dict`` entry (None stays None)."""
    return None if value is None else np.array(value, dtype=np.float32, copy=True)


class Memory:
    """Interface of an error-feedback memory."""

    #: attribute names of the memory's array buffers (moved together by :meth:`to`)
    buffers: tuple[str, ...] = ()
    #: ``compensate`` is ``residual += grad`` in place and ``update`` zeroes the sent entries of it:
    #: the fused pass of :mod:`mpisparse.backend.fused` may do the compensation
    in_place: bool = False

    def to(self, xp) -> None:
        """Move every buffer to array module ``xp`` (explicit copies; a no-op where they already are)."""
        for name in self.buffers:
            setattr(self, name, backend.to_module(getattr(self, name), xp))

    def compensate(self, grad):
        raise NotImplementedError

    def update(self, acc, sent_indices) -> None:
        raise NotImplementedError

    def keep(self, indices, error) -> None:
        """After :meth:`update`: what the wire lost at ``indices`` (``acc - sent``: a 16-bit value's
        rounding, ``--wire-dtype``) stays in the memory, so that mass is conserved.  Kept nowhere without
        a memory (``--no-memory``: dropped like every unsent value)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def reset(self) -> None:
        pass


class NoMemory(Memory):
    """No error feedback: unsent values are dropped (``--no-memory``)."""

    def compensate(self, grad):
        return grad

    def update(self, acc, sent_indices) -> None:
        return None


class ResidualMemory(Memory):
    """Classic error feedback: ``e <- (e + g)`` with the sent entries zeroed."""

    buffers = ("residual",)
    in_place = True

    def __init__(self) -> None:
        self.residual = None

    def compensate(self, grad):
        self.residual = accumulate(self.residual, grad)
        return self.residual

    def update(self, acc, sent_indices) -> None:
        if acc is not self.residual:
            self.residual[...] = acc
        if sent_indices is None:  # everything was sent
            self.residual.fill(0)
        else:
            self.residual[sent_indices] = 0

    def keep(self, indices, error) -> None:
        if indices is None:
            self.residual += error
        else:
            self.residual[indices] += error  # the indices of one rank's set do not repeat

    def reset(self) -> None:
        self.residual = None

    def state_dict(self) -> dict[str, Any]:
        return {"residual": saved(self.residual)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residual = restored(state.get("residual"))


def make_memory(enabled: bool) -> Memory:
    """Residual error feedback, or none (``--no-memory``)."""
    return ResidualMemory() if enabled else NoMemory()
