"""The Python front's shape: folders by role whose imports point one way,
no module reaching into another's private names, and a public API that is
``shardkeep.__all__`` and nothing else."""

import ast
import inspect
import pathlib
import re

import shardkeep
from shardkeep import _core

PACKAGE = pathlib.Path(shardkeep.__file__).parent
TESTS = pathlib.Path(__file__).parent

# Each part of the package may import only parts of a lower rank (and
# itself). Saving and loading share a rank: neither imports the other. The
# manager reads other formats' steps under its root (Orbax's) with interop.
RANK = {
    "_core": 0, "errors": 0, "s3_settings": 1, "gcs_settings": 1, "options": 2,
    "base": 3, "job": 4, "saving": 5, "loading": 5,
    "interop": 6, "manager": 7, "__init__": 8,
    # The Orbax drop-in is a client of the package's public API, above it.
    "orbax": 9,
}
ROLES = ("base", "job", "saving", "loading", "manager", "interop")


def _sources(folder: pathlib.Path):
    return sorted(folder.rglob("*.py"))


def _part_of(path: pathlib.Path) -> str:
    """The top-level part of the package a file belongs to."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_parts(path: pathlib.Path):
    """(part, names) for each relative import in a package file."""
    folder = path.relative_to(PACKAGE).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = folder[:len(folder) - (node.level - 1)]
            target = base + tuple(node.module.split(".") if node.module else ())
            if target:
                yield target[0], [a.name for a in node.names]
            else:
                for alias in node.names:
                    yield alias.name, [alias.name]


def test_every_module_is_in_a_ranked_part():
    parts = {_part_of(p) for p in _sources(PACKAGE)}
    assert parts <= set(RANK), f"unranked parts: {parts - set(RANK)}"
    assert set(ROLES) <= parts


def test_imports_point_one_way():
    upward = []
    for path in _sources(PACKAGE):
        me = _part_of(path)
        for part, names in _imported_parts(path):
            if part != me and RANK[part] >= RANK[me]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {part} {names}")
    assert upward == []


def _private_reaches(path: pathlib.Path):
    """Private names a file takes from other shardkeep modules: imported by
    name, or read as an attribute of an imported shardkeep module."""
    tree = ast.parse(path.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("shardkeep")):
            for alias in node.names:
                if alias.name.startswith("_") and alias.name != "_core":
                    yield f"imports {alias.name}"
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("shardkeep"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            yield f"reads {node.value.id}.{node.attr}"


def test_no_file_reaches_into_another_modules_private_names():
    reaches = [f"{path.name}: {what}" for folder in (PACKAGE, TESTS)
               for path in _sources(folder) for what in _private_reaches(path)]
    assert reaches == []


def test_the_public_api_is_all_and_nothing_else():
    public = {name for name in dir(shardkeep) if not name.startswith("_")}
    # Importing the package binds its submodules as attributes too; they
    # are its internals, not its API.
    # The policy modules are public namespaces (``sk.save_decisions.X``, as
    # Orbax's users write ``checkpoint_managers.X``).
    namespaces = {"save_decisions", "preservation"}
    # Imported by its users alone (``from shardkeep import orbax``), not by the package.
    add_ons = {"orbax"}
    modules = {name for name in public if inspect.ismodule(getattr(shardkeep, name))}
    assert modules <= set(ROLES) | {"errors", "options", "s3_settings", "gcs_settings"} | namespaces | add_ons
    assert public - (modules - namespaces) - add_ons == set(shardkeep.__all__)


def test_the_orbax_drop_in_uses_the_public_api_alone():
    """shardkeep.orbax imports nothing of the package but ``shardkeep`` and
    its own modules: what it does, a user program can do."""
    reaches = []
    for path in _sources(PACKAGE / "orbax"):
        reaches += [f"{path.name}: {part} {names}" for part, names in _imported_parts(path)
                    if part != "orbax"]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level \
                    and (node.module or "").startswith("shardkeep"):
                reaches.append(f"{path.name}: from {node.module}")
            elif isinstance(node, ast.Import):
                reaches += [f"{path.name}: import {a.name}" for a in node.names
                            if a.name.startswith("shardkeep.")]
    assert reaches == []


# Where a checkpoint lives and how a root is laid out are the core's to say
# (``_core.Location``; ``step_folder_name``, ``temporary_folder`` and the
# other root-layout calls): adding a storage scheme or renaming a folder
# touches the core and nothing here.
STORAGE_SCHEMES = re.compile(r"\b(?:s3|gs|file|memory|memory-objects)://")
LAYOUT_NAMES = re.compile(r"\.shardkeep-(?:tmp|old|deleting|g|lease)")


def _code_strings(path: pathlib.Path):
    """(line, text) of a file's string constants, docstrings left out (they
    tell users which URLs work; code that decides must not spell them)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node.lineno, node.value


def test_no_module_spells_a_storage_scheme_or_a_roots_folder_names():
    spelled = [f"{path.relative_to(PACKAGE)}:{line}: {text!r}" for path in _sources(PACKAGE)
               for line, text in _code_strings(path)
               if STORAGE_SCHEMES.search(text) or LAYOUT_NAMES.search(text)]
    assert spelled == []


def test_the_core_alone_reads_and_writes_step_folder_names():
    # A regular expression that reads "000000100", or a number zero-padded
    # by a format spec: a second spelling of the core's step folders. Orbax's
    # step folders are Orbax's format, read where the other formats' markers
    # are (loading/other_formats.py).
    spellings = []
    for path in _sources(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and re.fullmatch(node.args[0].value, "000000100")):
                spellings.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
            if (isinstance(node, ast.FormattedValue) and isinstance(node.format_spec, ast.JoinedStr)
                    and node.format_spec.values
                    and isinstance(node.format_spec.values[0], ast.Constant)
                    and str(node.format_spec.values[0].value).startswith("0")):
                spellings.append(f"{path.relative_to(PACKAGE)}:{node.lineno} (zero-padding)")
    assert [s for s in spellings if not s.startswith("loading/other_formats.py:")] == []


# A json.loads whose argument names a commit record or a meta.json parses
# what the core decodes (and checks) a second time, outside its checks.
CORE_DOCUMENTS = re.compile(r"commit|meta\b|meta_|_SHARDKEEP|record", re.IGNORECASE)


def _json_parses(path: pathlib.Path):
    """(line, argument source) of each json.loads / json.load call."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("loads", "load") and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json" and node.args):
            yield node.lineno, ast.unparse(node.args[0])


def test_commit_records_and_meta_are_decoded_by_the_core_alone():
    parsed = [f"{path.relative_to(PACKAGE)}:{line}: json.loads({argument})"
              for path in _sources(PACKAGE) for line, argument in _json_parses(path)
              if CORE_DOCUMENTS.search(argument)]
    assert parsed == []
    # Nor does the binding hand them to Python as text to parse: a record
    # is a _core.CommitRecord, meta a dict the core decoded.
    as_text = [f"{cls.__name__}.{name}" for cls in (_core.Reader, _core.RootEntry)
               for name in ("commit_json", "meta_json") if hasattr(cls, name)]
    assert as_text == []


# -- import depth --------------------------------------------------------------

# The most modules a chain of module-level imports inside the package may
# pass through, below the package itself (whose __init__ imports every part
# to re-export the API). A deep chain is a module that needs the whole
# stack beneath it to be read, tested or imported.
MAX_IMPORT_DEPTH = 7


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level(tree: ast.Module):
    """The statements run on import: the module's own, and those under its
    top-level if/try/with blocks, not function or class bodies."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            pending.extend(node.body)


def _import_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports on import."""
    paths = {_module_name(p): p for p in _sources(PACKAGE)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in _module_level(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in paths)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module not in paths:
                    continue
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    found.add(sub if sub in paths else module)
        # A module's own packages are imported before it: naming one (as
        # ``from .. import _core`` names the extension through the root
        # package) adds no dependency.
        graph[name] = {m for m in found if m != name and not name.startswith(m + ".")}
    return graph


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    chains: dict[str, list[str]] = {}

    def chain(name: str, visiting: tuple = ()) -> list[str]:
        assert name not in visiting, f"import cycle: {' -> '.join(visiting + (name,))}"
        if name not in chains:
            below = [chain(d, visiting + (name,)) for d in sorted(graph[name])]
            chains[name] = [name] + max(below, key=len, default=[])
        return chains[name]

    starts = [name for name in graph if name != PACKAGE.name]
    return max((chain(name) for name in sorted(starts)), key=len)


def test_the_import_chain_is_shallow():
    longest = _longest_chain(_import_graph())
    assert len(longest) <= MAX_IMPORT_DEPTH, (
        f"an import chain of {len(longest)} modules (at most {MAX_IMPORT_DEPTH}): "
        + " -> ".join(longest))


# -- module size ---------------------------------------------------------------

# The most lines a module of the package may have: past it a module has
# more than one job, and is split by role.
MAX_MODULE_LINES = 400


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in _sources(PACKAGE)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
