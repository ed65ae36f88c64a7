"""W6's part of RESULTS.md: the training stall of an asynchronous save.

One table per state (W1's training state; W2's 2,000 small leaves): each
tool's stall and its parts (see training_loop.py), beside the floor of a
snapshot that stays correct under donation. A tool whose checkpoint did
not hold the values as of the save call is marked WRONG DATA and is no
one's best peer.
"""

from __future__ import annotations

MIB = 1 << 20
PEERS = ("orbax", "dcp")
PEER_FACTOR = 0.5
FLOOR_OF = {"stall": ("memcpy_touched", 1.5), "stall_small": ("d2h", 1.1)}
# W1's stall at small scale: (times the floor, plus seconds).
SMALL_STALL_LIMIT = (2, 0.010)
TITLES = {"stall": "W1's training state", "stall_small": "W2's 2,000 small leaves"}
FLOOR_NAMES = {"memcpy_touched": "memcpy into touched memory",
               "d2h": "device-to-host copies of the leaves"}


def _ran(results) -> bool:
    return "W6" in results["config"]["workloads"]


def _entry(results, op, tool) -> dict:
    return results["summary"].get("W6", {}).get(op, {}).get(tool, {})


def _good(e) -> float | None:
    """The median stall of a verified measurement."""
    return e.get("median") if e.get("verified", True) else None


def _fmt(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _verdict(target, measured, met=None):
    return {"target": target, "measured": measured, "met": met, "note": ""}


def _why_missing(results, op, tool) -> str:
    e = _entry(results, op, tool)
    if e.get("verified") is False:
        return f"{tool}: WRONG DATA (its checkpoint did not hold the values of the save call)"
    return f"not measured ({tool} failed: {e['error']})" if e.get("error") else "not measured"


def best_peer(results, op):
    """(tool, median stall) of the fastest verified peer configuration."""
    found = [(m, tool) for tool, e in results["summary"].get("W6", {}).get(op, {}).items()
             if tool.startswith(PEERS) and (m := _good(e)) is not None]
    if not found:
        return None, None
    m, tool = min(found)
    return tool, m


def verdicts(results) -> list[dict]:
    if not _ran(results):
        return []
    out = []
    sk = _good(_entry(results, "stall", "shardkeep"))
    tool, peer = best_peer(results, "stall")
    name = f"W6 stall ≤ {PEER_FACTOR}× best peer's"
    if sk is None or peer is None:
        out.append(_verdict(name, _why_missing(results, "stall",
                                               "shardkeep" if sk is None else "peers")))
    else:
        out.append(_verdict(name, f"{sk / peer:.2f}× ({_fmt(sk)} vs {tool} {_fmt(peer)})",
                            sk <= PEER_FACTOR * peer))
    for op, target in (("stall", "W6 stall"), ("stall_small", "W6 small-leaves stall")):
        floor_op, limit = FLOOR_OF[op]
        slack = 0.0
        if op == "stall" and results["config"]["scale"] != "full":
            # At small scale a save's fixed costs weigh as much as its copy.
            limit, slack = SMALL_STALL_LIMIT
        sk = _good(_entry(results, op, "shardkeep"))
        floor = _entry(results, floor_op, "floor").get("median")
        name = (f"{target} ≤ {limit}× {FLOOR_NAMES[floor_op]}"
                + (f" + {slack * 1000:.0f} ms" if slack else ""))
        if sk is None or floor is None:
            out.append(_verdict(name, _why_missing(results, op, "shardkeep" if sk is None
                                                   else "floor")))
        else:
            out.append(_verdict(name, f"{sk / floor:.2f}× ({_fmt(sk)} vs {_fmt(floor)})",
                                sk <= limit * floor + slack))
    out.append(_rss_verdict(results))
    return out


def _rss_verdict(results):
    name = "Peak RSS W6 ≤ state + one staging copy + 512 MiB"
    e = _entry(results, "stall", "shardkeep")
    if "peak_rss_kib" not in e or "runtime_rss_kib" not in e or "bytes" not in e:
        return _verdict(name, "not measured")
    used = (e["peak_rss_kib"] - e["runtime_rss_kib"]) * 1024
    limit = 2 * e["bytes"] + 512 * MIB
    return _verdict(name, f"{used / MIB:.0f} MiB above the runtime for a "
                          f"{e['bytes'] / MIB:.0f} MiB state (limit {limit / MIB:.0f} MiB)",
                    used <= limit)


def _row(tool, e) -> str:
    if e.get("median") is None:
        return (f"| {tool} | " + ("n/a" if e.get("not_applicable") else "FAILED")
                + " |" + " |" * 5)
    stall = _fmt(e["median"])
    if e["n"] > 1:
        stall += f" ({_fmt(e['min'])}–{_fmt(e['max'])})"
    if e.get("verified") is False:
        stall += " WRONG DATA"
    cells = [stall] + [_fmt(e.get(k)) for k in ("blocking_seconds", "step_after_seconds",
                                                "slowdown_seconds", "baseline_step_seconds")]
    rss = ""
    if "peak_rss_kib" in e and "runtime_rss_kib" in e:
        peak = e["peak_rss_kib"]
        rss = f"{peak / 1024:.0f} (+{(peak - e['runtime_rss_kib']) / 1024:.0f}"
        if "loop_rss_kib" in e:
            rss += f" / +{(peak - e['loop_rss_kib']) / 1024:.0f}"
        rss += ")"
    return f"| {tool} | " + " | ".join(cells + [rss]) + " |"


def section(results) -> list[str]:
    if not _ran(results):
        return []
    out = ["", "## W6: training stall of an async save", "",
           "A training loop on 8 CPU devices: JAX tools run a jitted update that donates its "
           "input, DCP updates its tensors in place right after the blocking phase. Per save: "
           "stall = blocking (the save call) + slowdown (the first update after it, minus the "
           "median update away from saves, at least 0); medians over saves 2–4. Each tool's "
           "last checkpoint is checked against the values as of its save call. Peak RSS: "
           "above the runtime (before the state was built) and above the loop's start (the "
           "state and the compiled update, after the warm-up steps): the latter is what the "
           "saves added."]
    ops = results["summary"].get("W6", {})
    tools = results["config"]["tools"]
    for op in ("stall", "stall_small"):
        if op not in ops:
            continue
        floor_op, _ = FLOOR_OF[op]
        floor = ops.get(floor_op, {}).get("floor", {})
        size = next((e["bytes"] for e in ops[op].values() if "bytes" in e), None)
        out += ["", f"### {TITLES[op]}" + (f" ({size / MIB:.1f} MiB)" if size else ""), "",
                "| tool | stall | blocking | step after save | slowdown | baseline step "
                "| peak RSS MiB (above runtime / above the loop's start) |",
                "|---|---|---|---|---|---|---|"]
        if floor:
            out.append(f"| floor: {FLOOR_NAMES[floor_op]} | {_fmt(floor.get('median'))} |"
                       + " |" * 5)
        out += [_row(t, ops[op][t]) for t in tools if t in ops[op]]
        sk = _good(ops[op].get("shardkeep", {}))
        tool, peer = best_peer(results, op)
        if sk and peer:
            out += ["", f"shardkeep ÷ best peer ({tool}): {sk / peer:.2f}×"
                    + (f"; shardkeep ÷ floor: {sk / floor['median']:.2f}×"
                       if floor.get("median") else "")]
    warned = sorted({f"{t}: {w}" for per_tool in ops.values() for t, e in per_tool.items()
                     for w in e.get("warnings", [])})
    if warned:
        out += ["", "Warnings raised in the loop:", ""] + [f"- {w}" for w in warned]
    return out
