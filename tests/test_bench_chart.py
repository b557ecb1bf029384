"""bench/chart.py: the chart of `python -m torchkiln bench --zoo --png`, drawn from a made-up result (no models run):
every peer in a colour of its own, the title, legend, bars and axis labels clear of each other."""
import itertools

import pytest

from torchkiln.bench.chart import PEER_COLOURS, latency_chart, peer_colours, write_png
from torchkiln.bench.peers import PEERS


def _result(peers, cases, low=0.05, high=60.0):
    """A zoo result of `cases` (model, batch) pairs, each peer's latency spread over [low, high] ms; the third peer
    failed on the last model, and one case was skipped."""
    span = len(peers) * len(cases)
    rows = []
    for k, (model, batch) in enumerate(cases):
        rows.append({"model": model, "batch": batch, "peers": {
            p: {"peer": p, "status": "failed", "reason": "RuntimeError: boom"} if (i, k) == (2, len(cases) - 1)
            else {"peer": p, "status": "ok", "ms": low * (high / low) ** (((7 * i + 3 * k) % span) / (span - 1))}
            for i, p in enumerate(peers)}})
    rows.append({"model": "missing", "batch": 1, "skipped": "ValueError: no model 'missing'", "peers": {}})
    return {"config": {"peers": list(peers), "precision": "float16", "device": "cuda"},
            "environment": {"gpu": "NVIDIA H100 80GB HBM3"}, "cases": rows}


ZOO_CASES = [(m, b) for m in ("resnet50", "mobilenet_v2", "vit_b_16", "bert-base") for b in (1, 32)]


def test_every_peer_gets_a_distinct_colour():
    assert set(PEER_COLOURS) == set(PEERS) and len(set(PEER_COLOURS.values())) == len(PEERS)
    many = [*PEERS, *(f"peer{i}" for i in range(40))]
    for peers in (list(PEERS), many, many[::-1], ["torchkiln", "x", "eager"]):
        colours = peer_colours(peers)
        assert set(colours) == set(peers) and len(set(colours.values())) == len(peers), colours
        assert all(colours[p] == PEER_COLOURS[p] for p in peers if p in PEERS)  # the same in every chart


def _disjoint(boxes):
    return not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("peers, cases, high", [
    (list(PEERS), ZOO_CASES, 60.0),
    (["eager", "torchkiln"], ZOO_CASES[:1], 1.0),
    ([*PEERS, *(f"peer{i}" for i in range(8))], ZOO_CASES * 3, 5e3),  # 15 peers: matplotlib's cycle has 10 colours
], ids=["zoo", "one-case", "crowded"])
def test_chart_parts_do_not_overlap(peers, cases, high):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    result = _result(peers, cases, high=high)
    fig = latency_chart(result)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    [ax] = fig.axes
    legend = ax.get_legend()
    title, legend_box, plot = (x.get_window_extent(renderer) for x in (ax.title, legend, ax))
    assert not title.overlaps(legend_box) and not plot.overlaps(legend_box) and not title.overlaps(plot)
    assert [t.get_text() for t in legend.get_texts()] == peers  # a failed peer keeps its entry
    handles = legend.legend_handles if hasattr(legend, "legend_handles") else legend.legendHandles
    colours = [h.get_facecolor() for h in handles]
    assert len(set(colours)) == len(peers)
    y_labels = [t for t in ax.get_yticklabels(which="both") if t.get_visible() and t.get_text()]
    assert 2 <= len(y_labels) <= 15 and _disjoint([t.get_window_extent(renderer) for t in y_labels])
    x_labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert len(x_labels) == len(cases) and _disjoint([t.get_window_extent(renderer) for t in x_labels])


def test_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "zoo.png"
    assert write_png(_result(list(PEERS), ZOO_CASES), str(path)) is True
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
