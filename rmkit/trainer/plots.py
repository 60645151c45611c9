"""End-of-run PNGs: training curves and validation reward histograms (needs matplotlib; skipped without)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or None with a note when matplotlib is absent."""
    try:
        import matplotlib
    except ImportError:
        print("rmkit: matplotlib is not installed; no plots (pip install 'rmkit[plots]')", file=sys.stderr)
        return None
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_training_curves(history: list[dict], path: Path, metrics: tuple[str, ...] = ("loss", "acc")) -> Path | None:
    """`metrics` (loss and accuracy) over steps: training (`train/*`) and each validation set (`validation-*/*`)."""
    plt = pyplot()
    if plt is None:
        return None
    val_names = sorted({k.split("/")[0] for r in history for k in r if k.startswith("validation-")})
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        ax.plot(*_series(history, f"train/{metric}"), label="train", alpha=0.6)
        for name in val_names:
            ax.plot(*_series(history, f"{name}/{metric}"), marker="o", label=name)
        ax.set_xlabel("step")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_reward_histograms(rewards: dict[str, tuple[torch.Tensor, torch.Tensor]], path: Path) -> Path | None:
    """One panel per validation set: histograms of chosen and rejected rewards."""
    plt = pyplot()
    if plt is None or not rewards:
        return None
    fig, axes = plt.subplots(1, len(rewards), figsize=(5.5 * len(rewards), 4), squeeze=False)
    for ax, (name, (chosen, rejected)) in zip(axes[0], rewards.items()):
        ax.hist(chosen.float().numpy(), bins=30, alpha=0.6, label="chosen")
        ax.hist(rejected.float().numpy(), bins=30, alpha=0.6, label="rejected")
        ax.set_title(f"validation-{name} rewards")
        ax.set_xlabel("reward")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
