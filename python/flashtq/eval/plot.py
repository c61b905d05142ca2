"""The PNG: perplexity change against bits per coordinate, one point per cache configuration."""
from __future__ import annotations


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in report["runs"]:
        rows = [c for c in run["configs"] if "rel_change" in c]
        x = [c["bits_per_coordinate"] for c in rows]
        y = [100 * c["rel_change"] for c in rows]
        lo = [100 * (c["rel_change"] - c["ci_low"]) if c["ci_low"] == c["ci_low"] else 0 for c in rows]
        hi = [100 * (c["ci_high"] - c["rel_change"]) if c["ci_high"] == c["ci_high"] else 0 for c in rows]
        label = f"{run['model']} on {run['corpus']} (ctx {run['ctx']}, {run['windows']} windows)"
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o", capsize=3, label=label)
        for c, xi, yi in zip(rows, x, y):
            ax.annotate(c["name"], (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("bits per coordinate (keys and values, norms included)")
    ax.set_ylabel("perplexity change vs exact (%)")
    ax.set_title("TurboQuant KV cache: perplexity change (95 % CI across windows)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
