"""The one figure writer of the plots the commands draw (eval's extrapolation plot, results, scaling, the
reproduction's ladders, the quickstart): matplotlib on the Agg backend, each figure written whole and closed."""
from __future__ import annotations

from idattn import atomic


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no display): an optional extra, loaded only by what draws."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def subplots(*args, **kw):
    """(figure, axes) of a new figure on the Agg backend: matplotlib.pyplot.subplots(*args, **kw)."""
    return pyplot().subplots(*args, **kw)


def save_figure(fig, path: str, title: str = "", fontsize: int = 9, **kw) -> str:
    """Writes `fig` to `path` whole (idattn.atomic), laid out tight (below the figure title `title`, when given), and
    closes it."""
    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    atomic.savefig(fig, path, **kw)
    pyplot().close(fig)
    return path
