"""Names the package's docstrings and comments cite exist: a module that
was moved or renamed must not live on in the text that points readers to
it."""

import importlib
import inspect
import pathlib
import re

import shardkeep

PACKAGE = pathlib.Path(shardkeep.__file__).parent
DOTTED = re.compile(r"\bshardkeep(?:\.[A-Za-z_]\w*)+")


def _unresolved(name: str) -> str | None:
    """Why ``name`` (``shardkeep.a.b``) names nothing, or None if it names
    a module or an attribute of one.

    A module reached as an attribute of a plain module (not a package) is
    only what that module imported: ``shardkeep.manager.checkpoint_manager.local_tier``
    would name ``shardkeep.manager.local_tier`` by its importer."""
    found = importlib.import_module("shardkeep")
    path = "shardkeep"
    for part in name.split(".")[1:]:
        holder, path = found, f"{path}.{part}"
        if hasattr(holder, part):
            found = getattr(holder, part)
            if (inspect.ismodule(found) and found.__name__ != path
                    and not hasattr(holder, "__path__")):
                return f"{part} is {found.__name__}, imported by {holder.__name__}"
            continue
        if hasattr(holder, "__path__"):  # a package: its submodule may not be imported yet
            try:
                found = importlib.import_module(path)
                continue
            except ModuleNotFoundError as error:
                if error.name != path:
                    raise
        return f"{getattr(holder, '__name__', type(holder).__name__)} has no {part}"
    return None


def test_every_shardkeep_name_in_the_package_text_exists():
    cited = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            for name in DOTTED.findall(line):
                cited.setdefault(name, []).append(f"{source.relative_to(PACKAGE)}:{number}")
    assert len(cited) > 20  # the pattern finds what the text cites
    wrong = [f"{where}: {name} ({why})" for name, wheres in sorted(cited.items())
             if (why := _unresolved(name)) for where in wheres]
    assert wrong == []


def test_the_check_tells_a_missing_name_from_a_present_one():
    assert _unresolved("shardkeep.manager.local_tier") is None
    assert _unresolved("shardkeep.Options.to_core") is None
    assert _unresolved("shardkeep.save_decisions") is None  # a public namespace
    assert _unresolved("shardkeep.manager.no_such_module")
    assert _unresolved("shardkeep.Options.no_such_method")
    assert _unresolved("shardkeep.manager.checkpoint_manager.local_tier")
