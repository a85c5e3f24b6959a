"""The synchronous client: `Sandcell` (a connection to the daemon), `Sandbox` and `Process`.
`async_sandbox` has the same shape with `async`; both only send what `_api` builds.

Generated from `async_sandbox.py` by `scripts/gen_sync.py`: edit that file, not this one."""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from datetime import timedelta
from types import TracebackType
from typing import IO, Any, Literal, TypeVar, overload

from . import _api
from ._context import ContextInput, build_inputs
from ._http import Config, SyncTransport, read_chunks
from ._models import (
    Artifact,
    AutoSnapshot,
    Budgets,
    BuildEvent,
    BuildInfo,
    CodeCallbacks,
    CodeEvent,
    CommandBuilder,
    CommandResult,
    Context,
    EgressEvent,
    EgressEventList,
    Execution,
    ExecutionBuilder,
    ExecutionError,
    ExportInfo,
    FileInfo,
    GitCloneResult,
    ImportResult,
    InferJob,
    Memory,
    MemoryList,
    MemorySearch,
    Metrics,
    MountInput,
    NetworkInfo,
    NetworkPolicyInput,
    Offsets,
    OutputEvent,
    PackagesInput,
    PreviewInfo,
    PreviewRoute,
    ProcessInfo,
    ProcessOutput,
    Result,
    RunEvent,
    RunInfo,
    RunOnceResult,
    SandboxInfo,
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
from .errors import BuildError, ConnectionError, NotFoundError, SandboxGoneError, TimeoutError
from .terminal import Terminal

PathOrFile = str | os.PathLike[str] | IO[bytes]
T = TypeVar("T")


def _context_id(context: str | Context) -> str:
    return context.id if isinstance(context, Context) else context


class Sandcell:
    """A connection to a Sandcell daemon, and the calls that belong to no one sandbox.

    Configured by the arguments, else `SANDCELL_API_URL` and `SANDCELL_API_KEY`, else what the
    daemon left in its home (`$SANDCELL_HOME`, …): the URL in `daemon.json`, the key in `admin.key`.
    """

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        request_timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self._setup(Config.resolve(api_url, api_key, request_timeout, connect_timeout))

    def _setup(self, config: Config) -> None:
        self.config = config
        self._http = SyncTransport(config)
        self.runs = Runs(self)
        """Agent runs: `start`, `run`, `get`, `list`, `resume`, `fork`, `step_sandbox`."""
        self.threads = Threads(self)
        """Threads, conversations that persist across runs: `create`, `list`, `get`,
        `rename`, `delete`."""
        self.memory = Memories(self, None)
        """The caller's own memories (not of any sandbox): `add`, `search`, `list`, `get`,
        `delete`; `get` and `delete` reach a sandbox's memories too."""
        self.templates = Templates(self)
        """Templates and their builds: `build`, `list`, `get`, `delete`, `get_build`,
        `list_builds`."""
        self.volumes = Volumes(self)
        """The caller's named volumes, folders that outlive sandboxes: `create`, `list`,
        `get`, `delete`."""

    @classmethod
    def _from_config(cls, config: Config) -> Sandcell:
        """Another connection with the same configuration."""
        made = cls.__new__(cls)
        made._setup(config)
        return made

    def system(self) -> dict[str, Any]:
        """The daemon's version, uptime, backends and what each offers, and the caller."""
        return self._http.call(_api.system())

    def list_snapshots(self, sandbox_id: str | None = None) -> list[SnapshotInfo]:
        """Snapshots, oldest first (only one sandbox's with `sandbox_id`)."""
        return self._http.call(_api.list_snapshots(sandbox_id))

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """One snapshot, with its lineage (`children`, `sandboxes`)."""
        return self._http.call(_api.get_snapshot(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot (refused with ConflictError while it has children)."""
        self._http.call(_api.delete_snapshot(snapshot_id))

    def list_exports(self, sandbox_id: str | None = None) -> list[ExportInfo]:
        """Exports, oldest first (only one sandbox's with `sandbox_id`)."""
        return self._http.call(_api.list_exports(sandbox_id))

    def get_export(self, export_id: str) -> ExportInfo:
        """One export, with a fresh signed link."""
        return self._http.call(_api.get_export(export_id))

    def delete_export(self, export_id: str) -> None:
        """Deletes an export and its stored copy."""
        self._http.call(_api.delete_export(export_id))

    def download_export(self, export_id: str, dest: PathOrFile) -> int:
        """Streams an export (a folder as a tar archive) to a path or file; returns its size."""
        return _download_to(self._http, _api.export_content(export_id), dest)

    def close(self) -> None:
        """Closes the connection pool."""
        self._http.close()

    def __enter__(self) -> Sandcell:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _download_to(http: SyncTransport, call: _api.Call[Any], dest: PathOrFile) -> int:
    if not isinstance(dest, (str, os.PathLike)):
        return http.download(call, dest)
    try:
        with open(dest, "wb") as f:
            return http.download(call, f)
    except BaseException:
        # A failed download leaves no partial file behind.
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise


def _connect(
    client: Sandcell | None, api_url: str | None, api_key: str | None
) -> tuple[Sandcell, bool]:
    """The client to use, and whether the caller made it (and so must close it)."""
    if client is not None:
        return client, False
    return Sandcell(api_url, api_key), True


class Sandbox:
    """One sandbox. Make one with `Sandbox.create()`; `with`
    deletes it at the end of the block."""

    def __init__(self, info: SandboxInfo, client: Sandcell, *, owns_client: bool = False) -> None:
        self.info = info
        self.client = client
        self._http = client._http
        self._owns_client = owns_client
        self._closed = False
        self.commands = Commands(self)
        """Commands under E2B's names: `run`, `list`, `kill`, `connect`."""
        self.files = Files(self)
        """Files under E2B's names: `write`, `read`, `list`, `get_info`, `exists`, `make_dir`,
        `remove`, `rename`."""
        self.memory = Memories(client, info.id)
        """The sandbox's memories: `add`, `search`, `list`, `get`, `delete` (a sandbox made
        from a snapshot starts with those its origin had then)."""

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.state} template={self.info.template}>"

    @property
    def id(self) -> str:
        """The sandbox's id (`sb-…`)."""
        return self.info.id

    @property
    def _exec_timeout(self) -> float | None:
        secs = self.info.limits.exec_timeout_secs
        return float(secs) if secs is not None else None

    # --- making, finding, ending ---------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: str | None = None,
        *,
        size: str | None = None,
        timeout: float | timedelta | None = None,
        ttl: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        ephemeral: bool = False,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        network: NetworkPolicyInput | None = None,
        packages: PackagesInput | None = None,
        secrets: Sequence[SecretInput] | None = None,
        mounts: Sequence[MountInput] | None = None,
        snapshot_id: str | None = None,
        backend: str | None = None,
        limits: Mapping[str, float] | None = None,
        kernels: Sequence[str] | None = None,
        checkpointable: bool = False,
        auto_snapshot: AutoSnapshot | None = None,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> Sandbox:
        """Creates a sandbox (or restores `snapshot_id`); `timeout`/`ttl` is its lifetime in seconds.
        `network` is what it reaches: `"loopback"` (the default), `"off"`, `"full"`, or a list of
        allow rules (`["example.org", "*.example.net:443", "127.0.0.1:8080"]`, the same as
        `{"allow": [...]}`); a bad rule is an InvalidArgumentError. `packages`
        (`{"pip": [...], "npm": [...], "r": [...]}`) are installed while it is made, from the
        registries the daemon's operator configured, or unpacked from the cache of an earlier
        install of the same lists; `info.packages` says which (`PackagesReport`). An install
        that failed is an InvalidArgumentError naming the package (no sandbox is left), as
        are packages with `network="off"`. `secrets` (`Secret(name, value, hosts)`s or
        `{"name", "value", "hosts"}` mappings) never enter the sandbox: each `name` is an
        environment variable holding a placeholder, which its egress proxy replaces with the
        value in the headers and query of requests to `hosts` only (so `network` must let it
        reach them; not with `"off"`); a malformed one is a TypeError or ValueError before
        anything is sent, a bad name, value or host rule an InvalidArgumentError. `mounts`
        (`Mount.from_host(host_path, path)`, `Mount.from_volume(name, path)`, or
        `{"host_path" or "volume", "path", "mode"}` mappings) puts host folders and named
        volumes into it at `path` (`/workspace` or a folder below `/workspace`,
        `/home/sandbox` or `/tmp`): a host folder must lie inside the daemon's
        `mounts.allowed_paths` (else a PermissionDeniedError) and is read-only unless `mode`
        is `"rw"` or `"overlay"` (writes to a scratch layer of the sandbox's own; process
        backend only); a volume is made on first use and is read-write unless `mode` says
        otherwise (not with `checkpointable`). A malformed mount is a TypeError or ValueError
        before anything is sent, a bad path, name or mode an InvalidArgumentError."""
        call = _api.create_sandbox(
            template=template,
            size=size,
            timeout=timeout,
            ttl=ttl,
            idle_timeout=idle_timeout,
            ephemeral=ephemeral,
            labels=labels,
            metadata=metadata,
            env=env,
            network=network,
            packages=packages,
            secrets=secrets,
            mounts=mounts,
            snapshot_id=snapshot_id,
            backend=backend,
            limits=limits,
            kernels=kernels,
            checkpointable=checkpointable,
            auto_snapshot=auto_snapshot,
        )
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            return cls(sandcell._http.call(call), sandcell, owns_client=owned)
        except BaseException:
            if owned:
                sandcell.close()
            raise

    @classmethod
    def get(
        cls,
        sandbox_id: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> Sandbox:
        """Connects to an existing sandbox (NotFoundError if this key has none of that id)."""
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            return cls(sandcell._http.call(_api.get_sandbox(sandbox_id)), sandcell, owns_client=owned)
        except BaseException:
            if owned:
                sandcell.close()
            raise

    @classmethod
    def list(
        cls,
        *,
        label: Mapping[str, str] | str | None = None,
        metadata: Mapping[str, str] | str | None = None,
        state: str | Sequence[str] | None = None,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[SandboxInfo]:
        """Sandboxes whose labels and metadata match (`{"team": "ml"}` or `"team:ml"`); active
        ones unless `state` says otherwise (`"all"`, `"stopped"`, …)."""
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            found: builtins.list[SandboxInfo] = []
            cursor: str | None = None
            while True:
                page, cursor = sandcell._http.call(
                    _api.list_sandboxes(label=label, metadata=metadata, state=state, cursor=cursor)
                )
                found += page
                if not cursor:
                    return found
        finally:
            if owned:
                sandcell.close()

    @classmethod
    def fork(
        cls,
        snapshot_id: str,
        count: int = 1,
        *,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        ephemeral: bool = False,
        secrets: Sequence[SecretInput] | None = None,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[Sandbox]:
        """Makes `count` independent sandboxes from a snapshot (all or none); each `info.restore`
        says what came back. Ephemeral ones leave no record once deleted. `secrets` gives
        values for the snapshot's secrets by name (needed after a restart of the daemon, which
        keeps values in memory only; otherwise the forks get the values the snapshot's sandbox
        had)."""
        call = _api.fork(
            snapshot_id,
            count=count,
            labels=labels,
            metadata=metadata,
            timeout=timeout,
            idle_timeout=idle_timeout,
            ephemeral=ephemeral,
            secrets=secrets,
        )
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            infos = sandcell._http.call(call)
        finally:
            if owned:
                sandcell.close()
        if not owned:
            return [cls(info, sandcell) for info in infos]
        # Each fork gets a connection of its own, closed with it.
        return [
            cls(info, Sandcell._from_config(sandcell.config), owns_client=True)
            for info in infos
        ]

    @classmethod
    def run_once(
        cls,
        code: str,
        *,
        template: str = "python",
        language: str | None = None,
        timeout: float | None = None,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> RunOnceResult:
        """Runs `code` in a new ephemeral sandbox, deletes it, and returns the output with timings."""
        started = time.perf_counter()
        sandbox = cls.create(template, ephemeral=True, client=client, api_url=api_url, api_key=api_key)
        created = time.perf_counter()
        try:
            execution = sandbox.run_code(code, language=language, timeout=timeout)
            ran = time.perf_counter()
        finally:
            sandbox.kill()
            sandbox.disconnect()
        ended = time.perf_counter()
        return RunOnceResult(
            sandbox_id=sandbox.id,
            execution=execution,
            create_ms=(created - started) * 1000,
            run_ms=(ran - created) * 1000,
            delete_ms=(ended - ran) * 1000,
            total_ms=(ended - started) * 1000,
        )

    def refresh(self) -> SandboxInfo:
        """Reads the sandbox's record again (state, reason, expiry)."""
        self.info = self._http.call(_api.get_sandbox(self.id))
        return self.info

    def is_running(self) -> bool:
        """Whether it is running now."""
        info = self.refresh()
        return info.state == "running"

    def kill(self) -> None:
        """Stops and deletes the sandbox (an ephemeral one leaves no record)."""
        self._http.call(_api.delete_sandbox(self.id))

    def disconnect(self) -> None:
        """Lets go of this object's connection if it made it; the sandbox runs on (for code
        that only looked at a sandbox it does not own)."""
        if self._owns_client:
            self.client.close()

    def close(self) -> None:
        """Ends the sandbox (one already gone is fine) and lets go of the connection: what
        other sandbox SDKs' `close()` does, and what leaving a `with` block does."""
        if self._closed:
            return
        self._closed = True
        try:
            self.kill()
        except (NotFoundError, SandboxGoneError):
            pass
        finally:
            self.disconnect()

    def delete(self) -> None:
        """`kill()`, then `disconnect()` (other sandbox SDKs' name): unlike `close()`, a
        sandbox that is already gone is an error."""
        try:
            self.kill()
        finally:
            self.disconnect()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def pause(self) -> SandboxInfo:
        """Freezes every process (no CPU; memory and state kept)."""
        self.info = self._http.call(_api.sandbox_action(self.id, "pause"))
        return self.info

    def resume(self) -> SandboxInfo:
        """Lets a paused sandbox go on where it stopped."""
        self.info = self._http.call(_api.sandbox_action(self.id, "resume"))
        return self.info

    def set_timeout(self, timeout: float | timedelta) -> SandboxInfo:
        """Gives the sandbox a new lifetime of `timeout` seconds from now."""
        self.info = self._http.call(_api.set_timeout(self.id, timeout))
        return self.info

    def metrics(self) -> Metrics:
        """CPU, memory and process counts from the sandbox's cgroups."""
        return self._http.call(_api.metrics(self.id))

    # --- network -------------------------------------------------------------------------

    def network(self) -> NetworkInfo:
        """The sandbox's network policy now, the proxies its programs reach the outside
        through (`http_proxy`, `socks_proxy`; set in their `HTTP_PROXY`, `HTTPS_PROXY` and
        `ALL_PROXY`), and what its egress proxy has carried."""
        return self._http.call(_api.get_network(self.id))

    def set_network(self, policy: NetworkPolicyInput) -> NetworkInfo:
        """Changes what the running sandbox reaches, from its next connection (or plain-HTTP
        request) on; tunnels open now stay open. `policy` is `"loopback"`, `"full"`, a list of
        allow rules or `{"allow": [...]}`; `"off"` is only set at creation, so a change to or
        from it is an InvalidArgumentError, as is a bad rule."""
        info = self._http.call(_api.set_network(self.id, policy))
        self.info.network = info.network
        return info

    def secrets(self) -> builtins.list[SecretState]:
        """The sandbox's secrets: names, placeholders, hosts and whether the daemon holds each
        value (`held` is False after a restart of the daemon until the value is given again:
        meanwhile a request carrying the placeholder is refused). Never the values."""
        return self._http.call(_api.get_secrets(self.id))

    def set_secrets(self, secrets: Sequence[SecretInput]) -> builtins.list[SecretState]:
        """Replaces the running sandbox's secrets, from its next request on: a name it has keeps
        its placeholder (give a value again after a restart of the daemon, or rotate one); a
        new name gets a new placeholder (see `secrets()`; processes already running do not have
        it in their environment); a name left out is forgotten. A bad secret is an
        InvalidArgumentError naming it, never its value."""
        return self._http.call(_api.set_secrets(self.id, secrets))

    def egress_events(
        self, *, limit: int | None = None, before: int | None = None
    ) -> EgressEventList:
        """One page of the sandbox's egress events, newest first: each connection its proxy
        allowed or denied (at most `limit`, 1 to 1000, default 100; only those older than event
        `before`). Pass the page's `next_before` as `before` for the next one (None: it was the
        last). They are audit entries: they outlive the sandbox."""
        return self._http.call(_api.egress_events(self.id, limit=limit, before=before))

    def iter_egress_events(self, *, page_size: int | None = None) -> Iterator[EgressEvent]:
        """Yields every egress event of the sandbox, newest first, reading a page (of
        `page_size`, default 100) at a time as the iteration gets to it."""
        before: int | None = None
        while True:
            page = self.egress_events(limit=page_size, before=before)
            for event in page:
                yield event
            if page.next_before is None:
                return
            before = page.next_before

    # --- previews ------------------------------------------------------------------------

    def preview(
        self, port: int, *, ttl_secs: int | None = None, public: bool | None = None
    ) -> PreviewInfo:
        """Makes a server listening on `port` inside the sandbox (on its loopback) reachable
        through the daemon: the answer has a token for that port, valid `ttl_secs` (default
        3600, at most 7 days), and where the port is reached (`path` on the daemon, `host` on
        the daemon's port). Requests there carry the API key, or the token
        (`?sandcell_token=…`, the `X-Sandcell-Token` header, or on the host route the cookie a
        URL with the token sets), or nothing once `public=True` (`public=False` makes the port
        private again). The sandbox's own network policy is unchanged. A port outside 1 to
        65535 or a `ttl_secs` outside 1 s to 7 days is an InvalidArgumentError. Nothing
        listening on the port is answered there with 502 `port_closed`; a sandbox with network
        `"off"` (nothing inside can listen), with 409 `invalid_state`."""
        return self._http.call(_api.create_preview(self.id, port, ttl_secs=ttl_secs, public=public))

    def get_host(self, port: int) -> str:
        """`{port}-{id}.localhost:{daemon port}`: the host at which a server on `port` inside
        the sandbox is reached through the daemon (browsers resolve `*.localhost` to this
        machine's loopback, so it serves a browser on the daemon's machine, or one whose
        daemon port is forwarded; no port when the client's URL names none). Made from
        `info.preview_host` and the client's URL, with no request; reaching it takes the API
        key, a token (`preview_url`) or a public port. A port outside 1 to 65535 is a
        ValueError."""
        return _api.preview_host(self.info.preview_host, self.id, port, self._http.config.api_url)

    def preview_url(
        self, port: int, *, route: PreviewRoute = "host", ttl_secs: int | None = None
    ) -> str:
        """A URL of the server on `port` inside the sandbox, to open in a browser or fetch with
        no API key: a new token (valid `ttl_secs`, default 3600) is in its query. `route="host"`
        gives `http://{port}-{id}.localhost:{daemon port}/?sandcell_token=…` (the daemon keeps
        the token in a cookie, so the page's own links work too; see `get_host` for where that
        name resolves); `route="path"` gives the daemon's URL with
        `/v1/sandboxes/{id}/ports/{port}/?sandcell_token=…`, which works wherever the daemon's
        URL does (the page's absolute links then miss the prefix). A `route` other than those
        two is a ValueError."""
        _api.check_route(route)
        info = self.preview(port, ttl_secs=ttl_secs)
        return _api.preview_url(info, self._http.config.api_url, route)

    # --- commands and processes ----------------------------------------------------------

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> CommandResult:
        """Runs a command (a shell line, or an argv list) and waits for it to end; the
        callbacks, if any, get its output as it comes."""
        if on_stdout is None and on_stderr is None:
            return self._http.call(
                _api.exec_command(
                    self.id,
                    cmd,
                    env=env,
                    cwd=cwd,
                    timeout=timeout,
                    stdin=stdin,
                    default_timeout=self._exec_timeout,
                )
            )
        builder = CommandBuilder(on_stdout, on_stderr)
        for event in self.exec_stream(cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin):
            builder.feed(event)
        return builder.build()

    def exec_stream(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> Iterator[OutputEvent]:
        """Runs a command and yields its stdout/stderr events as they happen, then `done`."""
        return self._http.stream(
            _api.exec_stream(self.id, cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin)
        )

    def start_process(
        self,
        cmd: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        buffer_bytes: int | None = None,
    ) -> Process:
        """Starts a background process (`stdin=True` to feed it; `pty=(rows, cols)` for a terminal)."""
        pid, exec_id = self._http.call(
            _api.start_process(
                self.id,
                cmd,
                env=env,
                cwd=cwd,
                timeout=timeout,
                stdin=stdin,
                pty=pty,
                buffer_bytes=buffer_bytes,
            )
        )
        return Process(self, pid, exec_id)

    def process(self, pid: int) -> Process:
        """A handle on a background process started earlier (by this client or another)."""
        return Process(self, pid)

    def processes(self) -> builtins.list[ProcessInfo]:
        """Every process in the sandbox."""
        return self._http.call(_api.list_processes(self.id))

    def get_processes(self) -> builtins.list[ProcessInfo]:
        """`processes()`, under other sandbox SDKs' name."""
        return self.processes()

    def kill_process(self, pid: int, signal: str | int = "KILL", *, tree: bool = False) -> None:
        """Sends `signal` to a process (and its descendants with `tree=True`)."""
        self._http.call(_api.kill_process(self.id, pid, signal, tree))

    def pty(
        self,
        cmd: str | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        pid: int | None = None,
    ) -> Terminal:
        """Opens an interactive terminal running `cmd` (default a login bash), or joins the
        terminal process `pid`; `Terminal.pid` names it either way."""
        if pid is None and env:
            # The WebSocket route takes no environment: start the process, then join it.
            pid = (self.start_process(cmd or "exec bash -l", cwd=cwd, env=env, pty=(rows, cols))).pid
        query = _api.pty_query(cmd=cmd, cwd=cwd, rows=rows, cols=cols, pid=pid)
        return Terminal.connect(self.client.config, _api.pty_path(self.id), query)

    # --- code ----------------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        language: str | None = None,
        context: str | Context | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        on_result: Callable[[Result], object] | None = None,
        on_error: Callable[[ExecutionError], object] | None = None,
    ) -> Execution:
        """Runs code in a kernel whose state persists (default: Python's default context); the
        callbacks, if any, get the output as it comes."""
        ctx = _context_id(context) if context is not None else None
        callbacks = CodeCallbacks(on_stdout, on_stderr, on_result, on_error)
        if not callbacks.any:
            return self._http.call(
                _api.run_code(
                    self.id,
                    code,
                    language=language,
                    context=ctx,
                    timeout=timeout,
                    default_timeout=self._exec_timeout,
                )
            )
        builder = ExecutionBuilder()
        for event in self.run_code_stream(code, language=language, context=ctx, timeout=timeout):
            builder.feed(event)
            callbacks.dispatch(event)
        return builder.build()

    def run_code_stream(
        self,
        code: str,
        *,
        language: str | None = None,
        context: str | Context | None = None,
        timeout: float | None = None,
    ) -> Iterator[CodeEvent]:
        """Runs code and yields its events in order, `done` last."""
        ctx = _context_id(context) if context is not None else None
        return self._http.stream(
            _api.run_code_stream(self.id, code, language=language, context=ctx, timeout=timeout)
        )

    def run_python(self, code: str, *, timeout: float | None = None) -> Execution:
        """Runs Python code in the default Python context."""
        return self.run_code(code, language="python", timeout=timeout)

    def run_node(self, code: str, *, timeout: float | None = None) -> Execution:
        """Runs JavaScript in the default Node.js context."""
        return self.run_code(code, language="node", timeout=timeout)

    def create_context(
        self, language: str = "python", *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> Context:
        """Makes a new context: a kernel with state of its own."""
        return self._http.call(_api.create_context(self.id, language, cwd, env))

    def list_contexts(self) -> builtins.list[Context]:
        """The sandbox's contexts."""
        return self._http.call(_api.list_contexts(self.id))

    def delete_context(self, context: str | Context) -> None:
        """Ends a context and its kernel."""
        self._http.call(_api.delete_context(self.id, _context_id(context)))

    def interrupt(self, context: str | Context = "python") -> None:
        """Interrupts the context's running execution; its state is kept."""
        self._http.call(_api.interrupt(self.id, _context_id(context)))

    def restart(self, context: str | Context = "python") -> Context:
        """Replaces the context's kernel with a fresh one (empty state)."""
        return self._http.call(_api.restart(self.id, _context_id(context)))

    def get_variables(
        self, names: Sequence[str] | None = None, *, context: str | Context = "python"
    ) -> Variables:
        """A context's variables (all, or `names`)."""
        return self._http.call(_api.get_variables(self.id, _context_id(context), names))

    def set_variables(
        self, values: Mapping[str, Any], *, context: str | Context = "python"
    ) -> builtins.list[str]:
        """Sets variables from JSON values; returns the names set."""
        return self._http.call(_api.set_variables(self.id, _context_id(context), values))

    def clear_variables(
        self, names: Sequence[str] | None = None, *, context: str | Context = "python"
    ) -> builtins.list[str]:
        """Deletes variables (all, or `names`); returns the names cleared."""
        return self._http.call(_api.clear_variables(self.id, _context_id(context), names))

    # --- files ---------------------------------------------------------------------------

    def write_file(
        self, path: str, data: str | bytes, *, mode: int | None = None, append: bool = False
    ) -> FileInfo:
        """Writes text or bytes to a file (relative paths are under /workspace)."""
        return self._http.call(_api.upload(self.id, path, mode, append, data))

    @overload
    def read_file(self, path: str, *, format: Literal["text"] = "text") -> str: ...

    @overload
    def read_file(self, path: str, *, format: Literal["bytes"]) -> bytes: ...

    def read_file(self, path: str, *, format: Literal["text", "bytes"] = "text") -> str | bytes:
        """Reads a whole file as text (UTF-8) or, with `format="bytes"`, as bytes."""
        data = self._http.call(_api.file_content(self.id, path))
        return data if format == "bytes" else data.decode()

    def ls(self, path: str = "/workspace") -> builtins.list[FileInfo]:
        """The entries of a folder, by name."""
        return self._http.call(_api.list_dir(self.id, path))

    def stat(self, path: str) -> FileInfo:
        """One entry."""
        return self._http.call(_api.stat(self.id, path))

    def exists(self, path: str) -> bool:
        """Whether the path exists."""
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def mkdir(self, path: str) -> FileInfo:
        """Makes a folder and its missing parents."""
        return self._http.call(_api.mkdir(self.id, path))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a folder (with its contents when `recursive`)."""
        self._http.call(_api.remove(self.id, path, recursive))

    def rename(self, src: str, dst: str) -> FileInfo:
        """Moves a file or folder (`dst` must not exist)."""
        return self._http.call(_api.rename(self.id, src, dst))

    def upload(self, src: PathOrFile, dst: str, *, mode: int | None = None) -> FileInfo:
        """Streams a local file (path or binary file object) into the sandbox, any size."""
        call = _api.upload(self.id, dst, mode, False)
        if isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as f:
                return self._http.call(call, read_chunks(f))
        return self._http.call(call, read_chunks(src))

    def download(self, src: str, dst: PathOrFile) -> int:
        """Streams a file out of the sandbox to a local path or file; returns its size."""
        return _download_to(self._http, _api.file_content(self.id, src), dst)

    def import_files(
        self,
        path: str,
        *,
        text: str | None = None,
        data: bytes | None = None,
        host_path: str | None = None,
        export_id: str | None = None,
        mode: int | None = None,
    ) -> ImportResult:
        """Puts files at `path` from one source: `text`, `data`, a host path the daemon allows,
        or an export (of any of this key's sandboxes, even gone ones)."""
        return self._http.call(
            _api.import_files(
                self.id, path, text=text, data=data, host_path=host_path, export_id=export_id, mode=mode
            )
        )

    def export_files(self, path: str) -> ExportInfo:
        """Copies a file or folder out; the service keeps it after the sandbox is gone."""
        return self._http.call(_api.create_export(self.id, path))

    def artifacts(self) -> builtins.list[Artifact]:
        """Files code left in /workspace/outputs."""
        return self._http.call(_api.artifacts(self.id))

    # --- git -----------------------------------------------------------------------------

    def git_clone(
        self,
        url: str,
        path: str | None = None,
        *,
        branch: str | None = None,
        depth: int | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> GitCloneResult:
        """Clones a repository (an `https://` or `http://` URL) into the sandbox, at `path`
        (default `/workspace/<repository name>`; relative paths are under /workspace), which
        must not exist or be empty. The clone runs on the daemon's host, through a proxy that
        lets it reach the repository's host only, whatever the sandbox's own network policy;
        credentials (`https://user:token@host/…`, or `username` and `password`) are used there
        and never enter the sandbox: its `.git/config` holds the URL without them. `branch`
        checks out a branch or tag; `depth` makes a shallow clone (smart HTTP servers only).
        A bad URL, branch or depth, or a clone that failed (the message quotes git), is an
        InvalidArgumentError; a `path` that is not empty, a ConflictError (`already_exists`)."""
        return self._http.call(
            _api.git_clone(
                self.id, url, path=path, branch=branch, depth=depth, username=username, password=password
            )
        )

    # --- snapshots -----------------------------------------------------------------------

    def create_snapshot(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        tags: Mapping[str, str] | None = None,
        volumes: VolumeCarry | None = None,
    ) -> SnapshotInfo:
        """Takes a durable snapshot (files, and Python/Node variables; see its `fidelity`).
        `volumes="copy"` also keeps a copy of each named volume the sandbox mounts (taken with
        the rest while it is paused; the answer's `volumes` lists them): each sandbox restored
        or forked from it then mounts a new volume of its own (`<volume>-<6 hex>`, named in its
        `info.restore["volumes"]`) filled from the copy, at the same path, and the live volume
        is left alone. Without it (`"mount"`, the daemon's default) a restore mounts the same
        volume again, as it is then. Host folders are never kept."""
        return self._http.call(
            _api.create_snapshot(self.id, name, description, tags, volumes=volumes)
        )

    def list_snapshots(self) -> builtins.list[SnapshotInfo]:
        """This sandbox's snapshots, oldest first."""
        return self._http.call(_api.list_snapshots(self.id))

    def get_auto_snapshot(self) -> AutoSnapshot:
        """The sandbox's automatic snapshot settings."""
        return self._http.call(_api.get_auto_snapshot(self.id))

    def set_auto_snapshot(
        self, *, interval: int | None = None, keep: int | None = None, before_reclaim: bool = False
    ) -> AutoSnapshot:
        """Sets automatic snapshots: every `interval` seconds (keeping `keep`), and/or one just
        before the sandbox is reclaimed."""
        settings = AutoSnapshot(interval_secs=interval, keep=keep, before_reclaim=before_reclaim)
        return self._http.call(_api.set_auto_snapshot(self.id, settings))

    def enable_auto_snapshot(
        self, interval_mins: float, *, keep: int | None = None, before_reclaim: bool = False
    ) -> AutoSnapshot:
        """`set_auto_snapshot(interval=interval_mins * 60, …)`: other sandbox SDKs' name, with
        the interval in minutes (rounded to whole seconds)."""
        return self.set_auto_snapshot(
            interval=round(interval_mins * 60), keep=keep, before_reclaim=before_reclaim
        )

    def disable_auto_snapshot(self) -> AutoSnapshot:
        """`set_auto_snapshot()` with nothing set: no more automatic snapshots (those taken stay)."""
        return self.set_auto_snapshot()


class Process:
    """A background process: follow its output (and come back to it), feed it,
    signal it."""

    def __init__(self, sandbox: Sandbox, pid: int, exec_id: int | None = None) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.exec_id = exec_id
        self.offsets = Offsets()

    def __repr__(self) -> str:
        return f"<Process {self.pid} in {self.sandbox.id}>"

    def stream(
        self, *, stdout_from: int | None = None, stderr_from: int | None = None
    ) -> Iterator[OutputEvent]:
        """Yields its output from these byte offsets (default: all still buffered), then `done`."""
        call = _api.process_stream(self.sandbox.id, self.pid, stdout_from, stderr_from)
        for event in self.sandbox._http.stream(call):
            self.offsets.advance(event)
            yield event

    def reconnect(self) -> Iterator[OutputEvent]:
        """Carries on streaming from where this handle's last stream stopped."""
        return self.stream(stdout_from=self.offsets.stdout, stderr_from=self.offsets.stderr)

    def wait(self, *, stdout_from: int | None = None, stderr_from: int | None = None) -> ProcessOutput:
        """Waits for it to end; returns its output (from these offsets) and how it ended."""
        return self.sandbox._http.call(
            _api.process_output(self.sandbox.id, self.pid, stdout_from, stderr_from)
        )

    def send_stdin(self, data: str | bytes, *, close: bool = False) -> None:
        """Writes to its stdin (or terminal); `close=True` closes stdin afterwards."""
        self.sandbox._http.call(_api.process_stdin(self.sandbox.id, self.pid, data, close))

    def close_stdin(self) -> None:
        """Closes its stdin (end of input)."""
        self.sandbox._http.call(_api.process_stdin(self.sandbox.id, self.pid, b"", True))

    def resize(self, rows: int, cols: int) -> None:
        """Resizes its terminal."""
        self.sandbox._http.call(_api.process_resize(self.sandbox.id, self.pid, rows, cols))

    def kill(self, signal: str | int = "KILL", *, tree: bool = False) -> None:
        """Sends it a signal (default KILL)."""
        self.sandbox.kill_process(self.pid, signal, tree=tree)

    def terminal(self) -> Terminal:
        """Joins its terminal over a WebSocket (recent output is replayed first)."""
        return self.sandbox.pty(pid=self.pid)


class Commands:
    """`sb.commands`: the command calls under E2B's names, each handing over to a
    method of `Sandbox` (`exec`, `start_process`, `processes`, `kill_process`, `process`)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[False] = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[True],
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> Process: ...

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
    ) -> CommandResult | Process:
        """`exec` (waits; a non-zero exit is `result.ok == False`, not an exception), or with
        `background=True` `start_process` (returns the `Process` at once)."""
        if not background:
            return self._sandbox.exec(
                cmd, env=envs, cwd=cwd, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr
            )
        if on_stdout is not None or on_stderr is not None:
            raise ValueError(
                "on_stdout/on_stderr follow a command run in the foreground; follow a background "
                "one with process.stream()"
            )
        return self._sandbox.start_process(cmd, env=envs, cwd=cwd, timeout=timeout)

    def list(self) -> builtins.list[ProcessInfo]:
        """`processes()`: every process in the sandbox, exited background ones included."""
        return self._sandbox.processes()

    def kill(self, pid: int, signal: str | int = "KILL") -> bool:
        """`kill_process(pid)`; False if there is no such process (any more)."""
        try:
            self._sandbox.kill_process(pid, signal)
        except NotFoundError:
            return False
        return True

    def connect(self, pid: int) -> Process:
        """`process(pid)`: a handle on a background process started earlier."""
        return self._sandbox.process(pid)


class Files:
    """`sb.files`: the file calls under E2B's names, each handing over to a method of
    `Sandbox` (`write_file`, `read_file`, `ls`, `stat`, `exists`, `mkdir`, `remove`, `rename`)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def write(
        self, path: str, data: str | bytes, *, mode: int | None = None, append: bool = False
    ) -> FileInfo:
        """`write_file`."""
        return self._sandbox.write_file(path, data, mode=mode, append=append)

    @overload
    def read(self, path: str, *, format: Literal["text"] = "text") -> str: ...

    @overload
    def read(self, path: str, *, format: Literal["bytes"]) -> bytes: ...

    def read(self, path: str, *, format: Literal["text", "bytes"] = "text") -> str | bytes:
        """`read_file`: text, or bytes with `format="bytes"`."""
        if format == "bytes":
            return self._sandbox.read_file(path, format="bytes")
        return self._sandbox.read_file(path, format="text")

    def list(self, path: str = "/workspace") -> builtins.list[FileInfo]:
        """`ls`."""
        return self._sandbox.ls(path)

    def get_info(self, path: str) -> FileInfo:
        """`stat`."""
        return self._sandbox.stat(path)

    def exists(self, path: str) -> bool:
        """`exists`."""
        return self._sandbox.exists(path)

    def make_dir(self, path: str) -> FileInfo:
        """`mkdir` (with missing parents; an existing folder is fine)."""
        return self._sandbox.mkdir(path)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """`remove` (a folder with contents needs `recursive=True`)."""
        self._sandbox.remove(path, recursive=recursive)

    def rename(self, old_path: str, new_path: str) -> FileInfo:
        """`rename`."""
        return self._sandbox.rename(old_path, new_path)


# A run's event stream that breaks is followed again this many times in a row (without an
# event coming in between) before the error is raised; the waits between grow from 0.2 s.
_RECONNECTS = 5
# `Run.wait` asks for the run's state every this many seconds, growing to the second,
# when the daemon has no live events of the run to give (it goes on in another process).
_POLL_FIRST, _POLL_MAX = 0.1, 1.0


def _in_thread(fn: Callable[[], T]) -> futures.Future[T]:
    """`fn()` in a daemon thread (one that never holds up the interpreter's exit): a wait
    can give up on it at its deadline, which a blocking read cannot be made to do."""
    future: futures.Future[T] = futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to whoever waits, as the call would have raised it
            future.set_exception(e)

    threading.Thread(target=run, name="sandcell-wait", daemon=True).start()
    return future


class Runs:
    """`client.runs`: agent runs, in which a model writes code, Sandcell runs it
    in a sandbox's live kernels and the model goes on until it answers, within budgets."""

    def __init__(self, client: Sandcell) -> None:
        self._client = client

    def start(
        self,
        task: str,
        *,
        model: str | None = None,
        mode: str | None = None,
        sandbox: str | Sandbox | None = None,
        template: str | None = None,
        context: str | None = None,
        budgets: Budgets | Mapping[str, float | None] | None = None,
        keep_sandbox: bool = False,
        validate: str | Validate | Mapping[str, Any] | None = None,
        snapshots: SnapshotPolicy | None = None,
        keep_snapshots: bool = False,
        thread_id: str | None = None,
    ) -> Run:
        """Starts a run and returns at once (it goes on in the daemon). `model` is
        `provider/model` (default: the daemon's `agent.model`); `sandbox` runs it in an
        existing sandbox (its kernels' state is where the model starts), else one is made from
        `template` (default `python`) and deleted when the run ends unless `keep_sandbox`.
        `validate` checks the model's final answer with a command run in that sandbox (a
        command, or a `Validate` / mapping with `command`, `timeout_s`, `max_attempts`): exit 0
        ends the run `validated`, anything else goes back to the model, until the attempts are
        spent (`validation_failed`). `snapshots` says when the run snapshots its sandbox at the
        end of a step (`on_mutation`, `every_step`, `off`; default the daemon's
        `agent.step_snapshots`), what a resume, a fork or `step_sandbox` starts from;
        `keep_snapshots` keeps them all when the run ends (else only the last one and those in
        use stay), so that it can be forked from any step later. `thread_id` runs it on a
        thread (`threads.create`): the model sees the thread's earlier conversation and works
        in the thread's sandbox."""
        sandbox_id = sandbox.id if isinstance(sandbox, Sandbox) else sandbox
        info = self._client._http.call(
            _api.start_run(
                task,
                model=model,
                mode=mode,
                sandbox_id=sandbox_id,
                template=template,
                context=context,
                budgets=budgets,
                keep_sandbox=keep_sandbox,
                validate=validate,
                snapshots=snapshots,
                keep_snapshots=keep_snapshots,
                thread_id=thread_id,
            )
        )
        return Run(info, self._client)

    def run(
        self,
        task: str,
        *,
        model: str | None = None,
        mode: str | None = None,
        sandbox: str | Sandbox | None = None,
        template: str | None = None,
        context: str | None = None,
        budgets: Budgets | Mapping[str, float | None] | None = None,
        keep_sandbox: bool = False,
        validate: str | Validate | Mapping[str, Any] | None = None,
        snapshots: SnapshotPolicy | None = None,
        keep_snapshots: bool = False,
        thread_id: str | None = None,
        timeout: float | None = None,
    ) -> RunInfo:
        """`start(…)`, then `wait(timeout)`: the run as it ended (a run that fails or is
        cancelled is a result, `info.ok == False`, not an exception)."""
        started = self.start(
            task,
            model=model,
            mode=mode,
            sandbox=sandbox,
            template=template,
            context=context,
            budgets=budgets,
            keep_sandbox=keep_sandbox,
            validate=validate,
            snapshots=snapshots,
            keep_snapshots=keep_snapshots,
            thread_id=thread_id,
        )
        return started.wait(timeout)

    def get(self, run_id: str) -> Run:
        """A handle on an existing run (NotFoundError if this key has none of that id)."""
        return Run(self._client._http.call(_api.get_run(run_id)), self._client)

    def list(self, *, limit: int | None = None) -> builtins.list[RunInfo]:
        """This key's runs, newest first (at most `limit`, 1 to 1000; the daemon's default
        is 100)."""
        return self._client._http.call(_api.list_runs(limit))

    def resume(self, run_id: str) -> RunInfo:
        """Takes up a run a stopped process left unfinished (`running` with no process, or
        `failed` with reason `interrupted`): it goes on from its last committed step, its
        sandbox restored from that step's snapshot when the next step had started to change
        it. Answers at once (follow it with `get(run_id)`); a run going on, one that ended
        or a sub-run is a ConflictError. The daemon resumes the runs it
        finds unfinished by itself when it starts."""
        return self._client._http.call(_api.resume_run(run_id))

    def fork(
        self,
        run_id: str,
        from_step: int,
        *,
        task: str | None = None,
        model: str | None = None,
        budgets: Budgets | Mapping[str, float | None] | None = None,
        validate: str | Validate | Mapping[str, Any] | None = None,
        keep_sandbox: bool = False,
        wait: bool = False,
    ) -> Run:
        """Starts a new run from step `from_step` of `run_id` (1 for the first; a committed
        one): its history is the original's steps up to there and its sandbox is restored from
        the newest step snapshot at or before it (a variable set at that step is there, one
        set later is not); the original is never changed. `task` is a new instruction given
        after the history (default: the model goes on with the original task); `model`,
        `budgets`, `validate` default to the original's. A step whose snapshot was pruned when
        the run ended is a ConflictError: start runs you mean to fork with
        `keep_snapshots=True`. Returns once the fork's sandbox is restored (the run going on),
        or with `wait=True` once the fork has ended."""
        info = self._client._http.call(
            _api.fork_run(
                run_id,
                from_step=from_step,
                task=task,
                model=model,
                budgets=budgets,
                validate=validate,
                keep_sandbox=keep_sandbox,
                wait=wait,
            )
        )
        return Run(info, self._client)

    def step_sandbox(self, run_id: str, step: int) -> StepSandbox:
        """Opens a new sandbox as the run's sandbox was at the end of its committed step
        `step` (restored from the newest step snapshot at or before it), without starting a
        run; reach it with `Sandbox.get(made.sandbox_id)`. It is not deleted by itself."""
        return self._client._http.call(_api.step_sandbox(run_id, step))


class Threads:
    """`client.threads`: conversations that persist across runs. A run started
    with `runs.start(…, thread_id=thread.id)` sees the thread's earlier conversation (its
    latest run's messages and answer) and works in the thread's sandbox, which no run deletes;
    one run at a time per thread (a second is a ConflictError while the first goes on)."""

    def __init__(self, client: Sandcell) -> None:
        self._client = client

    def create(self, name: str | None = None) -> ThreadInfo:
        """Makes a thread; `name` is unique among this key's threads (default: its id; a
        name taken is a ConflictError)."""
        return self._client._http.call(_api.create_thread(name))

    def list(self, *, limit: int | None = None) -> builtins.list[ThreadInfo]:
        """This key's threads, the most recently used first (at most `limit`, 1 to 1000; the
        daemon's default is 100)."""
        return self._client._http.call(_api.list_threads(limit))

    def get(self, thread_id: str) -> ThreadInfo:
        """One thread (NotFoundError if this key has none of that id)."""
        return self._client._http.call(_api.get_thread(thread_id))

    def rename(self, thread_id: str, name: str) -> ThreadInfo:
        """Gives a thread a new name (a name taken is a ConflictError)."""
        return self._client._http.call(_api.rename_thread(thread_id, name))

    def delete(self, thread_id: str) -> None:
        """Deletes a thread and its sandbox; its runs and their trajectories stay (a thread
        with a run going on is a ConflictError)."""
        self._client._http.call(_api.delete_thread(thread_id))


def _memory_id(memory: str | Memory) -> str:
    return memory.id if isinstance(memory, Memory) else memory


class Memories:
    """`sb.memory` and `client.memory`: a sandbox's memories, or (without a
    sandbox) the caller's own; short texts the daemon keeps and finds again by ranked search
    (full-text, and by meaning too when it has an embedding model). `add(..., infer=True)`
    has the daemon's model extract the facts of a text instead, in the background."""

    def __init__(self, client: Sandcell, sandbox_id: str | None) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        """The sandbox whose memories these are (None: the caller's own)."""

    def __repr__(self) -> str:
        return f"<Memories of {self.sandbox_id or 'the owner'}>"

    @overload
    def add(
        self,
        text: str,
        *,
        category: str | None = None,
        metadata: Mapping[str, str] | None = None,
        infer: Literal[False] = False,
    ) -> Memory: ...

    @overload
    def add(
        self,
        text: str,
        *,
        category: str | None = None,
        metadata: Mapping[str, str] | None = None,
        infer: Literal[True],
    ) -> InferJob: ...

    def add(
        self,
        text: str,
        *,
        category: str | None = None,
        metadata: Mapping[str, str] | None = None,
        infer: bool = False,
    ) -> Memory | InferJob:
        """Remembers `text` (not blank, at most 64 KiB) in `category` (lowercase letters,
        digits, `-`, `_`, `.`; default `general`) with `metadata` (at most 64 entries); a bad
        value is an InvalidArgumentError, a scope holding 10 000 already a LimitExceededError.
        The memory's `warning` is set when its embedding failed (it is kept all the same).

        With `infer=True` the daemon's model (`memory.infer_model`, else `agent.model`)
        extracts the facts of `text` in the background, each added as a memory of this
        category and metadata (plus `source: infer`): the answer is the `InferJob`, `queued`
        (follow it with `infer_status` or `wait_infer`). A daemon with no model to ask answers
        InvalidArgumentError at once."""
        if infer:
            return self._client._http.call(
                _api.infer_memories(self.sandbox_id, text, category=category, metadata=metadata)
            )
        return self._client._http.call(
            _api.add_memory(self.sandbox_id, text, category=category, metadata=metadata)
        )

    def infer_status(self, job: str | InferJob) -> InferJob:
        """An infer job as it is now (`client.memory` reaches any of the caller's jobs)."""
        job_id = job.id if isinstance(job, InferJob) else job
        return self._client._http.call(_api.get_infer_job(self.sandbox_id, job_id))

    def infer_jobs(self, *, limit: int | None = None) -> builtins.list[InferJob]:
        """This scope's infer jobs, newest first (at most `limit`, 1 to 1000, default 100)."""
        return self._client._http.call(_api.list_infer_jobs(self.sandbox_id, limit=limit))

    def wait_infer(
        self, job: str | InferJob, *, timeout: float = 120.0, poll: float = 0.1
    ) -> InferJob:
        """Waits until an infer job has ended (`succeeded` or `failed`) and returns it; a
        TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.infer_status(job)
            if current.done:
                return current
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"infer job {current.id} is still {current.status} after {timeout} s",
                    code="timeout",
                )
            time.sleep(poll)

    def search(
        self, query: str, *, limit: int | None = None, category: str | None = None
    ) -> MemorySearch:
        """The memories matching any of the words of `query` (stemmed: "deploying" finds
        "Deploys"), the most relevant first (bm25: more of the words, and rarer ones, first),
        each with its `score`; at most `limit` (1 to 100, default 10). `query` is only words:
        no search syntax. With an embedding model on the daemon the ranking is `hybrid`:
        memories close in meaning are found too (`matched_by` says how each was); the
        result's `ranking` and `warning` say how it ranked (`fts` and a warning when the
        embeddings endpoint failed)."""
        return self._client._http.call(
            _api.search_memories(self.sandbox_id, query, limit=limit, category=category)
        )

    def list(
        self, *, limit: int | None = None, cursor: str | None = None, category: str | None = None
    ) -> MemoryList:
        """One page of the memories, newest first (at most `limit`, 1 to 1000, default 100);
        pass its `next_cursor` as `cursor` for the next page (None: it was the last)."""
        return self._client._http.call(
            _api.list_memories(self.sandbox_id, limit=limit, cursor=cursor, category=category)
        )

    def get(self, memory: str | Memory) -> Memory:
        """One memory by id (NotFoundError if it is not in this scope; `client.memory` reaches
        any of the caller's memories, a sandbox's too)."""
        return self._client._http.call(_api.get_memory(self.sandbox_id, _memory_id(memory)))

    def delete(self, memory: str | Memory) -> None:
        """Forgets a memory (NotFoundError as for `get`)."""
        self._client._http.call(_api.delete_memory(self.sandbox_id, _memory_id(memory)))


class Run:
    """One agent run: wait for its end, follow its trajectory, cancel it."""

    def __init__(self, info: RunInfo, client: Sandcell) -> None:
        self.info = info
        self.client = client
        self._http = client._http
        # The last event a wait saw: the next wait follows on from there.
        self._seen = 0
        # The thread a wait follows the run in, kept when the wait gives up at its deadline.
        self._follower: futures.Future[RunInfo] | None = None

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.info.status}>"

    @property
    def id(self) -> str:
        """The run's id (`run-…`)."""
        return self.info.id

    def refresh(self) -> RunInfo:
        """Reads the run's record again (status, answer, usage so far)."""
        self.info = self._http.call(_api.get_run(self.id))
        return self.info

    def wait(self, timeout: float | None = None) -> RunInfo:
        """Waits for the run to end and returns its record; TimeoutError if it is still
        running after `timeout` seconds (it goes on: wait again, or `cancel()` it). The run's
        own `budgets.timeout_secs` bounds it in any case. It follows the run's events, so it
        returns as soon as `run_finished` comes (a run that has ended: at once); a later wait
        goes on from the last event this one saw."""
        if self.info.done:
            return self.info
        follow = self._follower
        if follow is None or follow.done():
            # A follow still going (a wait before this one gave up on it) is waited on again.
            follow = self._follower = _in_thread(self._follow_to_end)
        futures.wait([follow], timeout)
        if not follow.done():
            raise TimeoutError(f"run {self.id} is still running after {timeout} s", code="timeout")
        self._follower = None
        return follow.result()

    def _follow_to_end(self) -> RunInfo:
        """`wait` without its deadline: the run's events from the last one a wait saw until
        `run_finished`, then its record. A stream that ends before `run_finished` while the
        run goes on means the daemon has no live events of it (the run goes on in another
        process): its state is asked for instead, every 0.1 s growing to 1 s."""
        for event in self._follow(self._seen, settle=True):
            self._seen = event.seq
        pause = _POLL_FIRST
        while not (self.refresh()).done:
            time.sleep(pause)
            pause = min(pause * 1.5, _POLL_MAX)
        return self.info

    def events(self, after: int = 0) -> Iterator[RunEvent]:
        """Yields the run's events numbered after `after` (0: all) in order: the stored ones,
        then the live ones as they happen, ending with `run_finished`. A connection that drops
        on the way is followed again from the last event seen (`Last-Event-ID`), so no event
        comes twice or goes missing."""
        for event in self._follow(after, settle=False):
            yield event

    def _follow(self, after: int, *, settle: bool) -> Iterator[RunEvent]:
        """`events(after)`; with `settle`, a stream that ends (without breaking) before
        `run_finished` ends the iteration, for `wait` to find out why, instead of being
        followed again."""
        last = after
        finished = False
        failures = 0
        first = True
        while not finished:
            call = (
                _api.follow_run(self.id, after=after)
                if first
                else _api.follow_run(self.id, last_event_id=last)
            )
            first = False
            try:
                for event in self._http.stream(call):
                    if event.seq <= last:
                        continue  # already given (a server that replayed from earlier)
                    last, failures = event.seq, 0
                    finished = finished or event.type == "run_finished"
                    yield event
            except (ConnectionError, TimeoutError) as e:
                # A 504 is the daemon's answer, not a broken connection.
                if e.status is not None or failures >= _RECONNECTS:
                    raise
            else:
                if finished or settle:
                    return
                # Ended without `run_finished`: a run that ended without one (its process
                # died) has no more to give; one still going is followed again.
                if (self.refresh()).done:
                    return
                if failures >= _RECONNECTS:
                    raise ConnectionError(
                        f"the event stream of run {self.id} keeps ending before the run does",
                        code="connection_failed",
                    )
            failures += 1
            delay = min(0.2 * 2 ** (failures - 1), 5.0)
            time.sleep(delay)

    def list_events(self, after: int = 0) -> builtins.list[RunEvent]:
        """The run's stored events numbered after `after` (0: all), oldest first, read at
        once (`format=json`, page by page); a run going on has more later."""
        found: builtins.list[RunEvent] = []
        while True:
            page = self._http.call(_api.run_event_list(self.id, after))
            found += page
            if len(page) < _api.RUN_EVENTS_PAGE:
                return found
            after = page[-1].seq

    def cancel(self) -> RunInfo:
        """Cancels the run: its model call stops and a running cell is interrupted (the
        kernel's state stays). Answers once the end is recorded (`cancelled`); a run that
        has ended already is answered as it is."""
        self.info = self._http.call(_api.cancel_run(self.id))
        return self.info

    def sandbox(self) -> Sandbox:
        """The run's sandbox (one it made is deleted when the run ends, unless it was
        started with `keep_sandbox=True`)."""
        if self.info.sandbox_id is None:
            self.refresh()
        if self.info.sandbox_id is None:
            raise ValueError(f"run {self.id} has no sandbox yet")
        return Sandbox.get(self.info.sandbox_id, client=self.client)


# --- templates ----------------------------------------------------------------------------


def _build_call(
    name: str,
    *,
    dockerfile: str | None,
    context: ContextInput | None,
    build_args: Mapping[str, str] | None,
    no_cache: bool,
    allow_hosts: Sequence[str] | None,
    offline: bool,
    wait: bool,
) -> _api.Call[BuildInfo]:
    """The build's request: the context folder packed (it reads files: the async client does
    it in a thread), the Dockerfile given or read from the folder. A bad input is a ValueError or TypeError before
    anything is sent."""
    archive, text = build_inputs(context, dockerfile)
    return _api.start_build(
        name,
        dockerfile=text,
        context=archive,
        build_args=build_args,
        no_cache=no_cache,
        allow_hosts=allow_hosts,
        offline=offline,
        wait=wait,
    )


def _call_once(
    call: _api.Call[T], client: Sandcell | None, api_url: str | None, api_key: str | None
) -> T:
    """Sends one call on `client`, or on a connection made for it and closed after."""
    sandcell, owned = _connect(client, api_url, api_key)
    try:
        return sandcell._http.call(call)
    finally:
        if owned:
            sandcell.close()


def _settled(info: BuildInfo) -> bool:
    """Whether a build has ended and, when it succeeded, its image is recorded (a moment after
    its `finished` event)."""
    return info.done and (info.image is not None or not info.ok)


class Templates:
    """`client.templates`: templates the daemon builds from a Dockerfile and a
    context (each step in a build sandbox, its changes a cached layer of the daemon's image
    store), the builds that make them, and the templates of its store. A sandbox runs on a
    template with `Sandbox.create(template="name:tag")`. Building and deleting take an admin
    key (PermissionDeniedError otherwise)."""

    def __init__(self, client: Sandcell) -> None:
        self._client = client

    def build(
        self,
        name: str,
        *,
        dockerfile: str | None = None,
        context: ContextInput | None = None,
        build_args: Mapping[str, str] | None = None,
        no_cache: bool = False,
        allow_hosts: Sequence[str] | None = None,
        offline: bool = False,
        wait: bool = False,
    ) -> Build:
        """Starts building template `name` (`name[:tag]`; `name` is `name:latest`) and returns
        its `Build` at once, `queued` or `running` (follow it with `logs()`, `wait()`).
        `dockerfile` is the Dockerfile's text (default: the `Dockerfile` of the `context`
        folder); `context` a folder, packed here as a gzip tar archive (its contents at the
        top: `COPY app.py /app/` finds `<folder>/app.py`), or a tar archive's bytes (plain or
        gzip); None is an empty context. `build_args` are `--build-arg`s; `no_cache` runs every
        step, even those whose layer is cached; `allow_hosts` are hosts `RUN` steps may reach
        besides the machine's package registries, `offline` gives them no network. With
        `wait=True` the daemon answers once the build has ended (the handle's `info` is final:
        `wait()` returns it or raises BuildError). A bad name or Dockerfile is an
        InvalidArgumentError naming the line; a key that is not an admin key, a
        PermissionDeniedError."""
        call = _build_call(
            name,
            dockerfile=dockerfile,
            context=context,
            build_args=build_args,
            no_cache=no_cache,
            allow_hosts=allow_hosts,
            offline=offline,
            wait=wait,
        )
        return Build(self._client._http.call(call), self._client)

    def list(self) -> builtins.list[TemplateInfo]:
        """The templates of the daemon's store (built or imported), by name."""
        return self._client._http.call(_api.list_templates())

    def get(self, name: str) -> TemplateInfo:
        """One template (`name` is `name:latest`; NotFoundError if there is none)."""
        return self._client._http.call(_api.get_template(name))

    def delete(self, name: str) -> None:
        """Deletes a template's name (its layers go at the daemon's next garbage collection):
        a ConflictError while sandboxes run on it, NotFoundError if there is none."""
        self._client._http.call(_api.delete_template(name))

    def get_build(self, build_id: str) -> Build:
        """A handle on a build (`bld-…`; NotFoundError if the daemon has none of that id: it
        keeps its last 100 builds, in memory)."""
        return Build(self._client._http.call(_api.get_build(build_id)), self._client)

    def list_builds(self) -> builtins.list[BuildInfo]:
        """The builds the daemon has run since it started, newest first."""
        return self._client._http.call(_api.list_builds())


class Build:
    """One template build: follow its log, wait for its end, cancel it."""

    def __init__(self, info: BuildInfo, client: Sandcell, *, owns_client: bool = False) -> None:
        self.info = info
        self.client = client
        self._http = client._http
        self._owns_client = owns_client
        # The last event a wait saw, and whether it was `finished`: the next wait goes on from there.
        self._seen = 0
        self._finished = False
        # The thread a wait follows the build in, kept when the wait gives up at its deadline.
        self._follower: futures.Future[BuildInfo] | None = None

    def __repr__(self) -> str:
        return f"<Build {self.id} {self.info.name} {self.info.state}>"

    @property
    def id(self) -> str:
        """The build's id (`bld-…`)."""
        return self.info.id

    def refresh(self) -> BuildInfo:
        """Reads the build's record again (state, step, step reports, image)."""
        self.info = self._http.call(_api.get_build(self.id))
        return self.info

    def wait(self, timeout: float | None = None) -> BuildInfo:
        """Waits for the build to end, following its log (it returns as `finished` comes; a
        build that has ended: at once), and returns its `BuildInfo` once it succeeded, with its
        `image`. A build that failed or was cancelled raises BuildError (`exit_code`, `step`:
        the failing step's `StepReport`, `error`, `info`); one still going after `timeout`
        seconds, TimeoutError (it goes on: wait again, or `cancel()` it)."""
        if not _settled(self.info):
            follow = self._follower
            if follow is None or follow.done():
                # A follow still going (a wait before this one gave up on it) is waited on again.
                follow = self._follower = _in_thread(self._follow_to_end)
            futures.wait([follow], timeout)
            if not follow.done():
                raise TimeoutError(f"build {self.id} has not ended after {timeout} s", code="timeout")
            self._follower = None
            follow.result()
        if not self.info.ok:
            raise BuildError(self.info)
        return self.info

    def _follow_to_end(self) -> BuildInfo:
        """`wait` without its deadline: the log from the last event a wait saw until `finished`,
        then the build's record, asked for again (every 0.1 s growing to 1 s) until it has
        ended and, when it succeeded, holds its image (the image is given up on after ~2 s)."""
        if not self._finished:
            for event in self._follow(self._seen):
                self._seen = event.seq
                self._finished = self._finished or event.kind == "finished"
        pause = _POLL_FIRST
        while True:
            info = self.refresh()
            if _settled(info) or (info.done and pause >= _POLL_MAX):
                return info
            time.sleep(pause)
            pause = min(pause * 1.5, _POLL_MAX)

    def logs(self, follow: bool = True, *, after: int = 0) -> Iterator[BuildEvent]:
        """Yields the build's log events numbered after `after` (0: all) in order. With
        `follow` (the default): the stored ones, then the live ones as they happen, until
        `finished`; a connection that drops on the way is followed again from the last event
        seen (`Last-Event-ID`), so no event comes twice or goes missing. Without: the stored
        ones only, read at once. (`after` at or past the `finished` event of an ended build
        waits for nothing that will come: ask for the stored ones then.)"""
        if follow:
            for event in self._follow(after):
                yield event
            return
        while True:
            page = self._http.call(_api.build_log_list(self.id, after))
            for event in page:
                yield event
            if len(page) < _api.BUILD_LOG_PAGE:
                return
            after = page[-1].seq

    def _follow(self, after: int) -> Iterator[BuildEvent]:
        """The log's events after `after`, the live ones too, until `finished`."""
        last = after
        finished = False
        failures = 0
        first = True
        while not finished:
            call = (
                _api.follow_build(self.id, after=after)
                if first
                else _api.follow_build(self.id, last_event_id=last)
            )
            first = False
            try:
                for event in self._http.stream(call):
                    if event.seq <= last:
                        continue  # already given (a server that replayed from earlier)
                    last, failures = event.seq, 0
                    finished = finished or event.kind == "finished"
                    yield event
            except (ConnectionError, TimeoutError) as e:
                # A 504 is the daemon's answer, not a broken connection.
                if e.status is not None or failures >= _RECONNECTS:
                    raise
            else:
                if finished:
                    return
                # Ended without `finished`: a build that has ended has no more to give; one
                # still going is followed again.
                if (self.refresh()).done:
                    return
                if failures >= _RECONNECTS:
                    raise ConnectionError(
                        f"the log of build {self.id} keeps ending before the build does",
                        code="connection_failed",
                    )
            failures += 1
            delay = min(0.2 * 2 ** (failures - 1), 5.0)
            time.sleep(delay)

    def cancel(self) -> BuildInfo:
        """Cancels the build: its running step is killed. Answers once it has ended
        (`cancelled`); a build that had ended already is answered as it ended."""
        self.info = self._http.call(_api.cancel_build(self.id))
        return self.info

    def disconnect(self) -> None:
        """Lets go of this handle's connection if it made it (`Template.build` without a
        `client`); the build goes on."""
        if self._owns_client:
            self.client.close()


class Template:
    """Templates through class methods (as `Sandbox.create` makes sandboxes):
    each takes `client=` (else `api_url=` and `api_key=`, else the environment, as
    `Sandcell()` does). `client.templates` has the same calls on a connection of one's
    own."""

    @classmethod
    def build(
        cls,
        name: str,
        *,
        dockerfile: str | None = None,
        context: ContextInput | None = None,
        build_args: Mapping[str, str] | None = None,
        no_cache: bool = False,
        allow_hosts: Sequence[str] | None = None,
        offline: bool = False,
        wait: bool = False,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> Build:
        """Starts building template `name` from `dockerfile` (its text; default: the context
        folder's `Dockerfile`) and `context` (a folder, or a tar archive's bytes), as
        `client.templates.build` does, and returns its `Build` at once (`wait()` for its
        end). A handle made without `client` holds a connection of its own (`disconnect()`
        lets it go)."""
        call = _build_call(
            name,
            dockerfile=dockerfile,
            context=context,
            build_args=build_args,
            no_cache=no_cache,
            allow_hosts=allow_hosts,
            offline=offline,
            wait=wait,
        )
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            return Build(sandcell._http.call(call), sandcell, owns_client=owned)
        except BaseException:
            if owned:
                sandcell.close()
            raise

    @classmethod
    def wait_for_build(
        cls,
        build: str | Build,
        timeout: float | None = None,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> BuildInfo:
        """`Build.wait(timeout)` of a build (an id or a handle): its `BuildInfo` once it
        succeeded; BuildError if it failed or was cancelled, TimeoutError after `timeout`."""
        if isinstance(build, Build):
            return build.wait(timeout)
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            found = Build(sandcell._http.call(_api.get_build(build)), sandcell)
            return found.wait(timeout)
        finally:
            if owned:
                sandcell.close()

    @classmethod
    def logs(
        cls,
        build: str | Build,
        follow: bool = True,
        *,
        after: int = 0,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> Iterator[BuildEvent]:
        """`Build.logs(follow, after=after)` of a build (an id or a handle): its events,
        live until `finished` (or, without `follow`, the stored ones)."""
        if isinstance(build, Build):
            for event in build.logs(follow, after=after):
                yield event
            return
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            found = Build(sandcell._http.call(_api.get_build(build)), sandcell)
            for event in found.logs(follow, after=after):
                yield event
        finally:
            if owned:
                sandcell.close()

    @classmethod
    def get_build(
        cls,
        build_id: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> Build:
        """A handle on a build (NotFoundError if the daemon has none of that id)."""
        sandcell, owned = _connect(client, api_url, api_key)
        try:
            return Build(sandcell._http.call(_api.get_build(build_id)), sandcell, owns_client=owned)
        except BaseException:
            if owned:
                sandcell.close()
            raise

    @classmethod
    def list_builds(
        cls,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[BuildInfo]:
        """The builds the daemon has run since it started, newest first."""
        return _call_once(_api.list_builds(), client, api_url, api_key)

    @classmethod
    def list(
        cls,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[TemplateInfo]:
        """The templates of the daemon's store (built or imported), by name."""
        return _call_once(_api.list_templates(), client, api_url, api_key)

    @classmethod
    def get(
        cls,
        name: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> TemplateInfo:
        """One template (NotFoundError if there is none)."""
        return _call_once(_api.get_template(name), client, api_url, api_key)

    @classmethod
    def delete(
        cls,
        name: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        """Deletes a template's name: a ConflictError while sandboxes run on it, NotFoundError
        if there is none."""
        _call_once(_api.delete_template(name), client, api_url, api_key)


class Volumes:
    """`client.volumes`: the caller's named volumes, folders of the daemon that
    outlive the sandboxes that mount them (`Sandbox.create(mounts=[Mount.from_volume(name,
    path)])`, read-write by default). Each API key's owner has volumes of its own; one is made
    by `create`, or by the first sandbox that mounts it."""

    def __init__(self, client: Sandcell) -> None:
        self._client = client

    def create(self, name: str) -> VolumeInfo:
        """Makes an empty volume: `name` is 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting
        with a letter or digit (else an InvalidArgumentError); a name taken is a
        ConflictError (`already_exists`)."""
        return self._client._http.call(_api.create_volume(name))

    def list(self) -> builtins.list[VolumeInfo]:
        """The caller's volumes, by name, with their sizes and the running sandboxes that
        mount them."""
        return self._client._http.call(_api.list_volumes())

    def get(self, name: str) -> VolumeInfo:
        """One volume (NotFoundError if the caller has none of that name)."""
        return self._client._http.call(_api.get_volume(name))

    def delete(self, name: str) -> None:
        """Deletes a volume and its files: a ConflictError (`invalid_state`) while a running
        sandbox mounts it, NotFoundError if there is none."""
        self._client._http.call(_api.delete_volume(name))


class Volume:
    """Volumes through class methods (as `Sandbox.create` makes sandboxes):
    each takes `client=` (else `api_url=` and `api_key=`, else the environment, as
    `Sandcell()` does). `client.volumes` has the same calls on a connection of one's
    own."""

    @classmethod
    def create(
        cls,
        name: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> VolumeInfo:
        """Makes an empty volume (a bad name is an InvalidArgumentError, a name taken a
        ConflictError)."""
        return _call_once(_api.create_volume(name), client, api_url, api_key)

    @classmethod
    def list(
        cls,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> builtins.list[VolumeInfo]:
        """The caller's volumes, by name."""
        return _call_once(_api.list_volumes(), client, api_url, api_key)

    @classmethod
    def get(
        cls,
        name: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> VolumeInfo:
        """One volume (NotFoundError if there is none)."""
        return _call_once(_api.get_volume(name), client, api_url, api_key)

    @classmethod
    def delete(
        cls,
        name: str,
        *,
        client: Sandcell | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        """Deletes a volume and its files: a ConflictError while a running sandbox mounts
        it, NotFoundError if there is none."""
        _call_once(_api.delete_volume(name), client, api_url, api_key)
