"""The compression part of RESULTS.md: W1 saved by shardkeep with
``compression="zstd"`` beside shardkeep raw and Orbax's default (which
compresses with zstd level 3), in the same run.

Goals (issue "For Orbax users", item 5): no larger than Orbax's default,
with save and load times within 1.2x of shardkeep's uncompressed ones.
"""

from __future__ import annotations

MIB = 1 << 20
TIME_LIMIT = 1.2
COMPRESSED, RAW, ORBAX = "shardkeep-zstd", "shardkeep", "orbax"
OPS = ("save", "load_cold", "load_warm")


def _entry(results, op, tool) -> dict:
    return results["summary"].get("W1", {}).get(op, {}).get(tool, {})


def _ran(results) -> bool:
    return bool(_entry(results, "save", COMPRESSED))


def _fmt_s(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _verdict(target, measured, met):
    return {"target": target, "measured": measured, "met": met, "note": ""}


def verdicts(results) -> list[dict]:
    if not _ran(results):
        return []
    out = []
    ours = _entry(results, "save", COMPRESSED).get("stored_bytes")
    orbax = _entry(results, "save", ORBAX).get("stored_bytes")
    name = "W1 compressed: stored size ≤ Orbax default's"
    out.append(_verdict(name, "not measured", None) if ours is None or orbax is None else
               _verdict(name, f"{ours / orbax:.3f}× ({ours / MIB:.0f} MiB vs {orbax / MIB:.0f} MiB)",
                        ours <= orbax))
    for op in OPS:
        compressed = _entry(results, op, COMPRESSED).get("median")
        raw = _entry(results, op, RAW).get("median")
        name = f"W1 compressed {op} ≤ {TIME_LIMIT}× uncompressed"
        out.append(_verdict(name, "not measured", None) if compressed is None or raw is None else
                   _verdict(name, f"{compressed / raw:.2f}× ({_fmt_s(compressed)} vs {_fmt_s(raw)})",
                            compressed <= TIME_LIMIT * raw))
    return out


def section(results) -> list[str]:
    if not _ran(results):
        return []
    state = results["config"]["state_bytes"]["W1"]
    lines = ["## W1 compressed", "",
             "Stored size ÷ the state's bytes, and medians; see docs/COMPRESSION.md.", "",
             "| tool | stored | ÷ state | " + " | ".join(OPS) + " |",
             "|---|---|---|" + "---|" * len(OPS)]
    for tool in (RAW, COMPRESSED, ORBAX, "orbax-nocompress"):
        stored = _entry(results, "save", tool).get("stored_bytes")
        if stored is None:
            continue
        times = " | ".join(_fmt_s(_entry(results, op, tool).get("median")) for op in OPS)
        lines.append(f"| {tool} | {stored / MIB:.0f} MiB | {stored / state:.3f} | {times} |")
    return lines + [""]
