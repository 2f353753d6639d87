"""Matplotlib figures as PNG bytes, drawn at report time from results.json data."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

plt.rcParams.update(
    {
        "figure.dpi": 110,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "font.size": 9,
    }
)


def png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", bbox_inches="tight")  # "tight": legends placed outside the axes are kept
    plt.close(fig)
    return buf.getvalue()


def subplots(ncols: int = 1, width: float = 4.2, height: float = 3.0):
    """A figure and its `ncols` axes side by side: `fig, (ax,) = subplots(1)`."""
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def plain(value: float, _position: object = None) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def log_axis(ax: plt.Axes, which: str = "x", ticks: Sequence[float] | None = None) -> None:
    """A log axis labelled with plain numbers — 1, 16, 64 or 1, 2, 5, 10 — never 4×10¹ or 6×10⁰.
    `ticks`: exactly these (the batch sizes measured); otherwise 1-2-5 steps of each decade, or
    only the powers of ten when the data (plotted before this call) spans more than three decades."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    ax.set_xscale("log") if which == "x" else ax.set_yscale("log")
    low, high = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    subs = (1.0, 2.0, 5.0) if high <= 1000 * low else (1.0,)
    axis.set_major_locator(FixedLocator(list(ticks)) if ticks else LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(plain))
    axis.set_minor_formatter(NullFormatter())


def legend_outside(ax: plt.Axes, **kwargs: object) -> None:
    """The legend to the right of the axes, where it can never cover a bar or a point."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)
