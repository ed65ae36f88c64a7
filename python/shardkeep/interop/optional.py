"""Lazy imports of the optional libraries that read other formats.

shardkeep itself needs neither tensorstore nor torch; they are imported
only when a path that needs them is taken, and their absence is reported
with the package extra that installs them.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Imports ``module``; raises ImportError naming ``purpose`` and the
    ``pip install 'shardkeep[<extra>]'`` that provides it when missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{purpose} needs the optional package {module.split('.')[0]!r}, which is not"
            f" installed: pip install 'shardkeep[{extra}]'") from e
