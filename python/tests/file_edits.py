"""Editing checkpoint files behind shardkeep's back, as corruption does."""


def flip_byte(path: str, offset: int) -> None:
    """Inverts bit 6 of the byte at ``offset`` of the file at ``path``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))
