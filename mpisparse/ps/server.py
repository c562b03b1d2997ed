"""The server's message loop: pushes in, pulls out, until every worker is done.

One loop per server rank, single-threaded and message-driven:

1. send every worker its init bundle (the shard as ``MODEL``; Slim-DP adds
   its core keys) -- Slim-DP Alg. 1, worker l.1 ``w_k^0 <- Pull(w^0)``;
2. repeat until every worker has sent ``DONE``: ``probe`` the next message
   (phase ``wait``), receive it (``push``), and
   - ``PUSH`` / ``PUSH_FULL``: *asynchronous* mode applies it at once
     (``server_apply``) and answers that worker (``pull``); *synchronous*
     mode keeps it until every active worker has pushed in this round, then
     applies the round in worker order and answers each worker;
   - ``GET``: answer with the shard as it is now (``MODEL``);
   - ``DONE``: the worker leaves; in synchronous mode a round then waits
     only for the workers still active, so workers may stop at different
     times without a deadlock;
   - ``SAVE`` (checkpoints): the worker has had every push answered and
     waits; once every active worker has sent it (same tag), no push is in
     flight anywhere and the server's state is the one the workers' models
     were pulled from: ``on_save(tag, stop)`` writes the checkpoint (a
     collective with the workers), then the loop goes on (or ends, ``stop``);
3. send every worker its final bundle (the shard; DGS first sends the
   pending model difference).

Modes: ``sync`` (Slim-DP, Plump-DP as evaluated in the Slim-DP paper), ``async``
(ASGD, DGS: pushes in arrival order from any source) and ``round-robin``
(asynchronous, but the server takes workers in turn 0, 1, ..., K-1, 0, ...:
the same arithmetic as ``async`` in a fixed order, so runs are
reproducible; the equality tests use it).

Waiting polls politely when ranks share cores (:mod:`.polling`).  Replies
go out with non-blocking sends (:meth:`Communicator.isend`): a
server never blocks on a worker, so a worker blocked pushing to another
server can never close a wait cycle.  A reply's buffers are completed
before the next reply to the same worker.

Staleness: the server counts applied updates (``version``: pushes in
asynchronous mode, rounds in synchronous mode); a push's staleness is the
number of updates applied since its worker's last pull (0 in synchronous
mode, ``K - 1`` in steady round-robin).  The histogram goes into the JSON.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..results.timing import PhaseTimer
from .algorithm import ServerAlgorithm
from .polling import Poller
from .protocol import DONE, GET, MODEL, PUSH, PUSH_FULL, SAVE, Part, ProtocolError, recv_bundle, send_bundle
from .roles import Roles, Shard

MODES = ("sync", "async", "round-robin")


@dataclass
class ServerStats:
    pushes: int = 0
    recorded_pushes: int = 0
    rounds: int = 0
    reply_bytes: list[int] = field(default_factory=list)
    setup_bytes: int = 0
    get_bytes: int = 0
    final_bytes: int = 0
    staleness: Counter = field(default_factory=Counter)
    done_order: list[int] = field(default_factory=list)

    def summary(self, timer: PhaseTimer) -> dict[str, Any]:
        totals = timer.totals
        per = max(self.recorded_pushes, 1)
        return {
            "role": "server",
            "pushes": self.pushes,
            "rounds": self.rounds,
            "phases": {k: v / per for k, v in totals.items() if k != "step"},
            "bytes_per_communication": (sum(self.reply_bytes) / len(self.reply_bytes)) if self.reply_bytes else 0.0,
            "setup_bytes": self.setup_bytes,
            "get_bytes": self.get_bytes,
            "final_bytes": self.final_bytes,
            "staleness": dict(self.staleness),
            "done_order": list(self.done_order),
        }


class ServerLoop:
    """Serve ``roles.workers`` workers with ``algo`` on ``shard`` until all are done."""

    def __init__(self, comm, roles: Roles, shard: Shard, algo: ServerAlgorithm, *, mode: str,
                 timer: PhaseTimer | None = None, warmup: int = 0,
                 on_save: Callable[[int, bool], None] | None = None):
        if mode not in MODES:
            raise ValueError(f"server mode {mode!r}; choose one of {', '.join(MODES)}")
        self.comm = comm
        self.roles = roles
        self.shard = shard
        self.algo = algo
        self.mode = mode
        self.timer = timer if timer is not None else PhaseTimer()
        self.warmup = int(warmup)
        self.stats = ServerStats()
        self.poller = Poller(comm)
        K = roles.workers
        self._pending: dict[int, list] = {k: [] for k in range(K)}
        self._round: dict[int, Any] = {}
        self._version = 0
        self._last_pull = [0] * K
        self._turn = 0  # round-robin: position in the active workers of the one served next
        self.on_save = on_save
        self._saving: dict[int, tuple[int, bool]] = {}

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The scheme's server state and where the loop is (between rounds: nothing in flight)."""
        return {"algo": self.algo.state_dict(),
                "loop": {"version": self._version, "last_pull": list(self._last_pull), "turn": self._turn,
                         "pushes": self.stats.pushes, "rounds": self.stats.rounds}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.algo.load_state_dict(state["algo"])
        loop = state["loop"]
        self._version, self._turn = int(loop["version"]), int(loop["turn"])
        self._last_pull = [int(v) for v in loop["last_pull"]]
        self.stats.pushes, self.stats.rounds = int(loop["pushes"]), int(loop["rounds"])

    def _save_request(self, source: int, parts: list[Part], active: list[int]) -> None:
        keys = parts[-1].keys
        if self.on_save is None or keys.size != 2:
            raise ProtocolError(f"server {self.shard.index}: SAVE from worker {source} "
                                f"{'without a checkpoint directory' if self.on_save is None else 'malformed'}")
        if source in self._saving:
            raise ProtocolError(f"worker {source} sent SAVE twice for one checkpoint")
        self._saving[source] = (int(keys[0]), bool(keys[1]))
        if set(self._saving) != set(active):
            return
        requests = set(self._saving.values())
        if len(requests) != 1 or self._round:
            raise ProtocolError(f"server {self.shard.index}: workers asked for different checkpoints "
                                f"{sorted(requests)} or while a round was open")
        self._saving.clear()
        tag, stop = requests.pop()
        self.on_save(tag, stop)

    # ------------------------------------------------------------------ sends
    def _send(self, worker: int, parts: list[Part]) -> int:
        before = self.comm.bytes_sent
        self.comm.waitall(self._pending[worker])
        self._pending[worker] = []
        send_bundle(self.comm, parts, worker, self._pending[worker])
        return self.comm.bytes_sent - before

    def _reply(self, worker: int) -> None:
        with self.timer.phase("pull"):
            self.stats.reply_bytes.append(self._send(worker, self.algo.reply(worker)))
        self._last_pull[worker] = self._version

    def _complete_round_if_ready(self, active: list[int]) -> None:
        if not self._round or set(self._round) != set(active):
            return
        items = sorted(self._round.items())  # worker order: the sum is reproducible
        with self.timer.phase("server_apply"):
            self.algo.apply(items)
        self._version += 1
        self.stats.rounds += 1
        self._round.clear()
        for worker, _ in items:
            self._reply(worker)

    # ------------------------------------------------------------------- loop
    def run(self) -> ServerStats:
        comm, K, st = self.comm, self.roles.workers, self.stats
        for k in range(K):
            st.setup_bytes += self._send(k, self.algo.init_parts(k))
        active = list(range(K))
        while active:
            self.timer.recording = st.pushes >= self.warmup * K
            with self.timer.step():
                expect = (active[self._turn % len(active)] if self.mode == "round-robin" and not self._saving
                          else None)
                with self.timer.phase("wait"):
                    source, kind, nbytes = self.poller.probe(expect)
                if source not in active or source in self._saving:
                    raise ProtocolError(f"server {self.shard.index}: message {kind} from rank {source}, "
                                        f"which is not an active worker (or waits for a checkpoint)")
                if kind in (PUSH, PUSH_FULL):
                    with self.timer.phase("push"):
                        parts = recv_bundle(comm, source, first=(kind, nbytes))
                        push = self.algo.receive(source, parts)
                    st.pushes += 1
                    if self.timer.recording:  # warm-up pushes (bench step) are not counted
                        st.recorded_pushes += 1
                        st.staleness[self._version - self._last_pull[source]] += 1
                    if self.mode == "sync":
                        if source in self._round:
                            raise ProtocolError(f"worker {source} pushed twice in one synchronous round")
                        self._round[source] = push
                        self._complete_round_if_ready(active)
                    else:
                        with self.timer.phase("server_apply"):
                            self.algo.apply([(source, push)])
                        self._version += 1
                        self._reply(source)
                        self._turn = (active.index(source) + 1) % len(active)
                elif kind == GET:
                    recv_bundle(comm, source, first=(kind, nbytes))
                    st.get_bytes += self._send(source, [Part(MODEL, values=self.algo.model().copy())])
                elif kind == DONE:
                    recv_bundle(comm, source, first=(kind, nbytes))
                    pos = active.index(source)
                    active.remove(source)
                    st.done_order.append(source)
                    if active:
                        self._turn = pos % len(active)
                    if self.mode == "sync":
                        if source in self._round:
                            raise ProtocolError(f"worker {source} sent DONE while its push waits for an answer")
                        self._complete_round_if_ready(active)
                elif kind == SAVE:
                    self._save_request(source, recv_bundle(comm, source, first=(kind, nbytes)), active)
                else:
                    raise ProtocolError(f"server {self.shard.index}: unexpected message kind {kind} "
                                        f"from rank {source}")
        # 3. every worker's final bundle
        for k in range(K):
            st.final_bytes += self._send(k, self.algo.final_parts(k))
        self.poller.wait([p for k in range(K) for p in self._pending[k]])
        self._pending = {k: [] for k in range(K)}
        return st
