"""The registered pipeline schemes (runtime ``mp``): ``dct-mp``.

``dct-mp``: DCT-MP (Gupta et al., Sec. 2.2, Algorithm 2).

DCT-MP sparsifies what crosses a model-parallel split, not a gradient
vector: per sample, the activations of largest magnitude go forward with
their mask, and the activation gradients under the same mask come back.  It
therefore runs in the pipeline runtime (base :class:`~mpisparse.mp.scheme.MPScheme`):
``mpisparse train --scheme dct-mp --mp-stages S --density D``; the
implementation is :mod:`mpisparse.mp` (selection and wire format in
:mod:`mpisparse.mp.sparsify`, the point-to-point protocol in
:mod:`mpisparse.mp.link`).  This class only declares the name, the runtime
and the options, and builds the per-split selector.

Option ``--mp-threshold``: ``topk`` (default; exact per-row top-k,
Alg. 2 l.4-7) or ``laplace`` (one threshold per batch from a Laplace fit
of the activations' mean and variance, Sec. 2.2 / Appendix B; the kept
fraction drifts from ``--density`` and is reported as measured).  The name
differs from the ``threshold`` scheme's ``--threshold T`` (a float).
"""

from __future__ import annotations

from typing import Any

from ..registry import SchemeOption, register
from .scheme import MPScheme

__all__ = ["DCTMP"]


@register("dct-mp")
class DCTMP(MPScheme):
    """Activation sparsification between pipeline stages; see the module docstring."""

    options = (
        SchemeOption("mp_threshold", str, "topk",
                     "dct-mp: per-row threshold: topk (exact per-sample top-k, Alg. 2) or laplace "
                     "(estimated from a Laplace fit of the batch, Sec. 2.2)", choices=("topk", "laplace")),
    )

    @classmethod
    def sparsifier(cls, density: float, **options: Any):
        """A fresh selector for one split (:class:`mpisparse.mp.sparsify.ActivationSparsifier`)."""
        from .sparsify import ActivationSparsifier

        opts = cls.validate_options(options)
        return ActivationSparsifier(density, opts["mp_threshold"])
