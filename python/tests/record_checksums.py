"""The checksums of the commit record, written from docs/FORMAT.md section 3 alone.

Shares no code with shardkeep (``re``, ``json`` and the ``xxhash``
package), so a bug the C++ encoder and decoder share shows up in the tests
that use it. Tests of hostile checkpoints use ``relist`` and ``seal`` to
forge what a producer that edited a checkpoint's files would write: a
record whose checksums hold, so that the checks behind them are reached.
"""

from __future__ import annotations

import json
import pathlib
import re

import xxhash

# The record ends with its own checksum member and the closing brace, JSON
# white space allowed between the tokens.
_WS = rb"[ \t\r\n]*"
_OWN = re.compile(rb'"checksum"' + _WS + b":" + _WS + rb'"([0-9a-f]{16})"' + _WS + b"}" +
                  _WS + rb"\Z")
_ZEROS = b"0" * 16


def file_checksum(data: bytes) -> str:
    """XXH3-64 (seed 0) as 16 lower-case hexadecimal digits."""
    return xxhash.xxh3_64_hexdigest(data)


def own_checksum(record: bytes) -> tuple[str, str] | None:
    """(stated, actual) checksums of a version-2 record; None without one."""
    found = _OWN.search(record)
    if found is None:
        return None
    zeroed = record[:found.start(1)] + _ZEROS + record[found.end(1):]
    return found.group(1).decode(), file_checksum(zeroed)


def seal(record: bytes) -> bytes:
    """``record`` with its own checksum made to match its bytes."""
    found = _OWN.search(record)
    assert found is not None, "the record does not end with its checksum"
    zeroed = record[:found.start(1)] + _ZEROS + record[found.end(1):]
    return record[:found.start(1)] + file_checksum(zeroed).encode() + record[found.end(1):]


def write_record(ckpt, record: dict) -> None:
    """Writes ``record`` (a decoded _SHARDKEEP) into ``ckpt``, its checksum
    last and sealed."""
    record = {k: v for k, v in record.items() if k != "checksum"}
    record["checksum"] = _ZEROS.decode()
    text = (json.dumps(record, indent=2) + "\n").encode()
    (pathlib.Path(ckpt) / "_SHARDKEEP").write_bytes(seal(text))


def relist(ckpt) -> None:
    """Lists in ``ckpt``'s _SHARDKEEP the checksums of its meta.json and
    value files as they are now, and seals the record."""
    ckpt = pathlib.Path(ckpt)
    record = json.loads((ckpt / "_SHARDKEEP").read_bytes())
    root = ckpt / record.get("data_folder", "")
    for name, entry in record["checkpointables"].items():
        entry["meta_checksum"] = file_checksum((root / name / "meta.json").read_bytes())
        if entry["kind"] != "pytree":
            value = "value.json" if entry["kind"] == "json" else "value.bin"
            entry["value_checksum"] = file_checksum((root / name / value).read_bytes())
    write_record(ckpt, record)
