"""W8: checkpointing at scale on one machine, as 4-process JAX jobs.

    python bench/w8.py [--scale small|full] [--parts a,b] [--reps N]
                       [--drop-caches] [--out-dir bench/results-w8]

Each part is one job of 4 processes with one CPU device each, joined by
``jax.distributed`` on a free loopback port, collectives over gloo
(bench/w8_worker.py):

  a. load-and-broadcast (``Options(broadcast_load=True)``) against every
     replica reading (``broadcast_load=False``), onto a (replica=4) and a
     (replica=2, fsdp=2) mesh, each load cold;
  b. the manager's local tier: blocking and total time of local and
     persistent saves; restore from the local tier, from a peer's copy
     (one process's local root wiped) and from persistent storage (two
     adjacent roots wiped).

Writes results.json and RESULTS.md into --out-dir. ``--scale small`` takes
under a minute; full (512 MiB of state) a few minutes. A part whose
feature this shardkeep lacks is reported as not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import provenance  # noqa: E402
PROCESSES = 4
MIB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(part: str, args) -> dict:
    """Runs part ``part`` as one job; returns {"processes": [records]} or
    {"error": ...} with the failing processes' last lines."""
    coordinator = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="w8-") as scratch:
        procs, outs = [], []
        for i in range(PROCESSES):
            out = os.path.join(scratch, f"p{i}.json")
            spec = {"coordinator": coordinator, "process_id": i, "num_processes": PROCESSES,
                    "part": "a" if part == "a_s3" else part, "scale": args.scale,
                    "root": args.root, "s3_root": args.s3_root if part == "a_s3" else None,
                    "local_root": args.local_root, "drop_caches": args.drop_caches,
                    "reps": args.reps, "out": out}
            log = open(os.path.join(scratch, f"p{i}.log"), "w+")
            procs.append((subprocess.Popen(
                [sys.executable, os.path.join(HERE, "w8_worker.py"), json.dumps(spec)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
            outs.append(out)
        deadline = time.monotonic() + args.timeout
        for proc, _ in procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other, _ in procs:
                    other.kill()
                break
        records, problems = [], []
        for i, ((proc, log), out) in enumerate(zip(procs, outs)):
            proc.wait()
            log.seek(0)
            text = log.read()
            log.close()
            try:
                with open(out) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                record = {"process": i, "ok": False}
            if not record.get("ok"):
                lines = [line for line in (record.get("error") or text).splitlines()
                         if line.strip()]
                problems.append(f"process {i} (exit {proc.returncode}): "
                                + (lines[-1] if lines else "no output"))
            records.append(record)
    if problems:
        return {"error": "; ".join(problems), "processes": records}
    return {"processes": records}


# -- summaries -----------------------------------------------------------


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _floor(processes) -> dict:
    """Per pattern: the exchange floor's slowest process and the bytes
    each process sent."""
    out = {}
    floors = [p.get("exchange_floor") for p in processes]
    if any(f is None for f in floors):
        return out
    if "seconds" in floors[0]:  # part b: one pattern
        floors = [{"ring": f} for f in floors]
    for pattern in floors[0]:
        per = [f[pattern] for f in floors]
        if any(x is None for x in per):
            continue
        out[pattern] = {"seconds": max(x["seconds"] for x in per),
                        "bytes_sent": per[0]["bytes_sent"]}
    return out


def summarize_a(job: dict) -> dict:
    """Per (mesh, mode): the job's load time (slowest process) per
    repetition, storage bytes read per process, and whether every shard
    matched."""
    processes = job["processes"]
    stored = processes[0]["stored"]
    out = {"stored": stored, "broadcast_available": processes[0]["broadcast_available"],
           "exchange_floor": _floor(processes), "cases": {}}
    for i, load in enumerate(processes[0]["loads"]):
        per = [p["loads"][i] for p in processes]
        case = out["cases"].setdefault(f"{load['mesh']}|{load['mode']}", {
            "mesh": load["mesh"], "mode": load["mode"], "seconds": [],
            "bytes_read": [], "held_bytes": [q["held_bytes"] for q in per], "ok": True,
            "cold": [q["cold"] for q in per if q["cold"]]})
        case["seconds"].append(max(q["seconds"] for q in per))
        case["bytes_read"].append([q["bytes_read"] for q in per])
        case["ok"] = case["ok"] and all(q["ok"] for q in per)
    for case in out["cases"].values():
        case["median_seconds"] = _median(case["seconds"])
        case["median_bytes_read"] = [_median(col) for col in zip(*case["bytes_read"])]
    return out


def summarize_b(job: dict) -> dict:
    processes = job["processes"]
    if "not_run" in processes[0]:
        return {"not_run": processes[0]["not_run"]}
    saves = []
    for i, save in enumerate(processes[0]["saves"]):
        per = [p["saves"][i] for p in processes]
        saves.append({"step": save["step"], "tier": save["tier"],
                      "blocking_seconds": max(q["blocking_seconds"] for q in per),
                      "total_seconds": max(q["total_seconds"] for q in per),
                      "state_bytes": sum(q["state_bytes"] for q in per)})
    restores = []
    for i, restore in enumerate(processes[0]["restores"]):
        per = [p["restores"][i] for p in processes]
        restores.append({"source": restore["source"], "wiped": restore["wiped"],
                         "step": restore["step"], "expected_step": restore["expected_step"],
                         "seconds": max(q["seconds"] for q in per),
                         "bytes_read": [q["bytes_read"] for q in per],
                         "held_bytes": [q["held_bytes"] for q in per],
                         "ok": all(q["ok"] for q in per)})
    return {"saves": saves, "restores": restores, "exchange_floor": _floor(processes)}


# -- report --------------------------------------------------------------


def _s(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _mib(n) -> str:
    return "—" if n is None else f"{n / MIB:.1f}"


def _gib(n) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _gibs(nbytes, seconds) -> str:
    return "—" if not seconds else f"{nbytes / seconds / (1 << 30):.2f}"


def report_a(a: dict) -> list[str]:
    if "error" in a:
        return [f"Part a failed: {a['error']}", ""]
    lines = []
    data = a["stored"]["data"]
    lines += [f"Checkpoint: {_mib(data)} MiB of data files, {a['stored']['metadata']} bytes of "
              "commit record, meta.json and index. Loads cold, `map_files=False`; time = "
              "the slowest process, median over repetitions; bytes = what each process read "
              "through shardkeep's storage layer (`_core.storage_bytes_read()`).", ""]
    if not a["broadcast_available"]:
        lines += ["Load-and-broadcast not measured: this shardkeep has no "
                  "`Options.broadcast_load`.", ""]
    lines += ["| mesh | mode | load | read per process (MiB) | read by the job | "
              "copies of the checkpoint | delivered per process (GiB/s) | storage read "
              "per process (GiB/s) | values |",
              "|---|---|---|---|---|---|---|---|---|"]
    by_mesh = {}
    for case in a["cases"].values():
        seconds = case["median_seconds"]
        reads = case["median_bytes_read"]
        total = sum(reads)
        held = case["held_bytes"][0]
        by_mesh.setdefault(case["mesh"], {})[case["mode"]] = (seconds, total)
        lines.append(
            f"| {case['mesh']} | {case['mode'].replace('_', ' ')} | {_s(seconds)} | "
            f"{' / '.join(_mib(r) for r in reads)} | {_mib(total)} MiB | "
            f"{total / data:.2f} | {_gibs(held, seconds)} | "
            f"{' / '.join(_gibs(r, seconds) for r in reads)} | "
            f"{'exact' if case['ok'] else 'WRONG DATA'} |")
    lines.append("")
    for mesh, modes in by_mesh.items():
        if "broadcast" in modes and "every_replica_reads" in modes:
            (tb, bb), (te, be) = modes["broadcast"], modes["every_replica_reads"]
            lines.append(f"- {mesh}: broadcast {te / tb:.2f}× the speed of every replica "
                         f"reading; storage bytes {bb / be:.2f}× as many "
                         f"({_mib(bb)} vs {_mib(be)} MiB).")
    for mesh, floor in a.get("exchange_floor", {}).items():
        lines.append(f"- Floor, {mesh}: `exchange_bytes` alone sending what the broadcast "
                     f"sends ({_mib(floor['bytes_sent'])} MiB from each process) takes "
                     f"{_s(floor['seconds'])}.")
    lines += ["", "On one machine the replicas share one page cache: when every replica "
              "reads, the first read of a chunk comes from the disk and the others from "
              "memory, so every-replica-reads is timed here against a storage far faster "
              "than a shared file system or an object store serving R hosts at once, while "
              "the broadcast pays for moving R − 1 copies over gloo on loopback with 2 cores "
              "for 4 processes. The storage bytes are what carries over to a cluster.",
              "", "How it grows with replicas: with R replicas of a checkpoint of S bytes, "
              "every-replica-reads fetches R × S from storage (each process reads all the "
              "boxes it holds), load-and-broadcast fetches S whatever R, spread over the "
              "reading replica's processes; what grows with R is what the collective "
              "moves (R − 1 copies of each box, spread over all processes' links). The "
              "table's 'copies of the checkpoint' column is R vs 1 up to the metadata "
              "each process reads.", "",
              f"Projected from this checkpoint (S = {_mib(data)} MiB), per job:", "",
              "| replicas R | storage bytes, every replica reads | storage bytes, broadcast "
              "| bytes the broadcast moves between processes |", "|---|---|---|---|"]
    for r in (2, 4, 8, 32, 256):
        lines.append(f"| {r} | {_gib(r * data)} | {_gib(data)} | {_gib((r - 1) * data)} |")
    lines.append("")
    return lines


def report_b(b: dict) -> list[str]:
    if "error" in b:
        return [f"Part b failed: {b['error']}", ""]
    if "not_run" in b:
        return [f"Part b not run: {b['not_run']}.", ""]
    lines = ["Saves (async; blocking = the `save` call, total = until `wait` returns; "
             "slowest process; the state is sharded over the 4 processes):", "",
             "| step | tier | state | blocking | total |", "|---|---|---|---|---|"]
    for save in b["saves"]:
        lines.append(f"| {save['step']} | {save['tier']} | {_mib(save['state_bytes'])} MiB | "
                     f"{_s(save['blocking_seconds'])} | {_s(save['total_seconds'])} |")
    lines.append("")
    for tier in ("local", "persistent"):
        # The first save of each tier warms it up (staging memory, threads).
        later = [x for x in b["saves"] if x["tier"] == tier][1:]
        if later:
            lines.append(f"- {tier} saves after the first: blocking "
                         f"{_s(_median(x['blocking_seconds'] for x in later))}, total "
                         f"{_s(_median(x['total_seconds'] for x in later))} (median).")
    ring = b.get("exchange_floor", {}).get("ring")
    if ring:
        lines += ["", f"Floor: `exchange_bytes` alone sending each process's slice "
                  f"({_mib(ring['bytes_sent'])} MiB) to its successor takes "
                  f"{_s(ring['seconds'])}."]
    lines += ["", "A local save's blocking part includes sending each process's slice to "
              "its peer (a collective every process joins); a persistent save's blocking "
              "part is the device-to-host copy only.", "",
              "Restores (a fresh manager each; persistent files evicted first; time = "
              "slowest process; bytes read count the local roots' files too, which are "
              "read through the same storage layer; a peer's copy is counted by the "
              "process that reads and sends it):", "",
              "| source | roots wiped | step (expected) | time | read per process (MiB) | "
              "restored per process (GiB/s) | values |", "|---|---|---|---|---|---|---|"]
    for r in b["restores"]:
        held = r["held_bytes"][0]
        lines.append(
            f"| {r['source']} | {', '.join(f'p{p}' for p in r['wiped']) or 'none'} | "
            f"{r['step']} ({r['expected_step']}) | {_s(r['seconds'])} | "
            f"{' / '.join(_mib(x) for x in r['bytes_read'])} | {_gibs(held, r['seconds'])} | "
            f"{'exact' if r['ok'] else 'WRONG'} |")
    lines.append("")
    return lines


def _run_line(run: dict, repeated: bool) -> str:
    reps = f"{run['reps']} repetition(s), " if repeated else ""
    return (f"Run {run['started']}, shardkeep {run['shardkeep_commit']}, scale {run['scale']}, "
            f"{reps}caches {'dropped' if run['drop_caches'] else 'evicted per file (fadvise)'}.")


def render(results: dict) -> str:
    machine = results["machine"]
    lines = ["# W8: load-and-broadcast and the local tier", "",
             f"{machine.get('cpu', '?')}, {machine['cores']} cores, "
             f"{machine['memory_gib']} GiB; 4 processes × 1 CPU device, gloo collectives "
             "(bench/w8.py; bench/README.md says what each part measures).", ""]
    titles = {"a": "## a. Load-and-broadcast vs every replica reading",
              "a_s3": "## a on S3. The same loads from an S3 server (SeaweedFS on this machine)",
              "b": "## b. Local tier"}
    for part, title in titles.items():
        if part in results["parts"]:
            summary = results["parts"][part]
            lines += [title, "", _run_line(summary["run"], part != "b"), ""]
            lines += (report_b if part == "b" else report_a)(summary)
    return "\n".join(lines) + "\n"


def versions() -> dict:
    return provenance.versions(["shardkeep", "jax", "jaxlib", "numpy"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=["small", "full"], default="small")
    parser.add_argument("--parts", default="a,b",
                        help="comma-separated: a, b, a_s3 (part a against an S3 server)")
    parser.add_argument("--reps", type=int, default=None,
                        help="load repetitions of part a (default: 1 small, 3 full)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="cold loads drop the whole page cache (root only)")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results-w8"))
    parser.add_argument("--root", default=os.path.join(HERE, ".work", "w8"),
                        help="persistent checkpoints (a disk)")
    parser.add_argument("--local-root", default="/dev/shm/shardkeep-w8",
                        help="the local tier's roots (RAM: a host's RAM disk)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per job, seconds")
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 1 if args.scale == "small" else 3
    parts = [p for p in args.parts.split(",") if p]
    results = {"machine": provenance.machine_info(), "parts": {}}
    # Parts run earlier into the same folder stay, so that each can be
    # rerun alone (every part records its own run).
    previous = os.path.join(args.out_dir, "results.json")
    if os.path.exists(previous):
        with open(previous) as f:
            kept = json.load(f).get("parts", {})
        results["parts"] = {p: kept[p] for p in kept if p not in parts}
    commit = versions()
    args.s3_root = None
    server = None
    if "a_s3" in parts:
        sys.path.insert(0, HERE)
        import s3_server
        os.makedirs(os.path.dirname(args.root), exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="w8-s3-", dir=os.path.dirname(args.root))
        server = s3_server.start(scratch, "bench-w8")
        os.environ.update(server.env())  # the job's processes inherit it
        args.s3_root = "s3://bench-w8/root"
    try:
        _run_parts(parts, args, results, commit)
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)
    shutil.rmtree(os.path.join(args.local_root), ignore_errors=True)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out_dir, "RESULTS.md"), "w") as f:
        f.write(render(results))
    print(f"W8: wrote {args.out_dir}/RESULTS.md", flush=True)
    return 0 if all("error" not in results["parts"][p] for p in parts) else 1


def _run_parts(parts: list[str], args, results: dict, commit: dict) -> None:
    for part in parts:
        clock = time.monotonic()
        started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        job = run_job(part, args)
        if "error" in job:
            summary = {"error": job["error"]}
        else:
            summary = summarize_b(job) if part == "b" else summarize_a(job)
        summary["run"] = {"started": started, "scale": args.scale, "reps": args.reps,
                          "drop_caches": args.drop_caches, "versions": commit,
                          "shardkeep_commit": commit["shardkeep_commit"],
                          "job_seconds": time.monotonic() - clock}
        summary["raw"] = job["processes"]
        results["parts"][part] = summary
        print(f"W8 part {part}: {summary['run']['job_seconds']:.0f} s"
              + (f", FAILED: {summary['error']}" if "error" in summary else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
