"""Interactive terminals over the `/pty` WebSocket: `Terminal` (blocking sockets) and
`AsyncTerminal` (asyncio streams), both driving the I/O-free protocol in `_ws`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from types import TracebackType

from . import _ws, errors
from ._http import Config
from ._models import ExitStatus

_READ = 64 * 1024


def _as_bytes(marker: str | bytes) -> bytes:
    return marker.encode() if isinstance(marker, str) else marker


class _Buffer:
    """Output read from the socket but not handed out yet (by `read_until`)."""

    def __init__(self) -> None:
        self.data = b""

    def take_until(self, marker: bytes) -> bytes | None:
        """Everything up to and including `marker`, if it is there."""
        at = self.data.find(marker)
        if at < 0:
            return None
        out, self.data = self.data[: at + len(marker)], self.data[at + len(marker) :]
        return out

    def take_all(self) -> bytes:
        """Everything."""
        out, self.data = self.data, b""
        return out


class Terminal:
    """A process on a terminal, attached over a WebSocket: type into it, read what it shows."""

    def __init__(self, sock: socket.socket, leftover: bytes, pid: int) -> None:
        self.pid = pid
        self._sock = sock
        self._proto = _ws.TerminalProtocol()
        self._buf = _Buffer()
        self._early = leftover

    @classmethod
    def connect(cls, config: Config, path: str, query: dict[str, str]) -> Terminal:
        """Opens the WebSocket at `path` and completes its handshake; the pid of the terminal
        started or joined comes in the answer."""
        ep = _ws.endpoint(config, path, query)
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((ep.host, ep.port), timeout=config.connect_timeout)
            if ep.tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=ep.host)
            sock.settimeout(config.request_timeout)
            sock.sendall(ep.request)
            buf = b""
            while (head := _ws.parse_handshake(buf, ep.key)) is None:
                chunk = sock.recv(_READ)
                if not chunk:
                    raise errors.ConnectionError(
                        "the daemon closed the terminal's connection", code="connection_failed"
                    )
                buf += chunk
            pid = head.pid()
        except errors.SandcellError as e:  # before OSError: some of them are OSErrors too
            if sock is not None:
                sock.close()
            raise config.explain(e) from None
        except OSError as e:
            if sock is not None:
                sock.close()
            raise errors.ConnectionError(
                f"cannot open a terminal at {config.api_url}: {e}", code="connection_failed"
            ) from e
        return cls(sock, buf[head.length :], pid)

    @property
    def exit(self) -> ExitStatus | None:
        """How the process ended, once it did."""
        return self._proto.exit

    def send(self, data: str | bytes) -> None:
        """Types `data` into the terminal (`"\\x03"` is Ctrl-C)."""
        self._sock.sendall(_ws.input_frame(data))

    def resize(self, rows: int, cols: int) -> None:
        """Resizes the terminal."""
        self._sock.sendall(_ws.resize_frame(rows, cols))

    def _pump(self, timeout: float | None) -> None:
        """Reads once from the socket into the buffer (raises TimeoutError after `timeout`)."""
        if self._early:
            data, self._early = self._early, b""
        else:
            # A zero timeout would make the socket non-blocking (BlockingIOError, not a timeout).
            if timeout is not None and timeout <= 0:
                raise errors.TimeoutError("the terminal showed nothing in time", code="timeout")
            self._sock.settimeout(timeout)
            try:
                data = self._sock.recv(_READ)
            except TimeoutError as e:
                raise errors.TimeoutError("the terminal showed nothing in time", code="timeout") from e
        output, reply = self._proto.receive(data)
        if reply:
            self._sock.sendall(reply)
        self._buf.data += output

    def _ended(self) -> bool:
        return self._proto.closed or self._proto.exit is not None

    def read(self, timeout: float | None = None) -> bytes:
        """The next output; b"" once the process ended and everything was read."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._buf.data and not self._ended():
            self._pump(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._buf.take_all()

    def read_until(self, marker: str | bytes, timeout: float | None = None) -> bytes:
        """Everything up to and including `marker` (TimeoutError if it does not show in time)."""
        want = _as_bytes(marker)
        deadline = None if timeout is None else time.monotonic() + timeout
        while (out := self._buf.take_until(want)) is None:
            if self._ended():
                raise errors.SandcellError(
                    f"the terminal ended before showing {want!r}", code="terminal_ended"
                )
            self._pump(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return out

    def wait(self, timeout: float | None = None) -> ExitStatus:
        """Reads until the process ends (its output is dropped) and returns how it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended():
            self._pump(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._buf.take_all()
        if self._proto.exit is None:
            raise errors.ConnectionError("the terminal closed without an exit", code="connection_failed")
        return self._proto.exit

    def close(self) -> None:
        """Leaves the terminal; its process runs on (join it again with `sandbox.pty(pid=…)`)."""
        # The peer may be gone already (the process ended): closing is best effort.
        with contextlib.suppress(OSError):
            self._sock.sendall(_ws.close_frame())
        self._sock.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncTerminal:
    """The async form of `Terminal`."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, leftover: bytes, pid: int
    ) -> None:
        self.pid = pid
        self._reader = reader
        self._writer = writer
        self._proto = _ws.TerminalProtocol()
        self._buf = _Buffer()
        self._early = leftover

    @classmethod
    async def connect(cls, config: Config, path: str, query: dict[str, str]) -> AsyncTerminal:
        """Opens the WebSocket at `path` and completes its handshake; the pid of the terminal
        started or joined comes in the answer."""
        ep = _ws.endpoint(config, path, query)
        writer: asyncio.StreamWriter | None = None
        try:
            reader, opened = await asyncio.wait_for(
                asyncio.open_connection(
                    ep.host, ep.port, ssl=ssl.create_default_context() if ep.tls else None
                ),
                config.connect_timeout,
            )
            writer = opened
            opened.write(ep.request)
            await opened.drain()
            buf = b""
            while (head := _ws.parse_handshake(buf, ep.key)) is None:
                chunk = await asyncio.wait_for(reader.read(_READ), config.request_timeout)
                if not chunk:
                    raise errors.ConnectionError(
                        "the daemon closed the terminal's connection", code="connection_failed"
                    )
                buf += chunk
            pid = head.pid()
        except errors.SandcellError as e:  # before OSError: some of them are OSErrors too
            if writer is not None:
                writer.close()
            raise config.explain(e) from None
        except (OSError, asyncio.TimeoutError) as e:
            if writer is not None:
                writer.close()
            raise errors.ConnectionError(
                f"cannot open a terminal at {config.api_url}: {e!r}", code="connection_failed"
            ) from e
        return cls(reader, opened, buf[head.length :], pid)

    @property
    def exit(self) -> ExitStatus | None:
        """How the process ended, once it did."""
        return self._proto.exit

    async def send(self, data: str | bytes) -> None:
        """Types `data` into the terminal."""
        self._writer.write(_ws.input_frame(data))
        await self._writer.drain()

    async def resize(self, rows: int, cols: int) -> None:
        """Resizes the terminal."""
        self._writer.write(_ws.resize_frame(rows, cols))
        await self._writer.drain()

    async def _pump(self, timeout: float | None) -> None:
        if self._early:
            data, self._early = self._early, b""
        else:
            try:
                data = await asyncio.wait_for(self._reader.read(_READ), timeout)
            except asyncio.TimeoutError as e:
                raise errors.TimeoutError("the terminal showed nothing in time", code="timeout") from e
        output, reply = self._proto.receive(data)
        if reply:
            self._writer.write(reply)
            await self._writer.drain()
        self._buf.data += output

    def _ended(self) -> bool:
        return self._proto.closed or self._proto.exit is not None

    async def read(self, timeout: float | None = None) -> bytes:
        """The next output; b"" once the process ended and everything was read."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._buf.data and not self._ended():
            await self._pump(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._buf.take_all()

    async def read_until(self, marker: str | bytes, timeout: float | None = None) -> bytes:
        """Everything up to and including `marker` (TimeoutError if it does not show in time)."""
        want = _as_bytes(marker)
        deadline = None if timeout is None else time.monotonic() + timeout
        while (out := self._buf.take_until(want)) is None:
            if self._ended():
                raise errors.SandcellError(
                    f"the terminal ended before showing {want!r}", code="terminal_ended"
                )
            await self._pump(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return out

    async def wait(self, timeout: float | None = None) -> ExitStatus:
        """Reads until the process ends (its output is dropped) and returns how it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended():
            await self._pump(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._buf.take_all()
        if self._proto.exit is None:
            raise errors.ConnectionError("the terminal closed without an exit", code="connection_failed")
        return self._proto.exit

    async def close(self) -> None:
        """Leaves the terminal; its process runs on."""
        with contextlib.suppress(OSError):
            self._writer.write(_ws.close_frame())
            await self._writer.drain()
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
