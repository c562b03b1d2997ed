"""The reproduce targets by name (``mpisparse reproduce --list``)."""

from __future__ import annotations

from .base import Target

__all__ = ["TARGETS", "register", "get_target"]

#: name -> target instance, in registration order
TARGETS: dict[str, Target] = {}


def register(cls: type[Target]) -> type[Target]:
    """Class decorator: add a target under its ``name``."""
    if cls.name in TARGETS:
        raise ValueError(f"reproduce target {cls.name!r} is registered twice")
    TARGETS[cls.name] = cls()
    return cls


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"no reproduce target {name!r}; targets: {', '.join(TARGETS)}") from None
