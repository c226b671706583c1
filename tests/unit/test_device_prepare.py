"""benchmarks/device/prepare.py: the one step before a GPU run, and its refusals."""

import io
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from benchmarks.device import prepare  # noqa: E402


def make_bundle(where: Path, dists=("sglang-0.5.12", "pydantic_settings-2.16.3", "python_dotenv-1.2.4")) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    with tarfile.open(where / "site.tar.xz", "w:xz") as tar:
        for d in dists:
            data = f"Name: {d}\n".encode()
            info = tarfile.TarInfo(f"./{d}.dist-info/METADATA")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return where


def git_repo(path: Path, files: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    (path / ".gitignore").write_text("dist/\nbuild/\n.gpu-bundle/\n")
    g = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(g[:3] + ["init", "-q"], check=True)
    subprocess.run(g + ["add", "-A"], check=True)
    subprocess.run(g + ["commit", "-qm", "x"], check=True)
    return path


def test_bundle_without_the_plugins_dependencies_is_refused(tmp_path):
    old = make_bundle(tmp_path / "b", dists=("sglang-0.5.12", "pydantic-2.14.4"))
    with pytest.raises(prepare.Problem, match="lacks pydantic-settings, python-dotenv .bundles made before 2026-11-30"):
        prepare.check_bundle(old, tmp_path / "cache.json")


def test_missing_bundle_says_how_to_make_it(tmp_path):
    with pytest.raises(prepare.Problem, match="no .*site.tar.xz: make the SGLang bundle with .*make-bundle.sh"):
        prepare.check_bundle(tmp_path / "none", tmp_path / "cache.json")


def test_bundle_listing_is_cached_until_the_file_changes(tmp_path, monkeypatch):
    b = make_bundle(tmp_path / "b")
    cache = tmp_path / "cache.json"
    assert prepare.check_bundle(b, cache)["python_dotenv"] == "1.2.4"

    def no_listing(*a, **k):
        raise AssertionError("listed again")

    monkeypatch.setattr(tarfile, "open", no_listing)
    assert prepare.check_bundle(b, cache)["sglang"] == "0.5.12"  # from the cache
    monkeypatch.undo()
    make_bundle(b, dists=("sglang-0.5.15",))  # a rebuilt bundle: listed again, and refused
    with pytest.raises(prepare.Problem, match="lacks"):
        prepare.check_bundle(b, cache)


def test_what_travels_is_counted_once_and_limited(tmp_path):
    repo = git_repo(tmp_path / "r", {"a.txt": b"x" * 1000, "sub/b.txt": b"y" * 500})
    (repo / "untracked.txt").write_bytes(b"z" * 100)  # not ignored: travels too
    (repo / "dist").mkdir()
    (repo / "dist" / "w.whl").write_bytes(b"w" * 300)
    bundle = make_bundle(repo / ".gpu-bundle")
    parts = prepare.check_size(repo, [bundle, repo / "dist"])
    assert parts["working tree"] == 1000 + 500 + 100 + len((repo / ".gitignore").read_bytes())
    assert parts["dist"] == 300 and parts[".gpu-bundle"] == (bundle / "site.tar.xz").stat().st_size
    with pytest.raises(prepare.Problem, match=r"would travel, over the device's 0 MiB \(working tree"):
        prepare.check_size(repo, [bundle, repo / "dist"], limit=1000)


def test_prepare_builds_the_wheel_and_checks_a_result_file(tmp_path, capsys):
    repo = tmp_path / "checkout"
    repo.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    git_repo(repo, {})
    make_bundle(repo / ".gpu-bundle")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert prepare.main(["--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    (wheel,) = (repo / "dist").glob("*.whl")
    assert (repo / "dist" / "GIT_COMMIT").read_text().strip() == head
    names = zipfile.ZipFile(wheel).namelist()
    assert "sglang_dynspec_startup.pth" in names and "sglang_dynspec/data/support-matrix.json" in names
    assert "ready: carry .gpu-bundle and dist" in out

    rec = tmp_path / "r.json"  # outside the checkout, which an untracked file would make dirty
    rec.write_text(json.dumps({"kind": "sweep", "git_commit": "0000000", "sglang_version": "0.5.15",
                               "command": "bash benchmarks/device/run_sweep.sh sweep --stats-root <tmp>/s"}))
    assert prepare.main(["--repo", str(repo), "--result", str(rec)]) == 1
    err = capsys.readouterr().err
    assert f"r.json was made at commit 0000000, this checkout is at {head}" in err
    assert "ran on SGLang 0.5.15, the bundle holds 0.5.12: SGLANG_VERSION=0.5.15 make-bundle.sh" in err
    rec.write_text(json.dumps({"kind": "sweep", "git_commit": head, "sglang_version": "0.5.12",
                               "command": "bash benchmarks/device/run_sweep.sh sweep --stats-root <tmp>/s"}))
    assert prepare.main(["--repo", str(repo), "--result", str(rec)]) == 0
    assert "  bash benchmarks/device/run_sweep.sh sweep --stats-root /tmp/s" in capsys.readouterr().out
