"""Plain SGD with momentum, for the runtimes' own training (``train``, the parameter server, the pipeline).

The same update as ``torch.optim.SGD`` (its single-tensor loop: weight decay added to the gradient,
the momentum buffer started as a copy of the first gradient, then ``buf * momentum + (1 - dampening) *
grad``, Nesterov's look-ahead, ``param -= lr * step``), the same ``param_groups``, ``state`` and
``state_dict()`` layout, so a checkpoint of either loads into the other.  Why not ``torch.optim.SGD``
itself: every ``torch.optim`` optimizer imports ``torch._dynamo`` on its constructor and its first
step (``Optimizer.add_param_group`` is wrapped by ``torch._disable_dynamo``), about 1.2 s of CPU per
rank before the first step (docs/performance-log.md, "Start-up of a rank"); nothing here needs it.
Library users keep their own ``torch.optim`` optimizer (:func:`mpisparse.torch.DistributedOptimizer`
wraps either).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import torch

#: the options of a parameter group, as torch.optim.SGD names them (its extra ones kept for its state_dict)
_DEFAULTS = {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False,
             "maximize": False, "foreach": None, "differentiable": False, "fused": None}


class SGD:
    """``torch.optim.SGD(params, lr, momentum, dampening, weight_decay, nesterov)``'s update and state."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if not value >= 0.0:
                raise ValueError(f"{name} is {value}; allowed: >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov needs momentum > 0 and dampening 0")
        self.defaults: dict[str, Any] = {**_DEFAULTS, "lr": lr, "momentum": momentum, "dampening": dampening,
                                         "weight_decay": weight_decay, "nesterov": nesterov}
        params = list(params)
        if not params:
            raise ValueError("the optimizer got an empty parameter list")
        self.param_groups: list[dict[str, Any]] = [{"params": params, **self.defaults}]
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            lr, mom, damp, wd, nesterov = g["lr"], g["momentum"], g["dampening"], g["weight_decay"], g["nesterov"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                d = p.grad if not g["maximize"] else -p.grad
                if d.is_sparse and (wd != 0 or mom != 0):  # an embedding's rows: momentum as for a dense table
                    d = d.to_dense()
                if wd != 0:
                    d = d.add(p, alpha=wd)
                if mom != 0:
                    buf = self.state[p].get("momentum_buffer")
                    if buf is None:
                        buf = self.state[p]["momentum_buffer"] = torch.clone(d).detach()
                    else:
                        buf.mul_(mom).add_(d, alpha=1 - damp)
                    d = d.add(buf, alpha=mom) if nesterov else buf
                p.add_(d, alpha=-lr)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    # ------------------------------------------------------------- state, as torch.optim lays it out
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {"momentum_buffer": tensor}}, "param_groups": [{..., "params": [index...]}]}``
        (parameters numbered in group order, as ``torch.optim.Optimizer.state_dict``)."""
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(self.param_groups, groups)):
            raise ValueError("the loaded state dict's parameter groups do not match the optimizer's "
                             f"({[len(g['params']) for g in groups]} parameters against "
                             f"{[len(g['params']) for g in self.param_groups]})")
        by_index = {i: p for a, b in zip(self.param_groups, groups) for i, p in zip(b["params"], a["params"])}
        self.state = defaultdict(dict)
        for i, s in state_dict["state"].items():
            p = by_index[int(i)]
            self.state[p] = {k: (v.detach().to(dtype=p.dtype, device=p.device, copy=True) if torch.is_tensor(v) else v)
                             for k, v in s.items()}
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})

    def __repr__(self) -> str:
        g = self.param_groups[0]
        return (f"SGD(lr={g['lr']}, momentum={g['momentum']}, dampening={g['dampening']}, "
                f"weight_decay={g['weight_decay']}, nesterov={g['nesterov']})")
