"""An index-file decoder and encoder written from docs/FORMAT.md section 2 alone.

Shares no code with shardkeep: it decodes with `struct` and checks the
trailer with the `xxhash` package, so a bug that the C++ encoder and
decoder share shows up in the tests that use it.
"""

import struct

import xxhash

MAGIC = b"SKIDX\x00\x00\x01"
HEADER = struct.Struct("<8sQ")           # magic, record count
RECORD = struct.Struct("<IIIIQQQQ")      # leaf, rank, file, codec, offset,
                                         # stored, raw, checksum
TRAILER = struct.Struct("<Q")            # XXH3-64 of everything before it


def read_index(data: bytes) -> list[dict]:
    """Decodes an index file per docs/FORMAT.md section 2."""
    assert len(data) >= HEADER.size + TRAILER.size
    (trailer,) = TRAILER.unpack_from(data, len(data) - TRAILER.size)
    assert xxhash.xxh3_64_intdigest(data[: -TRAILER.size]) == trailer
    magic, count = HEADER.unpack_from(data, 0)
    assert magic == MAGIC
    pos = HEADER.size
    records = []
    for _ in range(count):
        leaf, rank, data_file, codec, offset, stored, raw, checksum = (
            RECORD.unpack_from(data, pos))
        pos += RECORD.size
        assert rank <= 64 and codec in (0, 1, 2)
        dims = struct.unpack_from(f"<{2 * rank}Q", data, pos)
        pos += 16 * rank
        records.append(dict(leaf=leaf, rank=rank, data_file=data_file,
                            codec=codec, offset=offset, stored_length=stored,
                            raw_length=raw, checksum=checksum,
                            origin=list(dims[:rank]), shape=list(dims[rank:])))
    assert pos == len(data) - TRAILER.size, "bytes between records and trailer"
    return records


def write_index(records: list[dict]) -> bytes:
    """Encodes records as returned by ``read_index``, trailer included."""
    out = bytearray(HEADER.pack(MAGIC, len(records)))
    for r in records:
        out += RECORD.pack(r["leaf"], len(r["shape"]), r["data_file"], r["codec"],
                           r["offset"], r["stored_length"], r["raw_length"], r["checksum"])
        out += struct.pack(f"<{2 * len(r['shape'])}Q", *r["origin"], *r["shape"])
    return bytes(out + TRAILER.pack(xxhash.xxh3_64_intdigest(bytes(out))))
