"""What a release needs: the metadata of the built distribution, and dependencies that match
what the package imports.  tox installs the project from a wheel it builds, so the installed
distribution's metadata is the wheel's."""

import ast
import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dist():
    try:
        return importlib.metadata.distribution("sglang-dynspec")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("sglang-dynspec is not installed (tox installs it from a built wheel)")


def test_built_distribution_carries_release_metadata():
    dist = _dist()
    meta = dist.metadata
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    assert any(str(f).endswith("LICENSE") for f in dist.files or [])
    assert meta["Description-Content-Type"] == "text/markdown" and "# sglang-dynspec" in meta.get_payload()
    assert meta["Requires-Python"] == ">=3.10"
    classifiers = meta.get_all("Classifier") or []
    minors = [c.rsplit(" ", 1)[-1] for c in classifiers if c.startswith("Programming Language :: Python :: 3.")]
    assert minors and minors[0] == "3.10"  # the classifiers start where requires-python does
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression alone


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names imported when the module loads (function bodies import lazily)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try, ast.Import, ast.ImportFrom)) else ():
            if isinstance(sub, ast.Import):
                names.update(a.name.split(".")[0] for a in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module:
                names.add(sub.module.split(".")[0])
    return names


def test_every_module_level_import_is_a_declared_dependency():
    declared = {Requirement(r).name.lower().replace("_", "-") for r in PYPROJECT["project"]["dependencies"]}
    owners = importlib.metadata.packages_distributions()
    missing = {}
    for path in sorted((ROOT / "src" / "sglang_dynspec").rglob("*.py")):
        for name in _module_level_imports(path):
            if name in sys.stdlib_module_names or name in ("sglang_dynspec", "__future__"):
                continue
            dists = {d.lower().replace("_", "-") for d in owners.get(name, [name.replace("_", "-")])}
            if not dists & declared:
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert missing == {}
