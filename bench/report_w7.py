"""W7's part of RESULTS.md: a bfloat16 model in Hugging Face-style
safetensors files loaded onto 8 devices.

Goals: shardkeep faster than the fastest peer (the `safetensors`
library, Orbax's safetensors loader) in each layout, at least 1.2x warm
and 1.5x cold, and a cold load within 1.2x of the cold read floor (one
sequential read of each of the model's files).
"""

from __future__ import annotations

MIB = 1 << 20
PEER_FACTOR = {"cold": 1.5, "warm": 1.2}
FLOOR_LIMIT = 1.2
PEERS = ("safetensors", "orbax", "orbax-tuned")
OPS = {"load_cold": "FSDP, cold", "load_warm": "FSDP, warm",
       "reshard_cold": "2×4 mesh, cold", "reshard_warm": "2×4 mesh, warm"}
FLOOR_OP = {"load_cold": "read_cold", "load_warm": "read_warm",
            "reshard_cold": "read_cold", "reshard_warm": "read_warm"}


def _ran(results) -> bool:
    return "W7" in results["config"]["workloads"] or "W7" in results.get("not_run", {})


def _entry(results, op, tool) -> dict:
    return results["summary"].get("W7", {}).get(op, {}).get(tool, {})


def _fmt_s(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fastest_peer(results, op):
    """(tool, median) of the fastest peer for ``op``, or (None, None)."""
    found = [(e["median"], tool) for tool, e in results["summary"].get("W7", {})
             .get(op, {}).items() if tool in PEERS and e.get("median") is not None]
    if not found:
        return None, None
    seconds, tool = min(found)
    return tool, seconds


def _verdict(target, measured, met=None):
    return {"target": target, "measured": measured, "met": met, "note": ""}


def verdicts(results) -> list[dict]:
    if not _ran(results):
        return []
    out = []
    not_run = results.get("not_run", {}).get("W7")
    for op, label in OPS.items():
        sk = _entry(results, op, "shardkeep").get("median")
        tool, peer = fastest_peer(results, op)
        factor = PEER_FACTOR[op.rsplit("_", 1)[1]]
        name = f"W7 safetensors load ({label}) ≥ {factor}× faster than the fastest peer"
        if not_run or sk is None or peer is None:
            out.append(_verdict(name, f"not run: {not_run}" if not_run else "not measured"))
        else:
            out.append(_verdict(name, f"{peer / sk:.2f}× ({_fmt_s(sk)} vs {tool} "
                                      f"{_fmt_s(peer)})", peer / sk >= factor))
    for op in ("load_cold", "reshard_cold"):
        sk = _entry(results, op, "shardkeep").get("median")
        floor = _entry(results, "read_cold", "floor").get("median")
        name = f"W7 safetensors load ({OPS[op]}) ≤ {FLOOR_LIMIT}× the cold read floor"
        if not_run or sk is None or floor is None:
            out.append(_verdict(name, f"not run: {not_run}" if not_run else "not measured"))
        else:
            out.append(_verdict(name, f"{sk / floor:.2f}× ({_fmt_s(sk)} vs {_fmt_s(floor)})",
                                sk / floor <= FLOOR_LIMIT))
    return out


def _cell(e) -> str:
    if not e:
        return ""
    if e.get("median") is None:
        return "n/a" if e.get("not_applicable") else "FAILED"
    text = _fmt_s(e["median"])
    if e["n"] > 1:
        text += f" ({_fmt_s(e['min'])}–{_fmt_s(e['max'])})"
    if e.get("verified") is False:
        text += " WRONG DATA"
    return text


def _rss(e) -> str:
    if "peak_rss_kib" not in e:
        return ""
    text = f"{e['peak_rss_kib'] / 1024:.0f}"
    if "runtime_rss_kib" in e:
        text += f" (+{(e['peak_rss_kib'] - e['runtime_rss_kib']) / 1024:.0f})"
    return text


def section(results) -> list[str]:
    if not _ran(results):
        return []
    out = ["", "## W7: a bfloat16 model in safetensors files", ""]
    not_run = results.get("not_run", {}).get("W7")
    if not_run:
        return out + [f"Not run: {not_run}"]
    size = results["config"]["state_bytes"].get("W7", 0)
    ops = results["summary"].get("W7", {})
    tools = [t for t in results["config"]["tools"] if any(t in ops.get(op, {}) for op in OPS)]
    out += [f"W1's parameter shapes with 6× the layers, bfloat16 only ({size / MIB:.0f} MiB), "
            "written once per run by the `safetensors` library as Hugging Face-style sharded "
            "files (`model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`), "
            "loaded onto 8 CPU devices: FSDP (first dimension over 8) and a 2×4 mesh "
            "(P(\"data\", \"model\"), 1-D leaves over \"model\"). shardkeep: "
            "`sk.load_safetensors(index.json, target)`. safetensors: `safe_open(file, "
            "framework=\"numpy\")` per file, and per tensor `jax.make_array_from_callback` "
            "taking each device's box with `get_slice(name)[index]`. orbax: orbax-checkpoint's "
            "v1 `ocp.load(folder, abstract_state)` with `CheckpointLayout.SAFETENSORS` "
            "(orbax-tuned: `read_concurrent_bytes` raised past the model). Floor: one "
            "sequential read of each file (64 MiB reads). Every load's every shard is "
            "compared bit for bit with the expected values, outside the clock.", ""]
    columns = ["floor"] + tools + ["fastest peer ÷ shardkeep", "shardkeep ÷ cold read floor",
                                   "shardkeep ÷ same-cache read floor"]
    out += ["| op | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
    cold_floor = ops.get("read_cold", {}).get("floor", {}).get("median")
    for op, label in OPS.items():
        per_tool = ops.get(op, {})
        floor_e = ops.get(FLOOR_OP[op], {}).get("floor", {})
        row = [label, f"{FLOOR_OP[op]}: {_cell(floor_e)}" if floor_e else ""]
        row += [_cell(per_tool.get(t)) for t in tools]
        sk = per_tool.get("shardkeep", {}).get("median")
        tool, peer = fastest_peer(results, op)
        row.append(f"{peer / sk:.2f}× ({tool})" if sk and peer else "—")
        row.append(f"{sk / cold_floor:.2f}×" if sk and cold_floor else "—")
        row.append(f"{sk / floor_e['median']:.2f}×" if sk and floor_e.get("median") else "—")
        out.append("| " + " | ".join(row) + " |")
    out += ["", "Peak RSS (MiB; in brackets, above the process's RSS once JAX had started):", "",
            "| op | " + " | ".join(tools) + " |", "|---" * (1 + len(tools)) + "|"]
    for op, label in OPS.items():
        out.append(f"| {label} | " + " | ".join(_rss(ops.get(op, {}).get(t, {}))
                                                for t in tools) + " |")
    return out
