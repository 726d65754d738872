"""The runtime image (issue 40, item 2; issue 42): one name from the stack to the pods to the workflow's push, a
lock of only what the controller and the agent import, and a Dockerfile whose last stage holds the venv alone.

The image itself is built, from this same Dockerfile on a base made from Debian's packages, by
``scripts/build-image.sh --local-base DIR`` (root, debootstrap, buildah, minutes of downloads: not part of the suite;
docs/infra.md, "The image", has its last result).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import yaml

from serving.plan.loader import load_fleet
from serving.render.k8s import runtime
from serving.render.k8s.runtime import RUNTIME_UID
from serving.spec.schema import image_repository, pinned_image
from serving.spec.stack import load_stack
from tests.support.cli import exaserve
from tests.support.lockfile import pins
from tests.support.paths import REPO

DIGEST = "sha256:" + "5e" * 32


def test_one_image_name_from_the_stack_through_the_pods_to_the_workflows_push() -> None:
    """Before: the workflow pushed IMAGE_REGISTRY/exaserve/exaserve-deploy, prod's pods pulled
    registry.exaserve.internal/mirror/exaserve/exaserve-deploy (render adds the mirror), and the job summary told the
    operator to set runtime.image to the pushed name with its registry, which render would prefix again."""
    st = load_stack("prod")
    pods = [c["image"] for o in runtime.render(load_fleet(st.name, st.spec)) for c in _containers(o)]
    assert len(pods) == 2  # the controller and the agent
    printed = exaserve("image", "--stack", "prod")
    assert printed.returncode == 0, printed.stderr
    pulled = printed.stdout.strip()
    assert (
        {image_repository(p) for p in pods}
        == {pulled}
        == {"registry.exaserve.internal/mirror/exaserve/exaserve-deploy"}
    )
    tagged = exaserve("image", "--stack", "prod", "--tag", "0.1.0").stdout.strip()
    assert tagged == f"{pulled}:0.1.0" and tagged in pods  # prod's tag, through its mirror: what the pods pull
    field = exaserve("image", "--stack", "prod", "--tag", "0.1.0", "--digest", DIGEST).stdout.strip()
    # the value to set is the stack's own repository (render adds the mirror once), pinned as the schema demands
    assert field == f"{image_repository(st.spec.runtime.image)}:0.1.0@{DIGEST}" == pinned_image(field)
    pinned = st.spec.model_copy(update={"runtime": st.spec.runtime.model_copy(update={"image": field})})
    assert {c["image"] for o in runtime.render(load_fleet(st.name, pinned)) for c in _containers(o)} == {
        f"{pulled}:0.1.0@{DIGEST}"
    }
    # the workflow pushes what `exaserve image` prints and publishes what it prints for the pushed digest
    steps = yaml.safe_load((REPO / ".github/workflows/image.yml").read_text())["jobs"]["image"]["steps"]
    run = "\n".join(s.get("run", "") for s in steps)
    assert 'IMAGE=$(exaserve image --stack prod --tag "$version")' in run
    assert 'scripts/build-image.sh --tag "$IMAGE"' in run and 'docker push --quiet "$IMAGE"' in run
    assert 'exaserve image --stack prod --tag "$VERSION" --digest "${pushed#*@}"' in run
    assert "GITHUB_TOKEN" not in (REPO / ".github/workflows/image.yml").read_text()  # one registry's token only


def test_image_refuses_a_bad_tag_or_digest_naming_the_value() -> None:
    bad_tag = exaserve("image", "--stack", "prod", "--tag", "-x")
    assert bad_tag.returncode == 2 and "--tag '-x' is not an image tag" in bad_tag.stderr
    bad_digest = exaserve("image", "--stack", "prod", "--digest", "sha256:abc")
    assert bad_digest.returncode == 2 and "--digest 'sha256:abc'" in bad_digest.stderr
    assert "Traceback" not in bad_tag.stderr + bad_digest.stderr


def _containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("containers", []), *spec.get("initContainers", [])]


def test_the_image_lock_is_the_image_group_of_the_one_resolution() -> None:
    """requirements-image.lock (scripts/lock.sh, pyproject.toml's `image` group) pins each package at the version and
    hashes requirements.lock pins it (one resolution), and leaves the operator's tools out."""
    image, package = pins(REPO / "requirements-image.lock"), pins(REPO / "requirements.lock")
    assert image and not {n: v for n, v in image.items() if package.get(n) != v}, "pinned apart from requirements.lock"
    assert not {"pulumi", "ansible-core", "matplotlib", "numpy", "smg", "kubernetes-validate", "paramiko"} & set(image)
    # the pods reach the API server in-cluster (serving.kubeapi over httpx); the kubernetes client (126 MB installed)
    # only reads an operator's kubeconfig
    assert "kubernetes" not in image
    assert {"pydantic", "typer", "httpx", "aiohttp", "prometheus-client"} <= set(image)
    # the SBOM's writer is a lock of its own: the install stage's throwaway venv, never the image's
    sbom = pins(REPO / "requirements-sbom.lock")
    assert "cyclonedx-bom" in sbom and "cyclonedx-bom" not in image and "cyclonedx-bom" not in package
    assert not {n: v for n, v in sbom.items() if n in image and image[n] != v}, "one resolution for both"


# A Python that refuses to import what the image lacks: every module of a distribution requirements-image.lock does
# not pin (the exaserve wheel itself goes in with --no-deps).
BLOCKER = textwrap.dedent(
    """
    import importlib.abc, importlib.metadata, re, sys
    allowed = {n.lower() for n in re.findall(r"^([A-Za-z0-9._-]+)==", open(sys.argv[1]).read(), re.M)}
    allowed.add("exaserve-deploy")
    dists = importlib.metadata.packages_distributions()
    def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
    class NotInTheImage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            providers = dists.get(name.split(".")[0], [])
            if providers and not {norm(p) for p in providers} & allowed:
                raise ModuleNotFoundError(f"{name} ({', '.join(providers)}) is not in the image", name=name)
            return None
    sys.meta_path.insert(0, NotInTheImage())
    what = sys.argv[2:]
    if what[0] == "import":
        import importlib
        for module in what[1:]:
            importlib.import_module(module)
        print("imported")
    else:
        sys.argv = ["exaserve", *what]
        from serving.cli.main import main
        main()
    """
)


def _in_the_image(*what: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, str(REPO / "requirements-image.lock"), *what],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_controller_and_the_agent_run_with_only_what_the_image_installs() -> None:
    """Every command the image's pods run, and every module of the controller's and the agent's Kubernetes path with
    the library they import on first use (the warm-up's HTTP client), under an import hook that
    refuses every distribution requirements-image.lock does not pin; a command of the operator's (render: Pulumi)
    fails there, which shows the hook refuses."""
    for command in (["--version"], ["controller", "run", "--help"], ["agent", "run", "--help"]):
        r = _in_the_image(*command)
        assert r.returncode == 0 and "not in the image" not in r.stderr, (command, r.stderr[-2000:])
    modules = sorted(f"serving.runtime.{p.stem}" for p in (REPO / "serving/runtime").glob("*.py"))
    r = _in_the_image("import", *modules, "serving.cli.runtime", "serving.kubeapi", "aiohttp")
    assert r.returncode == 0 and r.stdout.strip() == "imported", r.stderr[-2000:]
    render = _in_the_image("render", "--help")
    assert render.returncode != 0 and "is not in the image" in render.stderr, render.stderr[-2000:]


def test_the_dockerfile_ships_the_venv_alone_as_the_pods_user() -> None:
    """The last stage copies /opt/exaserve from the install stage and nothing of the build context (before: one stage
    whose COPY layer kept every wheel, ~134 MB); it runs as the pods' runAsUser; image-install.sh installs the hashed
    image lock and the wheel without its dependencies, and refuses a context without the lock (before: an unhashed
    install of the wheel's own ranges)."""
    stages = re.split(r"^FROM ", (REPO / "Dockerfile").read_text(), flags=re.M)[1:]
    assert len(stages) == 2 and stages[0].startswith("${BASE} AS install") and stages[1].startswith("${BASE}\n")
    last = stages[1]
    assert re.findall(r"^COPY .*", last, re.M) == ["COPY --from=install /opt/exaserve /opt/exaserve"]
    assert f"USER {RUNTIME_UID}:{RUNTIME_UID}" in last and f"--uid {RUNTIME_UID}" in last
    install = (REPO / "scripts/image-install.sh").read_text()
    assert '--require-hashes -r "$lock"' in install and '--no-deps "$ctx"/dist/*.whl' in install
    refused = subprocess.run(
        ["sh", str(REPO / "scripts/image-install.sh"), str(REPO / "tests")], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2 and "no " in refused.stderr and "requirements-image.lock" in refused.stderr
