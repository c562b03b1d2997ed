"""``mpisparse reproduce``: one command per claim of the papers the schemes come from.

Each target (one module here, registered by name) runs the ``mpisparse``
jobs that measure one figure or table of a paper as subprocesses
(``mpisparse bench step -n W ... --json``, ``mpisparse train ...``,
``mpisparse bench select ...``), printing each command line, and ends with a
table of the paper's claim beside what was measured.  The framework is in
:mod:`.base`, the subprocess runner in :mod:`mpisparse.bench.runs`.

=======================  ========================================================
``deft-buildup``         DEFT Fig. 1 (and Sec. 5.2): top-k's measured density vs W
``deft-breakdown``       DEFT Fig. 7: per-phase time of topk, cltk and deft
``deft-speedup``         DEFT Fig. 9: DEFT's selection speedup vs W
``scalecom-similarity``  ScaleCom Fig. 2 and 3: memory similarity, Hamming distance
``dct-threshold``        DCT Fig. 2 (threshold stability) and Fig. 8a (life-span L)
``slimdp-traffic``       Slim-DP Sec. 3.4 and Table 1: traffic and communication time
``dgs-speedup``          DGS slides: speedup over ASGD under low bandwidth
=======================  ========================================================
"""

from .registry import TARGETS, get_target, register

# importing a target module registers it (order: the order of --list)
from . import deft_buildup, deft_breakdown, deft_speedup, scalecom_similarity, dct_threshold  # noqa: E402,F401
from . import slimdp_traffic, dgs_speedup  # noqa: E402,F401

__all__ = ["TARGETS", "get_target", "register"]
