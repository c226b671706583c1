"""The README's commands work as written from a fresh checkout: the project is installed from
the checkout or a wheel built from it (it is on no package registry), and every repository
path a command or its prose names exists."""

import re
import shlex
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _bash_lines():
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            yield line.split("  #")[0].lstrip("# ").strip()


def test_readme_installs_the_project_from_a_checkout_or_a_built_wheel():
    targets = []
    for line in _bash_lines():
        for cmd in line.split("&&"):
            if "pip install" not in cmd:
                continue
            words = shlex.split(cmd)
            if words[:2] == ["pip", "install"]:
                targets += [w for w in words[2:] if not w.startswith("-")]
    assert targets
    for t in targets:
        if t.endswith(".whl"):
            assert re.fullmatch(r"dist/sglang_dynspec-[\w.]+-py3-none-any\.whl", t), t
            assert any("pip wheel" in line and "-w dist" in line for line in _bash_lines())  # it is built first
        elif t.startswith((".", "/")):
            continue  # a checkout
        else:
            assert Requirement(t).name != "sglang-dynspec", f"`pip install {t}`: not on any registry"


def test_readme_wheel_name_is_what_the_build_makes():
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"dist/sglang_dynspec-{version}-py3-none-any.whl" in README


def test_paths_the_readme_names_exist():
    paths = set(re.findall(r"(?<![\w/.<-])((?:benchmarks|examples|src|tests|hooks|constraints)/[\w./-]*\w)", README))
    assert paths
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []
