"""The exception hierarchy shared by the Python front and the C++ core.

The extension looks these classes up by name when it maps a C++ Status to a
Python exception, so the names are part of the binding contract. Each class
also derives from the closest built-in exception, so that code written
against the standard library (``except FileNotFoundError``) keeps working.
"""

import builtins


class ShardkeepError(Exception):
    """Base class of every error raised by shardkeep."""


class NotFoundError(ShardkeepError, FileNotFoundError):
    """A checkpoint, checkpointable, leaf or file does not exist."""


class CorruptionError(ShardkeepError):
    """Stored bytes fail a checksum or do not decode."""


class IncompatibleError(ShardkeepError, ValueError):
    """The checkpoint does not fit the request (shape, dtype or tree mismatch)."""


class TimeoutError(ShardkeepError, builtins.TimeoutError):  # noqa: A001
    """A wait (save completion, barrier, key-value get) ran out of time."""


class StorageError(ShardkeepError):
    """The storage backend failed (I/O error, permission, network)."""


class AlreadyExistsError(ShardkeepError, FileExistsError):
    """A committed checkpoint is already at the path and ``force`` is False."""


class InvalidArgumentError(ShardkeepError, ValueError):
    """An argument is malformed: unsupported leaf type, bad option, bad path."""


class OutOfSpaceError(StorageError):
    """The storage is full; the message gives the bytes needed and free."""


class CommitStateUnknownError(ShardkeepError):
    """A save failed at a point where its checkpoint may or may not exist.

    The commit's outcome could not be settled (the coordination service or
    the storage failed while deciding it). Check the path before retrying.
    """


class LeaseLostError(ShardkeepError):
    """A save in flight lost its lease, and nothing was committed.

    Another process (a manager opening the same root, ``shardkeep gc``,
    ``shardkeep rm --force``) judged the save dead and removed its files:
    its process looked gone, or it had not renewed its lease within the
    lease's duration plus the allowance for clocks. Save again.
    """
