"""No fixed cost per call: device workspaces reused across calls, and a call's launches replayed as a CUDA graph.

A GPU kernel call that allocates its counters and scratch, zeroes them and
issues four or five launches pays tens of microseconds of host time however
small its input (docs/gpu.md, "Why the two kernel targets miss").  Two
things remove that cost:

* a :class:`Workspace` per (kernel, device, size, k, dtypes): every buffer a
  call needs (counters, candidate arrays, outputs) allocated once, on the
  first call of that shape, and reused by every later call
  (:func:`workspace`; at most :data:`MAX_WORKSPACES` are kept, the least
  recently used dropped first);
* the call's launch sequence captured once as a CUDA graph through CuPy's
  stream capture (``cupy.cuda.Stream.begin_capture`` /
  ``end_capture``, which returns a ``cupy.cuda.Graph``) and replayed with
  ``Graph.launch(stream)`` (:func:`run`).  A graph holds the kernels'
  arguments as they were at capture: device pointers (the workspace's
  buffers and the input's address) and scalars.  So a graph is kept per
  input address (at most :data:`GRAPHS_PER_WORKSPACE`); values that change
  between calls (a threshold) live in workspace slots the kernels read.

The first call of a shape (and of an input address) runs the plain launch
sequence: it compiles and loads the kernels, which must not happen during a
capture.  The second captures and replays; later calls replay.  Where
capture is unsupported or fails (HIP, an old driver, an emulator without
it, ``MPISPARSE_CUDA_GRAPHS=0``) every call runs the plain launch sequence
on the same workspace: the same results, only the launch cost differs.
:data:`STATS` counts plain runs, captures, replays and fallbacks.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable

from .cupy_launch import _cupy

#: Workspaces kept at most (least recently used dropped first): layer-by-layer callers use many shapes.
MAX_WORKSPACES = 64
#: Captured graphs kept per workspace (one per input address); beyond, plain launches.
GRAPHS_PER_WORKSPACE = 4
#: Environment switch: ``MPISPARSE_CUDA_GRAPHS=0`` turns capture off (workspaces stay).
ENV = "MPISPARSE_CUDA_GRAPHS"

#: plain launch sequences, captures, replays, and captures that failed (then plain) since :func:`reset_stats`
STATS = {"plain": 0, "captures": 0, "replays": 0, "capture_failures": 0}

_WORKSPACES: OrderedDict = OrderedDict()
_CAPTURE_STREAMS: dict[tuple, object] = {}
_UNSUPPORTED: dict[tuple, str] = {}  # (CuPy module, device) -> why capture is off there


def reset_stats() -> None:
    for key in STATS:
        STATS[key] = 0


def enabled() -> bool:
    """Whether graph capture is allowed (``MPISPARSE_CUDA_GRAPHS`` unset or not ``0``/``false``/``no``/``off``)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def unsupported_reason(device: int = 0) -> str | None:
    """Why capture is off on ``device`` (it failed once there), or None."""
    return _UNSUPPORTED.get((id(_cupy()), device))


class Workspace:
    """The device buffers of one kernel shape, and the graphs captured over them (by input address).

    Buffers are attributes set by the kernel module's builder.  ``seen``
    counts plain runs per input address (a graph is captured on the second
    call of an address); :meth:`drop_graphs` forgets the graphs when a
    buffer is replaced (a graph holds the old pointers).
    """

    def __init__(self, key: tuple):
        self.key = key
        self.device = key[1]
        self.graphs: dict = {}
        self.seen: dict = {}

    def drop_graphs(self) -> None:
        self.graphs.clear()
        self.seen.clear()


def device_of(a) -> int:
    try:
        return int(a.data.device_id)
    except AttributeError:  # an emulated array
        return 0


def address(a) -> int:
    """The device address of ``a``'s first element (what a captured launch holds)."""
    try:
        return int(a.data.ptr)
    except AttributeError:
        return int(a.__cuda_array_interface__["data"][0])


def workspace(key: tuple, build: Callable[[Workspace], None]) -> Workspace:
    """The workspace of ``key`` (kernel name, device, shape, dtypes), built by ``build(ws)`` on first use."""
    full = (id(_cupy()), key)  # a workspace belongs to one CuPy (the tests swap emulators)
    ws = _WORKSPACES.get(full)
    if ws is None:
        ws = Workspace(key)
        build(ws)
        _WORKSPACES[full] = ws
        while len(_WORKSPACES) > MAX_WORKSPACES:
            _WORKSPACES.popitem(last=False)
    else:
        _WORKSPACES.move_to_end(full)
    return ws


def _capture_stream(cp, dev: int):
    s = _CAPTURE_STREAMS.get((id(cp), dev))
    if s is None:  # capture needs a stream of its own: CuPy refuses the legacy default stream
        s = _CAPTURE_STREAMS[(id(cp), dev)] = cp.cuda.Stream(non_blocking=True)
    return s


def run(ws: Workspace, at, launch: Callable[[], None]) -> str:
    """Enqueue ``launch()``'s sequence on the current stream: replayed, captured then replayed, or plain.

    ``at`` keys the graph (the input's address, and anything else baked
    into the launches as a scalar).  ``launch`` must only enqueue work (no
    allocation, no read back): under capture nothing runs until the graph
    is launched.  Returns ``"replay"``, ``"capture"`` or ``"plain"``.
    """
    cp = _cupy()
    g = ws.graphs.get(at)
    if g is not None:
        g.launch(stream=cp.cuda.get_current_stream())
        STATS["replays"] += 1
        return "replay"
    dev = ws.device
    if (not enabled() or (id(cp), dev) in _UNSUPPORTED or ws.seen.get(at, 0) < 1
            or len(ws.graphs) >= GRAPHS_PER_WORKSPACE):
        ws.seen[at] = ws.seen.get(at, 0) + 1
        launch()
        STATS["plain"] += 1
        return "plain"
    g = _capture(cp, dev, launch)
    if g is None:
        launch()
        STATS["plain"] += 1
        return "plain"
    ws.graphs[at] = g
    g.launch(stream=cp.cuda.get_current_stream())
    STATS["captures"] += 1
    return "capture"


def _capture(cp, dev: int, launch):
    """The graph of ``launch()``'s sequence, or None (capture unsupported or invalidated: noted per device)."""
    try:
        s = _capture_stream(cp, dev)
        with s:
            s.begin_capture()
            try:
                launch()
            finally:
                g = s.end_capture()  # leaves capture mode even when a launch failed
        return g
    except Exception as e:  # no capture here (HIP, old driver, emulator without it) or an invalid capture
        _UNSUPPORTED[(id(cp), dev)] = f"{type(e).__name__}: {e}"
        STATS["capture_failures"] += 1
        return None


def clear() -> None:
    """Forget every workspace, graph and capture stream (tests; a device reset)."""
    _WORKSPACES.clear()
    _CAPTURE_STREAMS.clear()
    _UNSUPPORTED.clear()
    reset_stats()
