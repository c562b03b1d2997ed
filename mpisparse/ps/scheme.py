"""The base class of the parameter-server schemes (runtime ``ps``).

A :class:`PSScheme` is registered like every scheme (``--scheme NAME``,
options declared with :class:`~mpisparse.registry.SchemeOption`); its
runtime is ``ps``, so :mod:`mpisparse.runtimes` runs it with the drivers of
this package.  An instance validates the options, knows the roles and
shards of its world, and builds the worker side
(:meth:`PSScheme.make_worker`) or the server loop
(:meth:`PSScheme.make_server`) of its algorithm.  The registered schemes
are in :mod:`mpisparse.ps.schemes`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..backend.fusion import FusionLayout
from ..registry import SchemeBase, SchemeOption
from ..results.timing import PhaseTimer
from .algorithm import ServerAlgorithm, ServerContext, WorkerAlgorithm, WorkerContext
from .roles import Roles, make_shards
from .server import ServerLoop
from .worker import PSWorker

SHARD_BY_LAYER = SchemeOption(
    "shard_by_layer", bool, False,
    "ps: with --servers > 1, give each server whole layers (boundaries nearest to equal sizes) "
    "instead of equal ranges of the flat vector")
LOCAL_STEPS = SchemeOption(
    "local_steps", int, 1, "ps: p, minibatch steps of local SGD between two communications", low=1)
ASYNC_MOMENTUM = SchemeOption(
    "async_momentum", str, "compensated",
    "asgd, dgs: the workers' momentum under asynchrony. compensated: m - (1 - 1/K) for K workers "
    "(not below 0), since K asynchronous workers already add about 1 - 1/K of implicit momentum; "
    "as-given: m unchanged (the papers' setting; may diverge with K >= 2 at m = 0.9)",
    choices=("compensated", "as-given"))
ROUND_ROBIN = SchemeOption(
    "round_robin", bool, False,
    "ps: the server takes pushes from workers in turn (0, 1, ..., K-1) instead of in arrival order: "
    "asynchronous arithmetic in a reproducible order")


class PSScheme(SchemeBase):
    """Base of ``plumpdp``, ``slimdp``, ``asgd``, ``dgs``."""

    runtime: ClassVar[str] = "ps"
    min_world_size: ClassVar[int] = 2
    uses_memory: ClassVar[bool] = False
    #: "sync" (rounds) or "async" (arrival order; ``--round-robin`` makes it deterministic)
    mode: ClassVar[str] = "sync"
    worker_class: ClassVar[type[WorkerAlgorithm]] = WorkerAlgorithm
    server_class: ClassVar[type[ServerAlgorithm]] = ServerAlgorithm

    def __init__(self, comm, layout: FusionLayout, density: float, *, servers: int = 1, memory: bool = True,
                 timer: PhaseTimer | None = None, seed: int = 0, **options: Any):
        super().__init__(comm, layout, density, timer=timer, seed=seed, **options)
        self.check_config(self.density, self.opts)
        self.use_memory = bool(memory)
        self.roles = Roles(comm.size, int(servers))
        self.shards = make_shards(layout, self.roles, by_layer=bool(self.opts.get("shard_by_layer")))

    # ------------------------------------------------------------ checks
    @classmethod
    def check_config(cls, density: float, opts: dict[str, Any]) -> None:
        """Checks that involve several values (ValueError naming them); options are already valid."""

    @property
    def server_mode(self) -> str:
        if self.mode == "async" and self.opts.get("round_robin"):
            return "round-robin"
        return self.mode

    @property
    def local_optimizer(self) -> bool:
        return self.worker_class.local_optimizer

    # ------------------------------------------------------------- roles
    def is_server(self) -> bool:
        return self.roles.is_server(self.comm.rank)

    def make_worker(self, *, lr: float, momentum: float, weight_decay: float = 0.0,
                    timer: PhaseTimer | None = None) -> PSWorker:
        """This rank's worker: the scheme's worker side plus the client."""
        timer = timer if timer is not None else self.timer
        ctx = WorkerContext(layout=self.layout, shards=self.shards, worker=self.comm.rank,
                            workers=self.roles.workers, density=self.density, opts=dict(self.opts), lr=float(lr),
                            momentum=float(momentum), weight_decay=float(weight_decay), memory=self.use_memory,
                            seed=self.seed, timer=timer)
        return PSWorker(self.comm, self.roles, self.shards, self.worker_class(ctx), timer)

    def make_server(self, w: np.ndarray, *, timer: PhaseTimer | None = None, warmup: int = 0) -> ServerLoop:
        """This rank's server loop over its shard of the full initial model ``w``."""
        shard = self.shards[self.roles.server_index(self.comm.rank)]
        ctx = ServerContext(layout=self.layout, shard=shard, workers=self.roles.workers, density=self.density,
                            opts=dict(self.opts), memory=self.use_memory, seed=self.seed)
        algo = self.server_class(ctx, np.asarray(w[shard.lo:shard.hi], dtype=np.float32))
        return ServerLoop(self.comm, self.roles, shard, algo, mode=self.server_mode,
                          timer=timer if timer is not None else PhaseTimer(), warmup=warmup)
