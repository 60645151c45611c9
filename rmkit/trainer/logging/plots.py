"""End-of-run PNGs: training curves and validation reward histograms (needs matplotlib; skipped without)."""

from __future__ import annotations

from pathlib import Path

import torch

from rmkit.plotting import pyplot


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _save(plt, fig, path: Path) -> Path:
    """Lay the figure out, write it to `path` as a PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_training_curves(history: list[dict], path: Path, metrics: tuple[str, ...] = ("loss", "acc")) -> Path | None:
    """One panel per metric over steps (loss and accuracy by default): training (`train/*`) and each
    validation set (`validation-*/*`)."""
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
    return _save(plt, fig, path)


def plot_curves(history: list[dict], path: Path, panels: dict[str, list[str]]) -> Path | None:
    """One panel per title in `panels`, each plotting the logged series of its metric names over steps."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, keys) in zip(axes[0], panels.items()):
        for key in keys:
            steps, values = _series(history, key)
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(plt, fig, path)


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
    return _save(plt, fig, path)
