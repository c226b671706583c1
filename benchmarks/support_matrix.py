"""Generate the README's support matrix from committed evidence (never typed by hand).

CPU-tested: benchmarks/results/cpu-matrix.json (written by collect_cpu_matrix.py from the tox
runs' JUnit files): the adapter's test module passed against that real release.
GPU-tested: a result JSON under benchmarks/results/ on that release, path and topk in which a
dynspec server really switched (plugin stats show off-steps), with no failed request, no leak
report, no crash and outputs identical to the reference.

    python benchmarks/support_matrix.py            # print the table
    python benchmarks/support_matrix.py --write    # replace it in README.md and write the packaged JSON
    python benchmarks/support_matrix.py --check    # exit 1 if README.md or the JSON is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Imported as benchmarks.support_matrix (tests) or run as a file, whose folder is then on sys.path.
try:
    from . import readme_block
except ImportError:
    import readme_block

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RELEASES = ["0.5.9", "0.5.12", "0.5.15", "0.5.23"]


def _v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(".")[:3])


def rows_for(release: str) -> list[tuple[str, str]]:
    """(worker path, topk label) combinations the release runs."""
    v = _v(release)
    if v <= (0, 5, 12):
        # v1 takes every topk; spec_v2 only topk 1 (0.5.9/0.5.10 only with SGLANG_ENABLE_SPEC_V2=1)
        return [("v1", "1"), ("v1", ">1"), ("spec_v2", "1")]
    return [("spec_v2", "1"), ("spec_v2", ">1")]


def cpu_evidence() -> dict:
    p = RESULTS / "cpu-matrix.json"
    return json.loads(p.read_text()) if p.exists() else {}


def gpu_evidence() -> dict[tuple[str, str, str], list[str]]:
    found: dict[tuple[str, str, str], list[str]] = {}
    for f in sorted(RESULTS.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except ValueError:
            continue
        if d.get("kind") == "fuzz":
            per = d.get("per_C") or {}
            ok = per and all(not r.get("crashed") and not r.get("leak_reports") and not r.get("mismatched")
                             and r.get("switches", 0) > 0 for r in per.values())
            if ok:
                topk = "1" if d.get("topk") == 1 else ">1"
                found.setdefault((d["sglang_version"], d["worker_path"], topk), []).append(f.name)
        elif d.get("kind") in ("sweep", "trace"):
            for mode, info in (d.get("mode_info") or {}).items():
                if info.get("kind") != "dynspec":
                    continue
                st = (d.get("server_stats") or {}).get(mode) or {}
                dyn = st.get("dynspec_stats") or {}
                levels = (d.get("modes") or {}).get(mode) or {}
                corr = (d.get("correctness") or {}).get(mode) or {}
                ok = (dyn.get("steps_off", 0) > 0 and dyn.get("off_not_applied", 0) == 0
                      and not st.get("leak_reports") and st.get("alive_at_end", False)
                      and levels and all(not lv.get("failed") for lv in levels.values())
                      and corr.get("requests", 0) > 0 and corr.get("mismatched", 1) == 0)
                if ok:
                    topk = "1" if info.get("topk") == 1 else ">1"
                    found.setdefault((d["sglang_version"], info["worker_path"], topk), []).append(f.name)
    return found


def _torch_note(env: dict) -> str:
    """Name the torch when the CI ran a release on a shared torch instead of its own pin."""
    torch, pin = env.get("torch"), env.get("torch_pin")
    return f"; torch {torch}, not its pin {pin}" if torch and pin and torch != pin else ""


def matrix() -> list[dict]:
    """One row per (release, worker path, topk): the README table and the packaged JSON that
    `sglang-dynspec doctor` prints for the installed release."""
    cpu, gpu = cpu_evidence(), gpu_evidence()
    rows = []
    for rel in RELEASES:
        act = "startup hook (.pth)" if _v(rel) < (0, 5, 11) else "plugin entry point"
        env = cpu.get(rel)
        for path, topk in rows_for(rel):
            if env is None:
                c = "no"
            else:
                t = env.get("adapters", {}).get(path, {})
                c = f"yes ({t.get('passed', 0)} adapter tests{_torch_note(env)})" if t.get("passed") and not t.get("failed") else "FAILING" if t.get("failed") else "no"
            rows.append({"sglang": rel, "path": path, "topk": topk, "activation": act, "cpu": c,
                         "gpu": sorted(set(gpu.get((rel, path, topk), [])))})
    return rows


def table() -> str:
    lines = ["| SGLang | worker path | topk | activation | CPU-tested | GPU-tested (H200) |",
             "|---|---|---|---|---|---|"]
    for r in matrix():
        gtxt = "yes: " + ", ".join(r["gpu"]) if r["gpu"] else "no"
        lines.append(f"| {r['sglang']} | {r['path']} | {r['topk']} | {r['activation']} | {r['cpu']} | {gtxt} |")
    return "\n".join(lines)


PACKAGED = ROOT / "src" / "sglang_dynspec" / "data" / "support-matrix.json"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rc = readme_block.main("support-matrix", table, argv)
    data = json.dumps(matrix(), indent=1) + "\n"
    if "--write" in argv:
        PACKAGED.write_text(data)
    elif "--check" in argv and (not PACKAGED.exists() or PACKAGED.read_text() != data):
        print(f"{PACKAGED.relative_to(ROOT)} is stale: run python benchmarks/support_matrix.py --write", file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
