"""The base class of the pipeline (model-parallel) schemes (runtime ``mp``).

An :class:`MPScheme` sparsifies what crosses a split between pipeline
stages (activations forward, their gradients back), not a gradient vector:
it declares its name and options, and builds the selector of one split.
:mod:`mpisparse.runtimes` runs it with :func:`mpisparse.mp.runtime.run_mp_training`.
The registered schemes are in :mod:`mpisparse.mp.schemes`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..registry import SchemeBase

__all__ = ["MPScheme"]


class MPScheme(SchemeBase):
    """Base of ``dct-mp``: a scheme applied to the activations between pipeline stages."""

    runtime: ClassVar[str] = "mp"

    @classmethod
    def sparsifier(cls, density: float, **options: Any):
        """A fresh selector for one split (``mpisparse.mp.link.ActivationLink`` calls it)."""
        raise NotImplementedError
