"""The one rule for Orbax arguments shardkeep does not support: refused, by name.

A program moved from Orbax must never lose an option without a word: an
argument given with a value other than the one shardkeep supports (for
most, Orbax's default) is an ``InvalidArgumentError`` that names it, says
where it was given and what to do instead. docs/ORBAX.md lists them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import shardkeep as sk


class Unsupported(NamedTuple):
    """An argument as given, the only value accepted for it, and what to do instead."""

    value: Any
    supported: Any
    advice: str


def check(where: str, arguments: dict[str, Unsupported]) -> None:
    """Raises for the first of ``arguments`` (name -> Unsupported) given
    another value than its supported one; ``where`` is the call it was given to."""
    for name, argument in arguments.items():
        if not _same(argument.value, argument.supported):
            raise refused(where, name, argument.value, argument.advice)


def refused(where: str, name: str, value: Any, advice: str) -> sk.InvalidArgumentError:
    """The error for argument ``name`` of ``where``, given as ``value``."""
    return sk.InvalidArgumentError(
        f"{where}: {name}={_shown(value)} is not supported by shardkeep.orbax"
        f" (docs/ORBAX.md lists what is refused): {advice}")


def _same(value: Any, supported: Any) -> bool:
    if value is supported:
        return True
    try:
        return bool(value == supported)
    except Exception:  # an object whose == is not a yes or no is not the supported value
        return False


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
