"""Cutting a model into pipeline stages (pure functions, no MPI).

A model that can be pipelined is a chain: its forward pass is the
composition of an ordered list of leaf layers, :func:`pipeline_layers`.
Stage ``s`` of ``S`` holds a consecutive run of them; what crosses a split is
the activation matrix ``X_act`` (rows = samples) going forward and its
gradient ``X_grad`` coming back (DCT paper, Fig. 1 right and Fig. 7).

Split points are named by the layer a split comes *after*
(``--split-after net.2`` puts ``net.0 .. net.2`` on stage 0), or chosen by
:func:`balanced_cuts`, which balances the stages' parameter counts.  The DCT
paper's Remark 1 inserts splits "after randomly chosen FC layers, or after the
ReLU following the FC layer if it exists" (the activation is then about half
zeros); the balanced choice follows it: a cut never separates a layer from
the parameter-free layers after it (ReLU, pooling, flatten), so it falls
after the ReLU.

Every stage must own at least one trainable parameter (its optimizer and
its data-parallel group need one), so ``S`` is at most the number of
parameterised layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import nn

__all__ = ["SPLITTABLE_MODELS", "pipeline_layers", "layer_parameters", "balanced_cuts", "cuts_from_names",
           "StagePlan", "plan_stages", "stage_module"]

#: model names (mpisparse.models.nets) whose forward pass is a chain of leaf layers
SPLITTABLE_MODELS = ("mlp", "cnn", "dlrm")


def pipeline_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model as an ordered chain of named leaf layers.

    ``nn.Sequential(*[m for _, m in pipeline_layers(model)])`` computes the
    same function as ``model`` (the tests check it).  Supported: the ``mlp``,
    ``cnn`` and ``dlrm`` networks of :mod:`mpisparse.models.nets`, plain
    ``nn.Sequential`` chains, and any module with a ``pipeline_layers()``
    method returning such a list.
    """
    from ..models.nets import MLP, SmallCNN

    own = getattr(model, "pipeline_layers", None)
    if callable(own):
        return list(own())
    if isinstance(model, MLP):
        return [(f"net.{n}", m) for n, m in model.net.named_children()]
    if isinstance(model, SmallCNN):
        return [(f"features.{n}", m) for n, m in model.features.named_children()] + [("fc", model.fc)]
    if isinstance(model, nn.Sequential):
        return [(n, m) for n, m in model.named_children()]
    raise ValueError(
        f"a {type(model).__name__} cannot be split into pipeline stages: its forward pass is not a "
        f"chain of layers; models that can: {', '.join(SPLITTABLE_MODELS)}")


def layer_parameters(layers: Sequence[tuple[str, nn.Module]]) -> list[int]:
    """Trainable parameters of each layer."""
    return [sum(p.numel() for p in m.parameters() if p.requires_grad) for _, m in layers]


def _blocks(params: Sequence[int]) -> list[int]:
    """Layer positions where a cut may go: after the last parameter-free layer that follows a
    parameterised one, i.e. just before each parameterised layer but the first."""
    weighted = [i for i, p in enumerate(params) if p > 0]
    return [i - 1 for i in weighted[1:]]


def balanced_cuts(params: Sequence[int], stages: int) -> list[int]:
    """``stages - 1`` cut positions (a cut ``c`` splits after layer ``c``) balancing parameter counts.

    Minimises the largest stage's parameter count (then the sum of squares of
    the stage counts, then prefers earlier cuts) by dynamic programming over
    the allowed cut positions (:func:`_blocks`): cuts fall just before a
    parameterised layer, so each stage ends with its own ReLU / pooling.
    """
    params = [int(p) for p in params]
    stages = int(stages)
    weighted = sum(1 for p in params if p > 0)
    if stages < 1:
        raise ValueError(f"stages is {stages}; it must be >= 1")
    if stages > weighted:
        raise ValueError(f"{stages} stages need {stages} layers with parameters; the model has {weighted}")
    if stages == 1:
        return []
    allowed = _blocks(params)
    prefix = [0]
    for p in params:
        prefix.append(prefix[-1] + p)
    n = len(params)
    ends = allowed + [n - 1]  # a stage ends at an allowed cut or at the last layer

    def cost(a: int, b: int) -> int:  # parameters of layers a..b inclusive
        return prefix[b + 1] - prefix[a]

    # best[j][e]: (max, sumsq, cuts) splitting layers 0..ends[e] into j+1 stages
    best: list[dict[int, tuple[int, int, tuple[int, ...]]]] = [{} for _ in range(stages)]
    for e, end in enumerate(ends):
        c = cost(0, end)
        best[0][e] = (c, c * c, ())
    for j in range(1, stages):
        for e, end in enumerate(ends):
            cand = None
            for f in range(e):
                if f not in best[j - 1]:
                    continue
                mx, sq, cuts = best[j - 1][f]
                c = cost(ends[f] + 1, end)
                if c == 0:
                    continue
                key = (max(mx, c), sq + c * c, cuts + (ends[f],))
                if cand is None or key < cand:
                    cand = key
            if cand is not None:
                best[j][e] = cand
    return list(best[stages - 1][len(ends) - 1][2])


def cuts_from_names(names: Sequence[str], split_after: Sequence[str]) -> list[int]:
    """Cut positions for ``--split-after`` layer names (strictly increasing, none after the last layer)."""
    index = {n: i for i, n in enumerate(names)}
    cuts = []
    for s in split_after:
        if s not in index:
            raise ValueError(f"--split-after {s!r} is not a layer of this model; its layers: {', '.join(names)}")
        cuts.append(index[s])
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"--split-after layers must be distinct and in forward order, got {','.join(split_after)}")
    if cuts and cuts[-1] == len(names) - 1:
        raise ValueError(f"--split-after {names[-1]!r} is the last layer: nothing would be left for the last stage")
    return cuts


@dataclass
class StagePlan:
    """Which layers each stage holds.

    ``cuts[j]`` is the index of the last layer before split ``j``;
    ``stage_layers[s]`` the layer names of stage ``s``;
    ``stage_parameters[s]`` its trainable parameter count.
    """

    names: list[str]
    cuts: list[int]
    stage_layers: list[list[str]]
    stage_parameters: list[int]

    @property
    def stages(self) -> int:
        return len(self.stage_layers)

    @property
    def split_after(self) -> list[str]:
        return [self.names[c] for c in self.cuts]

    def bounds(self, stage: int) -> tuple[int, int]:
        """``[start, stop)`` layer positions of ``stage``."""
        edges = [-1, *self.cuts, len(self.names) - 1]
        return edges[stage] + 1, edges[stage + 1] + 1

    def to_dict(self) -> dict:
        return {"split_after": self.split_after, "stage_layers": self.stage_layers,
                "stage_parameters": self.stage_parameters}


def plan_stages(model: nn.Module, stages: int, split_after: Sequence[str] | None = None) -> StagePlan:
    """Place ``model``'s layers on ``stages`` stages (named splits, or balanced by parameters).

    Raises ValueError naming the problem: a model that is not a chain, an
    unknown layer name, a count of ``--split-after`` names that is not
    ``stages - 1``, or a stage without trainable parameters.
    """
    layers = pipeline_layers(model)
    names = [n for n, _ in layers]
    params = layer_parameters(layers)
    stages = int(stages)
    if stages < 1:
        raise ValueError(f"--mp-stages is {stages}; it must be >= 1")
    if split_after:
        split_after = list(split_after)
        if len(split_after) != stages - 1:
            raise ValueError(f"--split-after names {len(split_after)} layer(s) ({','.join(split_after)}) but "
                             f"--mp-stages {stages} needs {stages - 1}")
        cuts = cuts_from_names(names, split_after)
    else:
        cuts = balanced_cuts(params, stages)
    plan = StagePlan(names, cuts, [], [])
    for s in range(stages):
        a, b = plan.bounds(s)
        plan.stage_layers.append(names[a:b])
        plan.stage_parameters.append(sum(params[a:b]))
    for s, p in enumerate(plan.stage_parameters):
        if p == 0:
            raise ValueError(f"stage {s} ({', '.join(plan.stage_layers[s])}) has no trainable parameters; "
                             f"move a split (--split-after) so that every stage holds a layer with parameters")
    return plan


def stage_module(model: nn.Module, plan: StagePlan, stage: int) -> nn.Sequential:
    """The layers of ``stage`` as an ``nn.Sequential`` sharing ``model``'s modules (and parameters)."""
    layers = pipeline_layers(model)
    a, b = plan.bounds(stage)
    return nn.Sequential(*[m for _, m in layers[a:b]])
