"""Matplotlib figures as PNG bytes, drawn at report time from results.json data."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def subplots(ncols: int = 1, width: float = 4.2, height: float = 3.0):
    return plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
