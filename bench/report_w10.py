"""W10's part of RESULTS.md: W1's state saved to and loaded from GCS (the
emulator), side by side with Orbax (TensorStore's gcs driver), DCP through
gcsfs and a floor (google-cloud-storage's transfer manager of the same
bytes).

Targets: save and load at least 1.5× faster than the best configuration of
Orbax and of DCP, and within 1.2× of the floor's time; peak host memory as
for local saves (the state plus 512 MiB).
"""

from __future__ import annotations

import report_w5

W = "W10"
FLOOR_OP = {"save": "upload", "load": "download"}
PEER_FACTOR = 1.5
FLOOR_FACTOR = 1.2
RSS_SLACK_MIB = 512


def _ran(results) -> bool:
    return W in results["config"]["workloads"] or W in results.get("not_run", {})


def _ops(results) -> dict:
    return results["summary"].get(W, {})


def _median(results, op, tool):
    return _ops(results).get(op, {}).get(tool, {}).get("median")


def _best(results, op, prefix):
    found = [(e["median"], tool) for tool, e in _ops(results).get(op, {}).items()
             if tool.startswith(prefix) and e.get("median") is not None]
    return min(found) if found else (None, None)


def _state_mib(results) -> float:
    return results["config"]["state_bytes"]["W1"] / 2**20


def verdicts(results) -> list[dict]:
    if not _ran(results):
        return []
    if W in results.get("not_run", {}):
        return [_verdict("W10 (GCS) save and load", f"not run: {results['not_run'][W]}")]
    out = []
    for op in ("save", "load"):
        sk = _median(results, op, "shardkeep")
        for prefix, label in (("orbax", "Orbax"), ("dcp", "DCP+gcsfs")):
            peer, tool = _best(results, op, prefix)
            name = f"W10 (GCS) {op} ≥ {PEER_FACTOR}× faster than {label}"
            if sk is None or peer is None:
                out.append(_verdict(name, "not measured"))
            else:
                out.append(_verdict(name, f"{peer / sk:.2f}× ({sk:.2f} s vs {tool} {peer:.2f} s)",
                                    peer / sk >= PEER_FACTOR))
        floor = _median(results, FLOOR_OP[op], "floor")
        name = f"W10 (GCS) {op} ≤ {FLOOR_FACTOR}× the floor (google-cloud-storage)"
        if sk is None or floor is None:
            out.append(_verdict(name, "not measured"))
        else:
            out.append(_verdict(name, f"{sk / floor:.2f}× ({sk:.2f} s vs {floor:.2f} s)",
                                sk <= FLOOR_FACTOR * floor))
        entry = _ops(results).get(op, {}).get("shardkeep", {})
        if "peak_rss_kib" in entry and "runtime_rss_kib" in entry:
            above = (entry["peak_rss_kib"] - entry["runtime_rss_kib"]) / 1024
            limit = _state_mib(results) + RSS_SLACK_MIB
            out.append(_verdict(f"Peak RSS, W10 {op} ≤ state + {RSS_SLACK_MIB} MiB",
                                f"{above:.0f} MiB above the runtime (limit {limit:.0f} MiB)",
                                above <= limit))
    return out


def _verdict(target, measured, met=None):
    return {"target": target, "measured": measured, "met": met, "note": ""}


def section(results) -> list[str]:
    if not _ran(results):
        return []
    out = ["", "## W10: training state on GCS (emulator)", ""]
    if W in results.get("not_run", {}):
        return out + [f"Not run: {results['not_run'][W]}"]
    server = results.get("gcs", {}).get("server", "a GCS emulator")
    out += [f"W1's state ({results['config']['state_bytes']['W1'] / 1e9:.2f} GB) saved to and "
            f"loaded from {server}. Orbax through TensorStore's gcs driver "
            "(TENSORSTORE_GCS_HTTP_URL); DCP through FsspecWriter / FsspecReader and gcsfs "
            "(STORAGE_EMULATOR_HOST); floor: google-cloud-storage's transfer manager "
            "(upload_many / download_many, one object per device's shard group, 8 threads). "
            "The emulator keeps objects in memory and runs on the same cores as the tools.", ""]
    ops = _ops(results)
    tools = [t for t in results["config"]["tools"]
             if any(t in ops.get(op, {}) for op in ("save", "load"))]
    columns = ["floor (google-cloud-storage)"] + tools + ["shardkeep ÷ floor"]
    out += ["| op | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
    for op in ("save", "load"):
        floor = ops.get(FLOOR_OP[op], {}).get("floor", {})
        row = [op, f"{FLOOR_OP[op]}: {report_w5._cell(results, floor)}" if floor else ""]
        row += [report_w5._cell(results, ops.get(op, {}).get(t)) for t in tools]
        sk = _median(results, op, "shardkeep")
        row.append(f"{sk / floor['median']:.2f}×" if sk and floor.get("median") else "—")
        out.append("| " + " | ".join(row) + " |")
    return out
