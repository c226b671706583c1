"""Replace or check a generated block of README.md between two HTML comment markers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

README = Path(__file__).resolve().parents[1] / "README.md"


def main(name: str, generate: Callable[[], str], argv=None, readme: Path = README) -> int:
    """CLI shared by the generators: print the block, ``--write`` it, or ``--check`` it is current."""
    ap = argparse.ArgumentParser(description=f"README.md block '{name}'")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    block = generate()
    if not (a.write or a.check):
        print(block)
        return 0
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = readme.read_text()
    if start not in text or end not in text:
        print(f"{readme.name} has no {start} ... {end} block", file=sys.stderr)
        return 1
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{block}\n{end}{tail}"
    if a.check:
        if new != text:
            print(f"{readme.name} {name} is stale: run python benchmarks/{name.replace('-', '_')}.py --write",
                  file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0
