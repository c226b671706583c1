"""PNG for a sweep: tok/s vs concurrency per mode, and each mode's ratio to the best static mode."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless machines
import matplotlib.pyplot as plt  # noqa: E402


def trace_phase_series(record: dict, field: str = "tpot_p50_ms") -> tuple[list[str], dict[str, list]]:
    """(phase labels in trace order, {mode: value per phase or None}) for modes with trace phases."""
    traced = {name: ((lv or {}).get("trace") or {}).get("phases") for name, lv in (record.get("modes") or {}).items()}
    traced = {name: ph for name, ph in traced.items() if ph}
    phases = list(dict.fromkeys(p for ph in traced.values() for p in ph))
    return phases, {name: [(ph.get(p) or {}).get(field) for p in phases] for name, ph in traced.items()}


def _plot_levels(ax, ax2, record: dict, series: dict) -> None:
    ratios = record.get("ratio_to_best_static") or {}
    for name, pts in series.items():
        style = "--" if name.startswith("dynspec:") else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name)
        rp = sorted((int(c), r) for c, r in (ratios.get(name) or {}).items() if c.isdigit() and r)
        if rp:
            ax2.plot([p[0] for p in rp], [p[1] for p in rp], style, marker="o", label=name)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("output tok/s")
    ax.legend(fontsize=8)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_ylabel("÷ best static (max off/on)")
    ax2.set_xlabel("concurrency C (closed loop)")


def _plot_phases(ax, phases: list[str], by_mode: dict) -> None:
    # Open-loop trace: TPOT p50 per phase instance, one line per mode (low/high alternate on x).
    x = list(range(len(phases)))
    for name, vals in by_mode.items():
        pts = [(i, v) for i, v in zip(x, vals) if v is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if name.startswith("dynspec:") else "-",
                marker="o", label=name)
    ax.set_xticks(x, phases, fontsize=8)
    ax.set_ylabel("TPOT p50 ms (trace)")
    ax.set_xlabel("open-loop trace phase")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_sweep(record: dict, path: str | Path) -> bool:
    """Tok/s and ratio panels over the numeric concurrency levels, plus a TPOT-per-phase panel when
    modes ran a phased trace. Returns False (and writes nothing) when there is neither."""
    series = {}
    for name, levels in (record.get("modes") or {}).items():
        pts = sorted((int(c), lv["output_tok_per_s"]) for c, lv in levels.items()
                     if c.isdigit() and lv.get("output_tok_per_s"))
        if pts:
            series[name] = pts
    phases, by_mode = trace_phase_series(record)
    panels = (2 if series else 0) + (1 if phases else 0)
    if not panels:
        return False
    heights = ([2, 1] if series else []) + ([1.4] if phases else [])
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3 * sum(heights) + 1), gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    axes = list(axes[:, 0])
    if series:
        _plot_levels(axes[0], axes[1], record, series)
    if phases:
        _plot_phases(axes[-1], phases, by_mode)
    title = f"{record.get('model') or ''} | SGLang {record.get('sglang_version')} | {record.get('gpu')}"
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
