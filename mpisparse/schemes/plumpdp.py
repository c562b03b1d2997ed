"""``plumpdp``: Plump-DP, the standard parameter-server data parallelism (Sun et al., Sec. 2.1).

Dense push of the accumulated local update, pull of the whole model,
synchronous rounds.  The algorithm lives in :mod:`mpisparse.ps.plumpdp`.
"""

from ..ps.plumpdp import PlumpDPServer, PlumpDPWorker
from ..ps.scheme import LOCAL_STEPS, SHARD_BY_LAYER, PSScheme
from .base import register


@register("plumpdp")
class PlumpDP(PSScheme):
    """Plump-DP (``--density`` is not used: everything is sent)."""

    options = (LOCAL_STEPS, SHARD_BY_LAYER)
    mode = "sync"
    worker_class = PlumpDPWorker
    server_class = PlumpDPServer
