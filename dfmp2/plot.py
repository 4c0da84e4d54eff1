"""``--plot``: the pair-energy matrix of a run as a picture (matplotlib, an optional extra:
``pip install 'dfmp2[plot]'``).

One panel per spin block (closed shell: one; open shell: alpha-alpha, beta-beta, alpha-beta)
shows the MP2 pair energies eps_ij = E_OS(ij) + E_SS(ij) in mEh, unscaled, over the active
occupied orbitals in energy order (pair i != j of one space: its whole energy, shown at [i, j]
and [j, i]). A counterpoise run adds a panel of the fragments' contributions: the interaction
energy's parts (reference, singles of ROHF, unscaled opposite-spin and same-spin correlation:
the complex's minus the fragments', each in the complex's basis) and its totals per level, in
kcal/mol.
"""

from __future__ import annotations

import os
import shutil

from .errors import InputError

__all__ = ["check_plot_path", "pair_matrix", "plot_pair_energies"]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'dfmp2[plot]'") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path: str) -> None:
    """Before any work: matplotlib is installed, it writes files of the path's type, and the
    file can be created there."""
    from ._files import check_writable_file

    plt = _pyplot()
    if os.path.isdir(path):
        raise InputError(f"plot {path!r} (--plot) is a directory: give a file name, e.g. "
                         f"{os.path.join(path, 'pairs.png')!r}")
    kind = os.path.splitext(path)[1].lstrip(".").lower()
    figure = plt.figure()
    try:
        types = figure.canvas.get_supported_filetypes()
    finally:
        plt.close(figure)
    if kind not in types:
        raise InputError(f"plot {path!r} (--plot): matplotlib cannot write a {kind or 'nameless'} "
                         f"file; use one of .{', .'.join(sorted(types))}")
    if kind == "pgf":  # matplotlib lays out a PGF picture's text with LaTeX
        import matplotlib

        tex = matplotlib.rcParams["pgf.texsystem"]
        if shutil.which(tex) is None:
            raise InputError(f"plot {path!r} (--plot): a .pgf picture needs LaTeX ({tex}), "
                             "which is not on PATH; use .pdf, .svg or .png")
    check_writable_file(path, "plot")


def pair_matrix(block: dict):
    """The pair energies of one block (``Result.pair_energies['blocks'][name]``) as a numpy
    matrix in Eh: eps_ij = E_OS + E_SS of pair (i, j); within one space the ordered halves
    are added (eps_ij = M_ij + M_ji off the diagonal), so the upper triangle sums to the
    block's energy."""
    import numpy as np

    total = np.asarray(block["os"]) + np.asarray(block["ss"])
    if block["spaces"][0] == block["spaces"][1]:
        total = total + total.T - np.diag(np.diag(total))
    return total


def plot_pair_energies(result, path: str) -> None:
    """Draw ``result``'s pair energies (it must have them: ``pair_energies=True``) to
    ``path``."""
    import numpy as np

    if result.pair_energies is None:
        raise InputError("the result has no pair energies: run with pair_energies=True")
    check_plot_path(path)  # what the command checks before any work, here before drawing
    plt = _pyplot()
    blocks = result.pair_energies["blocks"]
    inter = result.interaction
    panels = len(blocks) + (inter is not None)
    figure, axes = plt.subplots(1, max(panels, 1), figsize=(4.8 * max(panels, 1), 4.2),
                                squeeze=False)
    axes = list(axes[0])
    for ax, (name, block) in zip(axes, blocks.items()):
        matrix = pair_matrix(block) * 1000.0
        image = ax.imshow(matrix, cmap="viridis_r", origin="upper")
        figure.colorbar(image, ax=ax, label="pair energy (mEh)")
        rows, cols = matrix.shape
        same_space = block["spaces"][0] == block["spaces"][1]
        total = np.triu(matrix).sum() if same_space else matrix.sum()
        ax.set_title(f"{name}: sum {total:.3f} mEh")
        ax.set_xlabel("occupied orbital j (active, by energy)")
        ax.set_ylabel("occupied orbital i")
        _ticks(ax, rows, cols)
    if not blocks and inter is None:  # no active pair (no virtual or occupied orbital)
        axes[0].axis("off")
        axes[0].text(0.5, 0.5, result.method.note or "no active electron pairs: E(corr) = 0",
                     ha="center", va="center", wrap=True)
    if inter is not None:
        _interaction_panel(axes[-1], inter, result.scf.kind.upper())
    figure.suptitle(f"{result.molecule.formula}: MP2 pair energies (unscaled, "
                    f"{result.scf.kind.upper()} orbitals)")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=150)
    except OSError as exc:
        raise InputError(f"cannot write the plot to {path!r}: {exc.strerror}") from None
    except Exception as exc:  # a backend's own failure (a tool it runs): one line, not lost
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"cannot draw the plot to {path!r}: {first}") from None
    finally:
        plt.close(figure)


def _interaction_panel(ax, inter: dict, reference: str) -> None:
    """Bars: the counterpoise-corrected interaction energy's parts and totals (kcal/mol)."""
    parts = inter["components"]
    singles = abs(parts["singles"]["eh"]) > 0.0
    names = [reference, *(["singles"] if singles else []), "OS corr. (unscaled)",
             "SS corr. (unscaled)"] + list(inter["levels"].values())[1:]
    values = [parts["reference"]["kcal_mol"], *([parts["singles"]["kcal_mol"]] if singles else []),
              parts["os"]["kcal_mol"], parts["ss"]["kcal_mol"]]
    values += [inter[level]["kcal_mol"] for level in list(inter["levels"])[1:]]
    colours = (["#7f7f7f"] + (["#9467bd"] if singles else []) + ["#1f77b4", "#ff7f0e"]
               + ["#2ca02c"] * (len(names) - 3 - singles))
    ax.bar(range(len(names)), values, color=colours)
    ax.axhline(0.0, color="black", linewidth=0.8)
    for k, value in enumerate(values):
        ax.text(k, value, f"{value:.3f}", ha="center", va="bottom" if value >= 0 else "top",
                fontsize=9)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("kcal/mol")
    ax.set_title(f"interaction energy, {len(inter['fragments'])} fragments (CP-corrected)")


def _ticks(ax, rows: int, cols: int) -> None:
    """Orbital numbers 1..n on both axes (every k-th when there are many)."""
    for count, setter in ((cols, ax.set_xticks), (rows, ax.set_yticks)):
        step = max(1, count // 12)
        positions = list(range(0, count, step))
        setter(positions, [str(k + 1) for k in positions])
