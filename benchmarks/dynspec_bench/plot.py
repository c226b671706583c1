"""PNG for a sweep: tok/s vs concurrency per mode, and each mode's ratio to the best static mode."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless machines
import matplotlib.pyplot as plt  # noqa: E402


def plot_sweep(record: dict, path: str | Path) -> bool:
    """Returns False (and writes nothing) when there are no numeric concurrency levels."""
    modes = record.get("modes") or {}
    ratios = record.get("ratio_to_best_static") or {}
    series = {}
    for name, levels in modes.items():
        pts = sorted((int(c), lv["output_tok_per_s"]) for c, lv in levels.items()
                     if c.isdigit() and lv.get("output_tok_per_s"))
        if pts:
            series[name] = pts
    if not series:
        return False
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 8), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for name, pts in series.items():
        style = "--" if name.startswith("dynspec:") else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name)
        rp = sorted((int(c), r) for c, r in (ratios.get(name) or {}).items() if c.isdigit() and r)
        if rp:
            ax2.plot([p[0] for p in rp], [p[1] for p in rp], style, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_ylabel("output tok/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    title = f"{record.get('model') or ''} | SGLang {record.get('sglang_version')} | {record.get('gpu')}"
    ax.set_title(title, fontsize=9)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_ylabel("÷ best static (max off/on)")
    ax2.set_xlabel("concurrency C (closed loop)")
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
