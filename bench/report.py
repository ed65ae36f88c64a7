"""Turns results.json into RESULTS.md, with the issue's targets judged
automatically, and draws a chart per workload (charts.py). Run alone to
re-render: python report.py [results.json [OUT_DIR]] (OUT_DIR: the json's folder).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from typing import Sequence

import charts
import report_compression
import report_w10
import report_w5
import report_w6
import report_w7
from baseline import TOOL as BASELINE  # suite.py --baseline

MIB = 1 << 20
PEERS = ("orbax", "dcp")
FLOOR_FOR = {("W1", "save"): "write", ("W1", "load_cold"): "map_cold",
             ("W1", "load_warm"): "map_warm", ("W1", "reshard_cold"): "read_fresh_cold",
             ("W1", "reshard_warm"): "read_fresh_warm", ("W1", "async_save"): "memcpy",
             ("W1", "reload_warm"): "read_warm",
             ("W3", "save"): "write", ("W3", "load"): "map_warm",
             ("W2", "save"): "write", ("W2", "load_cold"): "device_put",
             ("W2", "load_warm"): "device_put"}


def entry(results, workload, op, tool):
    return results["summary"].get(workload, {}).get(op, {}).get(tool, {})


def median(results, workload, op, tool):
    return entry(results, workload, op, tool).get("median")


def best_peer(results, workload, op, peer):
    """(tool, median) of the fastest configuration of ``peer``, or (None, None)."""
    found = [(m, tool) for tool, e in results["summary"].get(workload, {}).get(op, {}).items()
             if tool.startswith(peer) and (m := e.get("median")) is not None]
    if not found:
        return None, None
    m, tool = min(found)
    return tool, m


def _verdict(target, measured, met, note=""):
    return {"target": target, "measured": measured, "met": met, "note": note}


def _fmt_s(seconds):
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _ratio_check(results, target, workload, op, other_tool, other_op, limit):
    """shardkeep time / other time <= limit."""
    sk = median(results, workload, op, "shardkeep")
    other = median(results, workload, other_op, other_tool)
    if sk is None or other is None:
        return _verdict(target, "not measured", None)
    ratio = sk / other
    return _verdict(target, f"{ratio:.2f}× ({_fmt_s(sk)} vs {_fmt_s(other)})", ratio <= limit)


def _speedup_checks(results, target, workload, op, factor):
    """Each peer's best configuration is at least ``factor`` times slower."""
    out = []
    sk = median(results, workload, op, "shardkeep")
    for peer in PEERS:
        tool, other = best_peer(results, workload, op, peer)
        name = f"{target} — vs {peer}"
        if sk is None or other is None:
            out.append(_verdict(name, "not measured", None))
            continue
        speedup = other / sk
        out.append(_verdict(name, f"{speedup:.2f}× faster ({_fmt_s(sk)} vs {tool} "
                                  f"{_fmt_s(other)})", speedup >= factor))
    return out


def _rss_check(results, target, workload, op, allowance_bytes):
    e = entry(results, workload, op, "shardkeep")
    if "peak_rss_kib" not in e or "runtime_rss_kib" not in e:
        return _verdict(target, "not measured", None)
    used = (e["peak_rss_kib"] - e["runtime_rss_kib"]) * 1024
    state = results["config"]["state_bytes"][workload]
    return _verdict(target, f"{used / MIB:.0f} MiB above the runtime for a {state / MIB:.0f} MiB "
                            f"state (limit {allowance_bytes / MIB:.0f} MiB)",
                    used <= allowance_bytes)


def verdicts(results) -> list[dict]:
    state = results["config"]["state_bytes"].get("W1", 0)
    v = []
    v.append(_ratio_check(results, "W1 durable save ≤ 1.10× write floor", "W1", "save",
                          "floor", "write", 1.10))
    v += _speedup_checks(results, "W1 durable save ≥ 1.5× faster than each peer", "W1",
                         "save", 1.5)
    v.append(_ratio_check(results, "W1 async save blocking ≤ 1.2× memcpy floor", "W1",
                          "async_save", "floor", "memcpy", 1.2))
    v.append(_ratio_check(results, "W1 first async save blocking ≤ 0.3× a sync save", "W1",
                          "async_save", "shardkeep", "save", 0.3))
    v.append(_ratio_check(results, "W1 cold load ≤ 1.2× its floor (map_cold)", "W1",
                          "load_cold", "floor", "map_cold", 1.2))
    for cache in ("cold", "warm"):
        sk = median(results, "W1", f"reshard_{cache}", "shardkeep")
        same = median(results, "W1", f"load_{cache}", "shardkeep")
        name = f"W1 resharded load ≤ 1.3× same-sharding load ({cache})"
        v.append(_verdict(name, "not measured", None) if sk is None or same is None else
                 _verdict(name, f"{sk / same:.2f}× ({_fmt_s(sk)} vs {_fmt_s(same)})",
                          sk / same <= 1.3))
    slowest = entry(results, "W1", "reload_warm", "shardkeep").get("max_seconds")
    floor = median(results, "W1", "read_warm", "floor")
    name = "W1 reload into the live state ≤ 1.5× the warm read floor"
    v.append(_verdict(name, "not measured", None) if slowest is None or floor is None else
             _verdict(name, f"{slowest / floor:.2f}× (slowest {_fmt_s(slowest)}, median "
                            f"{_fmt_s(median(results, 'W1', 'reload_warm', 'shardkeep'))} vs "
                            f"{_fmt_s(floor)})", slowest <= 1.5 * floor,
                      "the slowest of the loads after the first"))
    by_sk = median(results, "W1", "sk_load_warm", "orbax")
    by_orbax = median(results, "W1", "load_warm", "orbax")
    name = "W1 saved by Orbax: load_orbax ≥ 2× faster than Orbax's own restore (warm)"
    v.append(_verdict(name, "not measured", None) if by_sk is None or by_orbax is None else
             _verdict(name, f"{by_orbax / by_sk:.2f}× ({_fmt_s(by_sk)} vs {_fmt_s(by_orbax)})",
                      by_orbax / by_sk >= 2))
    v += _speedup_checks(results, "W3 (tmpfs) save ≥ 2× faster than each peer", "W3", "save", 2)
    v += _speedup_checks(results, "W3 (tmpfs) load ≥ 2× faster than each peer", "W3", "load", 2)
    v.append(_ratio_check(results, "W2 synchronous save ≤ 1.5× its write floor", "W2", "save",
                          "floor", "write", 1.5))
    for op in ("load_warm", "load_cold"):
        sk = median(results, "W2", op, "shardkeep")
        name = f"W2 {op} < 100 ms"
        floor_op = FLOOR_FOR[("W2", op)]
        floor = median(results, "W2", floor_op, "floor")
        bound = (f" (floor, {floor_op} of the same leaves: {_fmt_s(floor)})"
                 if floor is not None else "")
        v.append(_verdict(name, "not measured", None) if sk is None
                 else _verdict(name, _fmt_s(sk) + bound, sk < 0.1))
    for op in ("save", "load_warm"):
        sk = median(results, "W2", op, "shardkeep")
        tool, other = best_peer(results, "W2", op, "orbax")
        name = f"W2 {op} ≥ 10× faster than orbax"
        v.append(_verdict(name, "not measured", None) if sk is None or other is None else
                 _verdict(name, f"{other / sk:.1f}× ({_fmt_s(sk)} vs {tool} {_fmt_s(other)})",
                          other / sk >= 10))
    v.append(_rss_check(results, "Peak RSS, W1 sync save ≤ state + 512 MiB", "W1", "save",
                        state + 512 * MIB))
    for op in ("load_cold", "load_warm", "reshard_cold", "reshard_warm"):
        v.append(_rss_check(results, f"Peak RSS, W1 {op} ≤ state + 512 MiB", "W1", op,
                            state + 512 * MIB))
    v.append(_rss_check(results, "Peak RSS, W1 reload_warm ≤ state + 512 MiB (no memory kept"
                                 " beyond the live state)", "W1", "reload_warm", state + 512 * MIB))
    v.append(_rss_check(results, "Peak RSS, W1 async save ≤ state + one staging copy + 512 MiB",
                        "W1", "async_save", 2 * state + 512 * MIB))
    if "W4" in results.get("not_run", {}):
        reason = results["not_run"]["W4"]
        v.append(_verdict("W4 save throughput equal to one process", f"not run: {reason}", None))
        v.append(_verdict("W4 coordination overhead < 50 ms per save", f"not run: {reason}",
                          None))
    else:
        multi = median(results, "W4", "save", "shardkeep")
        single = median(results, "W1", "save", "shardkeep")
        name = "W4 save throughput equal to one process (within 10%)"
        v.append(_verdict(name, "not measured", None) if multi is None or single is None else
                 _verdict(name, f"{single / multi:.2f}× one process's throughput "
                                f"({_fmt_s(multi)} vs {_fmt_s(single)})", multi <= 1.1 * single,
                          "both processes share this machine's cores and disk"))
        multi = median(results, "W4", "save_tiny", "shardkeep")
        single = median(results, "W1", "save_tiny", "shardkeep")
        name = "W4 coordination overhead < 50 ms per save"
        v.append(_verdict(name, "not measured", None) if multi is None or single is None else
                 _verdict(name, f"{(multi - single) * 1000:.1f} ms (tiny save: "
                                f"{_fmt_s(multi)} in 2 processes vs {_fmt_s(single)} in one)",
                          multi - single < 0.05))
    v = [x for x in v if _ran(results, x["target"])]
    v += report_w5.verdicts(results)
    v += report_w10.verdicts(results)
    v += report_w6.verdicts(results)
    v += report_w7.verdicts(results)
    v += report_compression.verdicts(results)
    return v


def _ran(results, target: str) -> bool:
    """Whether the workload a W1-W4 target names was part of the run (or
    recorded as not run), so that a run of other workloads alone lists
    only its own targets."""
    named = re.search(r"\bW\d\b", target)
    return (named is None or named.group() in results["config"]["workloads"]
            or named.group() in results.get("not_run", {}))


def _cell(e):
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


def _workload_table(results, workload) -> list[str]:
    ops = results["summary"].get(workload, {})
    if not ops:
        return []
    has_floor = any("floor" in per_tool for per_tool in ops.values())
    tools = [t for t in results["config"]["tools"]
             if any(t in per_tool for per_tool in ops.values())]
    ratio_cols = [f"{p} best ÷ shardkeep" for p in PEERS]
    ratio_cols += ["shardkeep ÷ floor"] if has_floor else []
    columns = (["floor"] if has_floor else []) + tools + ratio_cols
    lines = ["| op | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
    for op in [o for o in charts.OP_ORDER if o in ops]:
        per_tool = ops[op]
        if not any(t in per_tool for t in tools):
            continue
        row = [op]
        floor_op = FLOOR_FOR.get((workload, op))
        floor_e = ops.get(floor_op, {}).get("floor") if floor_op else None
        if has_floor:
            row.append(f"{floor_op}: {_cell(floor_e)}" if floor_e else "")
        row += [_cell(per_tool.get(t)) for t in tools]
        sk = per_tool.get("shardkeep", {}).get("median")
        for peer in PEERS:
            _, other = best_peer(results, workload, op, peer)
            row.append(f"{other / sk:.2f}×" if sk and other else "—")
        if has_floor:
            row.append(f"{sk / floor_e['median']:.2f}×"
                       if sk and floor_e and floor_e.get("median") else "—")
        lines.append("| " + " | ".join(row) + " |")
    return lines


FLOOR_ORDER = ["write", "read_cold", "read_warm", "read_fresh_cold", "read_fresh_warm",
               "map_cold", "map_warm", "memcpy", "first_touch"]


def _floor_records(results, op: str) -> list[dict]:
    return [r for r in results.get("measurements", []) if r.get("tool") == "floor"
            and r.get("workload") == "W1" and r.get("op") == op and r.get("ok")]


def _floor_configs(records: list[dict]) -> str:
    """The winning configuration(s) and every configuration's median."""
    if not any("configs" in r for r in records):
        return ""
    wins: dict[str, int] = {}
    times: dict[str, list[float]] = {}
    for r in records:
        wins[r["best"]] = wins.get(r["best"], 0) + 1
        for name, seconds in r["configs"].items():
            times.setdefault(name, []).append(seconds)
    best = ", ".join(name if len(records) == 1 else f"{name} ({n}×)"
                     for name, n in sorted(wins.items(), key=lambda x: -x[1]))
    each = ", ".join(f"{name} {_fmt_s(statistics.median(t))}" for name, t in times.items())
    return f"{best} | {each}"


def _floors_section(results) -> list[str]:
    """W1's floors: each op's time and rate over the state's bytes, with the
    configurations tried, and the cost of new memory on this machine."""
    ops = results["summary"].get("W1", {})
    measured = [op for op in FLOOR_ORDER if ops.get(op, {}).get("floor", {}).get("median")]
    if not measured:
        return []
    state = results["config"]["state_bytes"]["W1"]
    lines = ["", "## Floors (W1)", "",
             "| floor | seconds | GiB/s | best configuration | each configuration (median) |",
             "|---|---|---|---|---|"]
    for op in measured:
        e = ops[op]["floor"]
        configs = _floor_configs(_floor_records(results, op)) or " | "
        lines.append(f"| {op} | {_cell(e)} | {state / e['median'] / (1 << 30):.2f} | "
                     f"{configs} |")
    touches = _floor_records(results, "first_touch")
    if touches:
        def per_gib(key):
            return statistics.median(r[key] for r in touches)
        line = (f"First touch of fresh memory on this machine: "
                f"{per_gib('seconds_per_gib'):.2f} s/GiB (a copy into memory already "
                f"touched: {per_gib('touched_copy_seconds_per_gib'):.2f} s/GiB)")
        if all("held_seconds_per_gib" in r for r in touches):
            line += (f"; the next state's size of new memory, beside the first as a staging "
                     f"copy is beside the state: {per_gib('held_seconds_per_gib'):.2f} s/GiB; "
                     f"new memory right after the first is freed: "
                     f"{per_gib('recycled_seconds_per_gib'):.2f} s/GiB")
        lines += ["", line + "."]
    return lines


def _baseline_section(results) -> list[str]:
    """This build against an earlier one measured in the same run
    (suite.py --baseline): every op both have, as a ratio."""
    commit = results["config"].get("baseline")
    if not commit:
        return []
    lines = ["", f"## Against the baseline {commit}", "",
             f"The same run measured shardkeep at {commit} as `{BASELINE}`; "
             "`shardkeep ÷ baseline` < 1 means this build is faster.", "",
             f"| workload | op | {BASELINE} | shardkeep | shardkeep ÷ baseline |",
             "|---|---|---|---|---|"]
    for workload, ops in sorted(results["summary"].items()):
        for op, per_tool in ops.items():
            before, now = per_tool.get(BASELINE), per_tool.get("shardkeep")
            if not (before and now and before.get("median") and now.get("median")):
                continue
            lines.append(f"| {workload} | {op} | {_cell(before)} | {_cell(now)} | "
                         f"{now['median'] / before['median']:.2f}× |")
    return lines


def _rss_table(results) -> list[str]:
    tools = results["config"]["tools"]
    lines = ["| workload / op | " + " | ".join(tools) + " |", "|---" * (1 + len(tools)) + "|"]
    for workload in ("W1", "W3", "W4"):
        ops = results["summary"].get(workload, {})
        for op in [o for o in charts.OP_ORDER if o in ops]:
            per_tool = ops[op]
            if op == "save_tiny" or not any(t in per_tool for t in tools):
                continue
            cells = []
            for t in tools:
                e = per_tool.get(t, {})
                if "peak_rss_kib" in e:
                    extra = (f" (+{(e['peak_rss_kib'] - e['runtime_rss_kib']) / 1024:.0f})"
                             if "runtime_rss_kib" in e else "")
                    cells.append(f"{e['peak_rss_kib'] / 1024:.0f}{extra}")
                else:
                    cells.append("")
            lines.append(f"| {workload} {op} | " + " | ".join(cells) + " |")
    return lines


def render(results, charts_drawn: Sequence[str] = ()) -> str:
    cfg = results["config"]
    m = results["machine"]
    ver = results["versions"]
    mark = {True: "met", False: "NOT met", None: "not measured"}
    colds = sorted({method for w in results["summary"].values() for per_tool in w.values()
                    for e in per_tool.values() for method in e.get("cold_method", [])})
    out = [
        "# shardkeep benchmark results",
        "",
        f"Generated by `bench/run.sh --scale {cfg['scale']} --reps {cfg['reps']}"
        f"{' --drop-caches' if cfg['drop_caches'] else ''}` on {results['date']} "
        f"({results['duration_s']} s).",
        "",
        f"- Machine: {m.get('cpu', '?')}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"Linux {m['kernel']}, Python {m['python']}",
        f"- Storage: disk {results['filesystems']['disk']}; tmpfs "
        f"{results['filesystems']['tmpfs']}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in ver.items() if v),
        f"- Workloads: W1 = {cfg['state_bytes']['W1'] / MIB:.0f} MiB Llama-style state "
        "(bf16 params + f32 Adam mu/nu) on 8 CPU devices, FSDP-sharded; W2 = 2,000 leaves "
        f"of 1–64 KiB ({cfg['state_bytes']['W2'] / MIB:.1f} MiB); W3 = W1 on tmpfs; "
        "W4 = W1 as a 2-process × 4-device job"
        + ("; W5 = W1 on an S3 server" if "W5" in cfg["workloads"] else "")
        + ("; W10 = W1 on GCS (an emulator)" if "W10" in cfg["workloads"] else "")
        + ("; W6 = W1's and W2's states in a training loop" if "W6" in cfg["workloads"]
           else "")
        + ("; W7 = a bfloat16 model in safetensors files" if "W7" in cfg["workloads"]
           else "") + ".",
        f"- Each cell: median of {cfg['reps']} repetition(s) (min–max), every measurement in "
        "a fresh process; tools interleaved per repetition.",
        "- Cold loads: " + (", ".join(colds) if colds else "none measured")
        + ("" if cfg["drop_caches"] else " (the page cache was not dropped: each cold "
           "measurement evicted its own files with POSIX_FADV_DONTNEED, checked with fincore)"),
    ]
    for workload, reason in results.get("not_run", {}).items():
        out.append(f"- {workload} not run: {reason}")
    out += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    for v in results["verdicts"]:
        note = f" ({v['note']})" if v["note"] else ""
        out.append(f"| {v['target']} | {v['measured']}{note} | {mark[v['met']]} |")
    if charts_drawn:
        out += ["", "## Charts", "", "Each workload side by side (medians, log scale; dashed: "
                "the machine's floor for the same bytes).", ""]
        out += [f"![{name}]({name})" for name in charts_drawn]
    out += _baseline_section(results)
    titles = {"W1": "W1: training state on disk", "W2": "W2: 2,000 small leaves",
              "W3": "W3: training state on tmpfs", "W4": "W4: 2 processes × 4 devices"}
    for workload in ("W1", "W2", "W3", "W4"):
        table = _workload_table(results, workload)
        if table:
            out += ["", f"## {titles[workload]}", ""] + table
    out += _floors_section(results)
    out += report_w5.section(results)
    out += report_w10.section(results)
    out += report_w6.section(results)
    out += report_w7.section(results)
    out += report_compression.section(results)
    out += ["", "Ratios: `peer best ÷ shardkeep` > 1 means shardkeep is faster than that "
            "peer's fastest configuration; `shardkeep ÷ floor` is the time over the machine's "
            "floor for the same bytes, named in the floor column: the fastest of several "
            "parallel writers with fsync for saves, the files mapped and every page touched for "
            "same-sharding loads, a parallel read into new memory for resharded loads, a read "
            "into a reused buffer for reloads, one memcpy for the async save. "
            "`save_tiny` is the median of 5 saves of one 8×8 array (per-save fixed cost).",
            "", "## Peak RSS (MiB; in brackets, above the process's runtime before the state "
            "was built)", ""] + _rss_table(results)
    failures = [(w, op, t, e) for w, ops in results["summary"].items()
                for op, per_tool in ops.items() for t, e in per_tool.items()
                if e.get("error")]
    if failures:
        out += ["", "## Not applicable or failed", ""]
        for w, op, t, e in failures:
            kind = "n/a" if e.get("not_applicable") else "FAILED"
            out.append(f"- {w} {t} {op}: {kind}: {e['error']}")
    return "\n".join(out) + "\n"


def floor_ops() -> dict[tuple[str, str], str]:
    """(workload, op) -> the floor op that bounds it, for every workload
    (W5, W6, W7 and W10 keep theirs beside their own targets)."""
    out = dict(FLOOR_FOR)
    for workload, module in (("W5", report_w5), ("W7", report_w7), ("W10", report_w10)):
        out.update({(workload, op): floor for op, floor in module.FLOOR_OP.items()})
    out.update({("W6", op): floor for op, (floor, _) in report_w6.FLOOR_OF.items()})
    return out


def write_outputs(results, out_dir: str) -> None:
    """RESULTS.md and one chart per workload (charts.py) into ``out_dir``;
    ``results`` already has its verdicts."""
    drawn = charts.draw(results, out_dir, floor_ops())
    with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
        f.write(render(results, drawn))


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    src = argv[0] if argv else os.path.join(here, "results.json")
    with open(src) as f:
        results = json.load(f)
    results["verdicts"] = verdicts(results)
    write_outputs(results, argv[1] if len(argv) > 1 else os.path.dirname(src))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
