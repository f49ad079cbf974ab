"""GFLOP/s vs size, one line per kernel variant, the vendor library as the reference line.

The only module that imports matplotlib (with the non-interactive Agg backend, so it works
on machines without a display). One panel per backend; a kernel keeps its colour across
block sizes, which differ by line style, so "same rung, other block" reads at a glance.
"""

from __future__ import annotations

from pathlib import Path

from tilegemm.bench.results import Results
from tilegemm.bench.timing import OK, Measurement
from tilegemm.errors import InvalidValueError

STYLES = ("-", "--", ":", "-.")


def check_plot_path(path: str | Path) -> None:
    """Refuse a plot file name whose extension matplotlib cannot write, before a benchmark
    runs (saving is the last step; a refusal then would waste the run and lose the plot).

    The formats are matplotlib's own list, read without loading a plotting backend. Without
    matplotlib nothing is checked here: drawing then fails with the missing package's
    error, as it always did.
    """
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        what = f"'.{suffix}' is not an image format matplotlib writes" if suffix else \
            "the name has no extension to tell the image format"
        raise InvalidValueError(f"--plot {path}: {what}; use one of "
                                f"{', '.join('.' + f for f in sorted(formats))} (e.g. .png)")


def plot_sizes(results: Results, path: str | Path) -> Path:
    """Write the size sweep of ``results`` at ``path`` (the format from its extension:
    PNG, SVG, PDF...); return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = results.backends("sizes")
    if not backends:
        raise InvalidValueError("these results have no size sweep to plot (run the 'sizes' report)")
    fig, axes = plt.subplots(1, len(backends), figsize=(10.0 * len(backends), 5.5),
                             squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, be in zip(axes[0], backends):
        ms = results.for_report("sizes", be)
        variants: dict[str, list[Measurement]] = {}
        for m in sorted(ms, key=lambda m: (m.vendor, m.rung or 0, m.kernel, m.m)):
            variants.setdefault(m.variant, []).append(m)
        kernels = list(dict.fromkeys(m.kernel for m in ms if not m.vendor))
        style_of: dict[str, int] = {}
        for name, runs in variants.items():
            pts = [(m.m, m.gflops) for m in runs if m.status == OK and m.gflops]
            if not pts:
                continue
            xs, ys = zip(*pts)
            first = runs[0]
            if first.vendor:
                ax.plot(xs, ys, color="black", linestyle="--", linewidth=2.5, marker="s",
                        markersize=4, label=f"{first.kernel} (vendor)", zorder=5)
                continue
            k = first.kernel
            style = style_of.setdefault(k, 0)
            style_of[k] += 1
            ax.plot(xs, ys, color=cmap(kernels.index(k) % 10), linestyle=STYLES[style % 4],
                    marker="o", markersize=3.5, linewidth=1.6, label=name)
        sizes = sorted({m.m for m in ms})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes], fontsize=8)
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("GFLOP/s (median)")
        device = results.meta.get("backends", {}).get(be, {}).get("device", "")
        ax.set_title(f"{be}: {device}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        # The legend sits beside the panel, never on top of a line.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, frameon=False)
    fig.suptitle(title(results), fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # keeps the legends beside the panels
    plt.close(fig)
    return out


def title(results: Results) -> str:
    """The figure's title: dtype, the commit (short, with "-dirty" kept: a plot of
    uncommitted code must say so, as the results file does) and when it ran."""
    dtype = results.meta.get("settings", {}).get("dtype", "")
    commit = str(results.meta.get("git_commit", ""))
    commit = commit[:12] + (commit[40:] if len(commit) > 40 else "")
    return f"tilegemm ladder, {dtype} (commit {commit}, {results.meta.get('created', '')})"
