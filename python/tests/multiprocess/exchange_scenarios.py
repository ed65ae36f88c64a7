"""Scenarios for exchange_bytes in real multi-process jobs (test_exchange.py).

Every process derives every buffer from (source, destination, number) alone,
so each can check what it received without being told.
"""

from __future__ import annotations

import jax
import numpy as np

from shardkeep.job import exchange
from shardkeep.errors import InvalidArgumentError


def _buffer(source: int, dest: int, number: int, size: int) -> np.ndarray:
    rng = np.random.default_rng([source, dest, number])
    return rng.integers(0, 256, size, dtype=np.uint8)


def _check(received: dict, expected: dict) -> None:
    assert sorted(received) == sorted(expected), (sorted(received), sorted(expected))
    for source, buffers in expected.items():
        got = received[source]
        assert len(got) == len(buffers), (source, len(got), len(buffers))
        for a, b in zip(got, buffers):
            assert a.dtype == np.uint8 and np.array_equal(a, b), source


def patterns() -> dict:
    """A ring, an all-to-all of mixed sizes over several rounds, self-sends,
    an empty call, bit patterns of floats, and a bad destination."""
    count, me = jax.process_count(), jax.process_index()
    exchange.ROUND_BYTES = exchange.MIN_ROUND_BYTES  # several rounds per shift

    # A ring: each process sends its successor one buffer.
    succ, pred = (me + 1) % count, (me - 1) % count
    got = exchange.exchange_bytes({succ: [_buffer(me, succ, 0, 1000)]}, name="ring")
    _check(got, {pred: [_buffer(pred, me, 0, 1000)]})

    # Everyone to everyone (itself included), sizes differing per pair: zero,
    # tiny, and longer than a round.
    def sizes(source, dest):
        return [(source * 7 + dest * 3) % 5 * 40_000 + dest, 0, 3]

    outgoing = {d: [_buffer(me, d, 1 + i, n) for i, n in enumerate(sizes(me, d))]
                for d in range(count)}
    got = exchange.exchange_bytes(outgoing, name="all to all")
    _check(got, {s: [_buffer(s, me, 1 + i, n) for i, n in enumerate(sizes(s, me))]
                 for s in range(count)})

    # Received into the caller's buffers, or, where they do not match what
    # the source sends, into fresh ones (the call stays collective).
    mine = np.zeros(1000, np.uint8)
    got = exchange.exchange_bytes({succ: [_buffer(me, succ, 7, 1000)]}, name="into",
                                  into={pred: [mine]})
    assert got[pred][0].ctypes.data == mine.ctypes.data
    assert np.array_equal(mine, _buffer(pred, me, 7, 1000))
    short = np.zeros(999, np.uint8)
    got = exchange.exchange_bytes({succ: [_buffer(me, succ, 8, 1000)]}, name="short into",
                                  into={pred: [short]})
    assert got[pred][0].ctypes.data != short.ctypes.data and not short.any()
    assert np.array_equal(got[pred][0], _buffer(pred, me, 8, 1000))

    # Nothing to send anywhere: still a matched call.
    assert exchange.exchange_bytes({}, name="empty") == {}

    # Only process 0 sends, to everyone else: floats with NaN payloads and -0.0
    # arrive bit for bit.
    floats = np.array([-0.0, np.nan, 1.5, -np.inf], np.float32)
    floats.view(np.uint32)[1] = 0x7FC0BEEF
    got = exchange.exchange_bytes({d: [floats] for d in range(1, count)} if me == 0 else {},
                                  name="floats")
    if me == 0:
        assert got == {}
    else:
        assert got[0][0].view(np.float32).view(np.uint32).tolist() == \
            floats.view(np.uint32).tolist()

    try:
        exchange.exchange_bytes({count: [floats]}, name="bad destination")
    except InvalidArgumentError as e:
        bad_destination = str(e)
    else:
        raise AssertionError("a destination outside the job was accepted")
    return {"bad_destination": bad_destination}
