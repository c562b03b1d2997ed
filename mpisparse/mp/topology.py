"""Hybrid parallelism: which rank holds which stage of which replica.

``W`` ranks run ``R = W / S`` replicas (data-parallel "trainers", DCT paper
Fig. 1) of an ``S``-stage pipeline.  World rank ``r`` is stage ``r mod S`` of
replica ``r div S``, so one replica's stages are consecutive ranks (on one
node when ranks are packed by node: the activations, sent every micro-batch,
stay local; the once-a-step gradient exchange crosses nodes).

Two communicator splits (:meth:`mpisparse.mpi.comm.Communicator.split`):

* the **pipeline** communicator of a replica (colour = replica, key = stage):
  ranks ``0 .. S-1`` are its stages; activations and their gradients travel
  on it;
* the **stage group** (colour = stage, key = replica): the ``R`` copies of
  one stage; the data-parallel scheme exchanges that stage's parameter
  gradients on it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HybridLayout", "split_communicators"]


@dataclass(frozen=True)
class HybridLayout:
    """``world`` ranks as ``replicas`` pipelines of ``stages`` stages."""

    world: int
    stages: int

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"--mp-stages is {self.stages}; it must be >= 1")
        if self.world < 1 or self.world % self.stages:
            raise ValueError(f"{self.world} ranks cannot run pipelines of --mp-stages {self.stages}: "
                             f"the number of ranks must be a multiple of the number of stages")

    @property
    def replicas(self) -> int:
        return self.world // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def rank_of(self, replica: int, stage: int) -> int:
        return replica * self.stages + stage

    def pipeline_ranks(self, replica: int) -> list[int]:
        """World ranks of one replica's stages, in stage order."""
        return [self.rank_of(replica, s) for s in range(self.stages)]

    def group_ranks(self, stage: int) -> list[int]:
        """World ranks holding ``stage``, in replica order."""
        return [self.rank_of(r, stage) for r in range(self.replicas)]


def split_communicators(comm, stages: int):
    """``(layout, pipeline communicator, stage-group communicator)`` for this rank of ``comm``."""
    layout = HybridLayout(comm.size, int(stages))
    stage, replica = layout.stage_of(comm.rank), layout.replica_of(comm.rank)
    pipe = comm.split(replica, stage)   # colour = replica: my pipeline, ranked by stage
    group = comm.split(stage, replica)  # colour = stage: my stage's replicas, ranked by replica
    return layout, pipe, group
