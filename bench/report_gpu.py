"""RESULTS.md of an accelerator run: python bench/report_gpu.py RESULTS_DIR.

Reads RESULTS_DIR/gpu.json (bench/gpu.py) and writes RESULTS_DIR/RESULTS.md:
the machine, the floors, each tool's stall, save and loads beside the
best peer's, and the issue's targets with their verdicts. A measurement
whose data did not check out is marked WRONG DATA and is no one's best.
"""

from __future__ import annotations

import json
import os
import sys

GIB = 1 << 30
TOOLS = ("shardkeep", "shardkeep-pageable", "orbax-tuned", "dcp-tuned", "safetensors")


def _fmt(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _rate(nbytes: int, seconds) -> str:
    return f"{nbytes / seconds / 1e9:.1f} GB/s" if seconds else "—"


def get(results: dict, *keys):
    """results[k1][k2]..., None where a key is missing."""
    node = results
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _cell(results: dict, section: str, tool: str, nbytes: int) -> str:
    entry = get(results, section, tool)
    error = results.get("errors", {}).get(f"{section}/{tool}")
    if error:
        return f"failed: {error[:80]}"
    if entry is None:
        return "—"
    if entry.get("verified") is False:
        return f"WRONG DATA ({_fmt(entry['seconds'])})"
    return f"{_fmt(entry['seconds'])} ({_rate(nbytes, entry['seconds'])})"


def _environment(results: dict) -> list[str]:
    env = results.get("environment", {})
    config = results.get("config", {})
    lines = ["## Machine", "",
             f"- device: {env.get('device_kind', '?')} ({env.get('platform', '?')}), "
             f"{env.get('devices', '?')} device(s); nvidia-smi: {env.get('nvidia_smi', '—')}",
             f"- host: {env.get('cpus', '?')} cores, "
             f"{(env.get('mem_total_kib') or 0) / (1 << 20):.0f} GiB; checkpoints on "
             f"{env.get('root_filesystem', '?')}; cold loads: "
             f"{env.get('drop_caches', 'POSIX_FADV_DONTNEED on the files')}",
             f"- state: scale {config.get('scale')}, "
             f"{config.get('state_bytes', 0) / GIB:.2f} GiB in {config.get('leaves')} leaves",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items()),
             ""]
    return lines


def _floors(results: dict, nbytes: int) -> list[str]:
    rows = [("device to host, pinned (JAX, pool reused)", ("floors", "jax", "d2h_pinned")),
            ("device to host, pinned (torch, buffers ready)", ("floors", "torch", "d2h_pinned")),
            ("device to host, pageable (JAX)", ("floors", "jax", "d2h_pageable")),
            ("device to host, pageable (torch)", ("floors", "torch", "d2h_pageable")),
            ("host to device, from pageable (JAX)", ("floors", "jax", "h2d", "pageable")),
            ("host to device, from pinned (JAX)", ("floors", "jax", "h2d", "pinned")),
            ("host to device, from pinned (torch)", ("floors", "torch", "h2d_pinned")),
            ("disk: durable write", ("floors", "disk", "write")),
            ("disk: read, page cache", ("floors", "disk", "read_warm")),
            ("disk: read, cold", ("floors", "disk", "read_cold"))]
    lines = ["## Floors", "", "| floor | time | rate |", "|---|---|---|"]
    for name, keys in rows:
        seconds = get(results, *keys, "seconds")
        lines.append(f"| {name} | {_fmt(seconds)} | {_rate(nbytes, seconds)} |")
    first = get(results, "floors", "jax", "d2h_pinned", "first_seconds")
    view = get(results, "floors", "jax", "pinned_numpy_is_a_view")
    lines += ["", f"JAX's first pinned copy (allocating the pool): {_fmt(first)}. "
              f"np.asarray of a pinned_host array is a view: {view}.", ""]
    return lines


def _stalls(results: dict) -> list[str]:
    lines = ["## Training stall (async save of the whole state)", "",
             "| tool | stall | blocking | slowdown of the next step | save to commit | checked |",
             "|---|---|---|---|---|---|"]
    for tool in TOOLS:
        e = get(results, "stall", tool)
        error = results.get("errors", {}).get(f"stall/{tool}")
        if e is None:
            if error:
                lines.append(f"| {tool} | failed: {error[:80]} | | | | |")
            continue
        lines.append(f"| {tool} | {_fmt(e['seconds'])} | {_fmt(e['blocking_seconds'])} | "
                     f"{_fmt(e['slowdown_seconds'])} | {_fmt(e['total_seconds'])} | "
                     f"{'yes' if e.get('verified') else 'WRONG DATA'} |")
    return lines + [""]


def _saves_and_loads(results: dict, nbytes: int) -> list[str]:
    lines = ["## Durable save and loads onto the device", "",
             "| tool | save | load, page cache | load, cold | bytes on disk |",
             "|---|---|---|---|---|"]
    for tool in TOOLS:
        if get(results, "save", tool) is None and f"save/{tool}" not in results.get("errors", {}):
            continue
        size = get(results, "save", tool, "bytes_on_disk")
        cells = [_cell(results, section, tool, nbytes)
                 for section in ("save", "load_warm", "load_cold")]
        cells.append(f"{size / GIB:.2f} GiB" if size else "—")
        lines.append(f"| {tool} | " + " | ".join(cells) + " |")
    return lines + [""]


def _targets(results: dict) -> list[str]:
    t = results.get("targets") or {}
    rows = [("stall ≤ 1.2× the pinned device-to-host floor", "stall_over_pinned_d2h_floor",
             "stall_over_pinned_d2h_floor_target", "≤"),
            ("stall ≤ 0.5× the best peer's", "stall_over_best_peer",
             "stall_over_best_peer_target", "≤"),
            ("load from the page cache ≥ 2× faster than the best peer",
             "load_warm_speedup_over_best_peer", "load_warm_speedup_target", "≥")]
    lines = ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for name, key, limit, sense in rows:
        value, bound = t.get(key), t.get(limit)
        met = "—" if value is None else (
            "yes" if (value <= bound if sense == "≤" else value >= bound) else "no")
        lines.append(f"| {name} | {'—' if value is None else f'{value:.2f}×'} | {met} |")
    return lines + [""]


def render(results: dict) -> str:
    nbytes = results.get("config", {}).get("state_bytes", 0)
    lines = ["# Accelerator benchmark", "",
             "Made by `bench/gpu.sh` (bench/gpu.py; bench/README.md says how), "
             "one command on the machine.", ""]
    lines += _environment(results) + _targets(results) + _floors(results, nbytes)
    lines += _stalls(results) + _saves_and_loads(results, nbytes)
    if results.get("skipped"):
        lines += ["## Skipped for time", ""] + [f"- {s}" for s in results["skipped"]] + [""]
    if results.get("errors"):
        lines += ["## Errors", ""] + [f"- {k}: {v[:300]}" for k, v in results["errors"].items()]
        lines.append("")
    lines.append(f"Wall time of the run: {results.get('wall_seconds', 0):.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    folder = argv[1]
    with open(os.path.join(folder, "gpu.json")) as f:
        results = json.load(f)
    with open(os.path.join(folder, "RESULTS.md"), "w") as f:
        f.write(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
