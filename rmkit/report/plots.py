"""The report's figures as PNG bytes (matplotlib, the `plots` extra; None without it): accuracy per subset
with 95% intervals, reward histograms, the reliability diagram and length bias."""

from __future__ import annotations

import io

import numpy as np

from rmkit.plotting import pyplot
from rmkit.report.scoring import ModelScores


def _png(fig, plt) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def accuracy_by_subset(report: dict) -> bytes | None:
    """Grouped bars: each model's accuracy per subset, Wilson 95% intervals as error bars, and the
    "longer response wins" baseline as black ticks."""
    plt = pyplot()
    if plt is None:
        return None
    models = report["models"]
    subsets = list(next(iter(models.values()))["subsets"])
    x, width = np.arange(len(subsets)), 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(subsets) * max(1, len(models) ** 0.5) + 2), 4.2))
    for k, (name, entry) in enumerate(models.items()):
        stats = [entry["subsets"][s] for s in subsets]
        acc = np.array([s["accuracy"] for s in stats])
        lo, hi = np.array([s["ci95"][0] for s in stats]), np.array([s["ci95"][1] for s in stats])
        ax.bar(x + (k - (len(models) - 1) / 2) * width, acc, width, yerr=[acc - lo, hi - acc], capsize=2, label=name)
    longer = [next(iter(models.values()))["subsets"][s]["longer_wins_accuracy"] for s in subsets]
    ax.scatter(x, longer, marker="_", s=300, color="black", zorder=3, label="longer wins")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xticks(x, subsets, rotation=45 if len(subsets) > 3 else 0, ha="right" if len(subsets) > 3 else "center")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title("accuracy per subset (95% Wilson intervals)")
    # outside the axes: inside, it covers the bars and the "longer wins" ticks of the first subsets
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig, plt)


def reward_histograms(models: list[ModelScores]) -> bytes | None:
    """One panel per model: histograms of its chosen and rejected rewards."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, scores in zip(axes[0], models):
        both = np.concatenate([scores.chosen, scores.rejected])
        bins = np.linspace(both.min(), both.max() + 1e-9, 31)
        ax.hist(scores.chosen, bins=bins, alpha=0.6, label="chosen")
        ax.hist(scores.rejected, bins=bins, alpha=0.6, label="rejected")
        ax.set_title(f"{scores.name}: rewards")
        ax.set_xlabel("reward")
        ax.legend()
    return _png(fig, plt)


def reliability_diagram(report: dict) -> bytes | None:
    """Accuracy against confidence `sigmoid(|r_chosen - r_rejected|)` per bin, one line per model."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5, 4.2))
    ax.plot([0.5, 1], [0.5, 1], color="grey", ls="--", lw=0.8, label="calibrated")
    for name, entry in report["models"].items():
        bins = [b for b in entry["calibration"]["bins"] if b["n"]]
        ece = entry["calibration"]["ece"]
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o",
                label=f"{name} (ECE {ece:.3f})")
    ax.set_xlabel("confidence sigmoid(|r_chosen - r_rejected|)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0.48, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("reliability diagram")
    ax.legend(fontsize=8)
    return _png(fig, plt)


def length_bias(report: dict) -> bytes | None:
    """Left: each subset's accuracy against the "longer wins" accuracy. Right: accuracy when the chosen
    response is the longer or the shorter one."""
    plt = pyplot()
    if plt is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot([0, 1], [0, 1], color="grey", ls="--", lw=0.8)
    for k, (name, entry) in enumerate(report["models"].items()):
        stats = entry["subsets"]
        x, y = [s["longer_wins_accuracy"] for s in stats.values()], [s["accuracy"] for s in stats.values()]
        left.scatter(x, y, label=name)
        if k == 0 and len(stats) <= 12:  # name the subsets while the plot stays readable
            for subset, xi, yi in zip(stats, x, y):
                left.annotate(subset, (xi, yi), textcoords="offset points", xytext=(5, 4), fontsize=7)
    left.set_xlabel("longer response wins: accuracy")
    left.set_ylabel("model accuracy")
    left.set_xlim(-0.02, 1.02)
    left.set_ylim(-0.02, 1.02)
    left.set_title("per subset")
    left.legend(fontsize=8)
    groups = ("chosen_longer", "chosen_shorter")
    names = list(report["models"])
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        bias = report["models"][name]["length_bias"]
        values = [bias[g]["accuracy"] if bias[g]["accuracy"] is not None else 0.0 for g in groups]
        right.bar(np.arange(2) + (k - (len(names) - 1) / 2) * width, values, width, label=name)
    counts = next(iter(report["models"].values()))["length_bias"]
    right.set_xticks(np.arange(2), [f"chosen longer (n={counts['chosen_longer']['n']})",
                                    f"chosen shorter (n={counts['chosen_shorter']['n']})"])
    right.axhline(0.5, color="grey", lw=0.8, ls="--")
    right.set_ylim(0, 1.05)
    right.set_ylabel("accuracy")
    right.set_title("accuracy by which response is longer")
    right.legend(fontsize=8)
    return _png(fig, plt)
