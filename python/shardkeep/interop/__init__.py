"""Reading other formats' checkpoints: Orbax (through tensorstore) and
PyTorch DCP (through torch), both optional dependencies imported only
when used. See docs/INTEROP.md."""

from .convert import SOURCE_FORMATS, convert
from .dcp import load_dcp
from .orbax import load_orbax

__all__ = ["SOURCE_FORMATS", "convert", "load_dcp", "load_orbax"]
