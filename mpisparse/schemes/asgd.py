"""``asgd``: dense asynchronous SGD on a parameter server (the DGS paper's baseline).

``--worker-density d < 1`` turns it into gradient dropping (GD-async).
The algorithm lives in :mod:`mpisparse.ps.asgd`.
"""

from ..ps.asgd import ASGDServer, ASGDWorker
from ..ps.scheme import ROUND_ROBIN, SHARD_BY_LAYER, PSScheme
from .base import SchemeOption, register


@register("asgd")
class ASGD(PSScheme):
    """ASGD (``--density`` is not used: see ``--worker-density``)."""

    options = (
        SchemeOption("worker_density", float, 1.0,
                     "asgd: fraction of each layer a worker pushes (gradient dropping with a residual; "
                     "1 = dense ASGD)", low=0.0, high=1.0, low_open=True),
        ROUND_ROBIN,
        SHARD_BY_LAYER,
    )
    mode = "async"
    uses_memory = True
    worker_class = ASGDWorker
    server_class = ASGDServer
