"""Parameter-server runtime: ``--servers S`` ranks hold the model, the rest train.

The schemes of this runtime (``plumpdp``, ``slimdp``: Slim-DP, Sun et al.;
``asgd``, ``dgs``: Dual-Way Gradient Sparsification, Yan et al.) do not fit
the collective :meth:`mpisparse.schemes.base.CollectiveScheme.step` contract: workers
push to and pull from servers, in lock-step rounds (synchronous mode) or
whenever they are ready (asynchronous mode).  The modules:

===================  ==========================================================
``roles``            which ranks serve, which train; sharding of the flat vector
``protocol``         message tags, the (keys, values) :class:`Part`, bundles
``server``           the server's message loop (sync / async / round-robin),
                     staleness, bytes and phases
``worker``           the worker's client: init, push + pull, GET, DONE + final
``algorithm``        the interfaces each scheme's worker and server implement
``plumpdp`` ...      one module per algorithm (``slimdp``, ``asgd``, ``dgs``)
``scheme``           :class:`PSScheme`, the registry's base for these schemes
``schemes``          the registered schemes (name, options, mode, algorithm)
``options``          the runtime's checks of a configuration before MPI starts
``results``          the result object plus PS keys
``train``, ``bench`` ``mpisparse train`` / ``bench step`` on this runtime
===================  ==========================================================

Importing this package imports NumPy only (torch stays lazy); it does not
import :mod:`mpisparse.schemes` (the data-parallel schemes), nor they it.
"""

from .roles import Roles, Shard, make_shards

__all__ = ["Roles", "Shard", "make_shards"]
