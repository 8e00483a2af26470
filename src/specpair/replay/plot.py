"""The replay's PNG: acceptance by draft position, greedy vs sampled (matplotlib Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

from specpair.replay.compute import ReplayResult  # noqa: E402

__all__ = ["plot"]


def plot(result: ReplayResult, path: str | Path, title: str) -> None:
    """Two panels: P(draft k accepted) and per-position acceptance a_k, by position k."""
    ks = list(range(1, result.depth + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for ax, (g, s), label in (
            (left, (result.reach_greedy, result.reach_sampled), "P(draft k accepted)"),
            (right, (result.alpha_greedy, result.alpha_sampled),
             "mean a_k (acceptance at k, prefix accepted)")):
        ax.plot(ks, g, "o-", color="tab:blue", label="greedy drafts: p(argmax q)")
        ax.plot(ks, s, "s-", color="tab:orange", label="sampled drafts: sum min(p, q)")
        ax.set_xlabel("draft position k")
        ax.set_ylabel(label)
        ax.set_xticks(ks)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    a = result.accepted
    fig.suptitle(f"{title}\naccepted/round at depth {result.depth}: greedy {a.greedy:.3f}, "
                 f"sampled {a.sampled:.3f} ({a.rel_pct:+.1f}%, 95% CI {a.rel_ci_pct[0]:+.1f} "
                 f"to {a.rel_ci_pct[1]:+.1f}%)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
