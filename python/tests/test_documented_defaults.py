"""The defaults the docs state are those of shardkeep.Options, and those
are the C++ core's (cpp/include/shardkeep/options.h)."""

import ast
import dataclasses
import pathlib
import re

import shardkeep as sk
from shardkeep import _core

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def _defaults() -> dict:
    return {f.name: f.default for f in dataclasses.fields(sk.Options)}


def _table() -> dict:
    """{option: default} from the table of docs/OPTIONS.md."""
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", (ROOT / "docs/OPTIONS.md").read_text(),
                      re.MULTILINE)
    return {name: ast.literal_eval(value) for name, value in rows}


def test_the_options_table_lists_every_field_with_its_default():
    table = _table()
    assert list(table) == list(_defaults()), "docs/OPTIONS.md lists other fields than Options"
    for name, default in _defaults().items():
        assert table[name] == default and type(table[name]) is type(default), name


def test_every_field_is_described_in_the_docstring():
    described = re.findall(r"^      (\w+): ", sk.Options.__doc__, re.MULTILINE)
    assert described == list(_defaults())


def test_no_doc_calls_another_value_the_default():
    """Phrases like "`Options(broadcast_load=True)` (the default)"."""
    claim = re.compile(r"(\w+)=([^`),]+)\)?`\s*\(the\s+default")
    defaults = _defaults()
    found = 0
    for doc in DOCS:
        for name, value in claim.findall(doc.read_text()):
            if name in defaults:
                found += 1
                assert ast.literal_eval(value) == defaults[name], (doc.name, name, value)
    assert found  # the phrase is in use, so the check checks something


def _bound_fields(core_object) -> dict:
    """{field: value} of a bound C++ struct (its def_rw properties), nested
    structs as dicts of their own fields."""
    fields = {}
    for name, attr in vars(type(core_object)).items():
        if isinstance(attr, property):
            value = getattr(core_object, name)
            bound = type(value).__module__.startswith("shardkeep")
            fields[name] = _bound_fields(value) if bound else value
    return fields


def test_python_defaults_are_the_cores():
    """shardkeep.Options() handed to the core equals the core's own
    defaults, field by field: a default changed on one side only (in
    options.h or options.py) fails here. _core.Options() takes every
    default from the C++ struct (core_module.cc)."""
    core = _bound_fields(_core.Options())
    from_python = _bound_fields(sk.Options().to_core())
    assert set(core) >= {"chunk_bytes", "compress", "io_threads", "host_memory_limit",
                         "timeout_s", "allow_lossy_cast", "s3"}
    differ = {name: (from_python[name], core[name]) for name in core
              if from_python[name] != core[name] or type(from_python[name]) is not type(core[name])}
    assert differ == {}, "(shardkeep.Options, options.h)"
