"""Configuration and the HTTP transports (sync and async) that send the calls `_api` builds,
turning transport failures and error answers into `SandcellError`s."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx

from . import errors
from ._api import Call, Default, ReadTimeout, StreamCall, check_status
from ._sse import SseParser

T = TypeVar("T")

VERSION = "0.1.0"
DEFAULT_API_URL = "http://127.0.0.1:7070"
DEFAULT_REQUEST_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 5.0
# The daemon sends a keep-alive comment every 15 s on an event stream: a read that waits
# longer than this on one means the connection is dead.
_STREAM_READ_TIMEOUT = 60.0
_CHUNK = 256 * 1024


def default_home() -> Path:
    """Sandcell's home, as the daemon and the CLI find it: `$SANDCELL_HOME`, else
    `/var/lib/sandcell` as root, else `~/.local/share/sandcell`."""
    home = os.environ.get("SANDCELL_HOME")
    if home:
        return Path(home)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/sandcell")
    try:
        return Path.home() / ".local/share/sandcell"
    except RuntimeError:  # no HOME and no password entry: what the daemon uses then
        return Path(".sandcell")


def _admin_key(home: Path) -> str | None:
    """The admin key `sandcell serve` wrote in its home, if this process may read it."""
    try:
        return (home / "admin.key").read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _daemon_url(home: Path) -> str | None:
    """The URL the daemon running with this home wrote in `daemon.json`, if any."""
    try:
        info = json.loads((home / "daemon.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    url = info.get("url") if isinstance(info, dict) else None
    return url if isinstance(url, str) and url else None


@dataclass(frozen=True)
class Config:
    """Where the daemon is, the key to use, and how long to wait for it."""

    api_url: str
    api_key: str | None
    request_timeout: float
    connect_timeout: float
    # Where the key came from (an argument, the environment, a file), or with no key the
    # admin key file that was looked for: said in authentication errors.
    key_origin: str = ""

    @classmethod
    def resolve(
        cls,
        api_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> Config:
        """Arguments first, then `SANDCELL_API_URL` / `SANDCELL_API_KEY`, then what a daemon left
        in its home (`daemon.json`'s URL, `admin.key`), as the CLI does, then the default URL."""
        url = api_url or os.environ.get("SANDCELL_API_URL")
        key, origin = api_key, "the api_key argument"
        if not key:
            key, origin = os.environ.get("SANDCELL_API_KEY") or None, "SANDCELL_API_KEY"
        if not url or not key:
            home = default_home()
            url = url or _daemon_url(home) or DEFAULT_API_URL
            if not key:
                key, origin = _admin_key(home), str(home / "admin.key")
        return cls(
            api_url=url.rstrip("/"),
            api_key=key,
            request_timeout=request_timeout if request_timeout is not None else DEFAULT_REQUEST_TIMEOUT,
            connect_timeout=connect_timeout if connect_timeout is not None else DEFAULT_CONNECT_TIMEOUT,
            key_origin=origin,
        )

    def explain(self, err: errors.SandcellError) -> errors.SandcellError:
        """`err`, with how to configure a key when the daemon refused the one sent (or none)."""
        if not isinstance(err, errors.AuthenticationError):
            return err
        if self.api_key is None:
            hint = (
                "this client has no API key: pass api_key=, set SANDCELL_API_KEY, or run where "
                f"the daemon's admin key is readable (looked for {self.key_origin}; the home is "
                "$SANDCELL_HOME, else /var/lib/sandcell as root, else ~/.local/share/sandcell)"
            )
        else:
            hint = f"the key was taken from {self.key_origin}"
        err.message = f"{err.message}; {hint}"
        err.args = (err.message,)
        return err

    def headers(self) -> dict[str, str]:
        """The headers every request carries."""
        headers = {"User-Agent": f"sandcell-python/{VERSION}"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        return headers

    def timeout(self, read: ReadTimeout = Default.TIMEOUT) -> httpx.Timeout:
        """The httpx timeout of a request whose read may wait `read` seconds."""
        if isinstance(read, Default):
            read = self.request_timeout
        return httpx.Timeout(self.request_timeout, connect=self.connect_timeout, read=read)


def translate(exc: httpx.HTTPError, config: Config) -> errors.SandcellError:
    """The SDK's error for an httpx failure."""
    if isinstance(exc, httpx.ConnectError):
        return errors.ConnectionError(
            f"no Sandcell daemon answers at {config.api_url} ({exc}); start one with "
            "`sandcell serve`, or set SANDCELL_API_URL",
            code="connection_failed",
        )
    if isinstance(exc, httpx.TimeoutException):
        return errors.TimeoutError(
            f"{config.api_url} did not answer in time ({type(exc).__name__})", code="timeout"
        )
    return errors.ConnectionError(
        f"the connection to {config.api_url} failed: {type(exc).__name__}: {exc}",
        code="connection_failed",
    )


def _check(resp: httpx.Response, config: Config) -> None:
    """Raises the mapped `SandcellError` for an error answer (its body must have been read)."""
    try:
        check_status(resp)
    except errors.AuthenticationError as e:
        raise config.explain(e) from None


def _request_args(call: Call[Any] | StreamCall[Any]) -> dict[str, Any]:
    args: dict[str, Any] = {"params": list(call.params), "json": call.json}
    if isinstance(call, StreamCall) and call.headers:
        args["headers"] = dict(call.headers)
    return args


class SyncTransport:
    """Sends calls with an `httpx.Client`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._client = httpx.Client(
            base_url=config.api_url, headers=config.headers(), timeout=config.timeout()
        )

    def call(self, call: Call[T], body: Iterable[bytes] | None = None) -> T:
        """Sends `call` (with a streamed `body`, for uploads) and parses its answer."""
        try:
            resp = self._client.request(
                call.method,
                call.path,
                content=body if body is not None else call.content,
                timeout=self.config.timeout(call.read_timeout),
                **_request_args(call),
            )
        except httpx.HTTPError as e:
            raise translate(e, self.config) from e
        _check(resp, self.config)
        return call.parse(resp)

    def stream(self, call: StreamCall[T]) -> Iterator[T]:
        """Sends `call` and yields its events as they come."""
        parser = SseParser()
        try:
            with self._client.stream(
                call.method,
                call.path,
                timeout=self.config.timeout(max(self.config.request_timeout, _STREAM_READ_TIMEOUT)),
                **_request_args(call),
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _check(resp, self.config)
                for line in resp.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        value = call.convert(event)
                        if value is not None:
                            yield value
        except httpx.HTTPError as e:
            raise translate(e, self.config) from e

    def download(self, call: Call[Any], sink: IO[bytes]) -> int:
        """Streams the answer's body into `sink`; returns the bytes written."""
        written = 0
        try:
            with self._client.stream(call.method, call.path, **_request_args(call)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _check(resp, self.config)
                for chunk in resp.iter_bytes(_CHUNK):
                    sink.write(chunk)
                    written += len(chunk)
        except httpx.HTTPError as e:
            raise translate(e, self.config) from e
        return written

    def close(self) -> None:
        """Closes the connection pool."""
        self._client.close()


class AsyncTransport:
    """Sends calls with an `httpx.AsyncClient`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._client = httpx.AsyncClient(
            base_url=config.api_url, headers=config.headers(), timeout=config.timeout()
        )

    async def call(self, call: Call[T], body: AsyncIterable[bytes] | None = None) -> T:
        """Sends `call` (with a streamed `body`, for uploads) and parses its answer."""
        try:
            resp = await self._client.request(
                call.method,
                call.path,
                content=body if body is not None else call.content,
                timeout=self.config.timeout(call.read_timeout),
                **_request_args(call),
            )
        except httpx.HTTPError as e:
            raise translate(e, self.config) from e
        _check(resp, self.config)
        return call.parse(resp)

    async def stream(self, call: StreamCall[T]) -> AsyncIterator[T]:
        """Sends `call` and yields its events as they come."""
        parser = SseParser()
        try:
            async with self._client.stream(
                call.method,
                call.path,
                timeout=self.config.timeout(max(self.config.request_timeout, _STREAM_READ_TIMEOUT)),
                **_request_args(call),
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _check(resp, self.config)
                async for line in resp.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        value = call.convert(event)
                        if value is not None:
                            yield value
        except httpx.HTTPError as e:
            raise translate(e, self.config) from e

    async def download(self, call: Call[Any], sink: IO[bytes]) -> int:
        """Streams the answer's body into `sink`; returns the bytes written."""
        written = 0
        try:
            async with self._client.stream(call.method, call.path, **_request_args(call)) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _check(resp, self.config)
                async for chunk in resp.aiter_bytes(_CHUNK):
                    sink.write(chunk)
                    written += len(chunk)
        except httpx.HTTPError as e:
            raise translate(e, self.config) from e
        return written

    async def close(self) -> None:
        """Closes the connection pool."""
        await self._client.aclose()


def read_chunks(f: IO[bytes]) -> Iterator[bytes]:
    """A file's bytes in chunks, so an upload never holds the whole file."""
    while chunk := f.read(_CHUNK):
        yield chunk


async def aread_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    """The same for the async client (httpx wants an async iterable there)."""
    while chunk := f.read(_CHUNK):
        yield chunk
