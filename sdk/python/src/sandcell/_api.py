"""Every API request as data (method, path, query, body, how to read the answer), shared by the
sync and async clients so that each of their methods only sends what is built here."""

from __future__ import annotations

import base64
import enum
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote, urlsplit

import httpx

from ._models import (
    Artifact,
    AutoSnapshot,
    Budgets,
    BuildEvent,
    BuildInfo,
    CodeEvent,
    CommandResult,
    Context,
    EgressEventList,
    Execution,
    ExecutionDone,
    ExecutionError,
    ExitStatus,
    ExportInfo,
    FileInfo,
    GitCloneResult,
    ImportResult,
    InferJob,
    Memory,
    MemoryList,
    MemorySearch,
    Metrics,
    Mount,
    MountInput,
    NetworkInfo,
    NetworkPolicyInput,
    OutputEvent,
    PackagesInput,
    PreviewInfo,
    PreviewRoute,
    ProcessInfo,
    ProcessOutput,
    Result,
    RunEvent,
    RunInfo,
    SandboxInfo,
    Secret,
    SecretInput,
    SecretState,
    SnapshotInfo,
    SnapshotPolicy,
    StepSandbox,
    TemplateInfo,
    ThreadInfo,
    Validate,
    Variables,
    VolumeCarry,
    VolumeInfo,
)
from ._sse import SseEvent
from .errors import error_from_body

T = TypeVar("T")

# Seconds added to a command's own timeout before the HTTP read gives up: the daemon answers
# once the command is killed, which takes a moment after its timeout.
_TIMEOUT_MARGIN = 30.0


class Default(enum.Enum):
    """Marks "the client's own request timeout"."""

    TIMEOUT = 0


ReadTimeout = float | None | Default


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to turn its (successful) answer into a value."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Sequence[tuple[str, str]] = ()
    json: Any = None
    content: bytes | None = None
    read_timeout: ReadTimeout = Default.TIMEOUT


@dataclass(frozen=True)
class StreamCall(Generic[T]):
    """A request answered with server-sent events, and how each event becomes a value (None:
    skipped; an API error event raises)."""

    method: str
    path: str
    convert: Callable[[SseEvent], T | None]
    params: Sequence[tuple[str, str]] = ()
    json: Any = None
    headers: Sequence[tuple[str, str]] = ()


def _json(resp: httpx.Response) -> Any:
    return resp.json()


def _nothing(_resp: httpx.Response) -> None:
    return None


def _sb(sandbox_id: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{rest}"


def _ctx(sandbox_id: str, context: str, rest: str = "") -> str:
    return _sb(sandbox_id, f"/contexts/{quote(context, safe='')}{rest}")


def _drop_none(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def _pairs(what: str, value: Mapping[str, str] | str | None) -> list[tuple[str, str]]:
    """`label=k:v` query pairs from a mapping or one "k:v" string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [(what, value)]
    return [(what, f"{k}:{v}") for k, v in value.items()]


def _whole_secs(value: float | timedelta | None) -> int | None:
    if value is None:
        return None
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return math.ceil(secs)


def _command(cmd: str | Sequence[str]) -> dict[str, Any]:
    if isinstance(cmd, str):
        return {"cmd": cmd}
    return {"argv": list(cmd)}


def _wait_for(timeout: float | None, default_secs: float | None) -> ReadTimeout:
    """The HTTP read timeout of a request that waits for a command of this timeout."""
    secs = timeout if timeout is not None else default_secs
    return None if secs is None else secs + _TIMEOUT_MARGIN


# --- sandboxes ---------------------------------------------------------------------------


def create_sandbox(
    *,
    template: str | None,
    size: str | None,
    timeout: float | timedelta | None,
    ttl: float | timedelta | None,
    idle_timeout: float | timedelta | None,
    ephemeral: bool,
    labels: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    env: Mapping[str, str] | None,
    network: NetworkPolicyInput | None,
    packages: PackagesInput | None,
    secrets: Sequence[SecretInput] | None,
    mounts: Sequence[MountInput] | None,
    snapshot_id: str | None,
    backend: str | None,
    limits: Mapping[str, float] | None,
    kernels: Sequence[str] | None,
    checkpointable: bool,
    auto_snapshot: AutoSnapshot | None,
) -> Call[SandboxInfo]:
    """`POST /v1/sandboxes`. With packages, no read timeout: the daemon bounds an install
    itself (`packages.timeout_secs`), and a large one takes a while."""
    if timeout is not None and ttl is not None:
        raise ValueError("give timeout or ttl (both are the sandbox's lifetime), not both")
    body = _drop_none(
        {
            "template": template,
            "size": size,
            "timeout_secs": _whole_secs(timeout if timeout is not None else ttl),
            "idle_timeout_secs": _whole_secs(idle_timeout),
            "ephemeral": ephemeral or None,
            "labels": dict(labels) if labels else None,
            "metadata": dict(metadata) if metadata else None,
            "env": dict(env) if env else None,
            "network": _network(network) if network is not None else None,
            "packages": _packages(packages) if packages is not None else None,
            "secrets": _secrets(secrets) if secrets is not None else None,
            "mounts": _mounts(mounts) if mounts is not None else None,
            "snapshot_id": snapshot_id,
            "backend": backend,
            "limits": dict(limits) if limits else None,
            "kernels": list(kernels) if kernels else None,
            "checkpointable": checkpointable or None,
            "auto_snapshot": auto_snapshot.to_json() if auto_snapshot else None,
        }
    )
    return Call(
        "POST",
        "/v1/sandboxes",
        lambda r: SandboxInfo.from_json(r.json()),
        json=body,
        read_timeout=None if packages else Default.TIMEOUT,
    )


def get_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    """`GET /v1/sandboxes/{id}`."""
    return Call("GET", _sb(sandbox_id), lambda r: SandboxInfo.from_json(r.json()))


def list_sandboxes(
    *,
    label: Mapping[str, str] | str | None,
    metadata: Mapping[str, str] | str | None,
    state: str | Sequence[str] | None,
    cursor: str | None,
) -> Call[tuple[list[SandboxInfo], str | None]]:
    """`GET /v1/sandboxes`: one page and the cursor of the next."""
    params = _pairs("label", label) + _pairs("metadata", metadata)
    if state is not None:
        params.append(("state", state if isinstance(state, str) else ",".join(state)))
    params.append(("limit", "1000"))
    if cursor:
        params.append(("cursor", cursor))

    def parse(r: httpx.Response) -> tuple[list[SandboxInfo], str | None]:
        d = r.json()
        return [SandboxInfo.from_json(i) for i in d["items"]], d.get("next_cursor")

    return Call("GET", "/v1/sandboxes", parse, params=params)


def delete_sandbox(sandbox_id: str) -> Call[None]:
    """`DELETE /v1/sandboxes/{id}`."""
    return Call("DELETE", _sb(sandbox_id), _nothing)


def sandbox_action(sandbox_id: str, action: str) -> Call[SandboxInfo]:
    """`POST /v1/sandboxes/{id}/pause` or `…/resume`."""
    return Call("POST", _sb(sandbox_id, f"/{action}"), lambda r: SandboxInfo.from_json(r.json()))


def set_timeout(sandbox_id: str, timeout: float | timedelta) -> Call[SandboxInfo]:
    """`POST /v1/sandboxes/{id}/timeout`."""
    return Call(
        "POST",
        _sb(sandbox_id, "/timeout"),
        lambda r: SandboxInfo.from_json(r.json()),
        json={"timeout_secs": _whole_secs(timeout)},
    )


def _network(policy: NetworkPolicyInput) -> str | dict[str, Any]:
    """A network policy as sent: a name as it is, a list of rules as `{"allow": rules}`, a
    mapping as it is (its lists made lists). Only its shape is made here: the rules are the
    daemon's to judge (a bad one is an InvalidArgumentError naming it)."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, Mapping):
        return {str(k): v if isinstance(v, str) else list(v) for k, v in policy.items()}
    if isinstance(policy, Sequence):
        return {"allow": list(policy)}
    raise TypeError(
        f"network is 'off', 'loopback', 'full', a list of allow rules or {{'allow': [...]}}, "
        f"not {type(policy).__name__}"
    )


def _packages(packages: PackagesInput) -> dict[str, list[str]]:
    """Packages as sent: each installer's list made a list. Only its shape is checked here (a
    string where a list belongs would otherwise be sent as a list of letters); the installers
    and the names are the daemon's to judge (an unknown one is an InvalidArgumentError)."""
    if not isinstance(packages, Mapping):
        raise TypeError(
            f"packages is a mapping such as {{'pip': [...], 'npm': [...], 'r': [...]}}, "
            f"not {type(packages).__name__}"
        )
    sent: dict[str, list[str]] = {}
    for installer, names in packages.items():
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(
                f"packages[{installer!r}] is a list of package names, not {type(names).__name__}"
            )
        sent[str(installer)] = list(names)
    return sent


_SECRET_KEYS = ("name", "value", "hosts")


def _secrets(secrets: Sequence[SecretInput]) -> list[dict[str, Any]]:
    """Secrets as sent, `{"name", "value", "hosts"}` each. Only their shape is checked here (a
    string where a list belongs would otherwise be sent as a list of letters, and a misspelt
    key would be refused with less to go on); the names, values and host rules are the
    daemon's to judge (a bad one is an InvalidArgumentError naming the secret). No message
    here or there holds a value."""
    if isinstance(secrets, (str, bytes, Mapping, Secret)) or not isinstance(secrets, Sequence):
        raise TypeError(
            f"secrets is a list of Secret(name, value, hosts) or {{'name', 'value', 'hosts'}} "
            f"mappings, not {type(secrets).__name__}"
        )
    return [_secret(i, s) for i, s in enumerate(secrets)]


def _secret(i: int, secret: SecretInput) -> dict[str, Any]:
    where = f"secrets[{i}]"
    if isinstance(secret, Secret):
        name, value, hosts = secret.name, secret.value, secret.hosts
    elif isinstance(secret, Mapping):
        keys = set(secret)
        unknown = sorted(str(k) for k in keys - set(_SECRET_KEYS))
        missing = [k for k in _SECRET_KEYS if k not in keys]
        if unknown or missing:
            raise ValueError(
                f"{where} has the keys 'name', 'value' and 'hosts'"
                + (f"; unknown: {', '.join(map(repr, unknown))}" if unknown else "")
                + (f"; missing: {', '.join(map(repr, missing))}" if missing else "")
            )
        name, value, hosts = secret["name"], secret["value"], secret["hosts"]
    else:
        raise TypeError(f"{where} is a Secret or a mapping, not {type(secret).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"{where}: name is a str, not {type(name).__name__}")
    where = f"{where} ({name!r})"
    if not isinstance(value, str):
        raise TypeError(f"{where}: value is a str, not {type(value).__name__}")
    if isinstance(hosts, str) or not isinstance(hosts, Sequence):
        raise TypeError(
            f"{where}: hosts is a list of host rules such as ['api.example.com'], not {type(hosts).__name__}"
        )
    for host in hosts:
        if not isinstance(host, str):
            raise TypeError(f"{where}: each host is a str, not {type(host).__name__}")
    return {"name": name, "value": value, "hosts": list(hosts)}


_MOUNT_KEYS = ("host_path", "volume", "path", "mode")


def _mounts(mounts: Sequence[MountInput]) -> list[dict[str, Any]]:
    """Mounts as sent, `{"host_path" or "volume", "path", "mode"}` each (no `mode`: the
    daemon's default for the kind). Only their shape is checked here (a lone mount where a
    list belongs, a misspelt key, both sources or none); the folders, names, paths and modes
    are the daemon's to judge (a bad one is an InvalidArgumentError, a host folder outside
    its `mounts.allowed_paths` a PermissionDeniedError)."""
    if isinstance(mounts, (str, bytes, Mapping, Mount)) or not isinstance(mounts, Sequence):
        raise TypeError(
            f"mounts is a list of Mount(...) or {{'host_path' or 'volume', 'path', 'mode'}} "
            f"mappings, not {type(mounts).__name__}"
        )
    return [_mount(i, m) for i, m in enumerate(mounts)]


def _mount(i: int, mount: MountInput) -> dict[str, Any]:
    where = f"mounts[{i}]"
    if isinstance(mount, Mount):
        sent: dict[str, Any] = {
            "host_path": mount.host_path,
            "volume": mount.volume,
            "path": mount.path,
            "mode": mount.mode,
        }
    elif isinstance(mount, Mapping):
        unknown = sorted(str(k) for k in set(mount) - set(_MOUNT_KEYS))
        if unknown or "path" not in mount:
            raise ValueError(
                f"{where} has the keys 'path', 'host_path' or 'volume', and 'mode'"
                + (f"; unknown: {', '.join(map(repr, unknown))}" if unknown else "")
                + ("; missing: 'path'" if "path" not in mount else "")
            )
        sent = {k: mount.get(k) for k in _MOUNT_KEYS}
        if isinstance(sent["host_path"], os.PathLike):
            sent["host_path"] = os.fspath(sent["host_path"])
    else:
        raise TypeError(f"{where} is a Mount or a mapping, not {type(mount).__name__}")
    path = sent["path"]
    if not isinstance(path, str):
        raise TypeError(f"{where}: path is a str, not {type(path).__name__}")
    where = f"{where} ({path!r})"
    if (sent["host_path"] is None) == (sent["volume"] is None):
        raise ValueError(f"{where}: give host_path or volume (exactly one)")
    for key in ("host_path", "volume", "mode"):
        value = sent[key]
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{where}: {key} is a str, not {type(value).__name__}")
    return _drop_none(sent)


def get_network(sandbox_id: str) -> Call[NetworkInfo]:
    """`GET /v1/sandboxes/{id}/network`."""
    return Call("GET", _sb(sandbox_id, "/network"), lambda r: NetworkInfo.from_json(r.json()))


def set_network(sandbox_id: str, policy: NetworkPolicyInput) -> Call[NetworkInfo]:
    """`PUT /v1/sandboxes/{id}/network`."""
    return Call(
        "PUT",
        _sb(sandbox_id, "/network"),
        lambda r: NetworkInfo.from_json(r.json()),
        json={"network": _network(policy)},
    )


def _secret_states(r: httpx.Response) -> list[SecretState]:
    return [SecretState.from_json(s) for s in r.json()["secrets"]]


def get_secrets(sandbox_id: str) -> Call[list[SecretState]]:
    """`GET /v1/sandboxes/{id}/secrets`."""
    return Call("GET", _sb(sandbox_id, "/secrets"), _secret_states)


def set_secrets(sandbox_id: str, secrets: Sequence[SecretInput]) -> Call[list[SecretState]]:
    """`PUT /v1/sandboxes/{id}/secrets`."""
    return Call("PUT", _sb(sandbox_id, "/secrets"), _secret_states, json={"secrets": _secrets(secrets)})


def egress_events(sandbox_id: str, *, limit: int | None, before: int | None) -> Call[EgressEventList]:
    """`GET /v1/sandboxes/{id}/network/events`: one page, newest first, and the `before` of
    the next."""
    params = []
    if limit is not None:
        params.append(("limit", str(limit)))
    if before is not None:
        params.append(("before", str(before)))
    return Call(
        "GET",
        _sb(sandbox_id, "/network/events"),
        lambda r: EgressEventList.from_json(r.json()),
        params=params,
    )


def git_clone(
    sandbox_id: str,
    url: str,
    *,
    path: str | None,
    branch: str | None,
    depth: int | None,
    username: str | None,
    password: str | None,
) -> Call[GitCloneResult]:
    """`POST /v1/sandboxes/{id}/git/clone`. No read timeout: the daemon bounds a clone itself
    (and a large repository takes a while)."""
    body = {"url": url} | _drop_none(
        {"path": path, "branch": branch, "depth": depth, "username": username, "password": password}
    )
    return Call(
        "POST",
        _sb(sandbox_id, "/git/clone"),
        lambda r: GitCloneResult.from_json(r.json()),
        json=body,
        read_timeout=None,
    )


def create_preview(
    sandbox_id: str, port: int, *, ttl_secs: int | None, public: bool | None
) -> Call[PreviewInfo]:
    """`POST /v1/sandboxes/{id}/previews/{port}`: a token for the port (and, with `public`,
    the port opened to anyone or closed again)."""
    return Call(
        "POST",
        _sb(sandbox_id, f"/previews/{port}"),
        lambda r: PreviewInfo.from_json(r.json()),
        json=_drop_none({"ttl_secs": ttl_secs, "public": public}),
    )


PREVIEW_TOKEN_PARAM = "sandcell_token"
"""The query parameter a preview token travels in (the host route then keeps it in a cookie)."""


def check_port(port: int) -> int:
    """`port` if it is a port number (1 to 65535), else a ValueError: a host name is made of
    it without asking the daemon, which would refuse it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r} must be an integer from 1 to 65535")
    return port


def check_route(route: str) -> PreviewRoute:
    """`route` if it is `"host"` or `"path"`, else a ValueError (before a token is made)."""
    if route == "host":
        return "host"
    if route == "path":
        return "path"
    raise ValueError(f"route {route!r} must be 'host' or 'path'")


def _daemon_port(api_url: str) -> str:
    """`:port` of the daemon's URL; empty when it names none (the scheme's own then)."""
    port = urlsplit(api_url).port
    return f":{port}" if port is not None else ""


def preview_host(host_template: str, sandbox_id: str, port: int, api_url: str) -> str:
    """The host route's `host[:port]` for `port`: the sandbox's `preview_host`
    (`{port}-<id>.localhost`, made from the id if the daemon sent none) with the port put in,
    and the daemon's port (none when the client's URL names none: its scheme's default)."""
    template = host_template or f"{{port}}-{sandbox_id}.localhost"
    return template.replace("{port}", str(check_port(port))) + _daemon_port(api_url)


def preview_url(preview: PreviewInfo, api_url: str, route: PreviewRoute) -> str:
    """A URL of the port with the preview's token in its query: under the daemon's URL for the
    `path` route, at `{scheme}://{host}:{daemon port}/` for the `host` route."""
    token = f"?{PREVIEW_TOKEN_PARAM}={quote(preview.token, safe='')}"
    if check_route(route) == "path":
        return f"{api_url.rstrip('/')}{preview.path}{token}"
    scheme = urlsplit(api_url).scheme or "http"
    return f"{scheme}://{preview.host}{_daemon_port(api_url)}/{token}"


def metrics(sandbox_id: str) -> Call[Metrics]:
    """`GET /v1/sandboxes/{id}/metrics`."""
    return Call("GET", _sb(sandbox_id, "/metrics"), lambda r: Metrics.from_json(r.json()))


def system() -> Call[dict[str, Any]]:
    """`GET /v1/system`."""
    return Call("GET", "/v1/system", _json)


# --- commands and processes -------------------------------------------------------------


def _exec_body(
    cmd: str | Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
) -> dict[str, Any]:
    return _command(cmd) | _drop_none(
        {"env": dict(env) if env else None, "cwd": cwd, "timeout_secs": timeout}
    )


def exec_command(
    sandbox_id: str,
    cmd: str | Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: str | None,
    default_timeout: float | None,
) -> Call[CommandResult]:
    """`POST /v1/sandboxes/{id}/exec`."""
    body = _exec_body(cmd, env, cwd, timeout) | _drop_none({"stdin": stdin})
    return Call(
        "POST",
        _sb(sandbox_id, "/exec"),
        lambda r: CommandResult.from_json(r.json()),
        json=body,
        read_timeout=_wait_for(timeout, default_timeout),
    )


def output_event(ev: SseEvent) -> OutputEvent | None:
    """An exec or background-process stream event (an `error` event raises)."""
    d = ev.data
    if ev.name in ("stdout", "stderr"):
        stream: Literal["stdout", "stderr"] = "stdout" if ev.name == "stdout" else "stderr"
        return OutputEvent(stream, data=d["data"], offset=d.get("offset"), bytes=d.get("bytes"))
    if ev.name == "lost":
        return OutputEvent("lost", offset=d["offset"], bytes=d["bytes"], channel=d["channel"])
    if ev.name == "exit":
        return OutputEvent("done", exit=ExitStatus.from_json(d))
    if ev.name == "error":
        raise error_from_body(d, None)
    return None


def exec_stream(
    sandbox_id: str,
    cmd: str | Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: str | None,
) -> StreamCall[OutputEvent]:
    """`POST /v1/sandboxes/{id}/exec/stream`."""
    body = _exec_body(cmd, env, cwd, timeout) | _drop_none({"stdin": stdin})
    return StreamCall("POST", _sb(sandbox_id, "/exec/stream"), output_event, json=body)


def start_process(
    sandbox_id: str,
    cmd: str | Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    stdin: bool,
    pty: tuple[int, int] | None,
    buffer_bytes: int | None,
) -> Call[tuple[int, int]]:
    """`POST /v1/sandboxes/{id}/processes`: answers (pid, exec_id)."""
    body = _exec_body(cmd, env, cwd, timeout) | _drop_none(
        {
            "stdin": stdin or None,
            "pty": {"rows": pty[0], "cols": pty[1]} if pty else None,
            "buffer_bytes": buffer_bytes,
        }
    )

    def parse(r: httpx.Response) -> tuple[int, int]:
        d = r.json()
        return d["pid"], d["exec_id"]

    return Call("POST", _sb(sandbox_id, "/processes"), parse, json=body)


def _offsets(stdout_from: int | None, stderr_from: int | None) -> list[tuple[str, str]]:
    params = []
    if stdout_from is not None:
        params.append(("stdout_from", str(stdout_from)))
    if stderr_from is not None:
        params.append(("stderr_from", str(stderr_from)))
    return params


def process_stream(
    sandbox_id: str, pid: int, stdout_from: int | None, stderr_from: int | None
) -> StreamCall[OutputEvent]:
    """`GET /v1/sandboxes/{id}/processes/{pid}/stream`."""
    return StreamCall(
        "GET",
        _sb(sandbox_id, f"/processes/{pid}/stream"),
        output_event,
        params=_offsets(stdout_from, stderr_from),
    )


def process_output(
    sandbox_id: str, pid: int, stdout_from: int | None, stderr_from: int | None
) -> Call[ProcessOutput]:
    """`GET /v1/sandboxes/{id}/processes/{pid}/output`: waits for the end (no read timeout:
    a background process may run for hours)."""
    return Call(
        "GET",
        _sb(sandbox_id, f"/processes/{pid}/output"),
        lambda r: ProcessOutput.from_json(r.json()),
        params=_offsets(stdout_from, stderr_from),
        read_timeout=None,
    )


def process_stdin(sandbox_id: str, pid: int, data: str | bytes, close: bool) -> Call[None]:
    """`POST /v1/sandboxes/{id}/processes/{pid}/stdin`."""
    return Call(
        "POST",
        _sb(sandbox_id, f"/processes/{pid}/stdin"),
        _nothing,
        params=[("close", "true")] if close else [],
        content=data.encode() if isinstance(data, str) else data,
    )


def process_resize(sandbox_id: str, pid: int, rows: int, cols: int) -> Call[None]:
    """`POST /v1/sandboxes/{id}/processes/{pid}/resize`."""
    return Call(
        "POST", _sb(sandbox_id, f"/processes/{pid}/resize"), _nothing, json={"rows": rows, "cols": cols}
    )


def list_processes(sandbox_id: str) -> Call[list[ProcessInfo]]:
    """`GET /v1/sandboxes/{id}/processes`."""
    return Call(
        "GET",
        _sb(sandbox_id, "/processes"),
        lambda r: [ProcessInfo.from_json(p) for p in r.json()["processes"]],
    )


def kill_process(sandbox_id: str, pid: int, signal: str | int, tree: bool) -> Call[None]:
    """`DELETE /v1/sandboxes/{id}/processes/{pid}`."""
    params = [("signal", str(signal))] + ([("tree", "true")] if tree else [])
    return Call("DELETE", _sb(sandbox_id, f"/processes/{pid}"), _nothing, params=params)


# --- code -------------------------------------------------------------------------------


def _code_body(code: str, language: str | None, context: str | None, timeout: float | None) -> dict[str, Any]:
    return _drop_none({"code": code, "language": language, "context": context, "timeout_secs": timeout})


def run_code(
    sandbox_id: str,
    code: str,
    *,
    language: str | None,
    context: str | None,
    timeout: float | None,
    default_timeout: float | None,
) -> Call[Execution]:
    """`POST /v1/sandboxes/{id}/code`."""
    return Call(
        "POST",
        _sb(sandbox_id, "/code"),
        lambda r: Execution.from_json(r.json()),
        json=_code_body(code, language, context, timeout),
        read_timeout=_wait_for(timeout, default_timeout),
    )


def code_event(ev: SseEvent) -> CodeEvent | None:
    """A code stream event. `error` names both the code's exception (`name`, `value`,
    `traceback`) and a failure of the request itself (`code`, `message`): the latter raises."""
    d = ev.data
    if ev.name in ("stdout", "stderr"):
        return CodeEvent("stdout" if ev.name == "stdout" else "stderr", text=d["text"])
    if ev.name in ("display", "result"):
        kind: Literal["display", "result"] = "display" if ev.name == "display" else "result"
        return CodeEvent(kind, result=Result(kind, d.get("data") or {}))
    if ev.name == "error":
        if "traceback" not in d and "code" in d:
            raise error_from_body(d, None)
        return CodeEvent("error", error=ExecutionError.from_json(d))
    if ev.name == "done":
        return CodeEvent("done", done=ExecutionDone.from_json(d))
    return None


def run_code_stream(
    sandbox_id: str, code: str, *, language: str | None, context: str | None, timeout: float | None
) -> StreamCall[CodeEvent]:
    """`POST /v1/sandboxes/{id}/code/stream`."""
    return StreamCall(
        "POST", _sb(sandbox_id, "/code/stream"), code_event, json=_code_body(code, language, context, timeout)
    )


def create_context(
    sandbox_id: str, language: str, cwd: str | None, env: Mapping[str, str] | None
) -> Call[Context]:
    """`POST /v1/sandboxes/{id}/contexts`."""
    body = _drop_none({"language": language, "cwd": cwd, "env": dict(env) if env else None})
    return Call("POST", _sb(sandbox_id, "/contexts"), lambda r: Context.from_json(r.json()), json=body)


def list_contexts(sandbox_id: str) -> Call[list[Context]]:
    """`GET /v1/sandboxes/{id}/contexts`."""
    return Call("GET", _sb(sandbox_id, "/contexts"), lambda r: [Context.from_json(c) for c in r.json()])


def delete_context(sandbox_id: str, context: str) -> Call[None]:
    """`DELETE /v1/sandboxes/{id}/contexts/{context}`."""
    return Call("DELETE", _ctx(sandbox_id, context), _nothing)


def interrupt(sandbox_id: str, context: str) -> Call[None]:
    """`POST …/contexts/{context}/interrupt`."""
    return Call("POST", _ctx(sandbox_id, context, "/interrupt"), _nothing)


def restart(sandbox_id: str, context: str) -> Call[Context]:
    """`POST …/contexts/{context}/restart`."""
    return Call("POST", _ctx(sandbox_id, context, "/restart"), lambda r: Context.from_json(r.json()))


def _names(names: Sequence[str] | None) -> list[tuple[str, str]]:
    return [] if names is None else [("names", ",".join(names))]


def get_variables(sandbox_id: str, context: str, names: Sequence[str] | None) -> Call[Variables]:
    """`GET …/contexts/{context}/variables`."""
    return Call(
        "GET",
        _ctx(sandbox_id, context, "/variables"),
        lambda r: Variables.from_json(r.json()),
        params=_names(names),
    )


def set_variables(sandbox_id: str, context: str, values: Mapping[str, Any]) -> Call[list[str]]:
    """`PUT …/contexts/{context}/variables`: answers the names set."""
    return Call(
        "PUT",
        _ctx(sandbox_id, context, "/variables"),
        lambda r: list(r.json()["names"]),
        json={"values": dict(values)},
    )


def clear_variables(sandbox_id: str, context: str, names: Sequence[str] | None) -> Call[list[str]]:
    """`DELETE …/contexts/{context}/variables`: answers the names cleared."""
    return Call(
        "DELETE",
        _ctx(sandbox_id, context, "/variables"),
        lambda r: list(r.json()["names"]),
        params=_names(names),
    )


# --- files ------------------------------------------------------------------------------


def _file_info(r: httpx.Response) -> FileInfo:
    return FileInfo.from_json(r.json())


def upload(
    sandbox_id: str, path: str, mode: int | None, append: bool, data: str | bytes | None = None
) -> Call[FileInfo]:
    """`PUT /v1/sandboxes/{id}/files/content` with `data`, or a body streamed when it is sent."""
    params = [("path", path)]
    if mode is not None:
        params.append(("mode", format(mode, "o")))
    if append:
        params.append(("append", "true"))
    content = data.encode() if isinstance(data, str) else data
    return Call("PUT", _sb(sandbox_id, "/files/content"), _file_info, params=params, content=content)


def file_content(sandbox_id: str, path: str) -> Call[bytes]:
    """`GET /v1/sandboxes/{id}/files/content` (whole, for `read_file`; `download` streams it)."""
    return Call("GET", _sb(sandbox_id, "/files/content"), lambda r: r.content, params=[("path", path)])


def list_dir(sandbox_id: str, path: str) -> Call[list[FileInfo]]:
    """`GET /v1/sandboxes/{id}/files`."""
    return Call(
        "GET",
        _sb(sandbox_id, "/files"),
        lambda r: [FileInfo.from_json(e) for e in r.json()["entries"]],
        params=[("path", path)],
    )


def stat(sandbox_id: str, path: str) -> Call[FileInfo]:
    """`GET /v1/sandboxes/{id}/files/stat`."""
    return Call("GET", _sb(sandbox_id, "/files/stat"), _file_info, params=[("path", path)])


def mkdir(sandbox_id: str, path: str) -> Call[FileInfo]:
    """`POST /v1/sandboxes/{id}/files/mkdir`."""
    return Call("POST", _sb(sandbox_id, "/files/mkdir"), _file_info, json={"path": path})


def rename(sandbox_id: str, src: str, dst: str) -> Call[FileInfo]:
    """`POST /v1/sandboxes/{id}/files/rename`."""
    return Call("POST", _sb(sandbox_id, "/files/rename"), _file_info, json={"from": src, "to": dst})


def remove(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    """`DELETE /v1/sandboxes/{id}/files`."""
    params = [("path", path)] + ([("recursive", "true")] if recursive else [])
    return Call("DELETE", _sb(sandbox_id, "/files"), _nothing, params=params)


def import_files(
    sandbox_id: str,
    path: str,
    *,
    text: str | None,
    data: bytes | None,
    host_path: str | None,
    export_id: str | None,
    mode: int | None,
) -> Call[ImportResult]:
    """`POST /v1/sandboxes/{id}/import`."""
    sources = [s for s in (text, data, host_path, export_id) if s is not None]
    if len(sources) != 1:
        raise ValueError("give exactly one of text, data, host_path and export_id")
    body = _drop_none(
        {
            "path": path,
            "text": text,
            "base64": base64.b64encode(data).decode("ascii") if data is not None else None,
            "host_path": host_path,
            "export_id": export_id,
            "mode": mode,
        }
    )
    return Call("POST", _sb(sandbox_id, "/import"), lambda r: ImportResult.from_json(r.json()), json=body)


def create_export(sandbox_id: str, path: str) -> Call[ExportInfo]:
    """`POST /v1/sandboxes/{id}/exports`."""
    return Call(
        "POST", _sb(sandbox_id, "/exports"), lambda r: ExportInfo.from_json(r.json()), json={"path": path}
    )


def list_exports(sandbox_id: str | None) -> Call[list[ExportInfo]]:
    """`GET /v1/exports`."""
    return Call(
        "GET",
        "/v1/exports",
        lambda r: [ExportInfo.from_json(e) for e in r.json()["exports"]],
        params=[("sandbox_id", sandbox_id)] if sandbox_id else [],
    )


def get_export(export_id: str) -> Call[ExportInfo]:
    """`GET /v1/exports/{export_id}`."""
    return Call("GET", f"/v1/exports/{quote(export_id, safe='')}", lambda r: ExportInfo.from_json(r.json()))


def delete_export(export_id: str) -> Call[None]:
    """`DELETE /v1/exports/{export_id}`."""
    return Call("DELETE", f"/v1/exports/{quote(export_id, safe='')}", _nothing)


def export_content(export_id: str) -> Call[None]:
    """`GET /v1/exports/{export_id}/content` (streamed by the transport)."""
    return Call("GET", f"/v1/exports/{quote(export_id, safe='')}/content", _nothing)


def artifacts(sandbox_id: str) -> Call[list[Artifact]]:
    """`GET /v1/sandboxes/{id}/artifacts`."""
    return Call(
        "GET",
        _sb(sandbox_id, "/artifacts"),
        lambda r: [Artifact.from_json(a) for a in r.json()["artifacts"]],
    )


# --- snapshots --------------------------------------------------------------------------


def _snapshot(r: httpx.Response) -> SnapshotInfo:
    return SnapshotInfo.from_json(r.json())


def create_snapshot(
    sandbox_id: str,
    name: str | None,
    description: str | None,
    tags: Mapping[str, str] | None,
    *,
    volumes: VolumeCarry | None = None,
) -> Call[SnapshotInfo]:
    """`POST /v1/sandboxes/{id}/snapshots` (`volumes` sent only when given)."""
    body = _drop_none(
        {
            "name": name,
            "description": description,
            "tags": dict(tags) if tags else None,
            "volumes": volumes,
        }
    )
    return Call("POST", _sb(sandbox_id, "/snapshots"), _snapshot, json=body, read_timeout=None)


def list_snapshots(sandbox_id: str | None) -> Call[list[SnapshotInfo]]:
    """`GET /v1/snapshots`."""
    return Call(
        "GET",
        "/v1/snapshots",
        lambda r: [SnapshotInfo.from_json(s) for s in r.json()["snapshots"]],
        params=[("sandbox", sandbox_id)] if sandbox_id else [],
    )


def get_snapshot(snapshot_id: str) -> Call[SnapshotInfo]:
    """`GET /v1/snapshots/{id}`."""
    return Call("GET", f"/v1/snapshots/{quote(snapshot_id, safe='')}", _snapshot)


def delete_snapshot(snapshot_id: str) -> Call[None]:
    """`DELETE /v1/snapshots/{id}`."""
    return Call("DELETE", f"/v1/snapshots/{quote(snapshot_id, safe='')}", _nothing)


def fork(
    snapshot_id: str,
    *,
    count: int,
    labels: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    timeout: float | timedelta | None,
    idle_timeout: float | timedelta | None,
    ephemeral: bool,
    secrets: Sequence[SecretInput] | None = None,
) -> Call[list[SandboxInfo]]:
    """`POST /v1/snapshots/{id}/fork`: the new sandboxes, each with its `restore` report."""
    body = _drop_none(
        {
            "count": count,
            "secrets": _secrets(secrets) if secrets is not None else None,
            "ephemeral": ephemeral or None,
            "labels": dict(labels) if labels else None,
            "metadata": dict(metadata) if metadata else None,
            "timeout_secs": _whole_secs(timeout),
            "idle_timeout_secs": _whole_secs(idle_timeout),
        }
    )

    def parse(r: httpx.Response) -> list[SandboxInfo]:
        made = []
        for f in r.json()["sandboxes"]:
            info = SandboxInfo.from_json(f["sandbox"])
            info.restore = f.get("restore")
            made.append(info)
        return made

    return Call(
        "POST", f"/v1/snapshots/{quote(snapshot_id, safe='')}/fork", parse, json=body, read_timeout=None
    )


def get_auto_snapshot(sandbox_id: str) -> Call[AutoSnapshot]:
    """`GET /v1/sandboxes/{id}/auto-snapshot`."""
    return Call("GET", _sb(sandbox_id, "/auto-snapshot"), lambda r: AutoSnapshot.from_json(r.json()))


def set_auto_snapshot(sandbox_id: str, settings: AutoSnapshot) -> Call[AutoSnapshot]:
    """`PUT /v1/sandboxes/{id}/auto-snapshot`."""
    return Call(
        "PUT",
        _sb(sandbox_id, "/auto-snapshot"),
        lambda r: AutoSnapshot.from_json(r.json()),
        json=settings.to_json(),
    )


# --- agent runs -------------------------------------------------------------------------


def _run(run_id: str, rest: str = "") -> str:
    return f"/v1/runs/{quote(run_id, safe='')}{rest}"


def _run_info(r: httpx.Response) -> RunInfo:
    return RunInfo.from_json(r.json())


def start_run(
    task: str,
    *,
    model: str | None,
    mode: str | None,
    sandbox_id: str | None,
    template: str | None,
    context: str | None,
    budgets: Budgets | Mapping[str, float | None] | None,
    keep_sandbox: bool,
    validate: str | Validate | Mapping[str, Any] | None,
    snapshots: SnapshotPolicy | None,
    keep_snapshots: bool,
    thread_id: str | None,
) -> Call[RunInfo]:
    """`POST /v1/runs` (answered at once, the run going on in the background)."""
    check = _validate(validate)
    body = _drop_none(
        {
            "task": task,
            "model": model,
            "mode": mode,
            "sandbox_id": sandbox_id,
            "template": template,
            "context": context,
            "budgets": _budgets(budgets),
            "keep_sandbox": keep_sandbox or None,
            "validate": check.to_json() if check is not None else None,
            "snapshots": snapshots,
            "keep_snapshots": keep_snapshots or None,
            "thread_id": thread_id,
        }
    )
    return Call("POST", "/v1/runs", _run_info, json=body)


def _budgets(budgets: Budgets | Mapping[str, float | None] | None) -> dict[str, Any] | None:
    """A run's `budgets` as sent (None when no limit is set): a mapping must name fields of
    `Budgets`, so that a misspelt limit is not silently the default."""
    if isinstance(budgets, Mapping):
        unknown = sorted(set(budgets) - {f.name for f in fields(Budgets)})
        if unknown:
            raise ValueError(f"unknown budgets {unknown}: the limits are the fields of Budgets")
        budgets = Budgets.from_json(dict(budgets))
    limits = budgets.to_json() if budgets is not None else None
    return limits or None


def _validate(validate: str | Validate | Mapping[str, Any] | None) -> Validate | None:
    """A run's `validate` as given (a command alone, a `Validate`, or a mapping of its fields)
    made a `Validate`. Only its shape is checked here: its values are the daemon's to judge."""
    if validate is None or isinstance(validate, Validate):
        return validate
    if isinstance(validate, str):
        return Validate(validate)
    if isinstance(validate, Mapping):
        names = {f.name for f in fields(Validate)}
        unknown = sorted(set(validate) - names)
        if unknown:
            raise ValueError(f"unknown validate fields {unknown}: they are {sorted(names)}")
        if "command" not in validate:
            raise ValueError("validate needs a 'command'")
        return Validate.from_json(dict(validate))
    raise TypeError(f"validate is a command, a Validate or a mapping, not {type(validate).__name__}")


def get_run(run_id: str) -> Call[RunInfo]:
    """`GET /v1/runs/{run_id}`."""
    return Call("GET", _run(run_id), _run_info)


def list_runs(limit: int | None) -> Call[list[RunInfo]]:
    """`GET /v1/runs`: the newest first."""
    return Call(
        "GET",
        "/v1/runs",
        lambda r: [RunInfo.from_json(i) for i in r.json()["runs"]],
        params=[("limit", str(limit))] if limit is not None else [],
    )


def cancel_run(run_id: str) -> Call[RunInfo]:
    """`POST /v1/runs/{run_id}/cancel`: answers once the run's end is recorded."""
    return Call("POST", _run(run_id, "/cancel"), _run_info)


def resume_run(run_id: str) -> Call[RunInfo]:
    """`POST /v1/runs/{run_id}/resume`: answered at once, the run going on in the background."""
    return Call("POST", _run(run_id, "/resume"), _run_info)


def fork_run(
    run_id: str,
    *,
    from_step: int,
    task: str | None,
    model: str | None,
    budgets: Budgets | Mapping[str, float | None] | None,
    validate: str | Validate | Mapping[str, Any] | None,
    keep_sandbox: bool,
    wait: bool,
) -> Call[RunInfo]:
    """`POST /v1/runs/{run_id}/fork`: answered once the fork's sandbox is restored (no read
    timeout, as for a snapshot's fork), or with `wait` once the fork has ended (its own
    budgets bound it)."""
    check = _validate(validate)
    body = _drop_none(
        {
            "from_step": from_step,
            "task": task,
            "model": model,
            "budgets": _budgets(budgets),
            "validate": check.to_json() if check is not None else None,
            "keep_sandbox": keep_sandbox or None,
            "wait": wait or None,
        }
    )
    return Call(
        "POST",
        _run(run_id, "/fork"),
        _run_info,
        json=body,
        read_timeout=None,
    )


def step_sandbox(run_id: str, step: int) -> Call[StepSandbox]:
    """`POST /v1/runs/{run_id}/steps/{step}/sandbox` (a restore: no read timeout, as for
    snapshots)."""
    return Call(
        "POST",
        _run(run_id, f"/steps/{step}/sandbox"),
        lambda r: StepSandbox.from_json(r.json()),
        read_timeout=None,
    )


# Most events one `format=json` answer holds (the route's own cap).
RUN_EVENTS_PAGE = 1000


def run_event_list(run_id: str, after: int, limit: int = RUN_EVENTS_PAGE) -> Call[list[RunEvent]]:
    """`GET /v1/runs/{run_id}/events?format=json`: stored events numbered after `after`."""
    return Call(
        "GET",
        _run(run_id, "/events"),
        lambda r: [RunEvent.from_json(e) for e in r.json()["events"]],
        params=[("format", "json"), ("after", str(after)), ("limit", str(limit))],
    )


def run_event(ev: SseEvent) -> RunEvent | None:
    """A run's stream event (each is named after its type; comments are dropped already)."""
    if isinstance(ev.data, dict) and "seq" in ev.data and "type" in ev.data:
        return RunEvent.from_json(ev.data)
    if ev.name == "error" and isinstance(ev.data, dict):
        raise error_from_body(ev.data, None)
    return None


def follow_run(run_id: str, *, after: int = 0, last_event_id: int | None = None) -> StreamCall[RunEvent]:
    """`GET /v1/runs/{run_id}/events` as server-sent events: from event `after + 1` (or, on a
    reconnect, after `Last-Event-ID`), the stored events then the live ones; the stream ends
    after `run_finished`."""
    headers = [("Accept", "text/event-stream")]
    if last_event_id is not None:
        headers.append(("Last-Event-ID", str(last_event_id)))
    return StreamCall(
        "GET",
        _run(run_id, "/events"),
        run_event,
        params=[("after", str(after))] if after else [],
        headers=headers,
    )


# --- threads ----------------------------------------------------------------------------


def _thread(thread_id: str) -> str:
    return f"/v1/threads/{quote(thread_id, safe='')}"


def _thread_info(r: httpx.Response) -> ThreadInfo:
    return ThreadInfo.from_json(r.json())


def create_thread(name: str | None) -> Call[ThreadInfo]:
    """`POST /v1/threads`."""
    return Call("POST", "/v1/threads", _thread_info, json=_drop_none({"name": name}))


def list_threads(limit: int | None) -> Call[list[ThreadInfo]]:
    """`GET /v1/threads`: the most recently used first."""
    return Call(
        "GET",
        "/v1/threads",
        lambda r: [ThreadInfo.from_json(t) for t in r.json()["threads"]],
        params=[("limit", str(limit))] if limit is not None else [],
    )


def get_thread(thread_id: str) -> Call[ThreadInfo]:
    """`GET /v1/threads/{thread_id}`."""
    return Call("GET", _thread(thread_id), _thread_info)


def rename_thread(thread_id: str, name: str) -> Call[ThreadInfo]:
    """`PATCH /v1/threads/{thread_id}`."""
    return Call("PATCH", _thread(thread_id), _thread_info, json={"name": name})


def delete_thread(thread_id: str) -> Call[None]:
    """`DELETE /v1/threads/{thread_id}` (its sandbox goes with it; its runs stay)."""
    return Call("DELETE", _thread(thread_id), _nothing)


# --- memories ---------------------------------------------------------------------------


def _memories(sandbox_id: str | None, rest: str = "") -> str:
    """A sandbox's memories (`/v1/sandboxes/{id}/memories…`), or with None the caller's own
    (`/v1/memories…`)."""
    if sandbox_id is None:
        return f"/v1/memories{rest}"
    return _sb(sandbox_id, f"/memories{rest}")


def _memory(r: httpx.Response) -> Memory:
    return Memory.from_json(r.json())


def add_memory(
    sandbox_id: str | None, text: str, *, category: str | None, metadata: Mapping[str, str] | None
) -> Call[Memory]:
    """`POST /v1/sandboxes/{id}/memories` or `POST /v1/memories`."""
    body = _drop_none(
        {"text": text, "category": category, "metadata": dict(metadata) if metadata else None}
    )
    return Call("POST", _memories(sandbox_id), _memory, json=body)


def infer_memories(
    sandbox_id: str | None, text: str, *, category: str | None, metadata: Mapping[str, str] | None
) -> Call[InferJob]:
    """`POST …/memories/infer`: the job, `queued`."""
    body = _drop_none(
        {"text": text, "category": category, "metadata": dict(metadata) if metadata else None}
    )
    return Call(
        "POST", _memories(sandbox_id, "/infer"), lambda r: InferJob.from_json(r.json()), json=body
    )


def get_infer_job(sandbox_id: str | None, job_id: str) -> Call[InferJob]:
    """`GET …/memories/infer/{job_id}` (without a sandbox: any of the caller's jobs)."""
    return Call(
        "GET",
        _memories(sandbox_id, f"/infer/{quote(job_id, safe='')}"),
        lambda r: InferJob.from_json(r.json()),
    )


def list_infer_jobs(sandbox_id: str | None, *, limit: int | None) -> Call[list[InferJob]]:
    """`GET …/memories/infer`: the scope's jobs, newest first."""
    params = [] if limit is None else [("limit", str(limit))]
    return Call(
        "GET",
        _memories(sandbox_id, "/infer"),
        lambda r: [InferJob.from_json(j) for j in r.json()["jobs"]],
        params=params,
    )


def search_memories(
    sandbox_id: str | None, query: str, *, limit: int | None, category: str | None
) -> Call[MemorySearch]:
    """`GET …/memories/search`: the best match first, each with its `score`, and how the
    search ranked (`ranking`, `warning`)."""
    params = [("q", query)]
    if limit is not None:
        params.append(("limit", str(limit)))
    if category is not None:
        params.append(("category", category))
    return Call(
        "GET",
        _memories(sandbox_id, "/search"),
        lambda r: MemorySearch.from_json(r.json()),
        params=params,
    )


def list_memories(
    sandbox_id: str | None, *, limit: int | None, cursor: str | None, category: str | None
) -> Call[MemoryList]:
    """`GET …/memories`: one page, newest first, and the cursor of the next."""
    params = []
    if limit is not None:
        params.append(("limit", str(limit)))
    if cursor:
        params.append(("cursor", cursor))
    if category is not None:
        params.append(("category", category))
    return Call(
        "GET", _memories(sandbox_id), lambda r: MemoryList.from_json(r.json()), params=params
    )


def get_memory(sandbox_id: str | None, memory_id: str) -> Call[Memory]:
    """`GET …/memories/{memory_id}` (without a sandbox: any of the caller's memories)."""
    return Call("GET", _memories(sandbox_id, f"/{quote(memory_id, safe='')}"), _memory)


def delete_memory(sandbox_id: str | None, memory_id: str) -> Call[None]:
    """`DELETE …/memories/{memory_id}` (without a sandbox: any of the caller's memories)."""
    return Call("DELETE", _memories(sandbox_id, f"/{quote(memory_id, safe='')}"), _nothing)


# --- templates --------------------------------------------------------------------------


def _template(name: str) -> str:
    return f"/v1/templates/{quote(name, safe='')}"


def _build(build_id: str, rest: str = "") -> str:
    return f"/v1/builds/{quote(build_id, safe='')}{rest}"


def _build_info(r: httpx.Response) -> BuildInfo:
    return BuildInfo.from_json(r.json())


def start_build(
    name: str,
    *,
    dockerfile: str,
    context: bytes | None,
    build_args: Mapping[str, str] | None,
    no_cache: bool,
    allow_hosts: Sequence[str] | None,
    offline: bool,
    wait: bool,
) -> Call[BuildInfo]:
    """`POST /v1/templates`: answered at once (202, `queued` or `running`), or with `wait` once
    the build has ended (200; no read timeout then: a build takes as long as its steps do).
    `context` is a tar archive (plain or gzip), sent base64-encoded."""
    if isinstance(allow_hosts, str):
        raise TypeError("allow_hosts is a list of hosts such as ['example.org'], not str")
    body = _drop_none(
        {
            "name": name,
            "dockerfile": dockerfile,
            "context": base64.b64encode(context).decode("ascii") if context is not None else None,
            "build_args": {str(k): str(v) for k, v in build_args.items()} if build_args else None,
            "no_cache": no_cache or None,
            "allow_hosts": list(allow_hosts) if allow_hosts else None,
            "offline": offline or None,
            "wait": wait or None,
        }
    )
    return Call(
        "POST",
        "/v1/templates",
        _build_info,
        json=body,
        read_timeout=None if wait else Default.TIMEOUT,
    )


def list_builds() -> Call[list[BuildInfo]]:
    """`GET /v1/builds`: the builds the daemon has run since it started, newest first."""
    return Call("GET", "/v1/builds", lambda r: [BuildInfo.from_json(b) for b in r.json()["builds"]])


def get_build(build_id: str) -> Call[BuildInfo]:
    """`GET /v1/builds/{build_id}`."""
    return Call("GET", _build(build_id), _build_info)


def cancel_build(build_id: str) -> Call[BuildInfo]:
    """`POST /v1/builds/{build_id}/cancel`: answers once the build has ended."""
    return Call("POST", _build(build_id, "/cancel"), _build_info)


# Most events one `format=json` answer of a build's log holds (the route's own cap).
BUILD_LOG_PAGE = 1000


def build_log_list(build_id: str, after: int, limit: int = BUILD_LOG_PAGE) -> Call[list[BuildEvent]]:
    """`GET /v1/builds/{build_id}/logs?format=json`: the events numbered after `after`."""
    return Call(
        "GET",
        _build(build_id, "/logs"),
        lambda r: [BuildEvent.from_json(e) for e in r.json()["events"]],
        params=[("format", "json"), ("after", str(after)), ("limit", str(limit))],
    )


def build_event(ev: SseEvent) -> BuildEvent | None:
    """A build log's stream event (each is named after its kind and carries its `seq`)."""
    if isinstance(ev.data, dict) and "seq" in ev.data and "event" in ev.data:
        return BuildEvent.from_json(ev.data)
    if ev.name == "error" and isinstance(ev.data, dict):
        raise error_from_body(ev.data, None)
    return None


def follow_build(
    build_id: str, *, after: int = 0, last_event_id: int | None = None
) -> StreamCall[BuildEvent]:
    """`GET /v1/builds/{build_id}/logs` as server-sent events: from event `after + 1` (or, on
    a reconnect, after `Last-Event-ID`), the stored events then the live ones; the stream ends
    after `finished`."""
    headers = [("Accept", "text/event-stream")]
    if last_event_id is not None:
        headers.append(("Last-Event-ID", str(last_event_id)))
    return StreamCall(
        "GET",
        _build(build_id, "/logs"),
        build_event,
        params=[("after", str(after))] if after else [],
        headers=headers,
    )


def list_templates() -> Call[list[TemplateInfo]]:
    """`GET /v1/templates`: by name."""
    return Call(
        "GET", "/v1/templates", lambda r: [TemplateInfo.from_json(t) for t in r.json()["templates"]]
    )


def get_template(name: str) -> Call[TemplateInfo]:
    """`GET /v1/templates/{name}`."""
    return Call("GET", _template(name), lambda r: TemplateInfo.from_json(r.json()))


def delete_template(name: str) -> Call[None]:
    """`DELETE /v1/templates/{name}` (refused, 409, while sandboxes run on it)."""
    return Call("DELETE", _template(name), _nothing)


# --- volumes ----------------------------------------------------------------------------


def _volume(name: str) -> str:
    return f"/v1/volumes/{quote(name, safe='')}"


def _volume_info(r: httpx.Response) -> VolumeInfo:
    return VolumeInfo.from_json(r.json())


def create_volume(name: str) -> Call[VolumeInfo]:
    """`POST /v1/volumes` (409 `already_exists` when the caller has one of that name)."""
    return Call("POST", "/v1/volumes", _volume_info, json={"name": name})


def list_volumes() -> Call[list[VolumeInfo]]:
    """`GET /v1/volumes`: the caller's, by name."""
    return Call("GET", "/v1/volumes", lambda r: [VolumeInfo.from_json(v) for v in r.json()["volumes"]])


def get_volume(name: str) -> Call[VolumeInfo]:
    """`GET /v1/volumes/{volume}`."""
    return Call("GET", _volume(name), _volume_info)


def delete_volume(name: str) -> Call[None]:
    """`DELETE /v1/volumes/{volume}` (refused, 409 `invalid_state`, while a running sandbox
    mounts it)."""
    return Call("DELETE", _volume(name), _nothing)


def check_status(resp: httpx.Response) -> None:
    """Raises the mapped `SandcellError` for an error answer (its body must have been read)."""
    if resp.status_code < 400:
        return
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    raise error_from_body(body, resp.status_code, resp.headers.get("x-request-id"))


def pty_path(sandbox_id: str) -> str:
    """The path of `GET /v1/sandboxes/{id}/pty` (a WebSocket)."""
    return _sb(sandbox_id, "/pty")


def pty_query(
    *, cmd: str | None = None, cwd: str | None = None, rows: int = 24, cols: int = 80, pid: int | None = None
) -> dict[str, str]:
    """The query of `GET /v1/sandboxes/{id}/pty`: join `pid`, or start `cmd` on a new terminal
    (the 101 answer names its pid in `X-Sandcell-Pid`)."""
    if pid is not None:
        return {"pid": str(pid)}
    return _drop_none({"cmd": cmd, "cwd": cwd, "rows": str(rows), "cols": str(cols)})
