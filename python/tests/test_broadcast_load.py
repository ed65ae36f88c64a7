"""Load-and-broadcast (Options.broadcast_load).

The plan and its exchange are checked in one process against simulated
jobs (fake devices of several processes, the exchange played by threads);
a real 4-process job checks values and the bytes each process reads from
storage, and others load Orbax and DCP checkpoints through the same plan;
a single-process load checks that the option changes nothing there.
"""

import collections
import math
import pathlib
import sys
import threading
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from conftest import assert_same_bits, make_mesh

sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
import harness  # noqa: E402

import shardkeep as sk  # noqa: E402
from shardkeep import _core  # noqa: E402
from shardkeep.loading import broadcast_load, load_plan


class FakeDevice:
    def __init__(self, device_id: int, process_index: int):
        self.id, self.process_index = device_id, process_index


class RowsSharding:
    """Dimension 0 cut into ``len(groups)`` equal blocks; block b is held by
    the devices ``groups[b]`` (a stand-in for a sharding over devices of
    several processes, which one process cannot build for real)."""

    def __init__(self, groups: list[list[FakeDevice]]):
        self.groups = groups

    def devices_indices_map(self, shape):
        rows = shape[0] // len(self.groups)
        rest = tuple(slice(None) for _ in shape[1:])
        return {device: (slice(b * rows, (b + 1) * rows),) + rest
                for b, devices in enumerate(self.groups) for device in devices}


def _job(processes: int, devices_per_process: int = 1) -> list[list[FakeDevice]]:
    return [[FakeDevice(p * devices_per_process + d, p) for d in range(devices_per_process)]
            for p in range(processes)]


class ChunkedReader:
    """Answers a source's ranges for leaves stored in chunks of
    ``chunk_rows`` rows, leaf n in file "data/n"."""

    def __init__(self, leaves: list, chunk_rows: int):
        self.leaves, self.chunk_rows = leaves, chunk_rows

    def ranges(self, requests):
        out = []
        for request in requests:
            number, origin, shape = request.leaf, request.origin, request.shape
            assert request.buffer is None
            full, stored, _ = self.leaves[number]
            assert request.dtype == np.dtype(stored).name
            row_bytes = math.prod(full[1:]) * np.dtype(stored).itemsize
            first = origin[0] // self.chunk_rows
            last = (origin[0] + shape[0] - 1) // self.chunk_rows
            out.append([(f"data/{number}", c * self.chunk_rows * row_bytes,
                         (c * self.chunk_rows
                          + min(self.chunk_rows, full[0] - c * self.chunk_rows)) * row_bytes)
                        for c in range(first, last + 1)])
        return out


def _simulate(processes: int, leaves: list, chunk_rows: int = 1) -> list[tuple]:
    """Plans every process of a job: ``leaves`` are (shape, dtype, sharding),
    stored in chunks of ``chunk_rows`` rows. Returns, per process, its plan
    and the buffers of its slots (one per box it holds, filled with 0x4d
    bytes), as the executor keeps them: slot -> array."""
    out = []
    for me in range(processes):
        plan = broadcast_load.Plan(me)
        buffers = {}
        for number, (shape, dtype, sharding) in enumerate(leaves):
            mine = {}
            for device, index in sharding.devices_indices_map(shape).items():
                if device.process_index == me:
                    origin = (index[0].start,) + (0,) * (len(shape) - 1)
                    extent = (index[0].stop - index[0].start,) + tuple(shape[1:])
                    slot = load_plan.Slot(number, f"leaf{number}", origin, extent,
                                          np.dtype(dtype), devices=())
                    mine[origin, extent] = slot
            for slot in mine.values():
                buffers[slot] = np.full(math.prod(slot.shape) * slot.dtype.itemsize, 0x4D,
                                        np.uint8).view(dtype).reshape(slot.shape)
            plan.add_leaf(number, f"leaf{number}", sharding, shape, (), np.dtype(dtype),
                          list(mine.values()))
        plan.choose_readers(ChunkedReader(leaves, chunk_rows))
        out.append((plan, buffers))
    return out


def _reads(simulated) -> dict[int, list[tuple]]:
    """(leaf number, origin, shape, buffer) of each read a simulated process makes."""
    reads = {}
    for me, (plan, buffers) in enumerate(simulated):
        shared = plan.shared_slots()
        reads[me] = [(s.number, s.origin, s.shape, buffer) for s, buffer in buffers.items()
                     if s not in shared]
        reads[me] += [(slot.number, origin, shape, buffer)
                      for slot, origin, shape, buffer in plan.own_pieces(buffers)]
    return reads


def _leaves_of_every_kind() -> list:
    job = _job(4, 2)
    devices = [d for process in job for d in process]
    return [
        # Each box held by every process (on its first or second device).
        ((64, 8), "float32", RowsSharding([devices[0::2], devices[1::2]])),
        ((32, 8), "float32", RowsSharding([devices[1::2], devices[0::2]])),
        ((64, 4), "int8", RowsSharding([devices[:4], devices[4:]])),  # 2 holders per box
        ((32, 2), "float32", RowsSharding([job[p] for p in range(4)])),  # unreplicated
        ((16, 3), "uint16", RowsSharding([devices[:2]])),  # one process's leaf
        ((0, 5), "float32", RowsSharding([devices])),  # no elements: every holder reads
    ]


@pytest.mark.parametrize("cut_bytes,spread", [(broadcast_load.MIN_CUT_BYTES, 1024),
                                                (64, 256)])
def test_each_row_is_read_once_and_the_reads_spread_over_processes(
        monkeypatch, cut_bytes, spread):
    """Whole boxes (the default for small ones) or boxes cut in pieces: every
    row of every leaf is read by exactly one process, and the processes'
    shares differ by at most one box or piece (``spread`` bytes) beyond the
    one-process leaf (96 bytes)."""
    monkeypatch.setattr(broadcast_load, "MIN_CUT_BYTES", cut_bytes)
    leaves = _leaves_of_every_kind()
    reads = _reads(_simulate(4, leaves))
    times_read = [np.zeros(shape[0], int) for shape, _, _ in leaves]
    for process_reads in reads.values():
        for number, origin, shape, buffer in process_reads:
            times_read[number][origin[0]:origin[0] + shape[0]] += 1
            assert buffer.shape == shape and buffer.flags.c_contiguous
    assert all((count == 1).all() for count in times_read), times_read
    # The empty box is "read" (for nothing) by each of its holders.
    assert sum(r[0] == 5 for process_reads in reads.values() for r in process_reads) == 4
    per_process = [sum(r[3].nbytes for r in reads[p]) for p in range(4)]
    assert max(per_process) - min(per_process) <= spread + 96, per_process
    assert min(per_process) > 0


def test_the_plan_is_the_same_whatever_order_the_holders_are_listed_in():
    job = _job(3, 3)  # block b lies on device b of every process
    forward = RowsSharding([[job[p][b] for p in range(3)] for b in range(3)])
    backward = RowsSharding([[job[p][b] for p in reversed(range(3))] for b in range(3)])
    first, second = [
        {p: [r[:3] for r in process_reads]
         for p, process_reads in _reads(_simulate(3, [((30, 2), "int32", sharding)])).items()}
        for sharding in (forward, backward)]
    assert first == second
    assert sorted(len(boxes) for boxes in first.values()) == [1, 1, 1]


@pytest.mark.parametrize("chunk_rows,readers", [(16, 4), (8, 4), (32, 2), (24, 1), (64, 1)])
def test_a_box_is_cut_only_where_no_stored_chunk_straddles_two_pieces(
        monkeypatch, chunk_rows, readers):
    """A box of 64 rows that 4 processes hold: stored in chunks of 16 or 8
    rows it is cut in 4 pieces (each process reads a quarter), in chunks of
    32 rows in halves; in chunks of 24 or 64 rows any cut would fetch a
    chunk twice, so one process reads the box whole."""
    monkeypatch.setattr(broadcast_load, "MIN_CUT_BYTES", 64)
    job = _job(4)
    leaves = [((64, 8), "float32", RowsSharding([[d for p in job for d in p]]))]
    reads = _reads(_simulate(4, leaves, chunk_rows))
    assert sum(bool(r) for r in reads.values()) == readers
    assert sorted(r[2][0] for process_reads in reads.values() for r in process_reads) == \
        [64 // readers] * readers


def test_overlap_of_pieces_ranges():
    overlap = broadcast_load.pieces_overlap
    assert not overlap([[("f", 0, 10)], [("f", 10, 5)], [("g", 0, 10)]])
    assert overlap([[("f", 0, 10)], [("f", 9, 5)]])
    # One piece's long range covers another's, past a range of its own.
    assert overlap([[("f", 0, 100), ("f", 10, 10)], [("f", 50, 10)]])
    assert not overlap([[("f", 0, 10), ("f", 5, 10)], [("f", 15, 1)]])


def _exchange_among_threads(processes: int):
    """An exchange_bytes for ``processes`` threads, one per simulated
    process (each sets ``me.index``); counts every process's calls."""
    me = threading.local()
    barrier = threading.Barrier(processes, timeout=30)
    mailbox: dict = {}
    calls = collections.Counter()

    def exchange_bytes(outgoing, *, name, timeout_s, into=None):
        # Ignores ``into``: the plan must then copy what it receives itself.
        assert timeout_s == 12.5 and name.startswith("load of ckpt, batch "), name
        calls[me.index] += 1
        for dest, buffers in outgoing.items():
            mailbox[me.index, dest] = [np.array(b.reshape(-1).view(np.uint8)) for b in buffers]
        barrier.wait()
        incoming = {src: mailbox[src, me.index] for src in range(processes)
                    if (src, me.index) in mailbox}
        barrier.wait()
        if me.index == 0:
            mailbox.clear()
        barrier.wait()
        return incoming

    return me, exchange_bytes, calls


@pytest.mark.parametrize("batch_bytes,cut_bytes", [
    (broadcast_load.BATCH_BYTES, broadcast_load.MIN_CUT_BYTES), (1000, 64)])
def test_receivers_get_the_readers_bytes(monkeypatch, batch_bytes, cut_bytes):
    """Each process fills only what it reads; after the exchange every
    holder holds every box (in several exchange calls when batches are
    small, of pieces from several readers when pieces are small)."""
    monkeypatch.setattr(broadcast_load, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(broadcast_load, "MIN_CUT_BYTES", cut_bytes)
    leaves = _leaves_of_every_kind()
    rng = np.random.default_rng(0)
    values = [rng.integers(0, 256, math.prod(shape) * np.dtype(dtype).itemsize, np.uint8)
              .view(dtype).reshape(shape) for shape, dtype, _ in leaves]
    simulated = _simulate(4, leaves)
    for process_reads in _reads(simulated).values():
        for number, origin, shape, buffer in process_reads:
            buffer[...] = values[number][origin[0]:origin[0] + shape[0]]
    me, fake, calls = _exchange_among_threads(4)
    monkeypatch.setattr(broadcast_load.exchange, "exchange_bytes", fake)
    errors = []

    def run(index):
        me.index = index
        try:
            plan, buffers = simulated[index]
            plan.exchange(buffers, "load of ckpt", 12.5)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for _, buffers in simulated:
        for s, buffer in buffers.items():
            assert_same_bits(buffer, values[s.number][s.origin[0]:s.origin[0] + s.shape[0]])
    assert len(set(calls.values())) == 1  # every process made the same calls
    assert (calls[0] > 1) == (batch_bytes < 2048)


def test_a_receiver_given_other_sizes_fails_naming_the_leaf(monkeypatch):
    job = _job(2)
    sharding = RowsSharding([[job[0][0], job[1][0]]])
    simulated = _simulate(2, [((4, 4), "float32", sharding)])
    (plan, buffers), = [(plan, buffers) for plan, buffers in simulated if plan.shared_slots()]
    reader = 1 - [plan for plan, _ in simulated].index(plan)
    monkeypatch.setattr(broadcast_load.exchange, "exchange_bytes",
                        lambda outgoing, name, timeout_s, into=None:
                        {reader: [np.zeros(3, np.uint8)]})
    with pytest.raises(sk.ShardkeepError,
                       match=rf"leaf 'leaf0'.*received 3 bytes from process {reader}"):
        plan.exchange(buffers, "load of ckpt", 1.0)


def test_single_process_loads_are_unchanged(ckpt, monkeypatch):
    mesh = make_mesh((4, 2), ("replica", "model"))
    value = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    value.view(np.uint32)[0, :3] = [0x80000000, 0x7FC00123, 0xFFC00001]
    state = {"w": jax.device_put(value, NamedSharding(mesh, P("model"))),
             "b": jax.device_put(value[:8], NamedSharding(mesh, P()))}
    sk.save(ckpt, state)
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
              for k, v in state.items()}

    def exchange_bytes(outgoing, **kwargs):
        raise AssertionError("a single-process load exchanged bytes")

    monkeypatch.setattr(broadcast_load.exchange, "exchange_bytes", exchange_bytes)
    results, read = [], []
    for broadcast in (True, False):
        before = _core.storage_bytes_read()
        results.append(sk.load(ckpt, target, options=sk.Options(
            broadcast_load=broadcast, map_files=False)))
        read.append(_core.storage_bytes_read() - before)
    assert read[0] == read[1] > value.nbytes
    for name in state:
        for on, off, want in zip(results[0][name].addressable_shards,
                                 results[1][name].addressable_shards,
                                 state[name].addressable_shards):
            assert_same_bits(on.data, want.data)
            assert_same_bits(off.data, want.data)


def _index_and_meta_bytes(path: pathlib.Path) -> int:
    """Bytes of the checkpoint's files other than data (commit record,
    meta.json, index files): what one process may read besides data."""
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and f.parent.name != "data")


def test_four_processes_read_one_copy_and_load_the_same_bits(tmp_path):
    """4 processes x 1 device: 2 replicas x 2 processes, then 4 replicas x 1.
    Values are checked in the job (bit-exact, on against off); here the
    bytes each process read from storage."""
    path = tmp_path / "ckpt"
    results = harness.run_job(4, 1, "broadcast_scenarios:layouts", {"path": str(path)},
                              timeout=240)
    overhead = _index_and_meta_bytes(path)
    for layout in ("2x2", "4x1"):
        runs = [r[layout] for r in results]
        one_copy, every_holder = runs[0]["one_copy"], runs[0]["every_holder"]
        on = [r["on"]["bytes_read"] for r in runs]
        off = [r["off"]["bytes_read"] for r in runs]
        assert one_copy <= sum(on) <= one_copy + 4 * overhead, (layout, on, one_copy)
        assert every_holder <= sum(off) <= every_holder + 4 * overhead, (layout, off)
        assert sum(off) - sum(on) >= every_holder - one_copy - 4 * overhead
        # Every process reads a near-equal share.
        assert max(on) <= 1.25 * one_copy / 4 + overhead, (layout, on)
        assert [r["on"]["exchanges"] for r in runs] == [1] * 4
    assert [r["small_batches"]["exchanges"] for r in results] == \
        [results[0]["small_batches"]["exchanges"]] * 4
    assert results[0]["small_batches"]["exchanges"] > 1


def _read_once_per_job(results: list, sizes: dict[str, int]) -> None:
    """No box is read twice in the job, and the boxes read cover each leaf
    exactly once (without broadcast, every holder would read its boxes)."""
    reads = [tuple(map(str, read)) for result in results for read in result["reads"]]
    assert len(reads) == len(set(reads)), sorted(reads)
    read_elements = collections.Counter()
    for result in results:
        for path, _, shape in result["reads"]:
            read_elements[path] += math.prod(shape)
    assert read_elements == sizes
    assert sum(1 for result in results if result["reads"]) > 1  # the reads are shared


def test_orbax_checkpoint_loads_through_load_and_broadcast(tmp_path):
    """Written by orbax's CheckpointManager (typed PRNG keys included), as a
    trainer writes it; loaded by a 4-process job, each box read once."""
    ocp = pytest.importorskip("orbax.checkpoint")
    import interop_scenarios

    values = interop_scenarios.broadcast_values()
    state = {name: jax.numpy.asarray(v) for name, v in values.items()}
    state["rng"] = jax.random.split(jax.random.key(0), interop_scenarios.KEY_COUNT)
    with ocp.CheckpointManager(str(tmp_path / "run")) as manager:
        manager.save(5, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
    results = harness.run_job(4, 2, "interop_scenarios:broadcast_orbax",
                              {"path": str(tmp_path / "run" / "5")}, timeout=240)
    sizes = {name: v.size for name, v in values.items()}
    sizes["rng"] = interop_scenarios.KEY_COUNT * 2  # threefry key data: 2 words a key
    _read_once_per_job(results, sizes)


def test_dcp_checkpoint_loads_through_load_and_broadcast(tmp_path):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import interop_scenarios

    values = interop_scenarios.broadcast_values()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save({name: torch.from_numpy(v) for name, v in values.items()},
                 checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    results = harness.run_job(4, 2, "interop_scenarios:broadcast_dcp",
                              {"path": str(tmp_path / "dcp")}, timeout=240)
    _read_once_per_job(results, {name: v.size for name, v in values.items()})


def test_the_default_broadcasts_loads_from_object_stores_only():
    assert sk.Options().broadcasts_load_of("s3://bucket/run/000000100")
    assert not sk.Options().broadcasts_load_of("/checkpoints/run/000000100")
    assert not sk.Options().broadcasts_load_of("file:///checkpoints/run/000000100")
    assert sk.Options(broadcast_load=True).broadcasts_load_of("/checkpoints/x")
    assert not sk.Options(broadcast_load=False).broadcasts_load_of("s3://bucket/x")
