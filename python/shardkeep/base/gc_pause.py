"""Pausing Python's cyclic garbage collector around tree-sized bookkeeping."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disables the cyclic collector inside the block (if it was enabled).

    Planning a save or load of thousands of leaves allocates tens of
    thousands of short-lived objects, none in cycles; each allocation burst
    sets off collections that walk the caller's whole heap (a training
    script's heap is large). Reference counting frees these objects anyway.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
