"""The pinned upstream CRDs (serving/data/crds.lock.json, serving.pulumi.crds): one resolution order
(--crd-dir, ../shared/crds beside the Pulumi project, the fetched cache), every directory verified against the
lock, and the fetch itself, from a real HTTP server on loopback laid out as raw.githubusercontent.com is
(<repository>/<commit>/<path>), holding the real upstream files."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from serving.pulumi import crds
from serving.pulumi.crds import CrdError, NoCrdDirError, pinned, resolve_crd_dir
from tests.support.k8s import crd_dir
from tests.support.paths import REPO

LWS = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty XDG cache (the fetched CRDs land in it) and no EXASERVE_PROJECT_DIR."""
    crd_dir()  # the real pinned CRDs (the tests' source files), resolved before the cache moves
    home = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.delenv("EXASERVE_PROJECT_DIR", raising=False)
    return home


def project(root: Path, *, mirror: bool) -> Path:
    """``root/project`` holding a Pulumi.yaml; with ``mirror``, a copy of the pinned CRDs at ``root/shared/crds``."""
    proj = root / "project"
    proj.mkdir(parents=True)
    (proj / "Pulumi.yaml").write_text("name: exaserve\nruntime: python\n")
    if mirror:
        shutil.copytree(crd_dir(), root / "shared" / "crds")
    return proj


def test_the_lock_pins_every_crd_the_mirror_holds() -> None:
    """Every file of the resolved directory (CI's ../shared/crds or the cache) is pinned with its sha256."""
    entries = pinned()
    assert {p.file for p in entries} == {p.name for p in crd_dir().glob("*.yaml")}
    assert {p.repository for p in entries} >= {"kubernetes-sigs/lws", "prometheus-operator/prometheus-operator",
                                               "chaos-mesh/chaos-mesh", "k8snetworkplumbingwg/network-attachment-definition-client"}  # fmt: skip
    for p in entries:
        assert len(p.commit) == 40 and len(p.sha256) == 64
        assert hashlib.sha256((crd_dir() / p.file).read_bytes()).hexdigest() == p.sha256
    nad = next(p for p in entries if p.file == "k8s.cni.cncf.io_network-attachment-definitions.yaml")
    assert nad.url() == (
        "https://raw.githubusercontent.com/k8snetworkplumbingwg/network-attachment-definition-client/"
        "46fcc4112dcb9af0b277dc85fec8178acbddd5ab/artifacts/networks-crd.yaml"
    )


def test_a_wrong_hash_is_an_error_naming_the_file_and_both_hashes(tmp_path: Path, cache_home: Path) -> None:
    proj = project(tmp_path, mirror=True)
    mirror = (tmp_path / "shared" / "crds").resolve()
    mine = tmp_path / "mine"
    mine.mkdir()
    tampered = (crd_dir() / LWS).read_bytes().replace(b"leaderWorkerTemplate", b"leaderWorkerTemplatX", 1)
    (mine / LWS).write_bytes(tampered)
    (mirror / LWS).write_bytes(tampered)
    expected = next(p.sha256 for p in pinned() if p.file == LWS)
    actual = hashlib.sha256(tampered).hexdigest()
    for resolve, where in ((partial(resolve_crd_dir, mine), mine), (partial(resolve_crd_dir, project=proj), mirror)):
        with pytest.raises(CrdError) as err:
            resolve()
        message = str(err.value)
        assert f"{where / LWS}: sha256 {actual}, expected {expected}" in message
        assert "kubernetes-sigs/lws" in message and "replace it with the pinned file" in message


def test_resolution_order_crd_dir_then_the_mirror_then_the_cache(tmp_path: Path, cache_home: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    proj = project(tmp_path, mirror=True)
    mirror = (tmp_path / "shared" / "crds").resolve()
    cached = crds.cache_path()
    shutil.copytree(crd_dir(), cached)
    mine = tmp_path / "mine"  # --crd-dir may hold a subset (and CRDs of the user's own)
    mine.mkdir()
    shutil.copy(crd_dir() / LWS, mine)
    (mine / "example.com_widgets.yaml").write_text("kind: CustomResourceDefinition\n")
    assert resolve_crd_dir(mine, project=proj) == mine
    assert resolve_crd_dir(project=proj) == mirror
    # the project found as pulumi finds it: the nearest Pulumi.yaml at or above the current directory
    (proj / "infra").mkdir()
    monkeypatch.chdir(proj / "infra")
    assert resolve_crd_dir() == mirror
    monkeypatch.setenv("EXASERVE_PROJECT_DIR", str(proj))
    monkeypatch.chdir(tmp_path)
    assert resolve_crd_dir() == mirror
    monkeypatch.delenv("EXASERVE_PROJECT_DIR")
    assert resolve_crd_dir() == cached, "no project here: the cache"
    shutil.rmtree(mirror)
    assert resolve_crd_dir(project=proj) == cached
    assert cached.parent == cache_home / "exaserve" / "crds"


def test_a_mirror_or_cache_missing_a_pinned_file_is_an_error(tmp_path: Path, cache_home: Path) -> None:
    proj = project(tmp_path, mirror=True)
    (tmp_path / "shared" / "crds" / LWS).unlink()
    with pytest.raises(CrdError, match=rf"{LWS} is missing: .* must hold every CRD pinned in crds.lock.json"):
        resolve_crd_dir(project=proj)


def test_missing_everything_is_a_clear_error(tmp_path: Path, cache_home: Path) -> None:
    with pytest.raises(NoCrdDirError) as err:
        resolve_crd_dir(project=project(tmp_path, mirror=False))
    message = str(err.value)
    assert f"no CRD directory: no --crd-dir, no {(tmp_path / 'shared' / 'crds').resolve()}" in message
    assert f"no fetched cache {crds.cache_path()}" in message
    assert "python -m serving.pulumi.crds fetch" in message and "pass --crd-dir DIR" in message
    with pytest.raises(CrdError, match=r"CRD directory .*nope does not exist; pass --crd-dir"):
        resolve_crd_dir(tmp_path / "nope")


# ------------------------------------------------------------------------------------------ fetch


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server holding the pinned files at <repository>/<commit>/<path>; returns (URL, its root)."""
    root = tmp_path / "upstream"
    for p in pinned():
        dest = root / p.repository / p.commit / p.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(crd_dir() / p.file, dest)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_fills_the_cache_and_verifies_each_file(upstream: tuple[str, Path], cache_home: Path,
                                                     tmp_path: Path) -> None:  # fmt: skip
    url, _ = upstream
    proj = project(tmp_path, mirror=False)
    assert crds.bootstrap(proj, url) == ("fetched", crds.cache_path())
    assert sorted(p.name for p in crds.cache_path().iterdir()) == sorted(p.file for p in pinned())
    assert resolve_crd_dir(project=proj) == crds.cache_path()
    assert crds.bootstrap(proj, url) == ("verified", crds.cache_path()), "a second run fetches nothing"
    # a corrupted cache is fetched again; a corrupted mirror is reported, never bypassed
    (crds.cache_path() / LWS).write_text("truncated")
    assert crds.bootstrap(proj, url) == ("fetched", crds.cache_path())
    assert resolve_crd_dir(project=proj) == crds.cache_path()
    shutil.copytree(crd_dir(), tmp_path / "shared" / "crds")
    (tmp_path / "shared" / "crds" / LWS).write_text("truncated")
    with pytest.raises(CrdError, match=f"{LWS}: sha256 "):
        crds.bootstrap(proj, url)


def test_fetch_refuses_a_file_with_the_wrong_hash_and_leaves_no_cache(upstream: tuple[str, Path],
                                                                     cache_home: Path) -> None:  # fmt: skip
    url, root = upstream
    pin = next(p for p in pinned() if p.file == LWS)
    (root / pin.repository / pin.commit / pin.path).write_text("not the pinned file\n")
    with pytest.raises(CrdError) as err:
        crds.fetch(url)
    actual = hashlib.sha256(b"not the pinned file\n").hexdigest()
    assert f"{pin.url(url)}: sha256 {actual}, expected {pin.sha256}" in str(err.value)
    assert not crds.cache_path().exists() and list(crds.cache_path().parent.iterdir()) == []
    (root / pin.repository / pin.commit / pin.path).unlink()
    with pytest.raises(CrdError, match=f"cannot fetch {LWS} from {pin.url(url)}: HTTP 404 "):
        crds.fetch(url)


def test_the_bootstrap_entry_point(upstream: tuple[str, Path], cache_home: Path, tmp_path: Path) -> None:
    """scripts/bootstrap.sh runs `python -m serving.pulumi.crds fetch`: in the checkout (CI's offline mirror) it
    verifies; elsewhere it fetches into the cache, then verifies."""
    url, _ = upstream
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}

    def fetch(cwd: Path) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "serving.pulumi.crds", "fetch", "--base-url", url]
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)

    if (REPO.parent / "shared" / "crds").is_dir():
        r = fetch(REPO)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"crds: verified 9 pinned CRDs in {(REPO.parent / 'shared' / 'crds').resolve()}\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    r = fetch(empty)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"crds: fetched 9 pinned CRDs in {crds.cache_path()}\n"
    r = fetch(empty)
    assert r.stdout == f"crds: verified 9 pinned CRDs in {crds.cache_path()}\n"
    proj = project(tmp_path, mirror=False)
    shutil.copytree(crds.cache_path(), tmp_path / "shared" / "crds")
    (tmp_path / "shared" / "crds" / LWS).unlink()
    r = fetch(proj)  # in a project whose ../shared/crds lacks a pinned file
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"error: {(tmp_path / 'shared' / 'crds').resolve() / LWS} is missing")
