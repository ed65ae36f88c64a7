"""W9: a LoRA fine-tune's checkpoints, every tool side by side in one run.

    python bench/w9.py [--scale small|full] [--reps N] [--tools a,b]
                       [--drop-caches] [--root DIR] [--out-dir bench/results-w9]

Each repetition runs every tool once (the starting tool rotates), each in
a fresh process (bench/w9_worker.py, which describes the state, the loop
and the tools). Writes results.json and RESULTS.md into --out-dir, with
the figures against the targets:

  save after the first   shardkeep <= 1.2x shardkeep-trainable (saving the
                         adapters and moments alone), and >= 10x faster
                         than the fastest peer saving a whole checkpoint
  bytes written          per save after the first <= 1.05x the changed
                         bytes (adapters, moments, step) plus metadata
  root size              after five saves, keep 3: <= 1.1x (base + 3 x changed)
  load                   the last checkpoint, within 10% of the same state
                         saved whole (shardkeep-whole)

Only arrays of at least 1 MiB are taken from an earlier checkpoint, so the
full scale (base matrices of 3.6-9.6 MiB) is the meaningful one; at small
scale most base matrices are below that and are written again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import provenance  # noqa: E402
import w9_worker  # noqa: E402

PEERS_WHOLE = ("orbax", "dcp")  # self-contained checkpoints


def run_tool(tool: str, args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, os.path.join(HERE, "w9_worker.py"), tool, "--scale", args.scale,
           "--root", os.path.join(args.root, tool), "--out", out]
    if args.drop_caches:
        cmd.append("--drop-caches")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    try:
        with open(out) as f:
            record = json.load(f)
    except (OSError, ValueError):
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        record = {"tool": tool, "ok": False, "error": lines[-1] if lines else "no output"}
    os.unlink(out)
    return record


def summarize(records: list[dict]) -> dict:
    """Per tool: medians over repetitions of the per-run figures."""
    out = {}
    for tool in w9_worker.TOOLS:
        runs = [r for r in records if r["tool"] == tool and r.get("ok")]
        if not runs:
            failed = [r for r in records if r["tool"] == tool]
            if failed:
                out[tool] = {"ok": False, "error": failed[-1].get("error", "")[-500:]}
            continue
        later = lambda r, key: statistics.median(s[key] for s in r["saves"][1:])  # noqa: E731
        med = lambda values: statistics.median(values)  # noqa: E731
        out[tool] = {
            "ok": True, "runs": len(runs), "verified": all(r["verified"] for r in runs),
            "first_save_seconds": med([r["saves"][0]["seconds"] for r in runs]),
            "save_seconds": med([later(r, "seconds") for r in runs]),
            "bytes_written": med([later(r, "bytes_written") for r in runs]),
            "root_bytes": med([r["saves"][-1]["root_bytes"] for r in runs]),
            "load_warm_seconds": med([r["loads"]["warm_seconds"] for r in runs]),
            "load_cold_seconds": (med([r["loads"]["cold_seconds"] for r in runs])
                                  if "cold_seconds" in runs[0]["loads"] else None),
            "base_bytes": runs[0]["base_bytes"], "trainable_bytes": runs[0]["trainable_bytes"],
            "adapter_rank": runs[0]["adapter_rank"]}
    return out


def targets(summary: dict) -> list[tuple[str, str, str]]:
    """(target, figure, met / missed / not measured)."""
    rows = []
    sk, trainable, whole = (summary.get(t, {}) for t in
                            ("shardkeep", "shardkeep-trainable", "shardkeep-whole"))
    if not sk.get("ok"):
        return [("every target", "shardkeep did not run", "not measured")]
    changed, base = sk["trainable_bytes"], sk["base_bytes"]

    def row(name, ratio, limit, text, at_most=True):
        if ratio is None:
            rows.append((name, text, "not measured"))
        else:
            met = ratio <= limit if at_most else ratio >= limit
            rows.append((name, f"{ratio:.2f}x ({text})", "met" if met else "missed"))

    if trainable.get("ok"):
        row("save after the first <= 1.2x saving the trainable part alone",
            sk["save_seconds"] / trainable["save_seconds"], 1.2,
            f"{sk['save_seconds'] * 1e3:.0f} ms vs {trainable['save_seconds'] * 1e3:.0f} ms")
    peers = [(summary[p]["save_seconds"], p) for p in PEERS_WHOLE if summary.get(p, {}).get("ok")]
    if peers:
        fastest, name = min(peers)
        row(">= 10x faster than the fastest peer saving a whole checkpoint",
            fastest / sk["save_seconds"], 10,
            f"{name} {fastest:.2f} s vs {sk['save_seconds'] * 1e3:.0f} ms", at_most=False)
    if trainable.get("ok"):
        # What a save of the trainable part alone writes beyond its array
        # bytes is metadata (index, meta.json, commit record).
        metadata = max(0, trainable["bytes_written"] - changed)
        row("bytes written per save after the first <= 1.05x (changed bytes + metadata)",
            sk["bytes_written"] / (changed + metadata), 1.05,
            f"{sk['bytes_written'] / 2**20:.1f} MiB vs {changed / 2**20:.1f} MiB changed"
            f" + {metadata / 2**20:.2f} MiB of metadata, as saving the trainable part"
            " alone writes it")
    row("root size after 5 saves (keep 3) <= 1.1x (base + 3 x changed)",
        sk["root_bytes"] / (base + 3 * changed), 1.1,
        f"{sk['root_bytes'] / 2**20:.0f} MiB vs {(base + 3 * changed) / 2**20:.0f} MiB")
    if whole.get("ok"):
        for kind in ("warm", "cold"):
            if sk[f"load_{kind}_seconds"] is not None and whole[f"load_{kind}_seconds"]:
                row(f"load ({kind}) within 10% of the state saved whole",
                    sk[f"load_{kind}_seconds"] / whole[f"load_{kind}_seconds"], 1.1,
                    f"{sk[f'load_{kind}_seconds'] * 1e3:.0f} ms vs "
                    f"{whole[f'load_{kind}_seconds'] * 1e3:.0f} ms")
    return rows


def report(results: dict) -> str:
    summary = results["summary"]
    lines = [f"# W9: a LoRA fine-tune's checkpoints ({results['scale']} scale)", "",
             f"Run {results['date']}, {results['reps']} repetition(s), machine: "
             f"{results['machine']}; versions: {results['versions']}.", ""]
    sk = next((s for s in summary.values() if s.get("ok")), None)
    if sk:
        lines += [f"State: frozen bf16 base {sk['base_bytes'] / 2**20:.0f} MiB; adapters "
                  f"(rank {sk['adapter_rank']}), their Adam moments and the step "
                  f"{sk['trainable_bytes'] / 2**20:.1f} MiB. Five saves, keep 3.", ""]
    lines += ["| tool | first save | later saves | written per later save | root after 5 |"
              " load warm | load cold | verified |", "|---|---|---|---|---|---|---|---|"]
    for tool, s in summary.items():
        if not s.get("ok"):
            lines.append(f"| {tool} | failed: {s.get('error', '')[-120:]} |||||||")
            continue
        cold = f"{s['load_cold_seconds'] * 1e3:.0f} ms" if s["load_cold_seconds"] else "-"
        lines.append(f"| {tool} | {s['first_save_seconds'] * 1e3:.0f} ms | "
                     f"{s['save_seconds'] * 1e3:.0f} ms | {s['bytes_written'] / 2**20:.1f} MiB | "
                     f"{s['root_bytes'] / 2**20:.0f} MiB | {s['load_warm_seconds'] * 1e3:.0f} ms"
                     f" | {cold} | {s['verified']} |")
    lines += ["", "dcp-trainable's checkpoints hold the adapters and moments only: they do"
              " not load without the base model from elsewhere.", "",
              "| target | figure | |", "|---|---|---|"]
    lines += [f"| {name} | {figure} | {verdict} |" for name, figure, verdict in
              targets(summary)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", default="small", choices=["tiny", "small", "full"])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--tools", default=",".join(w9_worker.TOOLS))
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--root", default=os.path.join(HERE, ".work", "w9"))
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results-w9"))
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    tools = args.tools.split(",")
    records = []
    for rep in range(args.reps):
        for tool in tools[rep % len(tools):] + tools[:rep % len(tools)]:
            print(f"rep {rep + 1}/{args.reps}: {tool}", flush=True)
            records.append(run_tool(tool, args))
            if not records[-1].get("ok"):
                print(f"  failed: {records[-1].get('error', '')[-300:]}", flush=True)
    results = {"scale": args.scale, "reps": args.reps,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": provenance.machine_info(),
               "versions": provenance.versions(["shardkeep", "jax", "orbax-checkpoint", "torch"]),
               "records": records, "summary": summarize(records)}
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = report(results)
    with open(os.path.join(args.out_dir, "RESULTS.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
