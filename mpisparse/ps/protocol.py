"""Messages between workers and servers.

Everything that crosses the wire is a :class:`Part`: a *kind* (the MPI tag
of its first message), int32 ``keys`` and float32 ``values``, sent as two
messages (keys with the kind's tag, then values with :data:`VALUES`), so
message lengths come from MPI's envelope (``probe``): no headers, and the
bytes counted are exactly the keys and values.  A *bundle* is a list of
parts ending with a terminal kind (only ``CORE`` and ``DIFF`` are
non-terminal), sent in order and received from one source.

Kinds, worker -> server:

``PUSH``       an update: dense (no keys, one value per shard element) or
               sparse (``keys`` shard-local, ``values`` aligned); Slim-DP
               puts its core values first (keys cached, see ``slimdp``)
``PUSH_FULL``  Slim-DP's full push before a core re-selection
``GET``        "send me the model as you hold it" (evaluation)
``DONE``       this worker has finished; it waits for its final bundle
``SAVE``       a checkpoint now: ``keys = [tag, stop]`` (the checkpoint's step, 1 when the run ends after
               it); the worker has every push answered and sends nothing more until the save is done

server -> worker:

``PULL``       the answer to a push (parameters, or a model difference)
``MODEL``      the whole shard, dense (start, ``GET``, end)
``CORE``       Slim-DP's new core keys (non-terminal, precedes ``PULL``)
``DIFF``       DGS's pending model difference at the end (non-terminal)

Dense or sparse: :func:`encode` sends ``(keys, values)`` as pairs while
that is smaller than the dense shard (``2 c < n``), else as ``n`` dense
values; :func:`decode_into` writes, adds or subtracts either form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TAG_BASE = 0x5300
PUSH, PUSH_FULL, GET, DONE, SAVE = TAG_BASE + 1, TAG_BASE + 2, TAG_BASE + 3, TAG_BASE + 4, TAG_BASE + 5
PULL, MODEL, CORE, DIFF = TAG_BASE + 11, TAG_BASE + 12, TAG_BASE + 13, TAG_BASE + 14
VALUES = TAG_BASE + 20
KIND_NAMES = {PUSH: "PUSH", PUSH_FULL: "PUSH_FULL", GET: "GET", DONE: "DONE", SAVE: "SAVE", PULL: "PULL",
              MODEL: "MODEL", CORE: "CORE", DIFF: "DIFF"}
NON_TERMINAL = frozenset({CORE, DIFF})
KEY_DTYPE = np.int32
VALUE_DTYPE = np.float32
_EMPTY_KEYS = np.empty(0, dtype=KEY_DTYPE)
_EMPTY_VALUES = np.empty(0, dtype=VALUE_DTYPE)


class ProtocolError(RuntimeError):
    """A message arrived that the receiver's state does not allow."""


@dataclass
class Part:
    kind: int
    keys: np.ndarray = field(default_factory=lambda: _EMPTY_KEYS)
    values: np.ndarray = field(default_factory=lambda: _EMPTY_VALUES)

    def __post_init__(self) -> None:
        if self.keys.dtype != KEY_DTYPE or self.values.dtype != VALUE_DTYPE:
            raise TypeError(f"a Part carries int32 keys and float32 values, got {self.keys.dtype} "
                            f"and {self.values.dtype}")

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)

    @property
    def name(self) -> str:
        return KIND_NAMES.get(self.kind, str(self.kind))


def bundle_bytes(parts: list[Part]) -> int:
    return sum(p.nbytes for p in parts)


def send_bundle(comm, parts: list[Part], dest: int, pending: list | None = None) -> None:
    """Send ``parts`` to ``dest`` in order; non-blocking when ``pending`` collects the requests."""
    if not parts or parts[-1].kind in NON_TERMINAL or any(p.kind not in NON_TERMINAL for p in parts[:-1]):
        raise ProtocolError(f"a bundle ends with its only terminal part; got {[p.name for p in parts]}")
    for p in parts:
        if pending is None:
            comm.send(p.keys, dest, tag=p.kind)
            comm.send(p.values, dest, tag=VALUES)
        else:
            pending.append(comm.isend(p.keys, dest, tag=p.kind))
            pending.append(comm.isend(p.values, dest, tag=VALUES))


def recv_part(comm, source: int, kind: int, nbytes: int) -> Part:
    """Receive a part whose first message was probed as ``(source, kind, nbytes)``."""
    keys = np.empty(nbytes // 4, dtype=KEY_DTYPE)
    comm.recv(keys, source=source, tag=kind)
    _, _, vbytes = comm.probe(source, VALUES)
    values = np.empty(vbytes // 4, dtype=VALUE_DTYPE)
    comm.recv(values, source=source, tag=VALUES)
    return Part(kind, keys, values)


def recv_bundle(comm, source: int, first: tuple[int, int] | None = None) -> list[Part]:
    """Receive one bundle from ``source``; ``first = (kind, nbytes)`` when already probed."""
    parts: list[Part] = []
    while True:
        if first is None:
            _, kind, nbytes = comm.probe(source)
        else:
            (kind, nbytes), first = first, None
        if kind == VALUES:
            raise ProtocolError(f"rank {source} sent values without keys")
        parts.append(recv_part(comm, source, kind, nbytes))
        if kind not in NON_TERMINAL:
            return parts


# --------------------------------------------------------------------------- encoding
def encode(kind: int, keys: np.ndarray, values: np.ndarray, n: int) -> Part:
    """``(keys, values)`` of an ``n``-element shard as the smaller of sparse pairs or dense values.

    ``keys`` are shard-local and distinct.  Dense when ``2 len(keys) >= n``.
    """
    keys = np.asarray(keys)
    if 2 * keys.size >= n:
        dense = np.zeros(n, dtype=VALUE_DTYPE)
        dense[keys] = values
        return Part(kind, _EMPTY_KEYS, dense)
    return Part(kind, keys.astype(KEY_DTYPE, copy=False), np.ascontiguousarray(values, dtype=VALUE_DTYPE))


def is_dense(part: Part, n: int) -> bool:
    return part.keys.size == 0 and part.values.size == n


def check_shape(part: Part, n: int) -> None:
    if not is_dense(part, n) and part.keys.size != part.values.size:
        raise ProtocolError(f"{part.name}: {part.keys.size} keys but {part.values.size} values "
                            f"(dense would be {n} values)")


def decode_into(out: np.ndarray, part: Part, *, mode: str = "set") -> None:
    """Write (``set``), add (``add``) or subtract (``sub``) a dense or sparse part into ``out``'s shard."""
    check_shape(part, out.size)
    if mode not in ("set", "add", "sub"):
        raise ValueError(f"decode mode {mode!r}; choose set, add or sub")
    if is_dense(part, out.size):
        keys: slice | np.ndarray = slice(None)
    else:
        keys = part.keys  # distinct within a part: fancy-index updates are exact
    if mode == "set":
        out[keys] = part.values
    elif mode == "add":
        out[keys] += part.values
    else:
        out[keys] -= part.values
