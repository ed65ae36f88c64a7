"""Draws the suite's side-by-side results as one PNG chart per workload.

Each chart is a horizontal grouped bar chart: one group per op (save,
load_cold, stall, ...), one bar per tool, the median in seconds on a log
axis (tools differ by orders of magnitude), min–max whiskers when there were
repetitions, and the machine's floor for that op as a dashed line across
the group, so a reader sees both "who is fastest" and "how far from the
hardware" at a glance. Run alone to re-draw:

    python bench/charts.py RESULTS_JSON [OUT_DIR]     # OUT_DIR: the json's folder
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only: no display on the benchmark machines
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

HEADLINE = "chart-W1.png"  # the chart bench/README.md shows

MIB = 1 << 20
# The order of ops in the charts and in RESULTS.md's tables (report.py).
OP_ORDER = ["save", "async_save", "load", "load_cold", "load_warm", "reshard_cold",
            "reshard_warm", "reload_warm", "save_tiny", "stall", "stall_small"]
SKIPPED_OPS = {"save_tiny"}  # a per-save fixed cost in ms: it would squash the axis
# These move W1's state (as report.py and report_w5.py count them): no size of their own.
SAME_STATE_AS = {"W3": "W1", "W4": "W1", "W5": "W1", "W10": "W1"}
# One colour per family, the same in every chart; shardkeep alone is saturated
# so that it stands out, its variants are lighter reds.
FAMILY_COLOURS = [("shardkeep-baseline", "#a6a6a6"), ("shardkeep-", "#e8928c"),
                  ("shardkeep", "#c62828"), ("orbax", "#7f9cc0"), ("dcp", "#d9b27c"),
                  ("safetensors", "#93bf93")]
OTHER_COLOUR = "#b9a8cc"
# A variant within a family is told apart by hatching, which (unlike a shade
# picked by position) stays the same whichever tools a run measured.
VARIANT_HATCH = {"-tuned": "///", "-nocompress": "...", "-zstd": "xxx"}
ROW_IN = 0.2     # inches per bar
GAP_ROWS = 1.2   # space between groups, in bars: room for the floor's label
WIDTH_IN, DPI = 10.0, 110
RIGHT_IN, LABEL_IN = 0.25, 1.3


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _style(tool: str) -> tuple[str, str | None]:
    colour = next((c for prefix, c in FAMILY_COLOURS if tool.startswith(prefix)), OTHER_COLOUR)
    # An unknown variant of a peer ("orbax-foo") still looks unlike its base.
    other = "\\\\\\" if "-" in tool and not tool.startswith("shardkeep") else None
    return colour, next((h for end, h in VARIANT_HATCH.items() if tool.endswith(end)), other)


def _tools(results: dict, ops: dict) -> list[str]:
    """Every non-floor tool of this workload: shardkeep first, then the
    config's order, then any the config does not list."""
    seen = {t for per_tool in ops.values() for t in per_tool} - {"floor"}
    order = ["shardkeep"] + list(results["config"]["tools"]) + sorted(seen)
    return [t for i, t in enumerate(order) if t in seen and t not in order[:i]]


def _state_mib(results: dict, workload: str) -> float | None:
    sizes = results["config"].get("state_bytes", {})
    size = sizes.get(workload, sizes.get(SAME_STATE_AS.get(workload, "")))
    return None if size is None else size / MIB


def _draw_one(results: dict, workload: str, floor_for: dict[tuple[str, str], str],
              path: str) -> bool:
    ops = results["summary"][workload]
    tools = _tools(results, ops)
    names = [o for o in OP_ORDER if o in ops] + [o for o in ops if o not in OP_ORDER]
    names = [o for o in names if o not in SKIPPED_OPS and set(ops[o]) - {"floor"}]
    missing: list[str] = []
    groups = []  # (op, [(tool, entry)], floor op or None, floor entry or None)
    for op in names:
        bars = []
        for tool, e in [(t, ops[op][t]) for t in tools if t in ops[op]]:
            if e.get("median") is None:
                missing.append(f"{tool} {op} ({'n/a' if e.get('not_applicable') else 'failed'})")
            else:
                bars.append((tool, e))
        floor_op = floor_for.get((workload, op))
        floor_e = ops.get(floor_op, {}).get("floor") if floor_op else None
        if floor_e is not None and floor_e.get("median") is None:
            missing.append(f"floor {floor_op} (failed)")
            floor_e = None
        if bars:  # a group of failed cells alone is the footnote's
            groups.append((op, bars, floor_op, floor_e))
    cells = [e for _, bars, _, fe in groups for e in [b for _, b in bars] + [fe] if e]
    values = [v for e in cells for v in (e.get("min") or e["median"], e.get("max") or e["median"])]
    if not values:
        return False
    rows = sum(len(bars) for _, bars, _, _ in groups) + GAP_ROWS * len(groups)
    notes = textwrap.wrap("Not shown (no median): " + "; ".join(missing), 150) if missing else []
    top_in, bottom_in, left_in = 0.75, 0.95 + 0.17 * len(notes), 1.2
    height = top_in + rows * ROW_IN + bottom_in
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height), dpi=DPI)
    fig.subplots_adjust(left=left_in / WIDTH_IN, right=1 - RIGHT_IN / WIDTH_IN,
                        top=1 - top_in / height, bottom=bottom_in / height)
    # Bars start at the axis' left edge: a log axis has no zero.
    lo = 10 ** math.floor(math.log10(min(values) / 1.5))
    # Right of the longest bar, LABEL_IN inches for its value or floor label.
    axes_in = WIDTH_IN - left_in - RIGHT_IN
    hi = lo * (max(values) / lo) ** (axes_in / (axes_in - LABEL_IN))
    y, ticks = GAP_ROWS, []
    for op, bars, floor_op, floor_e in groups:
        first = y
        for tool, e in bars:
            m = e["median"]
            colour, hatch = _style(tool)
            ax.barh(y, m - lo, left=lo, height=0.8, color=colour, hatch=hatch,
                    edgecolor="white" if hatch else colour, linewidth=0)
            right = m
            if e.get("n", 1) > 1 and e.get("min") is not None and e.get("max") is not None:
                ax.errorbar(m, y, xerr=[[m - e["min"]], [e["max"] - m]], fmt="none",
                            ecolor="#333333", elinewidth=0.8, capsize=2)
                right = e["max"]
            label = _fmt_s(m) + (" WRONG DATA" if e.get("verified") is False else "")
            # On a white box and above the floor line, which may cross it.
            ax.text(right * 1.06, y, label, va="center", fontsize=7.5, zorder=4,
                    fontweight="bold" if tool == "shardkeep" else "normal",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
            y += 1
        if floor_e:
            x = floor_e["median"]
            ax.vlines(x, first - 0.6, y - 0.4, colors="black", linestyles="--", linewidth=1.1)
            # In the gap above the group, where no bar or value label can be.
            ax.text(x * 1.03, first - 0.65, f"floor: {floor_op} {_fmt_s(x)}", fontsize=7,
                    va="bottom", ha="left", style="italic")
        ticks.append((op, (first + y - 1) / 2))
        y += GAP_ROWS
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(y - GAP_ROWS + 0.4, 0)  # top to bottom, in the order of the groups
    ax.set_yticks([t for _, t in ticks], [op for op, _ in ticks], fontsize=9)
    ax.tick_params(axis="y", length=0)
    # "10 ms", "1 s" read faster than "10^-2", "10^0".
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _: f"{x * 1000:g} ms" if x < 1 else f"{x:g} s"))
    ax.xaxis.set_minor_formatter(NullFormatter())  # else "2×10⁻¹" beside "100 ms"
    ax.set_xlabel("seconds (log scale; less is better)", fontsize=9)
    ax.grid(axis="x", which="major", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    mib = _state_mib(results, workload)
    size = "" if mib is None else f", {mib:,.{1 if mib < 10 else 0}f} MiB state"
    fig.suptitle(f"{workload}{size}, scale {results['config'].get('scale', '?')}",
                 x=left_in / WIDTH_IN, y=1 - 0.12 / height, ha="left", fontsize=12,
                 fontweight="bold")
    legend = ["bars: median"]
    legend += ["whiskers: min–max over the repetitions"] if any(
        e.get("n", 1) > 1 for _, bars, _, _ in groups for _, e in bars) else []
    legend += ["dashed: the machine's floor for the same bytes"] if any(
        fe for _, _, _, fe in groups) else []
    fig.text(left_in / WIDTH_IN, 1 - 0.42 / height, "; ".join(legend), fontsize=8,
             color="#444444")
    drawn = {t for _, bars, _, _ in groups for t, _ in bars}
    handles = [Patch(facecolor=_style(t)[0], hatch=_style(t)[1], edgecolor="white",
                     label=t) for t in tools if t in drawn]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, (0.05 + 0.17 * len(notes)) / height))
    if notes:
        fig.text(left_in / WIDTH_IN, 0.06 / height, "\n".join(notes), fontsize=7,
                 color="#8b0000", va="bottom")
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return True


def draw(results: dict, out_dir: str, floor_for: dict[tuple[str, str], str]) -> list[str]:
    """Writes out_dir/chart-<workload>.png for each workload with results;
    returns the names written, sorted."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for workload in results.get("summary", {}):
        name = f"chart-{workload}.png"
        if _draw_one(results, workload, floor_for, os.path.join(out_dir, name)):
            written.append(name)
    return sorted(written)


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:  # report.py and its siblings, when imported from elsewhere
        sys.path.insert(0, here)
    import report  # lazily: draw() itself needs none of report's imports

    with open(argv[0]) as f:
        results = json.load(f)
    out_dir = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(argv[0]))
    for name in draw(results, out_dir, report.FLOOR_FOR):
        print(os.path.join(out_dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
