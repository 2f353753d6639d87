"""Chart helpers: plain log-axis labels, legends that never cover the data."""

from __future__ import annotations

from dlscope.report import plots


def tick_labels(fig, axis) -> list[str]:
    fig.canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_log_axis_labels_are_plain_numbers():
    fig, (ax,) = plots.subplots(1)
    ax.plot([1, 16, 64], [1010, 8101, 9743])
    plots.log_axis(ax, "x", [1, 16, 64])
    plots.log_axis(ax, "y")
    assert tick_labels(fig, ax.xaxis) == ["1", "16", "64"]
    labels = tick_labels(fig, ax.yaxis)
    assert labels and all(label.replace(",", "").isdigit() for label in labels), labels
    assert not any(t.get_text() for t in ax.yaxis.get_minorticklabels())  # no 6×10⁰ between them


def test_log_axis_over_many_decades_labels_only_powers_of_ten():
    fig, (ax,) = plots.subplots(1)
    ax.barh(["loops", "numpy", "torch"], [0.002, 0.3, 40.0])
    plots.log_axis(ax, "x")
    labels = tick_labels(fig, ax.xaxis)
    assert labels and all(label.lstrip("0.").rstrip("0") in ("1", "") for label in labels), labels


def test_legend_outside_covers_no_bar():
    fig, (ax,) = plots.subplots(1)
    for i, name in enumerate(("data", "compute", "optimizer")):
        ax.bar([0, 1, 2], [5, 9, 7], bottom=[10 * i] * 3, label=name)
    plots.legend_outside(ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert not any(legend.overlaps(bar.get_window_extent(renderer)) for bar in ax.patches)
    assert plots.png(fig).startswith(b"\x89PNG")
