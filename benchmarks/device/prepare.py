"""Prepare everything a GPU run needs, or say what is missing.

    python3 benchmarks/device/prepare.py                      # this checkout, .gpu-bundle
    python3 benchmarks/device/prepare.py --result benchmarks/results/tp2-sweep-0512.json
    python3 benchmarks/device/prepare.py --repo ../dynspec-391930b --result benchmarks/results/tp2-sweep-0512.json

1. builds the checkout's wheel into dist/ (older wheels removed: the device scripts install
   every dist/*.whl) and writes dist/GIT_COMMIT, the commit the result files will name
   ("-dirty" appended when the checkout has changes no commit holds);
2. checks the SGLang bundle (<bundle>/site.tar.xz, made by the device kit's make-bundle.sh):
   that it exists and carries pydantic-settings and python-dotenv, which the device image lacks
   (bundles made before 2026-11-30 omit them and every dynspec server then dies at start); the
   listing is slow (xz), so it is cached in build/ by file size and time;
3. checks that what travels with a run (the files git does not ignore, the bundle, dist/) fits
   the device's 64 MiB.
With --result, also: the checkout is at the file's commit, the bundle holds its SGLang release,
and the command that made it is printed.  Exit status 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

HERE_REPO = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2**20  # what the device takes with one run, repository included
# Distributions the device image lacks that sglang-dynspec imports at server start.
NEEDED_IN_BUNDLE = ("pydantic_settings", "python_dotenv")
_DIST_INFO = re.compile(r"^(?:\./)?([A-Za-z0-9_.]+?)-([^/-]+)\.dist-info(?:/|$)")


class Problem(Exception):
    pass


def _git(repo: Path, *args: str) -> str:
    p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise Problem(f"git {' '.join(args)} in {repo}: {p.stderr.strip() or p.returncode}")
    return p.stdout


def commit_of(repo: Path) -> str:
    sha = _git(repo, "rev-parse", "--short=7", "HEAD").strip()
    dirty = bool(_git(repo, "status", "--porcelain").strip())
    return sha + ("-dirty" if dirty else "")


def build_wheel(repo: Path) -> Path:
    dist = repo / "dist"
    dist.mkdir(exist_ok=True)
    for old in dist.glob("*.whl"):
        old.unlink()
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist),
                        str(repo)], capture_output=True, text=True)
    wheels = sorted(dist.glob("*.whl"))
    if p.returncode != 0 or len(wheels) != 1:
        raise Problem(f"building the wheel failed (pip wheel, exit {p.returncode}): {p.stderr.strip()[-1500:]}")
    (dist / "GIT_COMMIT").write_text(commit_of(repo) + "\n")
    return wheels[0]


def bundle_dists(site_tar: Path, cache: Path) -> dict[str, str]:
    """{distribution (underscored): version} of the site tree in site.tar.xz."""
    st = site_tar.stat()
    key = f"{site_tar.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["dists"]
    except (OSError, ValueError):
        pass
    dists: dict[str, str] = {}
    try:
        with tarfile.open(site_tar, "r:xz") as tar:
            for member in tar:
                m = _DIST_INFO.match(member.name)
                if m:
                    dists[m.group(1).lower().replace(".", "_")] = m.group(2)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise Problem(f"{site_tar}: cannot be listed ({type(e).__name__}: {e}); rebuild the bundle") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "dists": dists}))
    return dists


def check_bundle(bundle: Path, cache: Path) -> dict[str, str]:
    site = bundle / "site.tar.xz"
    if not site.is_file():
        raise Problem(f"no {site}: make the SGLang bundle with the device kit's make-bundle.sh "
                      f"(../shared/gpu/make-bundle.sh, run from the repository root; SGLANG_VERSION picks the release)")
    dists = bundle_dists(site, cache)
    if "sglang" not in dists:
        raise Problem(f"{site} holds no sglang distribution: not an SGLang bundle")
    missing = [d.replace("_", "-") for d in NEEDED_IN_BUNDLE if d not in dists]
    if missing:
        raise Problem(f"{site} lacks {', '.join(missing)} (bundles made before 2026-11-30 do): every dynspec "
                      "server would stop at start (the plugin cannot import). Rebuild it with make-bundle.sh")
    return dists


def _files(path: Path):
    if path.is_file():
        yield path
    elif path.is_dir():
        for dirpath, _dirs, names in os.walk(path):
            for n in names:
                yield Path(dirpath) / n


def travelling_bytes(repo: Path, carried: list[Path]) -> dict[str, int]:
    """Bytes per part of what one device run takes: the working tree git does not ignore, and
    each carried path."""
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    seen: set[Path] = set()
    parts: dict[str, int] = {}

    def add(part: str, f: Path) -> None:
        f = f.resolve()
        if f in seen or not f.is_file():
            return
        seen.add(f)
        parts[part] = parts.get(part, 0) + f.stat().st_size

    for c in carried:
        for f in _files(c):
            add(os.path.relpath(c, repo), f)
    for name in filter(None, listed):
        add("working tree", repo / name)
    return parts


def check_size(repo: Path, carried: list[Path], limit: int = LIMIT) -> dict[str, int]:
    parts = travelling_bytes(repo, carried)
    total = sum(parts.values())
    if total > limit:
        detail = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
        raise Problem(f"{total / 2**20:.1f} MiB would travel, over the device's {limit / 2**20:.0f} MiB ({detail})")
    return parts


def reproduce(record_path: Path, repo: Path, dists: dict[str, str]) -> str:
    """The command that made a result file, after checking the checkout and bundle match it."""
    rec = json.loads(record_path.read_text())
    commit, version = rec.get("git_commit"), rec.get("sglang_version")
    problems = []
    head = commit_of(repo)
    if commit and head != commit[:7]:
        problems.append(f"{record_path.name} was made at commit {commit}, this checkout is at {head}: "
                        f"git worktree add ../dynspec-{commit[:7]} {commit}, then "
                        f"python3 benchmarks/device/prepare.py --repo ../dynspec-{commit[:7]} --result {record_path}")
    if version and dists.get("sglang") != version:
        problems.append(f"{record_path.name} ran on SGLang {version}, the bundle holds {dists.get('sglang')}: "
                        f"SGLANG_VERSION={version} make-bundle.sh")
    if problems:
        raise Problem("\n  ".join(problems))
    command = (rec.get("command") or "").replace("<tmp>/", "/tmp/")
    if rec.get("kind") == "pair":
        return f"bash benchmarks/device/run_pair.sh   # builds the pair into /tmp/pair, then runs: {command}"
    return command


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=HERE_REPO, help="the checkout to prepare (default: this one)")
    ap.add_argument("--bundle", type=Path, default=None,
                    help="the SGLang bundle (default: $DYNSPEC_BUNDLE or <repo>/.gpu-bundle, as run_sweep.sh)")
    ap.add_argument("--result", type=Path, help="a committed result file to reproduce")
    a = ap.parse_args(argv)
    repo = a.repo.resolve()
    bundle = (a.bundle or Path(os.environ.get("DYNSPEC_BUNDLE") or repo / ".gpu-bundle")).resolve()
    errors: list[str] = []
    dists: dict[str, str] = {}

    def step(fn, *args):
        try:
            return fn(*args)
        except Problem as e:
            errors.append(str(e))
            return None

    wheel = step(build_wheel, repo)
    if wheel is not None:
        commit = (repo / "dist" / "GIT_COMMIT").read_text().strip()
        print(f"prepare: wheel {wheel.relative_to(repo)}, dist/GIT_COMMIT {commit}")
        if commit.endswith("-dirty"):
            print("prepare: note: the checkout has uncommitted changes; results will name "
                  f"{commit} and cannot be reproduced from a commit")
    dists = step(check_bundle, bundle, repo / "build" / "prepare-bundle.json") or {}
    if dists:
        print(f"prepare: bundle {bundle}: SGLang {dists['sglang']}, "
              + ", ".join(f"{d.replace('_', '-')} {dists[d]}" for d in NEEDED_IN_BUNDLE))
    carried = [bundle, repo / "dist"]
    parts = step(check_size, repo, carried)
    if parts:
        print(f"prepare: {sum(parts.values()) / 2**20:.1f} MiB travel of {LIMIT / 2**20:.0f} MiB ("
              + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sorted(parts.items())) + ")")
    command = step(reproduce, a.result, repo, dists) if a.result and dists else None
    if errors:
        for e in errors:
            print(f"prepare: ERROR: {e}", file=sys.stderr)
        return 1
    rel = [os.path.relpath(c, repo) for c in carried]
    print(f"ready: carry {' and '.join(rel)} with the run; on the GPU machine, from the repository root:")
    print(f"  {command or 'bash benchmarks/device/run_sweep.sh [sweep|trace|fuzz|offstep|pytest] ...'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
