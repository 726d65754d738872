"""The operator's own credentials (issue 40, item 5): `exaserve rollout` and `status` reach the API server with a
kubeconfig as kubectl and the Pulumi provider do — an exec credential plugin's token, renewed as it expires, the stack
file's ``kubernetes:context`` — against the API-server stand-in, which answers 401 to any other bearer token, as the
API server answers a request no authenticator accepts. The kubeconfig is read by the official client library
(``kubernetes.config``); what is ours is the loading order and the refusals, tested here."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from serving import kubeapi
from serving.cli.runtime import _versions
from serving.kubeapi import KubeApi, KubeConfigError
from serving.rollout.operation import BackendConfig
from serving.spec.stack import load_stack_file
from tests.support.apiserver import RELEASES, ApiServerStandIn, k8s_spec
from tests.support.cli import exaserve, json_object
from tests.support.stacks import fleet_of, write_variant

# An exec credential plugin as `aws eks get-token` is one: it prints an ExecCredential on stdout. This one counts its
# runs in a file beside it and hands out "tok-<run>" (or always the same token), valid for ``valid_s`` seconds.
PLUGIN = """\
import json, sys, datetime, pathlib
runs = pathlib.Path(sys.argv[1])
n = len(runs.read_text().splitlines()) + 1 if runs.exists() else 1
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
if sys.argv[2] == "fail":
    print("error: not logged in; run 'sso login'", file=sys.stderr)
    sys.exit(1)
token = sys.argv[2] if sys.argv[2] != "counting" else f"tok-{n}"
expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(sys.argv[3]))
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
"""


def kubeconfig(tmp_path: Path, contexts: dict[str, tuple[str, dict[str, Any]]], current: str) -> Path:
    """A kubeconfig with one cluster and user per context: name → (server URL, user entry)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, (url, _user) in contexts.items()],
        "users": [{"name": n, "user": user} for n, (_url, user) in contexts.items()],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in contexts],
        "current-context": current,
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def exec_user(tmp_path: Path, token: str, valid_s: float = 3600) -> dict[str, Any]:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    args = [str(plugin), str(tmp_path / "runs"), token, str(valid_s)]
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable, "args": args}}


def plugin_runs(tmp_path: Path) -> int:
    runs = tmp_path / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def clean_env(tmp_path: Path) -> dict[str, str]:
    """No ambient kubeconfig or pod: HOME without ~/.kube, KUBECONFIG and the service host unset."""
    return {"HOME": str(tmp_path / "home"), "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}


def k8s_stack(tmp_path: Path) -> Path:
    """A stack file of the dev stack with the stand-in's releases (the stand-in's fleet, ``k8s_spec(False)``)."""
    return write_variant(tmp_path, "k8s", base="dev", changes={"serving.releases": RELEASES})


def dry_run(tmp_path: Path, stack: Path, config: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """``exaserve rollout --to v2 --dry-run`` on ``stack`` with the kubeconfig ``config`` only (no ambient one)."""
    return exaserve("rollout", "--stack-file", str(stack), "--to", "v2", "--dry-run", *more, "--kubeconfig",
                    str(config), "--state-dir", str(tmp_path / "state"), env=clean_env(tmp_path))  # fmt: skip


def test_a_rollout_dry_run_reaches_the_cluster_with_only_a_kubeconfig_at_the_stacks_context(tmp_path: Path) -> None:
    """The kubeconfig's current context points elsewhere (a closed port); the stack file names the Pulumi provider's
    ``kubernetes:context``; its user is an exec plugin whose token the stand-in requires. The dry run plans from the
    versions it read through that context: every request carried the plugin's token."""
    stack = k8s_stack(tmp_path)
    doc = yaml.safe_load(stack.read_text())
    doc["config"]["kubernetes:context"] = "fleet"
    stack.write_text(yaml.safe_dump(doc, sort_keys=False))
    with ApiServerStandIn(k8s_spec(False), token="tok-1") as api:
        config = kubeconfig(
            tmp_path,
            {"fleet": (api.url, exec_user(tmp_path, "tok-1")), "other": ("http://127.0.0.1:9", {"token": "x"})},
            current="other",
        )
        r = dry_run(tmp_path, stack, config, "--json")
        seen = list(api.authorizations)
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json_object(r)
    assert plan["dry_run"] is True and plan["to_version"] == "v2" and plan["batches"], plan
    assert seen and set(seen) == {"Bearer tok-1"}, seen  # the version reads went through the plugin's token
    assert plugin_runs(tmp_path) >= 1


def test_without_the_plugins_token_the_api_server_refuses_and_the_rollout_says_so(tmp_path: Path) -> None:
    """The same cluster through a context whose plugin hands out another token: 401 on the first read, and the dry
    run fails naming the status, never a traceback (the stand-in is not kinder than the API server)."""
    stack = k8s_stack(tmp_path)
    with ApiServerStandIn(k8s_spec(False), token="tok-1") as api:
        config = kubeconfig(tmp_path, {"fleet": (api.url, exec_user(tmp_path, "stale"))}, current="fleet")
        r = dry_run(tmp_path, stack, config)
        seen = list(api.authorizations)
    assert r.returncode != 0 and "401" in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "did not accept the credentials of kubeconfig" in " ".join(r.stderr.split()) and "context fleet" in r.stderr
    assert seen and set(seen) == {"Bearer stale"}


def test_a_context_without_credentials_is_told_none_were_sent(tmp_path: Path) -> None:
    """The API server takes a request without credentials as system:anonymous and refuses it 403: the message says no
    credentials were sent rather than blaming the updater's Role."""
    stack = k8s_stack(tmp_path)
    with ApiServerStandIn(k8s_spec(False), token="tok-1") as api:
        config = kubeconfig(tmp_path, {"fleet": (api.url, {})}, current="fleet")
        r = dry_run(tmp_path, stack, config)
    assert r.returncode != 0 and "403" in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "no credentials were sent" in " ".join(r.stderr.split()), r.stderr


class LibraryClock:
    """The client library's clock (``datetime`` as ``kube_config._is_expired`` reads it), moved on by the test."""

    def __init__(self) -> None:
        self.ahead = dt.timedelta(0)
        clock = self

        class Now(dt.datetime):
            @classmethod
            def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
                return dt.datetime.now(tz) + clock.ahead

        self.module = types.SimpleNamespace(datetime=Now, timedelta=dt.timedelta, timezone=dt.timezone)


def reads(kube: KubeApi, path: str, n: int) -> list[int]:
    async def go() -> list[int]:
        async with kube.client() as http:
            return [(await http.get(path)).status_code for _ in range(n)]

    return asyncio.run(go())


def test_an_exec_plugins_token_is_renewed_within_5_minutes_of_its_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library treats a token within 5 minutes of its expirationTimestamp as expired (kube_config.py
    EXPIRY_SKEW_PREVENTION_DELAY) and runs the plugin again before the request: a rollout outlives EKS's 15-minute
    tokens. On the library's own clock, moved 56 minutes on for a token valid one hour."""
    from kubernetes.config import kube_config

    clock = LibraryClock()
    monkeypatch.setattr(kube_config, "datetime", clock.module)
    with ApiServerStandIn(k8s_spec(False)) as api:
        config = kubeconfig(tmp_path, {"fleet": (api.url, exec_user(tmp_path, "counting", 3600))}, current="fleet")
        kube = KubeApi.from_kubeconfig(config, None)
        assert reads(kube, api.pods_path, 2) == [200, 200]
        clock.ahead = dt.timedelta(minutes=56)
        assert reads(kube, api.pods_path, 1) == [200]
        seen = list(api.authorizations)
    assert seen == ["Bearer tok-1", "Bearer tok-1", "Bearer tok-2"] and plugin_runs(tmp_path) == 2, seen


def test_a_401_reloads_the_context_once_and_retries(tmp_path: Path) -> None:
    """client-go runs the plugin again on a 401 (a token revoked or rotated before its expiry, an OIDC token, whose
    expiry the library does not track): the stand-in's token changes while it serves; the next read is refused once,
    the context reloaded (the plugin's next token) and the read retried."""
    with ApiServerStandIn(k8s_spec(False), token="tok-1") as api:
        config = kubeconfig(tmp_path, {"fleet": (api.url, exec_user(tmp_path, "counting", 3600))}, current="fleet")
        kube = KubeApi.from_kubeconfig(config, None)
        assert reads(kube, api.pods_path, 1) == [200]
        api.token = "tok-2"
        assert reads(kube, api.pods_path, 1) == [200]
        api.token = "tok-9"  # a credential the plugin cannot give: one retry, then the 401 is the answer
        assert reads(kube, api.pods_path, 1) == [401]
        seen = list(api.authorizations)
    assert seen == ["Bearer tok-1", "Bearer tok-1", "Bearer tok-2", "Bearer tok-2", "Bearer tok-3"], seen


def test_many_requests_refused_at_once_renew_the_credential_once(tmp_path: Path) -> None:
    """A revoked token fails every request in flight (the updater reads a batch's pods in parallel): the context is
    reloaded once, by the first retry; the others find a token newer than the one refused and use it (client-go's
    refresh of a token still current only)."""
    with ApiServerStandIn(k8s_spec(False), token="tok-1") as api:
        config = kubeconfig(tmp_path, {"fleet": (api.url, exec_user(tmp_path, "counting", 3600))}, current="fleet")
        kube = KubeApi.from_kubeconfig(config, None)
        api.token = "tok-2"

        async def at_once() -> list[int]:
            async with kube.client() as http:
                answers = await asyncio.gather(*(http.get(api.pods_path) for _ in range(8)))
            return [a.status_code for a in answers]

        assert asyncio.run(at_once()) == [200] * 8
    assert plugin_runs(tmp_path) == 2  # the load, and one renewal


def test_in_cluster_rereads_the_rotated_token_and_brackets_an_ipv6_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-go's InClusterConfig: both KUBERNETES_SERVICE_HOST and _PORT, the host joined as JoinHostPort does, the
    service account's token file read again (the kubelet rotates a bound token). The HTTP exchange is httpx's mock
    transport: what is checked is the header each request carried."""
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("first\n")
    monkeypatch.setattr(kubeapi, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(KubeConfigError, match="not running in a pod"):
        KubeApi.in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    kube = KubeApi.in_cluster()
    assert kube.server == "https://[fd00::1]:443" and kube.ca_file == account / "ca.crt"
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(200)

    with httpx.Client(transport=httpx.MockTransport(answer), auth=kube.auth) as http:
        http.get("https://[fd00::1]:443/api")
        (account / "token").write_text("rotated\n")
        http.get("https://[fd00::1]:443/api")  # within the minute: the token read then
        monkeypatch.setattr(kubeapi, "TOKEN_REREAD_S", 0.0)  # a minute on
        http.get("https://[fd00::1]:443/api")
    assert seen == ["Bearer first", "Bearer first", "Bearer rotated"]


def test_a_failing_plugin_a_missing_context_and_skipped_tls_verification_are_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    failing = kubeconfig(tmp_path, {"fleet": ("http://127.0.0.1:9", exec_user(tmp_path, "fail"))}, current="fleet")
    with pytest.raises(KubeConfigError) as failed:
        KubeApi.from_kubeconfig(failing, None)
    assert "exec: process returned 1" in str(failed.value) and "not logged in" in str(failed.value)
    assert "run the plugin by hand" in str(failed.value)
    with pytest.raises(KubeConfigError, match=r"context 'nope' not found.*name one of the file's contexts"):
        KubeApi.from_kubeconfig(failing, "nope")
    insecure = tmp_path / "insecure"
    insecure.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://10.0.0.1", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    with pytest.raises(KubeConfigError, match=r"insecure-skip-tls-verify is set.*certificate-authority"):
        KubeApi.from_kubeconfig(insecure, None)
    with pytest.raises(KubeConfigError, match="pass one way to the API server"):
        KubeApi.resolve(server="https://10.0.0.1", kubeconfig=failing)
    with pytest.raises(KubeConfigError, match="no such file"):
        KubeApi.resolve(kubeconfig=tmp_path / "absent")
    garbage = tmp_path / "garbage"
    garbage.write_text("users:\n- name: u\n  user:\n    token: SECRETTOKEN123 : x\n")
    with pytest.raises(KubeConfigError, match="not a readable YAML kubeconfig") as unreadable:
        KubeApi.from_kubeconfig(garbage, None)
    assert "SECRETTOKEN123" not in str(unreadable.value) and "line 4" in str(unreadable.value), unreadable.value
    # an oidc user the library cannot use: its error names the user entry, whose secrets must not be quoted
    secrets = {"client-secret": "S3CRET", "refresh-token": "R3FRESH"}
    oidc = {"auth-provider": {"name": "oidc", "config": {"client-id": "x", "idp-issuer-url": "https://i", **secrets}}}
    leaky = kubeconfig(tmp_path, {"fleet": ("https://10.0.0.1", oidc)}, current="fleet")
    with pytest.raises(KubeConfigError) as refused:
        KubeApi.from_kubeconfig(leaky, None)
    assert "S3CRET" not in str(refused.value) and "R3FRESH" not in str(refused.value), refused.value
    assert "context fleet" in str(refused.value)
    serverless = tmp_path / "serverless"
    serverless.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"certificate-authority-data": "eA=="}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    with pytest.raises(KubeConfigError, match="no current-context; pass --kube-context NAME"):
        KubeApi.from_kubeconfig(serverless, None)
    with pytest.raises(KubeConfigError, match="no server"):
        KubeApi.from_kubeconfig(serverless, "c")  # --kube-context works without a current-context


def test_a_proxy_is_the_clusters_proxy_url_and_otherwise_the_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client library copies HTTPS_PROXY into every configuration; handed to httpx that would send a NO_PROXY
    host (a loopback kubectl proxy) through it. A cluster's proxy-url is used; otherwise httpx reads the environment
    (HTTPS_PROXY with NO_PROXY), as kubectl does."""
    monkeypatch.setenv("HTTPS_PROXY", "http://corp:3128")
    monkeypatch.setenv("NO_PROXY", "10.0.0.1")
    doc = {
        "clusters": [
            {"name": "plain", "cluster": {"server": "https://10.0.0.1"}},
            {"name": "proxied", "cluster": {"server": "https://10.0.0.2", "proxy-url": "http://bastion:8888"}},
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in ("plain", "proxied")],
        "current-context": "plain",
    }
    path = tmp_path / "proxies"
    path.write_text(yaml.safe_dump(doc))
    assert KubeApi.from_kubeconfig(path, None).proxy is None
    assert KubeApi.from_kubeconfig(path, "proxied").proxy == "http://bastion:8888"


def test_the_loading_order_is_client_gos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--kube-server first; then --kubeconfig, $KUBECONFIG or ~/.kube/config at --kube-context, else the stack's
    context, else the file's current one; in-cluster only without any of them (clientcmd's loading rules)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    token = tmp_path / "token"
    token.write_text("t0\n")
    explicit = KubeApi.resolve(server="https://10.0.0.1:6443", token_file=token)
    assert (explicit.server, explicit.token) == ("https://10.0.0.1:6443", "t0")
    with pytest.raises(KubeConfigError, match=r"not running in a pod.*--kubeconfig"):
        KubeApi.resolve()
    config = kubeconfig(
        tmp_path,
        {"a": ("http://127.0.0.1:1", {"token": "ta"}), "b": ("http://127.0.0.1:2", {"token": "tb"})},
        current="a",
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert KubeApi.resolve().server == "http://127.0.0.1:1"  # the current context
    assert KubeApi.resolve(stack_context="b").server == "http://127.0.0.1:2"  # the stack's (Pulumi's) context
    assert KubeApi.resolve(context="a", stack_context="b").server == "http://127.0.0.1:1"  # the flag wins
    home_config = tmp_path / "home" / ".kube" / "config"
    home_config.parent.mkdir(parents=True)
    home_config.write_text(config.read_text())
    monkeypatch.delenv("KUBECONFIG")
    assert KubeApi.resolve(context="b").source.endswith("context b")  # ~/.kube/config when it exists
    # $KUBECONFIG lists files: missing ones are skipped, the first current-context wins (client-go; the client
    # library alone takes the last file's); none of them there: in-cluster, not ~/.kube/config (client-go reads the
    # home file only when KUBECONFIG is unset)
    second = tmp_path / "second"
    second.write_text(yaml.safe_dump({"current-context": "b", "contexts": [], "clusters": [], "users": []}))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{config}:{second}")
    assert KubeApi.resolve().server == "http://127.0.0.1:1"
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{second}:{config}")
    assert KubeApi.resolve().server == "http://127.0.0.1:2"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(KubeConfigError, match="not running in a pod"):
        KubeApi.resolve()  # in-cluster is the last resort (client-go's IsEmptyConfig → in-cluster)


def test_status_reads_versions_through_a_kubeconfig(tmp_path: Path) -> None:
    """`status`'s version column, as a rollout reads it, through the kubeconfig flag (no controller needed for the
    column: the reading is :func:`serving.cli.runtime._versions`)."""
    stack = load_stack_file(k8s_stack(tmp_path))
    fleet = fleet_of(stack.spec, stack.name)
    with ApiServerStandIn(k8s_spec(False), token="tok-1") as api:
        config = kubeconfig(tmp_path, {"fleet": (api.url, exec_user(tmp_path, "tok-1"))}, current="fleet")
        access = BackendConfig("kubernetes", kubeconfig=config)
        versions, why = asyncio.run(_versions(stack, fleet, access, tmp_path / "state"))
    assert why is None and versions and set(versions.values()) == {"v1"}, (why, versions)
