"""Rewrite machine paths in committed result files the way the harness now writes them.

Result files made before results.portable() hold the absolute paths of the machine that ran
them (its copy of the repository, e.g. /work/main/benchmarks/models/llama8b, and /tmp/...).
This rewrites those strings only: paths under that repository become relative to it, temp paths
``<tmp>/...``; the text is edited in place, so numbers and formatting stay byte-for-byte.

    python benchmarks/portable_results.py            # rewrite benchmarks/results/*.json
    python benchmarks/portable_results.py --check    # exit 1 if a file still holds such paths
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Imported as benchmarks.portable_results (tests) or run as a file, whose folder is then on sys.path.
try:
    from .dynspec_bench.results import REPO_ROOT, portable, portable_text
except ImportError:
    from dynspec_bench.results import REPO_ROOT, portable, portable_text

# A path into a copy of this repository: <root>/benchmarks/<one of its folders>/...
_REPO_COPY = re.compile(r"(/[^\s\"',;:]*?)/benchmarks/(?:models|results|device|dynspec_bench)(?=[/\"\s])")


def roots_in(text: str) -> set[str]:
    """Roots of the repository copies a result file names (the machine that ran it)."""
    return {m.group(1) for m in _REPO_COPY.finditer(text) if not m.group(1).startswith("<")} | {str(REPO_ROOT)}


def rewrite(text: str) -> str:
    roots = roots_in(text)
    new = portable_text(text, roots)
    # Only strings may change: the parsed values must equal the structure-wise rewrite.
    if json.loads(new) != portable(json.loads(text), roots):
        raise ValueError("the text rewrite touched more than JSON strings")
    return new


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    a = ap.parse_args(argv)
    files = a.files or sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    stale = []
    for f in files:
        text = f.read_text()
        new = rewrite(text)
        if new != text:
            stale.append(f)
            if not a.check:
                f.write_text(new)
    for f in stale:
        print(f"{'holds machine paths' if a.check else 'rewrote'}: {f}", file=sys.stderr if a.check else sys.stdout)
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
