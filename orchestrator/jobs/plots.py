"""PNG plots of a training run and of an ablation (matplotlib, Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(steps: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([s["rollouts"] for s in steps if key in s], dtype=float)
    y = np.array([s[key] for s in steps if key in s], dtype=float)
    return x, y


def plot_training(summary: dict, out_dir: Path) -> list[Path]:
    """Write ``curves.png`` (held-out accuracy and train reward vs rollouts; entropy, clip
    fractions, KL to the initial policy) and ``sampling.png`` (keep rate, groups dropped by
    reason per step, reward of all vs kept groups). Returns the paths."""
    plt = _plt()
    steps, evals = summary["steps"], summary["evals"]
    out_dir = Path(out_dir)
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    a = ax[0, 0]
    for key, label in (("heldout_acc", "held-out accuracy (avg@k)"), ("heldout_expected_acc", "held-out accuracy (expected)")):
        x, y = _series(evals, key)
        if len(x):
            a.plot(x, y, "o-", label=label)
    x, y = _series(steps, "accuracy_mean")
    a.plot(x, y, alpha=0.5, label="train batch accuracy")
    a.set_xlabel("rollouts generated")
    a.set_ylim(0, 1)
    a.legend()
    a.set_title("accuracy")
    a = ax[0, 1]
    for key, label in (("reward_all", "train reward: all groups"), ("reward_kept", "train reward: kept groups"),
                       ("reward_mean", "train reward: batch")):
        x, y = _series(steps, key)
        a.plot(x, y, label=label, alpha=0.8)
    a.set_xlabel("rollouts generated")
    a.legend()
    a.set_title("reward")
    a = ax[1, 0]
    x, y = _series(steps, "entropy")
    a.plot(x, y, label="entropy (nats/token)")
    x, y = _series(steps, "kl_ref")
    a.plot(x, y, label="KL to initial policy")
    a.set_xlabel("rollouts generated")
    a.legend()
    a.set_title("entropy and KL")
    a = ax[1, 1]
    for key, label in (("pg_clipfrac", "clip fraction, upper"), ("pg_clipfrac_lower", "clip fraction, lower"),
                       ("pg_clipfrac_dual", "dual clip")):
        x, y = _series(steps, key)
        a.plot(x, y, label=label)
    a.set_xlabel("rollouts generated")
    a.legend()
    a.set_title("policy-gradient clip fraction")
    fig.tight_layout()
    curves = out_dir / "curves.png"
    fig.savefig(curves, dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    idx = [s["step"] for s in steps]
    ax[0].plot(idx, [s["keep_rate"] for s in steps], "o-", ms=3)
    ax[0].set_ylim(0, 1)
    ax[0].set_xlabel("step")
    ax[0].set_title("keep rate (informative / classified)")
    reasons = sorted({r for s in steps for r, v in s["dropped"].items() if v})
    bottom = np.zeros(len(steps))
    for r in reasons:
        v = np.array([s["dropped"].get(r, 0) for s in steps], dtype=float)
        ax[1].bar(idx, v, bottom=bottom, label=r)
        bottom += v
    ax[1].set_xlabel("step")
    ax[1].set_title("groups dropped by reason")
    if reasons:
        ax[1].legend()
    ax[2].plot(idx, [s["reward_all"] for s in steps], label="all groups")
    ax[2].plot(idx, [s["reward_kept"] for s in steps], label="kept groups")
    ax[2].set_xlabel("step")
    ax[2].set_title("reward mean")
    ax[2].legend()
    fig.tight_layout()
    sampling = out_dir / "sampling.png"
    fig.savefig(sampling, dpi=90)
    plt.close(fig)
    return [curves, sampling]


def plot_ablation(curves: dict[str, list[list[tuple[float, float]]]], path: Path, *, xlabel: str = "rollouts generated",
                  ylabel: str = "held-out accuracy (avg@k)") -> Path:
    """A measure vs budget, one line per arm (mean over seeds, band = min..max).

    Args:
        curves: arm -> one list of (budget, value) per seed (default: rollouts, held-out accuracy).
    """
    plt = _plt()
    many = len(curves) > 10  # more arms than the default colour cycle: tab20, a legend beside the axes
    fig, ax = plt.subplots(figsize=(10.5, 5) if many else (8, 5))
    tab20 = plt.get_cmap("tab20").colors
    for i, (arm, runs) in enumerate(curves.items()):
        grid = np.linspace(0, min(r[-1][0] for r in runs), 20)
        ys = np.array([np.interp(grid, [p[0] for p in r], [p[1] for p in r]) for r in runs])
        colour = tab20[(2 * i) % 20 + (2 * i) // 20] if many else f"C{i}"
        ax.plot(grid, ys.mean(0), label=arm, color=colour, linestyle="-" if i < 10 else "--")
        ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.07 if many else 0.15, color=colour)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if many:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    else:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def plot_gigpo_training(summary: dict, out_dir: Path) -> list[Path]:
    """Write ``gigpo_curves.png``: success rate on training maps (per step) and held-out maps
    (per evaluation); the fraction of steps in anchor groups larger than one; mean |A^S| and
    |A^E|; episode length - all against trajectories generated. Returns the path."""
    plt = _plt()
    steps, evals = summary["steps"], summary["evals"]
    x = np.array([s["trajectories"] for s in steps], dtype=float)
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    a = ax[0, 0]
    a.plot(x, [s["success_rate"] for s in steps], alpha=0.6, label="training maps (step's rollouts)")
    a.plot([e["trajectories"] for e in evals], [e["heldout_success"] for e in evals], "o-", label="held-out maps")
    a.set_ylim(0, 1)
    a.set_title("success rate")
    a = ax[0, 1]
    a.plot(x, [s["anchor_group_fraction"] for s in steps])
    a.set_ylim(0, 1)
    a.set_title("steps in anchor groups of size > 1")
    a = ax[1, 0]
    a.plot(x, [s["mean_abs_step_advantage"] for s in steps], label="mean |A_S| (step)")
    a.plot(x, [s["mean_abs_episode_advantage"] for s in steps], label="mean |A_E| (episode)")
    a.set_title("advantage magnitudes")
    a = ax[1, 1]
    a.plot(x, [s["episode_length"] for s in steps])
    a.set_title("episode length (turns)")
    for a in ax.flat:
        a.set_xlabel("trajectories generated")
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    path = Path(out_dir) / "gigpo_curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def plot_gigpo_comparison(curves: dict[str, list[list[dict]]], path: Path, *, title: str = "") -> Path:
    """Write a GiGPO comparison's figure: per arm, against trajectories generated, the mean over seeds
    (band: mean ± std) of training-map success (each step's own rollouts), mean |A_S|, mean |A_E| and
    the fraction of steps in anchor groups larger than one.

    Args:
        curves: arm -> one list of step rows (``summary["steps"]`` of the training run) per seed.
    """
    plt = _plt()
    panels = (("success_rate", "training-map success (step's rollouts)"), ("mean_abs_step_advantage", "mean |A_S| (step)"),
              ("mean_abs_episode_advantage", "mean |A_E| (episode)"), ("anchor_group_fraction", "steps in anchor groups > 1"))
    fig, ax = plt.subplots(2, 2, figsize=(11, 7.5))
    for a, (key, label) in zip(ax.flat, panels):
        for arm, runs in curves.items():
            end = min(r[-1]["trajectories"] for r in runs)
            grid = np.array(sorted({s["trajectories"] for s in runs[0] if s["trajectories"] <= end}), dtype=float)
            ys = np.array([np.interp(grid, [s["trajectories"] for s in r], [s[key] for s in r]) for r in runs])
            mean, std = ys.mean(0), ys.std(0, ddof=1) if len(runs) > 1 else np.zeros(len(grid))
            a.plot(grid, mean, label=arm)
            a.fill_between(grid, mean - std, mean + std, alpha=0.15)
        a.set_title(label)
        a.set_xlabel("trajectories generated")
    ax[0, 0].set_ylim(0, 1)
    ax[1, 1].set_ylim(0, 1.05)
    ax[0, 0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)
