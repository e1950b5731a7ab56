"""Figure styles: sizes for a paper's columns, fonts a publisher accepts, colours and markers
every reader can tell apart.

- ``default``: 6.4 × 4.2 in, the legend beside the axes (screens, the report).
- ``single-column``: 3.5 in wide (one column of a two-column paper: ACM, IEEE, Springer LNCS
  text width is 3.3–3.5 in), 8 pt text, the legend under the axes.
- ``double-column``: 7.0 in wide (the full text width), 8 pt text, the legend under the axes.

The column styles are saved at exactly their width (constrained layout, no tight bounding
box), so ``\\includegraphics`` at 1.0 of the column keeps the 8 pt text at 8 pt.
Every PDF embeds its fonts as TrueType (``pdf.fonttype`` 42: no Type 3 bitmaps, text stays
text). Series are told apart three ways: the Okabe–Ito palette (safe for the common colour
vision deficiencies), a marker per series and a line style per series (so a greyscale print
still separates them).
"""

from __future__ import annotations

from contextlib import contextmanager

from scalestudy.record.terms import TERM_LABELS

STYLES = {
    "default": {"size": (6.4, 4.2), "font": 10.0, "legend": "right"},
    "single-column": {"size": (3.5, 2.9), "font": 8.0, "legend": "below"},
    "double-column": {"size": (7.0, 3.2), "font": 8.0, "legend": "below"},
}
#: Okabe & Ito (2008), "Color Universal Design": distinguishable with any common colour vision
#: deficiency. Black is last: it is also the colour of references and ideal lines.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000"]
#: One marker and one line style per series (cycled): greyscale keeps them apart.
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (1, 1)),
              (0, (3, 1, 1, 1))]


def checked(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"figure style {style!r}: use one of {', '.join(STYLES)}")
    return style


def series_styles(names) -> dict:
    """``{series: {"color", "marker", "linestyle"}}`` in first-seen order."""
    names = list(dict.fromkeys(names))
    return {s: {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)],
                "linestyle": LINESTYLES[i % len(LINESTYLES)]} for i, s in enumerate(names)}


def rc(style: str = "default") -> dict:
    """The matplotlib settings of a style (fonts embedded as TrueType in every case)."""
    s = STYLES[checked(style)]
    out = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none",
           "axes.prop_cycle": __import__("cycler").cycler(color=PALETTE)}
    if style != "default":
        f = s["font"]
        out.update({"font.size": f, "axes.titlesize": f, "axes.labelsize": f,
                    "xtick.labelsize": f - 1, "ytick.labelsize": f - 1, "legend.fontsize": f - 1,
                    "lines.linewidth": 1.2, "lines.markersize": 4.5, "savefig.dpi": 300})
    return out


@contextmanager
def applied(style: str = "default"):
    """Apply a style's settings for the figures drawn inside the block."""
    import matplotlib.pyplot as plt

    with plt.rc_context(rc(style)):
        yield


def new_figure(style: str = "default"):
    """``(fig, ax)`` of the style's size (column styles: constrained layout, exact width)."""
    import matplotlib.pyplot as plt

    s = STYLES[checked(style)]
    if style == "default":
        return plt.subplots(figsize=s["size"])
    return plt.subplots(figsize=s["size"], layout="constrained")


def legend(fig, ax, style: str = "default") -> None:
    """The legend beside the axes (default) or under them (column styles)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if STYLES[checked(style)]["legend"] == "right":
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    else:
        ncol = 2 if style == "single-column" else 3
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


def save_kwargs(style: str, ext: str) -> dict:
    """``savefig`` arguments: the default style crops to its content, column styles keep
    their exact width."""
    if style == "default":
        return {"dpi": 150 if ext == "png" else None, "bbox_inches": "tight"}
    return {"dpi": 300 if ext == "png" else None}


def save(fig, paths, style: str = "default") -> list:
    """Write ``fig`` to each of ``paths`` (one path or several; the format from each suffix)
    atomically, with the style's save options, then close it. Returns the paths."""
    import matplotlib.pyplot as plt

    from scalestudy.record.io import atomic_path

    paths = [paths] if isinstance(paths, (str, bytes)) or hasattr(paths, "suffix") else list(paths)
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, **save_kwargs(style, str(path).rsplit(".", 1)[-1]))
    plt.close(fig)
    return paths


def term_styles() -> dict:
    """``{term: {"color", "hatch"}}``: one Okabe–Ito colour per step term
    (``record.terms.TERM_LABELS``), the same in every figure; past the palette's length the
    colours repeat with a hatch, so no two terms look alike."""
    return {k: {"color": PALETTE[i % len(PALETTE)], "hatch": "" if i < len(PALETTE) else "//"}
            for i, k in enumerate(TERM_LABELS)}
