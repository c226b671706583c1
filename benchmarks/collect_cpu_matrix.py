"""Summarise the tox runs' JUnit files into benchmarks/results/cpu-matrix.json.

    tox -p auto && python benchmarks/collect_cpu_matrix.py
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTER_MODULES = {"v1": "test_adapter_v1", "spec_v2": "test_adapter_spec_v2"}


def summarise(xml_path: Path) -> dict:
    root = ET.parse(xml_path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    adapters = {k: {"passed": 0, "failed": 0, "skipped": 0} for k in ADAPTER_MODULES}
    for case in root.iter("testcase"):
        status = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        counts[status] += 1
        cls = case.get("classname", "")
        for path, mod in ADAPTER_MODULES.items():
            if mod in cls:
                adapters[path][status] += 1
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    versions = {k: props.get(k) or None for k in ("sglang", "torch", "torch_pin")}
    return {**counts, "adapters": adapters, **versions}


def main() -> int:
    out = {}
    for xml in sorted((ROOT / ".tox").glob("junit-sglang-*.xml")):
        release = xml.stem[len("junit-sglang-"):]
        out[release] = summarise(xml) | {"junit": xml.name}
    if not out:
        print("no .tox/junit-sglang-*.xml: run tox first", file=sys.stderr)
        return 1
    out["_collected"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    dest = ROOT / "benchmarks" / "results" / "cpu-matrix.json"
    dest.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
