"""W5's part of RESULTS.md: checkpoints on an S3 server, as throughput.

Throughput is the state's bytes over the median time, in GB/s (10^9
bytes). shardkeep is compared with the floor (boto3's managed transfer of
the same bytes) and with DCP's best configuration (fsspec/s3fs); the goal
is at least the floor's throughput and at least 1.5x DCP's.
"""

from __future__ import annotations

FLOOR_OP = {"save": "upload", "load": "download"}
DCP_FACTOR = 1.5


def _ran(results) -> bool:
    return "W5" in results["config"]["workloads"] or "W5" in results.get("not_run", {})


def _entry(results, op, tool) -> dict:
    return results["summary"].get("W5", {}).get(op, {}).get(tool, {})


def _bytes(results) -> int:
    sizes = results["config"]["state_bytes"]
    return sizes.get("W5", sizes["W1"])  # W5 is W1's state


def _gbps(results, seconds) -> float:
    return _bytes(results) / seconds / 1e9


def _best_dcp(results, op):
    """(tool, median) of DCP's fastest configuration, or (None, None)."""
    found = [(e["median"], tool) for tool, e in results["summary"].get("W5", {})
             .get(op, {}).items() if tool.startswith("dcp") and e.get("median") is not None]
    if not found:
        return None, None
    seconds, tool = min(found)
    return tool, seconds


def _why_missing(results, op, tool) -> str:
    if "W5" in results.get("not_run", {}):
        return f"not run: {results['not_run']['W5']}"
    error = _entry(results, op, tool).get("error")
    return f"not measured ({tool} failed: {error})" if error else "not measured"


def verdicts(results) -> list[dict]:
    if not _ran(results):
        return []
    out = []
    for op in ("save", "load"):
        sk = _entry(results, op, "shardkeep").get("median")
        floor = _entry(results, FLOOR_OP[op], "floor").get("median")
        name = f"W5 (S3) {op} throughput ≥ the floor (boto3 managed transfer)"
        if sk is None or floor is None:
            missing = "shardkeep" if sk is None else "floor"
            out.append(_verdict(name, _why_missing(results, op if sk is None else
                                                   FLOOR_OP[op], missing)))
        else:
            out.append(_verdict(name, f"{floor / sk:.2f}× the floor's throughput "
                                      f"({_gbps(results, sk):.2f} vs {_gbps(results, floor):.2f} "
                                      "GB/s)", sk <= floor))
        tool, dcp = _best_dcp(results, op)
        name = f"W5 (S3) {op} ≥ {DCP_FACTOR}× DCP's throughput (fsspec/s3fs)"
        if sk is None or dcp is None:
            out.append(_verdict(name, _why_missing(results, op, "shardkeep" if sk is None
                                                   else "dcp")))
        else:
            out.append(_verdict(name, f"{dcp / sk:.2f}× ({_gbps(results, sk):.2f} GB/s vs "
                                      f"{tool} {_gbps(results, dcp):.2f} GB/s)",
                                dcp / sk >= DCP_FACTOR))
    return out


def _verdict(target, measured, met=None):
    return {"target": target, "measured": measured, "met": met, "note": ""}


def _cell(results, e) -> str:
    if not e:
        return ""
    if e.get("median") is None:
        return "n/a" if e.get("not_applicable") else "FAILED"
    text = f"{e['median']:.2f} s, {_gbps(results, e['median']):.2f} GB/s"
    if e["n"] > 1:
        text += f" ({e['min']:.2f}–{e['max']:.2f} s)"
    if "peak_rss_kib" in e:
        text += f", peak RSS {e['peak_rss_kib'] / 1024:.0f} MiB"
    if e.get("verified") is False:
        text += " WRONG DATA"
    return text


def _cannot_write(results, prefix, label) -> str | None:
    """"<label>: cannot write to S3 (<error>)" when no configuration of the
    tool saved W5."""
    saves = {t: e for t, e in results["summary"].get("W5", {}).get("save", {}).items()
             if t.startswith(prefix)}
    if not saves or any(e.get("median") is not None for e in saves.values()):
        return None
    return f"{label}: cannot write to S3 ({next(iter(saves.values())).get('error')})"


def section(results) -> list[str]:
    if not _ran(results):
        return []
    out = ["", "## W5: training state on an S3 server", ""]
    if "W5" in results.get("not_run", {}):
        return out + [f"Not run: {results['not_run']['W5']}"]
    s3 = results.get("s3", {})
    out += [f"W1's state ({_bytes(results) / 1e9:.2f} GB) saved to and loaded from "
            f"{s3.get('server', 'an S3 server')}, data on {s3.get('data_filesystem', '?')}; "
            "credentials by the AWS environment variables, signatures checked. Floor: "
            "boto3's managed transfer (upload_fileobj / download_fileobj from and to memory, "
            "one object per device's shard group, 8 requests in flight, 64 MiB parts). DCP: "
            "FsspecWriter / FsspecReader through s3fs. A load reads the objects as the "
            "server holds them.", ""]
    ops = results["summary"].get("W5", {})
    tools = [t for t in results["config"]["tools"]
             if any(t in ops.get(op, {}) for op in ("save", "load"))]
    columns = ["floor (boto3)"] + tools + ["shardkeep ÷ floor throughput",
                                          "shardkeep ÷ DCP best throughput"]
    out += ["| op | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
    for op in ("save", "load"):
        floor = ops.get(FLOOR_OP[op], {}).get("floor", {})
        row = [op, f"{FLOOR_OP[op]}: {_cell(results, floor)}" if floor else ""]
        row += [_cell(results, ops.get(op, {}).get(t)) for t in tools]
        sk = ops.get(op, {}).get("shardkeep", {}).get("median")
        row.append(f"{floor['median'] / sk:.2f}×" if sk and floor.get("median") else "—")
        _, dcp = _best_dcp(results, op)
        row.append(f"{dcp / sk:.2f}×" if sk and dcp else "—")
        out.append("| " + " | ".join(row) + " |")
    out += ["", "Throughput ratios above 1 mean shardkeep moves the state faster; the goals "
            f"are at least 1 against the floor and at least {DCP_FACTOR} against DCP."]
    notes = [n for n in (_cannot_write(results, "orbax", "Orbax"),
                         _cannot_write(results, "dcp", "DCP through fsspec/s3fs"),
                         _cannot_write(results, "shardkeep", "shardkeep")) if n]
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    return out
