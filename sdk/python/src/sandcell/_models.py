"""Typed views of the API's answers (dataclasses), each built from the JSON the daemon sends."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypedDict

JsonDict = dict[str, Any]


def _strs(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def _known(cls: type, d: JsonDict) -> JsonDict:
    """The entries of `d` that are fields of the dataclass `cls` (newer answers may hold more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass
class Limits:
    """A sandbox's resource limits."""

    memory_mb: int | None
    cpus: float | None
    pids: int | None
    disk_mb: int
    tmp_mb: int
    home_mb: int
    open_files: int
    exec_timeout_secs: int | None

    @classmethod
    def from_json(cls, d: JsonDict) -> Limits:
        """Parses the API's `limits` object."""
        return cls(
            memory_mb=d.get("memory_mb"),
            cpus=d.get("cpus"),
            pids=d.get("pids"),
            disk_mb=d.get("disk_mb", 0),
            tmp_mb=d.get("tmp_mb", 0),
            home_mb=d.get("home_mb", 0),
            open_files=d.get("open_files", 0),
            exec_timeout_secs=d.get("exec_timeout_secs"),
        )


class AllowPolicy(TypedDict):
    """A network policy that lets the sandbox reach only the hosts its rules name, through its
    egress proxy: `"host"`, `"*.suffix"`, `"host:port"`, `"127.0.0.1:8080"`, `"[::1]:8080"`
    (a loopback, private, link-local or metadata address only when a rule names it)."""

    allow: list[str]


NetworkPolicy = Literal["off", "loopback", "full"] | AllowPolicy
"""What a sandbox's network reaches, as the daemon says it: `"off"` (no sockets but Unix
ones), `"loopback"` (its own loopback only: the default), `"full"` (any public host through
its egress proxy) or `{"allow": [rules]}` (only those hosts through it)."""


NetworkPolicyInput = str | Sequence[str] | Mapping[str, Sequence[str]]
"""A network policy as `Sandbox.create(network=…)` and `set_network` take it: `"off"`,
`"loopback"`, `"full"`, a list of allow rules (`["example.org", "*.example.net:443"]`,
meaning `{"allow": [...]}`), or the mapping `{"allow": [...]}` itself."""


class Packages(TypedDict, total=False):
    """Packages installed while a sandbox is made (`Sandbox.create(packages=…)`), through its
    egress proxy from the registries the daemon's operator configured, and cached: the next
    sandbox with the same lists gets them from the cache. `pip`: specifiers as pip takes them
    (`"numpy"`, `"pandas==2.2.2"`), installed for the sandbox's user (`~/.local`); `npm`:
    `"left-pad"`, `"@scope/name@1.2.3"`, installed globally under `~/.npm-global` (on `PATH` and
    `NODE_PATH`); `r`: R package names, installed into `~/R/library` (`R_LIBS_USER`)."""

    pip: Sequence[str]
    npm: Sequence[str]
    r: Sequence[str]


PackagesInput = Packages | Mapping[str, Sequence[str]]
"""Packages as `Sandbox.create(packages=…)` takes them: a `Packages` or any mapping of an
installer (`"pip"`, `"npm"`, `"r"`) to its list; another key is the daemon's to refuse (an
InvalidArgumentError)."""


@dataclass
class PackagesReport:
    """How a sandbox's packages were installed (only on the answer of the create that asked
    for them): `cached` when they came from the cache of an earlier install of the same lists
    (no registry reached), how long installing or unpacking took, the files and bytes the
    install put into the sandbox, and `from_pool` when the sandbox came from a warm pool that
    had installed them while it waited."""

    cached: bool
    duration_ms: int
    files: int
    bytes: int
    from_pool: bool = False

    @classmethod
    def from_json(cls, d: JsonDict) -> PackagesReport:
        """Parses a `PackagesReport`."""
        return cls(
            cached=bool(d["cached"]),
            duration_ms=int(d["duration_ms"]),
            files=int(d["files"]),
            bytes=int(d["bytes"]),
            from_pool=bool(d.get("from_pool", False)),
        )


@dataclass(frozen=True)
class Secret:
    """A secret that never enters the sandbox (`Sandbox.create(secrets=[…])`): the sandbox gets
    the environment variable `name` holding a placeholder (`SANDCELL_SECRET_…`), and its egress
    proxy puts `value` in place of the placeholder in the headers (Basic auth included) and
    query of requests to `hosts` only — network allow rules such as `"api.example.com"`,
    `"*.example.com"`, `"api.example.com:443"` — over TLS it terminates with a CA the sandbox
    trusts (`/run/sandcell/ca.pem`). A request carrying the placeholder to another host is
    refused. `name` is an environment variable name (`A-Z`, `0-9`, `_`, not starting with a
    digit); `value` 1 to 8192 bytes without control characters. Its repr leaves the value out,
    so that logging a `Secret` does not leak it."""

    name: str
    value: str = field(repr=False)
    hosts: Sequence[str]

    def __post_init__(self) -> None:
        # A lone host where a list belongs would otherwise become a list of its letters.
        if isinstance(self.hosts, str):
            raise TypeError(
                f"Secret {self.name!r}: hosts is a list of host rules such as ['api.example.com'], not str"
            )
        # A tuple, so that a frozen Secret is really unchanging (and hashable).
        object.__setattr__(self, "hosts", tuple(self.hosts))


SecretInput = Secret | Mapping[str, Any]
"""A secret as `Sandbox.create(secrets=[…])` takes it: a `Secret`, or a mapping with exactly
the keys `name`, `value` and `hosts` (`{"name": "API_TOKEN", "value": "…", "hosts":
["api.example.com"]}`)."""


MountMode = Literal["ro", "rw", "overlay"]
"""How a sandbox sees a mounted folder: `"ro"` read-only (the default for host folders), `"rw"`
read-write (the default for volumes), or `"overlay"`: read-only below, with the sandbox's
writes going to a scratch layer of its own that goes with it (process backend only)."""


@dataclass(frozen=True)
class Mount:
    """A folder mounted into a sandbox when it is made (`Sandbox.create(mounts=[…])`): a host
    folder (`host_path`, an absolute path inside one of the daemon's `mounts.allowed_paths`)
    or a named volume of the caller's (`volume`, made on first use), at `path` inside:
    `/workspace` or a folder below `/workspace`, `/home/sandbox` or `/tmp`. Exactly one of
    `host_path` and `volume`. `mode` (None: the daemon's default for the kind) is a
    `MountMode`. `Mount.from_host(...)` and `Mount.from_volume(...)` make each kind."""

    path: str
    host_path: str | None = None
    volume: str | None = None
    mode: MountMode | None = None

    def __post_init__(self) -> None:
        if (self.host_path is None) == (self.volume is None):
            raise ValueError(f"Mount at {self.path!r}: give host_path or volume (exactly one)")

    @classmethod
    def from_host(cls, host_path: str | os.PathLike[str], path: str, mode: MountMode | None = None) -> Mount:
        """A host folder (absolute, inside the daemon's `mounts.allowed_paths`) at `path`;
        read-only unless `mode` says `"rw"` or `"overlay"`."""
        return cls(path=path, host_path=os.fspath(host_path), mode=mode)

    @classmethod
    def from_volume(cls, name: str, path: str, mode: MountMode | None = None) -> Mount:
        """The caller's volume `name` (made on first use) at `path`; read-write unless `mode`
        says `"ro"` or `"overlay"`."""
        return cls(path=path, volume=name, mode=mode)


MountInput = Mount | Mapping[str, Any]
"""A mount as `Sandbox.create(mounts=[…])` takes it: a `Mount`, or a mapping with `path` and
exactly one of `host_path` and `volume`, and optionally `mode` (`{"host_path": "/srv/data",
"path": "/workspace/data"}`, `{"volume": "cache", "path": "/home/sandbox/cache", "mode":
"rw"}`)."""


@dataclass
class SecretState:
    """One of a sandbox's secrets as `Sandbox.secrets()` shows it: never its value. `held` is
    False after the daemon restarted (it keeps values in memory only): until the value is
    given again (`set_secrets`), a request carrying the placeholder is refused."""

    name: str
    placeholder: str
    hosts: list[str]
    held: bool

    @classmethod
    def from_json(cls, d: JsonDict) -> SecretState:
        """Parses one entry of a `SecretList` answer."""
        return cls(
            name=str(d["name"]),
            placeholder=str(d["placeholder"]),
            hosts=[str(h) for h in d.get("hosts", [])],
            held=bool(d.get("held", False)),
        )


def _policy(value: Any) -> NetworkPolicy:
    """A policy as the API sends it (`"off"`, …, or `{"allow": [...]}`); a missing one is
    the daemon's default, `loopback`."""
    if isinstance(value, dict):
        return AllowPolicy(allow=[str(r) for r in value.get("allow") or []])
    if value is None:
        return "loopback"
    policy: NetworkPolicy = value
    return policy


@dataclass
class SandboxInfo:
    """A sandbox's record: state, times, limits, labels (`restore` only right after a restore);
    `network` is its network policy now (`"loopback"`, …, or `{"allow": [...]}`); `packages`
    says how the packages asked for were installed (only on the create answer, else None);
    `preview_host` and `preview_path` say where a server inside on port P is reached through
    the daemon, with `{port}` to be replaced by P (`get_host` and `preview_url` do it)."""

    id: str
    state: str
    template: str
    backend: str
    network: NetworkPolicy
    ephemeral: bool
    created_at: str
    last_active_at: str
    limits: Limits
    labels: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    expires_at: str | None = None
    idle_timeout_secs: int | None = None
    reason: str | None = None
    restore: JsonDict | None = None
    packages: PackagesReport | None = None
    preview_host: str = ""
    preview_path: str = ""

    @classmethod
    def from_json(cls, d: JsonDict) -> SandboxInfo:
        """Parses a `SandboxInfo` answer."""
        return cls(
            id=d["id"],
            state=d["state"],
            template=d.get("template", ""),
            backend=d.get("backend", ""),
            network=_policy(d.get("network")),
            ephemeral=bool(d.get("ephemeral", False)),
            created_at=d.get("created_at", ""),
            last_active_at=d.get("last_active_at", ""),
            limits=Limits.from_json(d.get("limits") or {}),
            labels=_strs(d.get("labels")),
            metadata=_strs(d.get("metadata")),
            expires_at=d.get("expires_at"),
            idle_timeout_secs=d.get("idle_timeout_secs"),
            reason=d.get("reason"),
            restore=d.get("restore"),
            packages=PackagesReport.from_json(d["packages"]) if d.get("packages") else None,
            preview_host=d.get("preview_host", ""),
            preview_path=d.get("preview_path", ""),
        )


@dataclass
class ExitStatus:
    """How a command or process ended: `cause` is exited, signaled, oom_killed, timeout,
    pids_limit or killed; `message` says it in a sentence."""

    exit_code: int | None
    ok: bool
    cause: str
    message: str
    signal: int | None = None
    signal_name: str | None = None
    oom_killed: bool = False
    timed_out: bool = False
    pids_limit_hit: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0

    @classmethod
    def from_json(cls, d: JsonDict) -> ExitStatus:
        """Parses the API's exit information (`exit_code`, `cause`, … at the top level)."""
        return cls(**_exit_fields(d))


def _exit_fields(d: JsonDict) -> JsonDict:
    exit_code = d.get("exit_code")
    return {
        "exit_code": exit_code,
        "ok": bool(d.get("ok", exit_code == 0)),
        "cause": d.get("cause", ""),
        "message": d.get("message", ""),
        "signal": d.get("signal"),
        "signal_name": d.get("signal_name"),
        "oom_killed": bool(d.get("oom_killed", False)),
        "timed_out": bool(d.get("timed_out", False)),
        "pids_limit_hit": bool(d.get("pids_limit_hit", False)),
        "stdout_truncated": bool(d.get("stdout_truncated", False)),
        "stderr_truncated": bool(d.get("stderr_truncated", False)),
        "duration_ms": float(d.get("duration_ms", 0.0)),
    }


@dataclass
class CommandResult(ExitStatus):
    """A finished command: its output and how it ended."""

    stdout: str = ""
    stderr: str = ""

    @classmethod
    def from_json(cls, d: JsonDict) -> CommandResult:
        """Parses an `exec` answer."""
        return cls(stdout=d.get("stdout", ""), stderr=d.get("stderr", ""), **_exit_fields(d))


@dataclass
class ProcessOutput(CommandResult):
    """A background process's output once it ended; `*_lost` bytes had left its buffer."""

    stdout_lost: int = 0
    stderr_lost: int = 0

    @classmethod
    def from_json(cls, d: JsonDict) -> ProcessOutput:
        """Parses a `processes/{pid}/output` answer."""
        return cls(
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            stdout_lost=d.get("stdout_lost", 0),
            stderr_lost=d.get("stderr_lost", 0),
            **_exit_fields(d),
        )


@dataclass
class OutputEvent:
    """One event of a streamed command or background process, in the order it happened.

    `type` is `stdout` or `stderr` (`data` holds the text; for a background process `offset`
    is the byte offset of its first byte and `end` the offset to reconnect from), `lost`
    (`bytes` bytes of `channel` from `offset` left the buffer before they were read), or
    `done`, always last, with `exit`.
    """

    type: Literal["stdout", "stderr", "lost", "done"]
    data: str = ""
    offset: int | None = None
    bytes: int | None = None
    channel: str | None = None
    exit: ExitStatus | None = None

    @property
    def end(self) -> int | None:
        """The offset just past this chunk: where a reconnect carries on."""
        if self.offset is None or self.bytes is None:
            return None
        return self.offset + self.bytes


class CommandBuilder:
    """Collects a streamed command's events into the `CommandResult` `exec` would give, and
    hands its output to the callbacks, if any, as it comes."""

    def __init__(
        self,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> None:
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._exit: ExitStatus | None = None

    def feed(self, event: OutputEvent) -> object:
        """Adds one event; returns what its callback returned (an awaitable, for async ones)."""
        if event.type == "stdout":
            self._stdout.append(event.data)
            return self.on_stdout(event.data) if self.on_stdout else None
        if event.type == "stderr":
            self._stderr.append(event.data)
            return self.on_stderr(event.data) if self.on_stderr else None
        if event.exit is not None:
            self._exit = event.exit
        return None

    def build(self) -> CommandResult:
        """The result, once the exit was fed."""
        if self._exit is None:
            raise RuntimeError("the command stream ended without its exit event")
        return CommandResult(
            stdout="".join(self._stdout), stderr="".join(self._stderr), **asdict(self._exit)
        )


@dataclass
class ProcessInfo:
    """A process in a sandbox (those Sandcell started carry their output counters and exit)."""

    pid: int
    ppid: int
    pgid: int
    state: str
    cmdline: str
    rss_bytes: int
    tracked: bool
    background: bool
    pty: bool
    exited: bool
    exec_id: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    stdout_bytes: int | None = None
    stderr_bytes: int | None = None
    started_at_ms: int | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> ProcessInfo:
        """Parses one entry of `GET /processes`."""
        return cls(**_known(cls, d))


@dataclass
class Metrics:
    """A sandbox's resource use from its cgroups (None where the host cannot tell)."""

    cpu_percent: float | None = None
    cpu_seconds: float | None = None
    cpu_limit: float | None = None
    memory_bytes: int | None = None
    memory_peak_bytes: int | None = None
    memory_limit_bytes: int | None = None
    pids: int | None = None
    pids_limit: int | None = None
    oom_kills: int | None = None
    pids_limit_hits: int | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> Metrics:
        """Parses a `metrics` answer."""
        return cls(**_known(cls, d))


@dataclass
class FileInfo:
    """A file, folder or link in a sandbox."""

    name: str
    path: str
    size: int
    kind: str
    is_dir: bool
    mode: int
    mtime: int
    link_target: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> FileInfo:
        """Parses a `FileInfo` answer."""
        return cls(**_known(cls, d))


@dataclass
class ImportResult:
    """Where an import went, and how much was written."""

    path: str
    files: int
    bytes: int

    @classmethod
    def from_json(cls, d: JsonDict) -> ImportResult:
        """Parses an `import` answer."""
        return cls(path=d["path"], files=d["files"], bytes=d["bytes"])


@dataclass
class ExportInfo:
    """A file or folder copied out of a sandbox and kept by the service."""

    id: str
    sandbox_id: str
    path: str
    kind: str
    created_at: str
    download_url: str
    size: int | None = None
    sha256: str | None = None
    signed_url: str | None = None
    signed_url_expires_at: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> ExportInfo:
        """Parses an `ExportInfo` answer."""
        return cls(**_known(cls, d))


@dataclass
class Artifact:
    """A file code left in `/workspace/outputs` (`mtime` only in the artifacts listing)."""

    path: str
    size: int
    mime: str
    mtime: int | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> Artifact:
        """Parses an artifact entry."""
        return cls(path=d["path"], size=d["size"], mime=d["mime"], mtime=d.get("mtime"))


VolumeCarry = Literal["mount", "copy"]
"""What a snapshot keeps of the named volumes its sandbox mounts: `mount` (the default:
nothing; a sandbox made from it mounts the same volumes again, as they are then) or `copy` (a
copy of each, taken with the rest while the sandbox is paused; each sandbox restored or forked
from it mounts a new volume of its own, `<volume>-<6 hex>`, filled from the copy)."""


@dataclass
class VolumeCopy:
    """A named volume a snapshot keeps a copy of (`volumes="copy"`): the `volume` it was taken
    of, the `path` the sandbox mounted it at (where sandboxes made from the snapshot mount their
    new volume) and the copy's size in `bytes`."""

    volume: str
    path: str
    bytes: int

    @classmethod
    def from_json(cls, d: JsonDict) -> VolumeCopy:
        """Parses a `VolumeCopyInfo` entry."""
        return cls(volume=str(d["volume"]), path=str(d["path"]), bytes=int(d["bytes"]))


@dataclass
class SnapshotInfo:
    """A durable snapshot: what it holds (`manifest`, and `volumes`: the copies of named volumes
    it keeps, if taken with `volumes="copy"`), its fidelity and lineage."""

    id: str
    sandbox_id: str
    name: str
    description: str
    fidelity: str
    created_at: str
    size: int
    files: int
    tags: dict[str, str] = field(default_factory=dict)
    manifest: JsonDict = field(default_factory=dict)
    parent_id: str | None = None
    children: list[str] | None = None
    sandboxes: list[str] | None = None
    volumes: list[VolumeCopy] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JsonDict) -> SnapshotInfo:
        """Parses a `SnapshotInfo` answer (no `volumes`: none copied)."""
        known = _known(cls, d)
        known["tags"] = _strs(d.get("tags"))
        known["manifest"] = d.get("manifest") or {}
        known["volumes"] = [VolumeCopy.from_json(v) for v in d.get("volumes") or []]
        return cls(**known)


@dataclass
class AutoSnapshot:
    """Automatic snapshots: every `interval_secs`, keeping `keep`, and/or `before_reclaim`."""

    interval_secs: int | None = None
    keep: int | None = None
    before_reclaim: bool = False

    @classmethod
    def from_json(cls, d: JsonDict) -> AutoSnapshot:
        """Parses an `AutoSnapshot` answer."""
        return cls(
            interval_secs=d.get("interval_secs"),
            keep=d.get("keep"),
            before_reclaim=bool(d.get("before_reclaim", False)),
        )

    def to_json(self) -> JsonDict:
        """The request body."""
        body: JsonDict = {"before_reclaim": self.before_reclaim}
        if self.interval_secs is not None:
            body["interval_secs"] = self.interval_secs
        if self.keep is not None:
            body["keep"] = self.keep
        return body


@dataclass
class Context:
    """A code context: a kernel with state of its own."""

    id: str
    language: str
    execution_count: int = 0
    busy: bool = False
    pid: int | None = None
    created_at: str | None = None
    ended_at: str | None = None
    end_reason: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> Context:
        """Parses a `ContextView` answer."""
        return cls(**_known(cls, d))


@dataclass
class Variables:
    """A context's variables: JSON-exact `values`, the others as `{type, repr}`, and `missing`."""

    values: JsonDict
    unrepresentable: dict[str, JsonDict]
    missing: list[str]

    @classmethod
    def from_json(cls, d: JsonDict) -> Variables:
        """Parses a `VariablesView` answer."""
        return cls(
            values=d.get("values") or {},
            unrepresentable=d.get("unrepresentable") or {},
            missing=list(d.get("missing") or []),
        )


@dataclass
class Result:
    """A rich output as a MIME bundle: `kind` is `display` (shown during the run) or `result`
    (the last expression's value)."""

    kind: str
    data: JsonDict

    def _text(self, mime: str) -> str | None:
        value = self.data.get(mime)
        return value if isinstance(value, str) else None

    def _image(self, mime: str) -> bytes | None:
        value = self._text(mime)
        return base64.b64decode(value) if value is not None else None

    @property
    def formats(self) -> list[str]:
        """The MIME types this bundle holds."""
        return list(self.data)

    @property
    def text(self) -> str | None:
        """`text/plain`."""
        return self._text("text/plain")

    @property
    def html(self) -> str | None:
        """`text/html`."""
        return self._text("text/html")

    @property
    def markdown(self) -> str | None:
        """`text/markdown`."""
        return self._text("text/markdown")

    @property
    def svg(self) -> str | None:
        """`image/svg+xml`."""
        return self._text("image/svg+xml")

    @property
    def json(self) -> Any:
        """`application/json`, as decoded JSON."""
        return self.data.get("application/json")

    @property
    def png(self) -> bytes | None:
        """`image/png`, decoded from base64."""
        return self._image("image/png")

    @property
    def jpeg(self) -> bytes | None:
        """`image/jpeg`, decoded from base64."""
        return self._image("image/jpeg")

    def save_png(self, path: str | os.PathLike[str]) -> None:
        """Writes the PNG image to `path` (ValueError when the bundle has none)."""
        png = self.png
        if png is None:
            raise ValueError(f"this {self.kind} has no image/png (it has {self.formats})")
        with open(path, "wb") as f:
            f.write(png)


@dataclass
class ExecutionError:
    """The error code raised: its type `name`, `value` and `traceback` lines."""

    name: str
    value: str
    traceback: list[str]

    @classmethod
    def from_json(cls, d: JsonDict) -> ExecutionError:
        """Parses a `CodeErrorInfo`."""
        return cls(name=d.get("name", ""), value=d.get("value", ""), traceback=list(d.get("traceback") or []))

    def __str__(self) -> str:
        return "\n".join(self.traceback) or f"{self.name}: {self.value}"


@dataclass
class ExecutionDone:
    """How a code execution ended: `status` is ok, error, interrupted, timeout or crashed."""

    context: str
    language: str
    status: str
    execution_count: int
    duration_ms: float
    state_lost: bool = False
    kernel_restarted: bool = False
    exit_code: int | None = None
    crash: str | None = None
    notice: str | None = None
    artifacts: list[Artifact] = field(default_factory=list)
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    @classmethod
    def from_json(cls, d: JsonDict) -> ExecutionDone:
        """Parses a `CodeDoneInfo`."""
        known = _known(cls, d)
        known["artifacts"] = [Artifact.from_json(a) for a in d.get("artifacts") or []]
        return cls(**known)


@dataclass
class CodeEvent:
    """One event of a streamed code execution: `stdout`/`stderr` (`text`), `display`/`result`
    (`result`), `error` (`error`), then `done` (`done`), always last."""

    type: Literal["stdout", "stderr", "display", "result", "error", "done"]
    text: str = ""
    result: Result | None = None
    error: ExecutionError | None = None
    done: ExecutionDone | None = None


@dataclass
class Execution:
    """A finished code execution: printed text, rich results in order, the error if any."""

    stdout: str
    stderr: str
    results: list[Result]
    error: ExecutionError | None
    done: ExecutionDone

    @classmethod
    def from_json(cls, d: JsonDict) -> Execution:
        """Parses a `CodeResult` answer."""
        return cls(
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            results=[Result(o["kind"], o.get("data") or {}) for o in d.get("outputs") or []],
            error=ExecutionError.from_json(d["error"]) if d.get("error") else None,
            done=ExecutionDone.from_json(d["done"]),
        )

    @property
    def status(self) -> str:
        """ok, error, interrupted, timeout or crashed."""
        return self.done.status

    @property
    def ok(self) -> bool:
        """Whether it ran to the end without an error."""
        return self.done.status == "ok"

    @property
    def result(self) -> Result | None:
        """The value of the last expression, if it had one."""
        return next((r for r in reversed(self.results) if r.kind == "result"), None)

    @property
    def text(self) -> str | None:
        """The last expression's `text/plain`."""
        return self.result.text if self.result else None

    @property
    def png(self) -> bytes | None:
        """The first PNG image among the results (a matplotlib figure, …)."""
        return next((r.png for r in self.results if "image/png" in r.data), None)

    def save_png(self, path: str | os.PathLike[str]) -> None:
        """Writes the first PNG image among the results to `path` (ValueError if none)."""
        for r in self.results:
            if "image/png" in r.data:
                r.save_png(path)
                return
        raise ValueError("the execution produced no image/png")


class ExecutionBuilder:
    """Collects streamed code events into the `Execution` the collected route would give."""

    def __init__(self) -> None:
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._results: list[Result] = []
        self._error: ExecutionError | None = None
        self._done: ExecutionDone | None = None

    def feed(self, event: CodeEvent) -> None:
        """Adds one event."""
        if event.type == "stdout":
            self._stdout.append(event.text)
        elif event.type == "stderr":
            self._stderr.append(event.text)
        elif event.result is not None:
            self._results.append(event.result)
        elif event.error is not None:
            self._error = event.error
        elif event.done is not None:
            self._done = event.done

    def build(self) -> Execution:
        """The execution, once `done` was fed."""
        if self._done is None:
            raise RuntimeError("the code stream ended without its done event")
        return Execution(
            stdout="".join(self._stdout),
            stderr="".join(self._stderr),
            results=self._results,
            error=self._error,
            done=self._done,
        )


@dataclass(frozen=True)
class RunOnceMetrics:
    """The timings of a `run_once`, in milliseconds: `startup_ms` (creating the sandbox),
    `run_ms` (running the code, request to answer), `execution_ms` (the run as the kernel
    measured it), `cleanup_ms` (deleting the sandbox) and `total_ms`."""

    startup_ms: float
    run_ms: float
    execution_ms: float
    cleanup_ms: float
    total_ms: float


@dataclass
class RunOnceResult:
    """What `run_once` gives: the execution and client-side timings in milliseconds."""

    sandbox_id: str
    execution: Execution
    create_ms: float
    run_ms: float
    delete_ms: float
    total_ms: float

    @property
    def stdout(self) -> str:
        """What the code printed."""
        return self.execution.stdout

    @property
    def text(self) -> str | None:
        """The last expression's `text/plain`."""
        return self.execution.text

    @property
    def ok(self) -> bool:
        """Whether the code ran without an error."""
        return self.execution.ok

    @property
    def output(self) -> str:
        """What the code printed (`stdout`), under other sandbox SDKs' name."""
        return self.execution.stdout

    @property
    def metrics(self) -> RunOnceMetrics:
        """The timings grouped as other sandbox SDKs give them (`create_ms` is `startup_ms`,
        `delete_ms` is `cleanup_ms`; `execution_ms` is the kernel's own measure)."""
        return RunOnceMetrics(
            startup_ms=self.create_ms,
            run_ms=self.run_ms,
            execution_ms=self.execution.done.duration_ms,
            cleanup_ms=self.delete_ms,
            total_ms=self.total_ms,
        )


@dataclass
class Offsets:
    """The byte offsets a background process's output has been read to, per stream: where a
    reconnect carries on (None: from the oldest byte still buffered)."""

    stdout: int | None = None
    stderr: int | None = None

    def advance(self, event: OutputEvent) -> None:
        """Moves past what `event` delivered (or reported lost)."""
        channel = event.channel if event.type == "lost" else event.type
        end = event.end
        if end is None:
            return
        if channel == "stdout":
            self.stdout = end
        elif channel == "stderr":
            self.stderr = end


@dataclass
class CodeCallbacks:
    """The callbacks of a streamed code execution (each may be None; async ones may return an
    awaitable, which the async client awaits)."""

    on_stdout: Callable[[str], object] | None = None
    on_stderr: Callable[[str], object] | None = None
    on_result: Callable[[Result], object] | None = None
    on_error: Callable[[ExecutionError], object] | None = None

    @property
    def any(self) -> bool:
        """Whether any callback is set."""
        return any((self.on_stdout, self.on_stderr, self.on_result, self.on_error))

    def dispatch(self, event: CodeEvent) -> object:
        """Calls the callback for `event` (displays and the result go to `on_result`)."""
        if event.type == "stdout" and self.on_stdout:
            return self.on_stdout(event.text)
        if event.type == "stderr" and self.on_stderr:
            return self.on_stderr(event.text)
        if event.result is not None and self.on_result:
            return self.on_result(event.result)
        if event.error is not None and self.on_error:
            return self.on_error(event.error)
        return None


# --- agent runs ---------------------------------------------------------------------------


SnapshotPolicy = Literal["on_mutation", "every_step", "off"]
"""When a run snapshots its sandbox at the end of a step: `on_mutation` (the daemon's default:
after steps that ran code, a command, an import, …), `every_step`, or `off` (then the run
cannot be resumed, forked or opened at a step with its sandbox's state)."""


@dataclass
class Budgets:
    """A run's limits. Asked for at start (each field left None takes the daemon's default,
    and each is capped by its hard maximum); a run's `info.budgets` has them all resolved
    (`token_budget` None there: no token limit)."""

    max_iterations: int | None = None
    """Model calls that may use tools (default 10, at most 50)."""
    max_depth: int | None = None
    """Levels of sub-runs below the run (default 4, at most 5)."""
    max_sub_calls: int | None = None
    """Sub-calls (`sub_complete`, …) in the whole run tree (default 12)."""
    token_budget: int | None = None
    """Input plus output tokens of the whole run tree (default: no limit)."""
    cost_limit_usd: float | None = None
    """US dollars the run tree may spend (default 2.00, at most 10.00)."""
    timeout_secs: float | None = None
    """Seconds the run may take in all (default 300, at most 600)."""
    cell_timeout_secs: float | None = None
    """Seconds one cell of code may run (default 30, at most 600)."""
    max_output_tokens: int | None = None
    """Output tokens one model call may produce (default 4096)."""

    @classmethod
    def from_json(cls, d: JsonDict) -> Budgets:
        """Parses a run's `budgets`."""
        return cls(**_known(cls, d))

    def to_json(self) -> JsonDict:
        """The request's `budgets` (only the limits set)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Validate:
    """How a run checks its final answer before it accepts it: `command` runs (`sh -c`) in the
    run's sandbox; exit 0 ends the run `succeeded` with reason `validated`, anything else goes
    back to the model (exit code and output tail), until `max_attempts` answers have failed
    (`failed`, reason `validation_failed`, the last answer kept). Fields left None take the
    daemon's defaults; the daemon checks the values (a bad one is an InvalidArgumentError)."""

    command: str
    """The command (`python3 -m pytest -q`, `test -s out.csv`)."""
    timeout_s: float | None = None
    """Seconds it may run (default 60, more than 0 and at most 600)."""
    max_attempts: int | None = None
    """Answers the model may give before the run fails (default 3, 1 to 10)."""

    @classmethod
    def from_json(cls, d: JsonDict) -> Validate:
        """Parses a `validate` object (as `run_started` carries it)."""
        return cls(**_known(cls, d))

    def to_json(self) -> JsonDict:
        """The request's `validate` (the fields left None are not sent)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class RunUsage:
    """Tokens and money a run, with its sub-calls and sub-runs, has used (`cost_usd` None
    when some model's price is unknown; `estimated` when a server reported no token counts)."""

    input_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    sub_calls: int = 0
    cost_usd: float | None = None
    estimated: bool = False

    @classmethod
    def from_json(cls, d: JsonDict) -> RunUsage:
        """Parses a run's `usage`."""
        return cls(
            input_tokens=d.get("input_tokens", 0),
            output_tokens=d.get("output_tokens", 0),
            steps=d.get("steps", 0),
            llm_calls=d.get("llm_calls", 0),
            tool_calls=d.get("tool_calls", 0),
            sub_calls=d.get("sub_calls", 0),
            cost_usd=d.get("cost_usd"),
            estimated=bool(d.get("estimated", False)),
        )


@dataclass
class ForkedFrom:
    """Where a forked run's history comes from: the original run and the last of its steps
    the fork's history holds."""

    run_id: str
    step: int

    @classmethod
    def from_json(cls, d: JsonDict) -> ForkedFrom:
        """Parses a run's `forked_from`."""
        return cls(run_id=d["run_id"], step=int(d["step"]))


@dataclass
class RunInfo:
    """An agent run's record: `status` is `running`, `succeeded`, `failed` or `cancelled`;
    `reason` says why it ended (`final`, `text`, `forced`, `validated`, `validation_failed`,
    `budget:<which>`, `timeout`, `cancelled`, `provider_error`, `error`, `interrupted`);
    `forked_from` is set on a fork (`runs.fork`)."""

    id: str
    status: str
    task: str
    model: str
    mode: str
    root_id: str
    depth: int
    budgets: Budgets
    usage: RunUsage
    created_at: str
    answer: str | None = None
    reason: str | None = None
    sandbox_id: str | None = None
    parent_id: str | None = None
    ended_at: str | None = None
    forked_from: ForkedFrom | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> RunInfo:
        """Parses a `RunInfo` answer."""
        return cls(
            id=d["id"],
            status=d["status"],
            task=d.get("task", ""),
            model=d.get("model", ""),
            mode=d.get("mode", ""),
            root_id=d.get("root_id") or d["id"],
            depth=d.get("depth", 0),
            budgets=Budgets.from_json(d.get("budgets") or {}),
            usage=RunUsage.from_json(d.get("usage") or {}),
            created_at=d.get("created_at", ""),
            answer=d.get("answer"),
            reason=d.get("reason"),
            sandbox_id=d.get("sandbox_id"),
            parent_id=d.get("parent_id"),
            ended_at=d.get("ended_at"),
            forked_from=ForkedFrom.from_json(d["forked_from"]) if d.get("forked_from") else None,
        )

    @property
    def done(self) -> bool:
        """Whether it has ended (any status but `running`)."""
        return self.status != "running"

    @property
    def ok(self) -> bool:
        """Whether it succeeded (it answered)."""
        return self.status == "succeeded"


@dataclass
class RunEvent:
    """One event of a run's trajectory: its number `seq` (1, 2, 3, … without gaps), `type`
    (`run_started`, `llm_request`, `llm_response`, `tool_call`, `tool_result`,
    `step_committed`, `validation`, `run_finished`, …) and `data`, the whole event as recorded
    (the fields of each type are in docs/agent.md); `event["answer"]` reads `data`."""

    seq: int
    type: str
    ts: str
    run_id: str
    step: int | None
    depth: int
    data: JsonDict

    @classmethod
    def from_json(cls, d: JsonDict) -> RunEvent:
        """Parses one trajectory event (a flat JSON object)."""
        return cls(
            seq=int(d.get("seq", 0)),
            type=str(d.get("type", "")),
            ts=str(d.get("ts", "")),
            run_id=str(d.get("run_id", "")),
            step=d.get("step"),
            depth=int(d.get("depth", 0)),
            data=dict(d),
        )

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the event, or `default`."""
        return self.data.get(key, default)


@dataclass
class StepSandbox:
    """A new sandbox as a run's sandbox was at the end of one of its steps (`runs.step_sandbox`):
    restored from `snapshot_id`, the newest step snapshot at or before that step (taken at
    `snapshot_step`: the steps between changed nothing); `not_carried` says what the snapshot
    could not hold (running processes, variables that could not be saved)."""

    sandbox_id: str
    snapshot_id: str
    snapshot_step: int
    not_carried: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JsonDict) -> StepSandbox:
        """Parses a `StepSandbox` answer."""
        return cls(
            sandbox_id=d["sandbox_id"],
            snapshot_id=d["snapshot_id"],
            snapshot_step=int(d["snapshot_step"]),
            not_carried=[str(n) for n in d.get("not_carried") or []],
        )


# --- threads ------------------------------------------------------------------------------


@dataclass
class ThreadInfo:
    """A thread: a conversation that persists across runs (each run on it sees the ones
    before), in one sandbox (`sandbox_id`, None until its first run)."""

    id: str
    name: str
    runs: int
    created_at: str
    updated_at: str
    sandbox_id: str | None = None
    last_run_id: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> ThreadInfo:
        """Parses a `ThreadInfo` answer."""
        return cls(
            id=d["id"],
            name=d.get("name", ""),
            runs=int(d.get("runs", 0)),
            created_at=d.get("created_at", ""),
            updated_at=d.get("updated_at", ""),
            sandbox_id=d.get("sandbox_id"),
            last_run_id=d.get("last_run_id"),
        )


# --- memories -----------------------------------------------------------------------------


@dataclass
class Memory:
    """A remembered text: a sandbox's (`scope` `sandbox`, `sandbox_id` says which) or its
    owner's (`owner`). In search results only: `score`, how well it matched (higher is
    better, comparable within one search: bm25, or the fused rank with hybrid ranking),
    `matched_by` (`fts`: its words, `semantic`: its embedding only, `both`) and, when its
    embedding found it, `similarity` (cosine). `warning` is set on an add whose embedding
    failed (the memory is kept; a later hybrid search embeds it)."""

    id: str
    scope: str
    text: str
    category: str
    created_at: str
    metadata: dict[str, str] = field(default_factory=dict)
    sandbox_id: str | None = None
    score: float | None = None
    matched_by: str | None = None
    similarity: float | None = None
    warning: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> Memory:
        """Parses a `Memory` answer."""
        return cls(
            id=d["id"],
            scope=d.get("scope", ""),
            text=d.get("text", ""),
            category=d.get("category", ""),
            created_at=d.get("created_at", ""),
            metadata=_strs(d.get("metadata")),
            sandbox_id=d.get("sandbox_id"),
            score=d.get("score"),
            matched_by=d.get("matched_by"),
            similarity=d.get("similarity"),
            warning=d.get("warning"),
        )


class MemorySearch(list[Memory]):
    """Search results, best first (a list of `Memory`), and how they were ranked:
    `ranking` is `"hybrid"` (words and embeddings, when the daemon has an embedding model) or
    `"fts"` (words only); `warning` says why it could not rank as configured (the embeddings
    endpoint failed) or what it left out, else None."""

    def __init__(
        self, memories: list[Memory], ranking: str | None = None, warning: str | None = None
    ) -> None:
        super().__init__(memories)
        self.ranking = ranking
        self.warning = warning

    @classmethod
    def from_json(cls, d: JsonDict) -> MemorySearch:
        """Parses a search's `MemoryList` answer."""
        return cls(
            [Memory.from_json(m) for m in d.get("memories") or []],
            ranking=d.get("ranking"),
            warning=d.get("warning"),
        )


@dataclass
class InferJob:
    """A job extracting facts from a text with the daemon's model (`memory.add(..., infer=True)`):
    `status` is `queued`, `running`, `succeeded` (`memories`: the ids of the memories it
    added) or `failed` (`error` says why; `interrupted: …` when the daemon stopped first)."""

    id: str
    status: str
    scope: str
    model: str
    category: str
    created_at: str
    updated_at: str
    memories: list[str] = field(default_factory=list)
    sandbox_id: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        """Whether it has ended (`succeeded` or `failed`)."""
        return self.status in ("succeeded", "failed")

    @classmethod
    def from_json(cls, d: JsonDict) -> InferJob:
        """Parses an `InferJob` answer."""
        return cls(
            id=d["id"],
            status=d.get("status", ""),
            scope=d.get("scope", ""),
            model=d.get("model", ""),
            category=d.get("category", ""),
            created_at=d.get("created_at", ""),
            updated_at=d.get("updated_at", ""),
            memories=[str(m) for m in d.get("memories") or []],
            sandbox_id=d.get("sandbox_id"),
            error=d.get("error"),
        )


@dataclass
class MemoryList:
    """One page of a memory listing, newest first; `next_cursor` (None on the last page) is
    the `cursor` of the next. Iterating it gives its memories."""

    memories: list[Memory]
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> MemoryList:
        """Parses a `MemoryList` answer."""
        return cls(
            memories=[Memory.from_json(m) for m in d.get("memories") or []],
            next_cursor=d.get("next_cursor"),
        )

    def __iter__(self) -> Iterator[Memory]:
        return iter(self.memories)

    def __len__(self) -> int:
        return len(self.memories)


# --- network ------------------------------------------------------------------------------


@dataclass
class NetworkInfo:
    """A sandbox's network now: its policy, the proxies its programs reach it through (set in
    their `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`; None when the policy is `off`), and
    what its egress proxy has carried (bytes both ways, connections open now)."""

    network: NetworkPolicy
    http_proxy: str | None = None
    socks_proxy: str | None = None
    bytes: int = 0
    open_connections: int = 0

    @classmethod
    def from_json(cls, d: JsonDict) -> NetworkInfo:
        """Parses a `NetworkInfo` answer."""
        return cls(
            network=_policy(d.get("network")),
            http_proxy=d.get("http_proxy"),
            socks_proxy=d.get("socks_proxy"),
            bytes=int(d.get("bytes", 0)),
            open_connections=int(d.get("open_connections", 0)),
        )


@dataclass
class EgressEvent:
    """One connection (or plain-HTTP request) through a sandbox's egress proxy: `decision` is
    `allowed` or `denied` (`reason` says why it was denied, or cut); `protocol` is `http` (a
    plain request), `connect` (an HTTPS tunnel) or `socks5`; `at` is when it ended or was
    refused (RFC 3339). `id` orders events (pass it as `before` for older ones)."""

    id: int
    at: str
    protocol: str
    host: str
    port: int
    decision: str
    reason: str | None = None
    address: str | None = None
    sni: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    duration_ms: int = 0

    @classmethod
    def from_json(cls, d: JsonDict) -> EgressEvent:
        """Parses an `EgressEventInfo`."""
        return cls(**_known(cls, d))


@dataclass
class EgressEventList:
    """One page of a sandbox's egress events, newest first; `next_before` (None on the last
    page) is the `before` of the next, older, page. Iterating it gives its events."""

    events: list[EgressEvent]
    next_before: int | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> EgressEventList:
        """Parses an `EgressEventList` answer."""
        return cls(
            events=[EgressEvent.from_json(e) for e in d.get("events") or []],
            next_before=d.get("next_before"),
        )

    def __iter__(self) -> Iterator[EgressEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)


# --- git ----------------------------------------------------------------------------------


@dataclass
class GitCloneResult:
    """What `git_clone` brought into the sandbox: where it is (absolute), the checked-out
    `commit` (40 hex digits) and `branch` (None for a detached tag), the files copied in (its
    `.git` folder's included) and their bytes, and how long the clone and the copy took."""

    path: str
    commit: str
    branch: str | None = None
    files: int = 0
    bytes: int = 0
    duration_ms: int = 0

    @classmethod
    def from_json(cls, d: JsonDict) -> GitCloneResult:
        """Parses a `GitCloneResult` answer."""
        return cls(**_known(cls, d))


# --- previews -----------------------------------------------------------------------------

PreviewRoute = Literal["host", "path"]
"""How a preview URL reaches the port: `"host"` at `{port}-{id}.localhost` on the daemon's
port (a page's absolute links work as on its own server), `"path"` under
`/v1/sandboxes/{id}/ports/{port}/` on the daemon's own URL (works wherever the daemon does)."""


@dataclass
class PreviewInfo:
    """How to reach a port of a sandbox through the daemon: `path` is the path route on the
    daemon (`/v1/sandboxes/{id}/ports/{port}/`), `host` the host route's name
    (`{port}-{id}.localhost`, which browsers resolve to loopback; reached on the daemon's
    port), `token` lets anyone holding it reach this port until `expires_at` (RFC 3339), as
    `?sandcell_token=…` on a URL or the `X-Sandcell-Token` header; `public` says the port is
    reachable with no key or token at all."""

    port: int
    path: str
    host: str
    token: str
    expires_at: str
    public: bool = False

    @classmethod
    def from_json(cls, d: JsonDict) -> PreviewInfo:
        """Parses a `PreviewInfo` answer."""
        return cls(**_known(cls, d))


# --- templates ----------------------------------------------------------------------------


@dataclass
class StepReport:
    """What happened to one step of a build: its number `index` (1-based), its `line` in the
    Dockerfile and `text` (the instruction as written), whether its layer came from the cache,
    the command's `exit_code` (`RUN` steps that ran; None for a cached or file step), how long
    it took, and the `layer` it made (`sha256:…`) and its `size` in bytes."""

    index: int
    line: int
    text: str
    cached: bool
    duration_ms: int
    size: int
    exit_code: int | None = None
    layer: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> StepReport:
        """Parses a `StepReport`."""
        return cls(
            index=int(d["index"]),
            line=int(d.get("line", 0)),
            text=str(d.get("text", "")),
            cached=bool(d.get("cached", False)),
            duration_ms=int(d.get("duration_ms", 0)),
            size=int(d.get("size", 0)),
            exit_code=d.get("exit_code"),
            layer=d.get("layer"),
        )


@dataclass
class BuiltImage:
    """The image a build made: its name (`reference`, `name:tag`), manifest `digest`, its
    `layers` (the base's included) and their bytes, and the kernels that started in it."""

    reference: str
    digest: str
    layers: int
    size: int
    kernels: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JsonDict) -> BuiltImage:
        """Parses a `BuiltImage`."""
        return cls(
            reference=str(d["reference"]),
            digest=str(d.get("digest", "")),
            layers=int(d.get("layers", 0)),
            size=int(d.get("size", 0)),
            kernels=[str(k) for k in d.get("kernels") or []],
        )


@dataclass
class BuildInfo:
    """A template build: `state` is `queued`, `running`, `succeeded`, `failed` or `cancelled`;
    `step` the step running (1-based; 0 before the first) of `steps` (0 until the Dockerfile
    is planned); `step_reports` the steps that ended, in order; `exit_code` the failing step's
    exit code and `error` why it failed; `image` what it made (once it succeeded)."""

    id: str
    name: str
    state: str
    step: int
    steps: int
    created_at: str
    step_reports: list[StepReport] = field(default_factory=list)
    exit_code: int | None = None
    error: str | None = None
    image: BuiltImage | None = None
    finished_at: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> BuildInfo:
        """Parses a `BuildInfo` answer."""
        return cls(
            id=str(d["id"]),
            name=str(d.get("name", "")),
            state=str(d["state"]),
            step=int(d.get("step", 0)),
            steps=int(d.get("steps", 0)),
            created_at=str(d.get("created_at", "")),
            step_reports=[StepReport.from_json(s) for s in d.get("step_reports") or []],
            exit_code=d.get("exit_code"),
            error=d.get("error"),
            image=BuiltImage.from_json(d["image"]) if d.get("image") else None,
            finished_at=d.get("finished_at"),
        )

    @property
    def done(self) -> bool:
        """Whether it has ended (`succeeded`, `failed` or `cancelled`)."""
        return self.state in ("succeeded", "failed", "cancelled")

    @property
    def ok(self) -> bool:
        """Whether it succeeded (the template is tagged)."""
        return self.state == "succeeded"

    @property
    def failed_step(self) -> StepReport | None:
        """The step whose command failed (a non-zero exit code), if one did."""
        failed = [s for s in self.step_reports if s.exit_code not in (None, 0)]
        return failed[-1] if failed else None


@dataclass
class BuildEvent:
    """One event of a build's log, numbered `seq` (1, 2, 3, … without gaps), of one `kind`:

    - `warning`: an instruction ignored (`line`, `message`);
    - `base`: the base found or made now (`name`, `digest`, `made_ms`);
    - `step_started`: step `index` of `total` begins (`line`, `text`);
    - `output`: the running step `index` printed `text` on `stream` (`stdout`, `stderr`);
    - `network`: a request of step `index` through the build's proxy (`host`, `port`,
      `outcome` `allowed`/`denied`, `reason`);
    - `step_finished`: a step ended (`step`, its `StepReport`);
    - `smoke`: a kernel tried in the finished image (`kernel`, `ok`, `detail`);
    - `finished`: the build is over (`state` `succeeded`, `failed` or `cancelled`; `error`).

    The fields another kind has are None; `data` is the whole event as sent (`event["text"]`
    reads it)."""

    seq: int
    kind: str
    index: int | None = None
    total: int | None = None
    line: int | None = None
    text: str | None = None
    stream: str | None = None
    message: str | None = None
    name: str | None = None
    digest: str | None = None
    made_ms: int | None = None
    host: str | None = None
    port: int | None = None
    outcome: str | None = None
    reason: str | None = None
    step: StepReport | None = None
    kernel: str | None = None
    ok: bool | None = None
    detail: str | None = None
    state: str | None = None
    error: str | None = None
    data: JsonDict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: JsonDict) -> BuildEvent:
        """Parses a `NumberedBuildEvent` (a flat object: `seq`, `event`, then the kind's fields)."""
        step = d.get("step")
        return cls(
            seq=int(d.get("seq", 0)),
            kind=str(d.get("event", "")),
            index=d.get("index"),
            total=d.get("total"),
            line=d.get("line"),
            text=d.get("text"),
            stream=d.get("stream"),
            message=d.get("message"),
            name=d.get("name"),
            digest=d.get("digest"),
            made_ms=d.get("made_ms"),
            host=d.get("host"),
            port=d.get("port"),
            outcome=d.get("outcome"),
            reason=d.get("reason"),
            step=StepReport.from_json(step) if isinstance(step, dict) else None,
            kernel=d.get("kernel"),
            ok=d.get("ok"),
            detail=d.get("detail"),
            state=d.get("state"),
            error=d.get("error"),
            data=dict(d),
        )

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the event, or `default`."""
        return self.data.get(key, default)


@dataclass
class TemplateInfo:
    """A template: an image of the daemon's store, built or imported. `name` is `name:tag`;
    `env` its `ENV` (`KEY=value` each), `workdir` its `WORKDIR`, `kernels` those its build
    found starting in it (none recorded for an imported image), `sandboxes` how many run on
    it now (a template is not deleted while any do)."""

    name: str
    digest: str
    layers: int
    size: int
    sandboxes: int
    kernels: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    workdir: str | None = None

    @classmethod
    def from_json(cls, d: JsonDict) -> TemplateInfo:
        """Parses a `TemplateInfo` answer."""
        return cls(
            name=str(d["name"]),
            digest=str(d.get("digest", "")),
            layers=int(d.get("layers", 0)),
            size=int(d.get("size", 0)),
            sandboxes=int(d.get("sandboxes", 0)),
            kernels=[str(k) for k in d.get("kernels") or []],
            env=[str(e) for e in d.get("env") or []],
            workdir=d.get("workdir"),
        )


@dataclass
class VolumeInfo:
    """A named volume of the caller's (`Volume.create`, or made by the first sandbox that
    mounts it): its `name`, when it was made (`created_at`, RFC 3339), the bytes of its files
    (`size_bytes`) and the running sandboxes that mount it now (`sandboxes`, their ids; a
    volume is not deleted while there are any)."""

    name: str
    created_at: str
    size_bytes: int
    sandboxes: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: JsonDict) -> VolumeInfo:
        """Parses a `VolumeInfo` answer."""
        return cls(
            name=str(d["name"]),
            created_at=str(d.get("created_at", "")),
            size_bytes=int(d.get("size_bytes", 0)),
            sandboxes=[str(s) for s in d.get("sandboxes") or []],
        )
