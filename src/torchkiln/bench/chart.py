"""The chart of a zoo comparison (`python -m torchkiln bench --zoo --png FILE`): median latency per case and peer,
bars on a log axis, with matplotlib (the `bench` extra).

Each peer has a colour of its own, the same in every chart (`peer_colours`); the legend sits right of the plot and
the title above it, with constrained layout, so neither covers the other or the bars; the log axis labels 1, 2 and 5
of each decade (1 only over many decades) and leaves minor ticks unlabelled.
"""
from __future__ import annotations

import colorsys
import logging
import math
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("torchkiln.bench")

# A fixed colour per known peer (bench/peers.py), then colours for other names, in order; all distinct.
PEER_COLOURS = {"eager": "#7f7f7f", "eager+cudagraph": "#1f77b4", "compile": "#ff7f0e", "compile-ro": "#2ca02c",
                "compile-ro-freeze": "#9467bd", "torchkiln": "#d62728", "torchkiln-warm": "#ff9896",
                "ort-direct": "#8c564b", "torchkiln-session": "#e377c2"}
SPARE_COLOURS = ("#17becf", "#bcbd22", "#aec7e8", "#98df8a", "#ffbb78", "#c5b0d5",
                 "#c49c94", "#dbdb8d", "#9edae5", "#393b79")
MAX_DECADES_FOR_1_2_5 = 4  # a log axis spanning more decades labels only the powers of ten


def peer_colours(peers: Sequence[str]) -> dict[str, str]:
    """A distinct colour for each of `peers`: a known peer's own, then the spare colours, then evenly spaced hues."""
    colours = {p: PEER_COLOURS[p] for p in peers if p in PEER_COLOURS}
    spare = [c for c in SPARE_COLOURS if c not in colours.values()]
    others = [p for p in dict.fromkeys(peers) if p not in colours]
    for k, peer in enumerate(others):
        if k < len(spare):
            colours[peer] = spare[k]
            continue
        hue = 0.05 + (k - len(spare)) / max(len(others) - len(spare), 1)  # darker than the fixed colours
        colour = "#{:02x}{:02x}{:02x}".format(*(round(255 * v) for v in colorsys.hsv_to_rgb(hue % 1, 0.7, 0.55)))
        while colour in colours.values():  # never twice, even where a hue lands on a fixed colour
            colour = f"#{(int(colour[1:], 16) + 1) % 0x1000000:06x}"
        colours[peer] = colour
    return colours


def latency_chart(result: dict[str, Any]) -> Any:
    """The matplotlib Figure of a zoo result (compare.run_comparison or merge_results): one group of bars per case,
    one bar per peer that ran it (a failed peer keeps its legend entry)."""
    import matplotlib.ticker as ticker
    from matplotlib.figure import Figure

    cases = [c for c in result["cases"] if "skipped" not in c]
    peers = result["config"]["peers"]
    colours = peer_colours(peers)
    group = 0.8  # the width of one case's bars
    width = min(max(6.0, 1.5 + len(cases) * (0.2 * len(peers) + 0.5)), 24.0)
    fig = Figure(figsize=(width, 4.8), layout="constrained")  # no pyplot: the caller's backend and figures untouched
    ax = fig.add_subplot()
    step = group / max(len(peers), 1)
    times = []
    for i, peer in enumerate(peers):
        ok = [(k, c["peers"][peer]["ms"]) for k, c in enumerate(cases)
              if c["peers"].get(peer, {}).get("status") == "ok"]
        times += [ms for _, ms in ok]
        ax.bar([k - group / 2 + (i + 0.5) * step for k, _ in ok], [ms for _, ms in ok], width=step, label=peer,
               color=colours[peer])
    ax.set_xticks(range(len(cases)))
    crowded = width >= 24.0 and len(cases) > 12
    ax.set_xticklabels([f"{c['model']}\nbatch {c['batch']}" for c in cases], fontsize=8,
                       rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_yscale("log")
    decades = math.log10(max(times) / min(times)) if times else 0.0
    subs = (1.0,) if decades > MAX_DECADES_FOR_1_2_5 else (1.0, 2.0, 5.0)
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.set_ylabel("median latency, ms (log scale)")
    ax.set_title(f"torchkiln and peers, {result['config']['precision']} on "
                 f"{result['environment'].get('gpu', result['config']['device'])}")
    ax.legend(title="peer", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def write_png(result: dict[str, Any], path: str) -> bool:
    """The latency chart (latency_chart) as a PNG at `path`; False (with a warning) without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'torchkiln[bench]'); no chart written to %s", path)
        return False
    latency_chart(result).savefig(path, dpi=120, bbox_inches="tight")
    return True
