"""The worker's client: start, push and pull, ask for the model, finish.

:class:`PSWorker` drives a scheme's :class:`~.algorithm.WorkerAlgorithm`
against all servers (one bundle each) and times the phases of a
communication:

``compensate`` / ``select``
    inside the scheme: building the push (residual, selection, extraction);
``push``
    sending the bundles to all servers at once (non-blocking sends, then
    waiting for them to complete: servers never block, see :mod:`.server`);
``wait``
    ``probe`` until each server's answer is there: in synchronous mode the
    wait for the slowest worker of the round, in asynchronous mode the
    server's queue;
``pull``
    receiving the answers;
``update``
    inside the scheme: merging what was pulled into the model.

Bytes: ``bytes_up`` is what this worker sent in a communication (its
communicator's count), ``bytes_down`` what it received (the servers
counted the same bytes when they sent them).  Start, ``GET`` and the final
bundle are counted apart (``setup_bytes``, ``get_bytes``, ``final_bytes``).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..results.timing import PhaseTimer
from .algorithm import WorkerAlgorithm
from .polling import Poller
from .protocol import DONE, GET, MODEL, Part, ProtocolError, bundle_bytes, decode_into, recv_bundle, send_bundle
from .roles import Roles, Shard


@dataclass
class WorkerStats:
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    pushed: list[int] = field(default_factory=list)
    setup_bytes: int = 0
    get_bytes: int = 0
    final_bytes: int = 0

    def summary(self, timer: PhaseTimer, n: int) -> dict[str, Any]:
        def mean(x):
            return float(np.mean(x)) if x else 0.0

        return {
            "role": "worker",
            "communications": len(self.bytes_up),
            "phases": timer.means(),
            "bytes_up": mean(self.bytes_up),
            "bytes_down": mean(self.bytes_down),
            "density_up": mean(self.pushed) / n,
            "setup_bytes": self.setup_bytes,
            "get_bytes": self.get_bytes,
            "final_bytes": self.final_bytes,
        }


class PSWorker:
    """Worker ``rank`` of ``roles`` talking to the servers of ``shards``."""

    def __init__(self, comm, roles: Roles, shards: list[Shard], algo: WorkerAlgorithm,
                 timer: PhaseTimer | None = None):
        if roles.is_server(comm.rank):
            raise ValueError(f"rank {comm.rank} is a server, not a worker")
        self.comm = comm
        self.roles = roles
        self.shards = shards
        self.algo = algo
        self.timer = timer if timer is not None else algo.timer
        self.stats = WorkerStats()
        self.poller = Poller(comm)
        self.finished = False
        #: per communication (every one, warm-up included): (bytes up, bytes down, entries pushed)
        self.log: list[tuple[int, int, int]] = []

    def _recv_all(self, timed: bool = False) -> list[list[Part]]:
        replies = []
        for sh in self.shards:
            with (self.timer.phase("wait") if timed else nullcontext()):
                _, kind, nbytes = self.poller.probe(sh.rank)
            with (self.timer.phase("pull") if timed else nullcontext()):
                replies.append(recv_bundle(self.comm, sh.rank, first=(kind, nbytes)))
        return replies

    def start(self, w: np.ndarray) -> None:
        """Receive the init bundles; ``w`` becomes the servers' model."""
        replies = self._recv_all()
        self.stats.setup_bytes += sum(bundle_bytes(r) for r in replies)
        self.algo.on_init(w, replies)

    def step(self, w: np.ndarray, g: np.ndarray) -> bool:
        """After a minibatch with gradient ``g``: communicate if the scheme says so."""
        if self.finished:
            raise RuntimeError("this worker has finished; no more communication")
        if not self.algo.due():
            return False
        pushes = self.algo.make_push(w, g)
        before = self.comm.bytes_sent
        with self.timer.phase("push"):
            pending: list = []
            for sh, parts in zip(self.shards, pushes):
                send_bundle(self.comm, parts, sh.rank, pending)
            self.poller.wait(pending)
        up = self.comm.bytes_sent - before
        replies = self._recv_all(timed=True)
        down = sum(bundle_bytes(r) for r in replies)
        self.algo.on_reply(w, replies)
        self.algo.communications += 1
        self.log.append((up, down, self.algo.last_pushed))
        if self.timer.recording:
            self.stats.bytes_up.append(up)
            self.stats.bytes_down.append(down)
            self.stats.pushed.append(self.algo.last_pushed)
        return True

    def fetch_model(self) -> np.ndarray:
        """The model as the servers hold it now (``GET``; not counted as a communication)."""
        for sh in self.shards:
            send_bundle(self.comm, [Part(GET)], sh.rank)
        out = np.empty(self.algo.n, dtype=np.float32)
        for sh, parts in zip(self.shards, self._recv_all()):
            if parts[-1].kind != MODEL:
                raise ProtocolError(f"server {sh.index} answered GET with {parts[-1].name}")
            self.stats.get_bytes += bundle_bytes(parts)
            decode_into(out[sh.lo:sh.hi], parts[-1])
        return out

    def finish(self, w: np.ndarray) -> dict[str, float]:
        """Send ``DONE``; when every worker is done the servers send their final bundles."""
        for sh in self.shards:
            send_bundle(self.comm, [Part(DONE)], sh.rank)
        replies = self._recv_all()
        self.stats.final_bytes += sum(bundle_bytes(r) for r in replies)
        self.finished = True
        return self.algo.on_final(w, replies)

