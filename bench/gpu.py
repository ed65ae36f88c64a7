"""The accelerator benchmark in one command: W1's training state on one
GPU, its floors, and shardkeep beside Orbax, DCP and safetensors.

    python bench/gpu.py --out results.json [--scale gpu] [--drop-caches]

Runs unchanged on CPU devices (the tests run it at ``--scale tiny``); on a
machine with a GPU the default scale is ``gpu``: ~16.3 GiB (bfloat16
parameters, float32 Adam moments, 442 leaves; bench/workloads.py). In
order of importance, so that what a short lease cuts is the least needed:

  environment   the machine, the devices, the libraries, the disk
  floors        device-to-host into pinned and pageable memory, host to
                device, a durable write and reads of the state's bytes
                (gpu_floors.py)
  stall         a jitted update that donates its input, an async save, the
                next update (training_loop.py): shardkeep, Orbax (tuned),
                DCP (tuned, torch tensors of the same shapes on the GPU)
  save, load_warm, load_cold
                the durable save, then loads onto the GPU from the page
                cache and cold: shardkeep, Orbax, DCP, and the safetensors
                library (one file, fsynced)
  profile       one shardkeep async save's blocking phase under cProfile,
                and with --trace under JAX's profiler (a tar under --out's
                folder)
  stall (shardkeep-pageable)
                shardkeep with pinned staging off: the A/B of the pinned path

Each measurement is written to --out as soon as it is taken; one that
fails is recorded with its error and the run goes on; one the time left
(--budget-s) cannot hold is skipped and listed. ``targets`` holds the
issue's ratios, computed from what was measured.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.metadata
import io
import json
import os
import platform
import pstats
import shutil
import subprocess
import sys
import tarfile
import time
import traceback

# Before JAX starts: no preallocation of the GPU, and half of it at most,
# so that torch (DCP, safetensors) has room beside JAX's pool.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")

import floors  # noqa: E402
import gpu_floors  # noqa: E402
import gpu_state  # noqa: E402
import page_cache  # noqa: E402
import report_gpu  # noqa: E402
import tools  # noqa: E402
import training_loop  # noqa: E402
import workloads  # noqa: E402

STALL_SAVES = 3  # the first warms the tool up; two are counted
SAVE_TOOLS = ("shardkeep", "orbax-tuned", "dcp-tuned", "safetensors")
PEERS = ("orbax-tuned", "dcp-tuned", "safetensors")
STALL_PEERS = ("orbax-tuned", "dcp-tuned")
# How many times the write floor's time a tool's save may take, for
# deciding whether it still fits the time left (the peers write slower).
SLOWER_THAN_FLOOR = 3.0


class Run:
    """The results so far, the time left, and where both go."""

    def __init__(self, out: str, budget_s: float):
        self.out = out
        self.deadline = time.monotonic() + budget_s
        self.results: dict = {"skipped": [], "errors": {}}
        self.started = time.perf_counter()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, keys: tuple[str, ...], value) -> None:
        node = self.results
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        self.write()

    def write(self) -> None:
        self.results["wall_seconds"] = time.perf_counter() - self.started
        temporary = self.out + ".tmp"
        with open(temporary, "w") as f:
            # Anything else is named, never printed: the repr of a device
            # array would copy it to the host.
            json.dump(self.results, f, indent=1, default=lambda o: f"<{type(o).__name__}>")
        os.replace(temporary, self.out)

    def measure(self, keys: tuple[str, ...], fn, needs_s: float = 0.0):
        """Records ``fn()`` under ``keys``; a failure is recorded instead,
        and a step needing more than the time left is skipped."""
        name = "/".join(keys)
        if needs_s > self.left():
            self.results["skipped"].append(f"{name} (needs ~{needs_s:.0f} s, "
                                           f"{self.left():.0f} s left)")
            self.write()
            return None
        print(f"gpu bench: {name} ...", flush=True)
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as e:  # a peer's failure is a result, not the end of the run
            self.results["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            self.write()
            return None
        print(f"gpu bench: {name} took {time.perf_counter() - start:.1f} s", flush=True)
        self.record(keys, value)
        return value


# --- the environment --------------------------------------------------------

def environment(root: str, drop_caches: bool) -> dict:
    import jax
    device = jax.devices()[0]
    versions = {}
    for name in ("shardkeep", "jax", "jaxlib", "orbax-checkpoint", "torch", "safetensors",
                 "tensorstore", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except Exception as e:
            versions[name] = f"missing ({type(e).__name__})"
    out = {"python": sys.version.split()[0], "machine": platform.machine(),
           "cpus": os.cpu_count(), "mem_total_kib": _meminfo("MemTotal"),
           "platform": device.platform, "device_kind": device.device_kind,
           "devices": len(jax.devices()),
           "memory_kinds": [m.kind for m in device.addressable_memories()],
           "versions": versions, "root": root, "root_filesystem": _filesystem(root),
           "disk_free_bytes": shutil.disk_usage(root).free}
    if shutil.which("nvidia-smi"):
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,pcie.link.gen.current,"
             "pcie.link.width.current,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30)
        out["nvidia_smi"] = query.stdout.strip() or query.stderr.strip()
    if drop_caches:
        out["drop_caches"] = page_cache.evict(root, True)["method"]
    return out


def _meminfo(field: str) -> int | None:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def _filesystem(path: str) -> str:
    """The type and source of the mount holding ``path``."""
    path, best = os.path.realpath(path), ("", "?")
    with open("/proc/mounts") as f:
        for line in f:
            source, mount, kind = line.split()[:3]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) >= len(best[0]):
                best = (mount, f"{kind} ({source} on {mount})")
    return best[1]


# --- tools --------------------------------------------------------------------

class Safetensors:
    """The safetensors library: one file of the flat state_dict, fsynced
    (the library does not), loaded straight onto the accelerator."""

    framework = "torch"
    file = "model.safetensors"

    def __init__(self):
        import safetensors.torch
        self.st = safetensors.torch

    def save(self, path, state):
        os.makedirs(path, exist_ok=True)
        name = os.path.join(path, self.file)
        # The library writes host tensors: the device-to-host copy is part of its save.
        self.st.save_file({k: v.cpu() for k, v in gpu_state.torch_flat(state).items()}, name)
        floors.fsync_path(name)
        floors.fsync_path(path)

    def load(self, path, target):
        loaded = self.st.load_file(os.path.join(path, self.file),
                                   device=str(gpu_state.torch_device()))
        gpu_state.synchronize()
        return workloads.nest([(tuple(name.split(".")), t) for name, t in loaded.items()])

    def close(self):
        pass


def make_tool(name: str):
    return Safetensors() if name == "safetensors" else tools.make(name)


def _bytes_under(path: str) -> int:
    return sum(os.path.getsize(f) for f in page_cache.files_under(path))


# --- the stall ------------------------------------------------------------------

class Live:
    """The state the run trains and saves. A training loop donates the
    arrays it is given: it leaves the ones it made here, also when it fails."""

    def __init__(self, state):
        self.state = state


def stall(name: str, live: Live, scale: str, root: str) -> dict:
    """The training loop with ``name``'s async saves; its summary, the last
    checkpoint checked leaf by leaf."""
    tool = make_tool(name)
    folder = os.path.join(root, "stall", name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    loop_type = training_loop.TorchLoop if tool.framework == "torch" else training_loop.JaxLoop
    loop = loop_type(tool, gpu_state.WORKLOAD, scale, state=live.state)
    tool.prepare("async_save")
    try:
        for _ in range(training_loop.WARMUP_STEPS):
            loop.step()
        baseline, saves, expected, path = training_loop.run_loop(tool, loop, folder, STALL_SAVES)
        target = gpu_state.target_for(tool.framework, scale)
        verified = loop.matches(tool.load(path, target), expected)
    finally:
        live.state = loop.state
        tool.close()
        shutil.rmtree(folder, ignore_errors=True)
    return training_loop.summary(baseline, saves) | {"verified": verified}


# --- save and loads ----------------------------------------------------------------

def save_and_load(run: Run, name: str, state, scale: str, root: str, drop_caches: bool,
                  write_s: float, read_s: float) -> None:
    """The durable save, then a load from the page cache and a cold one,
    each checked against the state; the checkpoint is removed after."""
    tool = make_tool(name)
    path = os.path.join(root, "save", name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    factor = 1.0 if name == "shardkeep" else SLOWER_THAN_FLOOR
    try:
        def save():
            start = time.perf_counter()
            tool.save(path, state)
            seconds = time.perf_counter() - start
            return {"seconds": seconds, "bytes_on_disk": _bytes_under(path)}
        if run.measure(("save", name), save, needs_s=factor * write_s + 10) is None:
            return
        for cold in (False, True):
            def load(cold=cold):
                if cold:
                    eviction = page_cache.evict(path, drop_caches)
                else:
                    page_cache.warm(path)
                    eviction = None
                target = gpu_state.target_for(tool.framework, scale)
                start = time.perf_counter()
                loaded = tool.load(path, target)
                seconds = time.perf_counter() - start
                same = gpu_state.equal(tool.framework, loaded, state)
                return {"seconds": seconds, "verified": same} | (
                    {"eviction": eviction} if cold else {})
            run.measure(("load_cold" if cold else "load_warm", name), load,
                        needs_s=factor * (read_s if cold else read_s / 2) + 10)
    finally:
        tool.close()
        shutil.rmtree(path, ignore_errors=True)


# --- profile ----------------------------------------------------------------------

def profile(state, root: str, out_dir: str, trace: bool) -> dict:
    """One shardkeep async save (after one that warms it up): its blocking
    phase under cProfile, the top functions by cumulative time; with
    ``trace``, the same save under JAX's profiler too, packed as one tar."""
    import shardkeep as sk
    folder = os.path.join(root, "profile")
    shutil.rmtree(folder, ignore_errors=True)
    sk.save_async(os.path.join(folder, "warm"), state).result()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    future = sk.save_async(os.path.join(folder, "profiled"), state)
    profiler.disable()
    blocking = time.perf_counter() - start
    future.result()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).strip_dirs().sort_stats("cumulative").print_stats(30)
    out = {"blocking_seconds": blocking, "cprofile_top": text.getvalue().splitlines()[:80]}
    if trace:
        try:  # the profiler needs CUPTI on GPUs: its failure keeps the rest
            out["trace"] = _traced_save(state, folder, root, out_dir)
        except Exception as e:
            out["trace_error"] = f"{type(e).__name__}: {e}"[:2000]
    shutil.rmtree(folder, ignore_errors=True)
    return out


def _traced_save(state, folder: str, root: str, out_dir: str) -> str:
    """One async save under JAX's profiler; the trace's folder packed as
    one file under ``out_dir`` (the device tool brings back files, not
    deep folders). Returns the file's name."""
    import jax
    import shardkeep as sk
    trace_dir = os.path.join(root, "trace")
    shutil.rmtree(trace_dir, ignore_errors=True)
    with jax.profiler.trace(trace_dir):
        sk.save_async(os.path.join(folder, "traced"), state).result()
    archive = os.path.join(out_dir, "trace.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(trace_dir, arcname="trace")
    return os.path.basename(archive)


# --- targets -----------------------------------------------------------------------

def targets(results: dict) -> dict:
    """The issue's ratios, from what was measured (missing parts: None)."""
    def get(*keys):
        return report_gpu.get(results, *keys)

    pinned = [t for t in (get("floors", "jax", "d2h_pinned", "seconds"),
                          get("floors", "torch", "d2h_pinned", "seconds")) if t]
    ours = get("stall", "shardkeep", "seconds")
    peers = [get("stall", p, "seconds") for p in STALL_PEERS
             if get("stall", p, "verified")]
    warm = get("load_warm", "shardkeep", "seconds")
    warm_peers = [get("load_warm", p, "seconds") for p in PEERS if get("load_warm", p, "verified")]
    return {
        "stall_over_pinned_d2h_floor": ours / min(pinned) if ours and pinned else None,
        "stall_over_pinned_d2h_floor_target": 1.2,
        "stall_over_best_peer": ours / min(peers) if ours and peers else None,
        "stall_over_best_peer_target": 0.5,
        "load_warm_speedup_over_best_peer": min(warm_peers) / warm if warm and warm_peers else None,
        "load_warm_speedup_target": 2.0,
    }


# --- the run ------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the results' JSON file")
    parser.add_argument("--scale", default=None,
                        help="W1's scale (bench/workloads.py); default: gpu on a GPU, else tiny")
    parser.add_argument("--root", default=None,
                        help="where checkpoints and floor files go (default: a folder in /tmp)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="steps that would end past this many seconds are skipped")
    parser.add_argument("--drop-caches", action="store_true",
                        help="cold loads drop the whole page cache (root only)")
    parser.add_argument("--trace", action="store_true",
                        help="also trace one shardkeep async save with JAX's profiler")
    args = parser.parse_args(argv)

    import jax
    on_gpu = jax.devices()[0].platform == "gpu"
    scale = args.scale or ("gpu" if on_gpu else "tiny")
    root = args.root or os.path.join("/tmp", "shardkeep-gpu-bench")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    run = Run(out, args.budget_s)
    nbytes = gpu_state.state_bytes(scale)
    run.record(("config",), {"scale": scale, "state_bytes": nbytes,
                             "leaves": len(gpu_state.leaves(scale)) + 1,
                             "budget_s": args.budget_s, "drop_caches": args.drop_caches,
                             "stall_saves": STALL_SAVES})
    run.measure(("environment",), lambda: environment(root, args.drop_caches))

    live = Live(gpu_state.jax_state(scale))
    run.measure(("floors", "jax"),
                lambda: gpu_floors.all_transfers(jax.tree.leaves(live.state)))
    disk = run.measure(("floors", "disk"),
                       lambda: gpu_floors.disk(os.path.join(root, "floor"), nbytes,
                                               args.drop_caches))
    write_s = disk["write"]["seconds"] if disk else nbytes / 1e9
    read_s = disk["read_cold"]["seconds"] if disk else nbytes / 1e9

    stall_needs = STALL_SAVES * (write_s + 2) + read_s
    for name in ("shardkeep", "orbax-tuned"):
        factor = 1.0 if name == "shardkeep" else SLOWER_THAN_FLOOR
        run.measure(("stall", name), lambda name=name: stall(name, live, scale, root),
                    needs_s=factor * stall_needs)
    for name in ("shardkeep", "orbax-tuned"):
        save_and_load(run, name, live.state, scale, root, args.drop_caches, write_s, read_s)
    run.measure(("profile",), lambda: profile(live.state, root, os.path.dirname(out), args.trace),
                needs_s=3 * write_s + 10)

    live.state = None  # the JAX state is freed before torch's is made
    live.state = gpu_state.torch_state(scale)
    run.measure(("floors", "torch"), lambda: gpu_floors.torch_transfers(
        list(gpu_state.torch_flat(live.state).values())))
    run.measure(("stall", "dcp-tuned"), lambda: stall("dcp-tuned", live, scale, root),
                needs_s=SLOWER_THAN_FLOOR * stall_needs)
    for name in ("dcp-tuned", "safetensors"):
        save_and_load(run, name, live.state, scale, root, args.drop_caches, write_s, read_s)

    live.state = None
    _free_torch_memory()
    live.state = gpu_state.jax_state(scale)
    run.measure(("stall", "shardkeep-pageable"),
                lambda: stall("shardkeep-pageable", live, scale, root), needs_s=stall_needs)
    run.record(("targets",), targets(run.results))
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"targets": run.results["targets"], "skipped": run.results["skipped"],
                      "errors": list(run.results["errors"])}, indent=1))
    return 0


def _free_torch_memory() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
