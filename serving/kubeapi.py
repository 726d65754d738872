"""Where the Kubernetes API server is and how to authenticate to it: one place for the updater, the controllers, the
agents and ``status``.

Three sources, in the order of client-go's loading rules (``clientcmd.ClientConfigLoadingRules`` and
``DeferredLoadingClientConfig``, what ``kubectl`` and the Pulumi provider use):

1. an explicit server (``--kube-server``) with a bearer token file and a CA bundle;
2. a kubeconfig: ``--kubeconfig`` (one file), else ``$KUBECONFIG`` (a list of files, merged; missing ones skipped),
   else ``~/.kube/config`` when it exists; its context ``--kube-context``, else the stack's ``kubernetes:context``
   (the Pulumi provider's), else the ``current-context`` of the first file that sets one (client-go's merge: the first
   file wins; the client library alone would take the last);
3. none of them: in a pod, its service account (``/var/run/secrets/kubernetes.io/serviceaccount``), the token file
   read again every minute (bound service-account tokens rotate).

A kubeconfig is read by the official client library (``kubernetes.config``), so the ways platform teams authenticate
work: exec credential plugins (``aws eks get-token``, ``gke-gcloud-auth-plugin``, ``kubelogin``), the ``oidc`` auth
provider, client certificates, token files. Credentials are renewed as client-go renews them (:class:`_KubeconfigAuth`):
a token within 5 minutes of its ``expirationTimestamp`` makes the library run the exec plugin again before the request,
and any 401 reloads the context once and retries (an OIDC token, a plugin that gives no expiry). The plugin runs in a
worker thread, never on the event loop that renews the batch Lease. Not renewed: a client certificate an exec plugin
issued (Python's TLS takes certificates once per client), and an OIDC refresh token that the identity provider rotates
is not written back to the kubeconfig (kubectl writes it). Python's TLS takes certificates only as files: the library
writes a kubeconfig's certificate and key data to private (0600) temporary files and removes them at exit.

Refused, with the fix: plain HTTP to anything but a loopback address (a local ``kubectl proxy`` or test stand-in),
``insecure-skip-tls-verify`` (exaserve verifies the API server's certificate), ``tls-server-name``, a context that is
not in the file, a cluster without a server, an exec plugin that fails (its own message quoted, never a credential).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import ssl
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from serving.fleet_http import ca_tls, http_client

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
TOKEN_REREAD_S = 60.0  # client-go's cached token file source re-reads a rotated service-account token each minute


class KubeConfigError(Exception):
    """The API server cannot be reached as configured: what is wrong, the value, and the fix."""


class KubeCredentialError(httpx.RequestError):
    """A credential could not be renewed before a request (the exec plugin failed, an OIDC refresh was refused): a
    request error, so every caller that handles an unanswered request handles it."""


class _KubeconfigAuth(httpx.Auth):
    """The ``Authorization`` header of a kubeconfig context, asked of the client library before every request (it runs
    the exec plugin again once the last token is within 5 minutes of expiring); on a 401 the context is loaded again,
    unless another request already did since this one's token was taken (client-go refreshes only a token still
    current), and the request retried once. The library's calls run in one worker thread of their own, one at a time:
    never on the event loop, never holding the loop's default executor."""

    def __init__(self, load: Callable[[], Any], configuration: Any, source: str) -> None:
        """``configuration``: the context as ``load`` last loaded it."""
        self._load = load
        self._configuration = configuration
        self._source = source
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kube-credentials")

    def _header(self, request: httpx.Request, failed: str | None = None) -> str | None:
        """The header to send; with ``failed`` (the header a 401 refused), a renewed one first."""
        with self._lock, _plugin_messages() as said:  # the library logs a failed refresh: kept off the root logger
            try:
                if failed is not None and self._configuration.get_api_key_with_prefix("BearerToken") == failed:
                    self._configuration = self._load()
                value = self._configuration.get_api_key_with_prefix("BearerToken")
            except KubeConfigError as exc:
                raise KubeCredentialError(str(exc), request=request) from None
            except Exception as exc:  # the library's refresh raises whatever its transport raises
                text = f"{self._source}: renewing the credential failed: {_redacted(exc)}"
                raise KubeCredentialError(text, request=request) from None
            if said and failed is not None:
                raise KubeCredentialError(
                    f"{self._source}: renewing the credential failed: {'; '.join(said)}", request=request
                )
            return str(value) if value else None

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.read()  # a 401's retry sends the body again
        sent = self._header(request)
        if sent:
            request.headers["Authorization"] = sent
        response = yield request
        renewed = self._header(request, sent or "") if response.status_code == 401 else None
        if renewed and renewed != sent:
            request.headers["Authorization"] = renewed
            yield request

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        await request.aread()
        loop = asyncio.get_running_loop()
        sent = await loop.run_in_executor(self._executor, self._header, request)
        if sent:
            request.headers["Authorization"] = sent
        response = yield request
        if response.status_code == 401:
            renewed = await loop.run_in_executor(self._executor, self._header, request, sent or "")
            if renewed and renewed != sent:
                request.headers["Authorization"] = renewed
                yield request


class _TokenFileAuth(httpx.Auth):
    """A service account's token, read from its file again once a minute (a bound token is rotated by the kubelet)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._token = ""
        self._read_at = -TOKEN_REREAD_S

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        now = time.monotonic()
        if now - self._read_at >= TOKEN_REREAD_S:
            try:
                self._token = self._path.read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                if not self._token:
                    raise KubeCredentialError(f"{self._path}: {exc}", request=request) from None
            self._read_at = now
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


@dataclass(frozen=True)
class KubeApi:
    """The API server's URL and the credentials to reach it: a bearer ``token`` and a ``ca_file`` (explicit), or an
    ``auth`` that renews them (a kubeconfig context's, the service account's), a client ``cert`` and a ``proxy``."""

    server: str
    token: str | None = None
    ca_file: Path | None = None
    auth: httpx.Auth | None = None
    cert: tuple[str, str] | None = None  # client certificate and key files
    proxy: str | None = None
    source: str = "--kube-server"  # whose credentials, for messages: "in-cluster", "kubeconfig FILE, context NAME"

    @classmethod
    def in_cluster(cls) -> KubeApi:
        """The pod's service account (client-go ``rest.InClusterConfig``: both variables set, or not in a pod)."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeConfigError(
                "not running in a pod (KUBERNETES_SERVICE_HOST/PORT unset) and no kubeconfig found: pass --kubeconfig "
                "FILE (or set KUBECONFIG), or the API server URL, a token file and its CA bundle (--kube-server, "
                "--kube-token-file, --kube-ca-file)"
            )
        token = SERVICE_ACCOUNT / "token"
        if not token.is_file():
            raise KubeConfigError(f"in-cluster: no service account token at {token}; mount the pod's service account")
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return cls(server, ca_file=SERVICE_ACCOUNT / "ca.crt", auth=_TokenFileAuth(token), source="in-cluster")

    @classmethod
    def explicit(cls, server: str, token_file: Path | None, ca_file: Path | None) -> KubeApi:
        try:
            token = token_file.read_text().strip() if token_file else None
        except OSError as exc:
            raise KubeConfigError(f"--kube-token-file {token_file}: {exc.strerror or exc}") from None
        return cls(server, token, ca_file)

    @classmethod
    def from_kubeconfig(cls, path: Path | None, context: str | None) -> KubeApi:
        """The API server of ``context`` (None: the current context) in the kubeconfig ``path`` (None: the files of
        ``$KUBECONFIG`` or ``~/.kube/config``)."""
        files = kubeconfig_files(path)
        where = os.pathsep.join(str(f) for f in files) or str(path or DEFAULT_KUBECONFIG)
        if not files:
            raise KubeConfigError(f"kubeconfig {where}: no such file; pass --kubeconfig FILE or set KUBECONFIG")
        found = _contexts(files)
        names, name = found.names, context or found.current
        if not name:
            raise KubeConfigError(
                f"kubeconfig {where}: no current-context; pass --kube-context NAME (the file's: {', '.join(names)})"
            )
        if name not in names:
            raise KubeConfigError(
                f"kubeconfig {where}: context {name!r} not found; name one of the file's contexts "
                f"({', '.join(names) or 'it has none'})"
            )
        source = f"kubeconfig {where}, context {name}"

        def load() -> Any:
            return _load_context(where, name, source)

        configuration = load()
        if not configuration.host:
            raise KubeConfigError(f"{source}: its cluster has no server; give the cluster's server URL")
        if not configuration.verify_ssl:
            raise KubeConfigError(
                f"{source}: insecure-skip-tls-verify is set; exaserve verifies the API server's certificate: give the "
                "cluster's certificate-authority(-data) instead"
            )
        if getattr(configuration, "tls_server_name", None):
            raise KubeConfigError(
                f"{source}: tls-server-name is not supported; reach the API server by a name its certificate carries"
            )
        token = configuration.api_key.get("BearerToken")
        cert_file, key_file = configuration.cert_file, configuration.key_file
        return cls(
            configuration.host,
            ca_file=Path(configuration.ssl_ca_cert) if configuration.ssl_ca_cert else None,
            auth=_KubeconfigAuth(load, configuration, source) if token else None,
            cert=(cert_file, key_file) if cert_file and key_file else None,
            proxy=found.proxies.get(name),  # not the library's HTTPS_PROXY copy: httpx reads the environment itself
            source=source,
        )

    @classmethod
    def resolve(
        cls,
        *,
        server: str | None = None,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        kubeconfig: Path | None = None,
        context: str | None = None,
        stack_context: str | None = None,
    ) -> KubeApi:
        """The loading rules of the module docstring: ``server`` (with ``token_file``, ``ca_file``), else a kubeconfig
        (``kubeconfig``, ``$KUBECONFIG`` or an existing ``~/.kube/config``) at ``context`` or the stack's
        ``stack_context``, else in-cluster."""
        if server is not None:
            if kubeconfig is not None or context is not None:
                raise KubeConfigError(
                    "--kube-server and --kubeconfig/--kube-context both given: pass one way to the API server"
                )
            return cls.explicit(server, token_file, ca_file)
        if token_file is not None or ca_file is not None:
            raise KubeConfigError("--kube-token-file and --kube-ca-file go with --kube-server: pass the server's URL")
        if kubeconfig is not None and not kubeconfig.is_file():
            raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file; pass the path of a kubeconfig")
        if kubeconfig_files(kubeconfig):
            return cls.from_kubeconfig(kubeconfig, context or stack_context)
        if context is not None:
            raise KubeConfigError(
                f"--kube-context {context}: no kubeconfig to take it from (no --kubeconfig, no file of KUBECONFIG, no "
                f"{DEFAULT_KUBECONFIG}); pass --kubeconfig FILE"
            )
        return cls.in_cluster()

    def client(self, timeout_s: float = 10.0, **kwargs: Any) -> httpx.AsyncClient:
        """An HTTP client of the API server: its base URL, credentials and trust."""
        url = urlsplit(self.server)
        if url.scheme == "http" and not _loopback(url.hostname or ""):
            raise KubeConfigError(
                f"{self.server} ({self.source}): plain HTTP is allowed only to a loopback proxy; use https://"
            )
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.cert is None:
            verify = ca_tls(str(self.ca_file) if self.ca_file else None)
        else:  # a context of its own: the process's shared one must not present the operator's certificate
            ca = str(self.ca_file) if self.ca_file else None
            verify = httpx.create_ssl_context() if ca is None else ssl.create_default_context(cafile=ca)
            verify.load_cert_chain(*self.cert)
        return http_client(
            base_url=self.server,
            headers=headers,
            auth=self.auth,
            verify=verify,
            proxy=self.proxy,
            timeout=timeout_s,
            **kwargs,
        )


def kubeconfig_files(path: Path | None) -> list[Path]:
    """The kubeconfig files client-go would read: ``path`` (one file, as given), else the existing files of
    ``$KUBECONFIG``, else ``~/.kube/config`` if it exists."""
    if path is not None:
        return [path]
    listed = os.environ.get("KUBECONFIG", "")
    if listed:
        return [Path(p).expanduser() for p in listed.split(os.pathsep) if p and Path(p).expanduser().is_file()]
    default = DEFAULT_KUBECONFIG.expanduser()
    return [default] if default.is_file() else []


@dataclass(frozen=True)
class _Contexts:
    """What client-go's merge of the files gives: every context's name (the first file to name one wins), the first
    current-context set, and each context's cluster ``proxy-url`` (None: the environment's proxy settings apply)."""

    names: list[str]
    current: str | None
    proxies: dict[str, str | None]


def _contexts(files: list[Path]) -> _Contexts:
    current: str | None = None
    clusters: dict[str, dict[str, Any]] = {}
    cluster_of: dict[str, str] = {}  # context → its cluster, the contexts in the order the files name them
    for f in files:
        try:
            with f.open(encoding="utf-8") as stream:  # a stream's YAML error quotes no source line (a token's)
                doc = yaml.safe_load(stream)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}" if where is not None else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise KubeConfigError(f"kubeconfig {f}: not a readable YAML kubeconfig ({problem}{at})") from None
        if not isinstance(doc, dict):
            continue
        for c in doc.get("clusters") or []:
            if isinstance(c, dict) and c.get("name") and isinstance(c.get("cluster"), dict):
                clusters.setdefault(str(c["name"]), c["cluster"])
        for c in doc.get("contexts") or []:
            if isinstance(c, dict) and c.get("name"):
                cluster_of.setdefault(str(c["name"]), str((c.get("context") or {}).get("cluster", "")))
        current = current or (str(doc["current-context"]) if doc.get("current-context") else None)
    proxies = {n: clusters.get(cluster, {}).get("proxy-url") for n, cluster in cluster_of.items()}
    return _Contexts(list(cluster_of), current, proxies)


def _load_context(where: str, name: str, source: str) -> Any:
    """A client ``Configuration`` of context ``name`` from the files ``where``, loaded by the client library."""
    from kubernetes.client import Configuration  # noqa: PLC0415 - the library costs ≈ 0.3 s; only here
    from kubernetes.config import load_kube_config  # noqa: PLC0415

    configuration = Configuration()
    try:
        with _plugin_messages() as failures:
            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=where, context=name, client_configuration=configuration, persist_config=False
            )
    except Exception as exc:  # the library raises ConfigException, YAML, OS and auth-provider errors
        raise KubeConfigError(f"{source}: {_redacted(exc)}; check it with kubectl config view --minify") from None
    if failures and not configuration.api_key.get("BearerToken") and not configuration.cert_file:
        said = "; ".join(failures)
        if "'NoneType' object has no attribute 'strip'" in said:  # on a terminal the plugin's stderr is not captured
            said = "its message is on the terminal above"
        raise KubeConfigError(
            f"{source}: its credential plugin gave no credential ({said}); run the plugin by hand to see why (a "
            "login, a missing tool, a profile), then try again"
        )
    return configuration


def _redacted(exc: BaseException) -> str:
    """An error's text without the Python mappings the client library quotes whole (it names a kubeconfig node by its
    file and the entry's repr, and a user entry holds its secrets); JSON a plugin printed (double quotes) stays."""
    return re.sub(r"\{'.*\}", "{…}", str(exc).strip() or type(exc).__name__)


@contextmanager
def _plugin_messages() -> Iterator[list[str]]:
    """What the client library logged (rather than raised) while a kubeconfig loaded: an exec plugin's failure
    (``exec: process returned 1. …``), for the error that names it."""
    records: list[str] = []
    handler = _Collect(records)
    logging.getLogger().addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger().removeHandler(handler)


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if record.pathname.endswith(("kube_config.py", "exec_provider.py")):
            self.into.append(_redacted(Exception(record.getMessage())))


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
