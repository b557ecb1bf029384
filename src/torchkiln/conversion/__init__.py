"""Conversion: an engine block's nodes become a layer Network, through the converters and evaluators that
register in `torchkiln.analysis.registry`."""
from __future__ import annotations

from torchkiln.analysis.registry import CONVERTERS, EVALUATORS


def load_all() -> None:
    """Import every converter and evaluator module so that they register."""
    from torchkiln.conversion import converters, evaluators  # noqa: F401


def supported_ops() -> dict[str, list[str]]:
    """Registered keys: {'converters': [...], 'evaluators': [...]}, sorted."""
    load_all()
    return {"converters": sorted(CONVERTERS), "evaluators": sorted(EVALUATORS)}
