"""Model (pipeline) and hybrid parallelism with DCT-MP (Gupta et al., Sec. 2.2, Algorithm 2).

* :mod:`.stages` -- the stage split: the model as a chain of layers; split points (named or balanced);
* :mod:`.sparsify` -- DCT-MP's per-sample masks, the Laplace estimate and the wire format;
* :mod:`.link` -- the point-to-point protocol of one split (activations forward, gradients back);
* :mod:`.topology` -- ranks as replicas x stages, the two communicator splits;
* :mod:`.runtime` -- :func:`run_mp_training`, behind ``mpisparse train --mp-stages S``;
* :mod:`.config` -- :class:`MPConfig` and the checks run before MPI starts.

Imports torch lazily: ``mpisparse.mp.config`` and ``.sparsify`` load without it.
"""

from .config import MPConfig, check_mp_options, parse_split_after

__all__ = ["MPConfig", "check_mp_options", "parse_split_after", "run_mp_training"]


def run_mp_training(comm, cfg, **kw):
    """See :func:`mpisparse.mp.runtime.run_mp_training`."""
    from .runtime import run_mp_training as _run

    return _run(comm, cfg, **kw)
