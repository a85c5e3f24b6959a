"""The client side of a WebSocket (RFC 6455) with the standard library only, without I/O:
the handshake, frames, and the terminal messages `GET /v1/sandboxes/{id}/pty` sends. The sync
and async terminals feed it the bytes their sockets read and send what it gives back."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

from ._http import Config
from ._models import ExitStatus
from .errors import SandcellError, error_from_body

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_MAX_HEADER = 64 * 1024
# The header of the 101 answer that names the terminal's process.
PID_HEADER = "x-sandcell-pid"


@dataclass(frozen=True)
class Endpoint:
    """Where to connect and the opening request to send there."""

    host: str
    port: int
    tls: bool
    request: bytes
    key: str


def endpoint(config: Config, path: str, query: dict[str, str]) -> Endpoint:
    """The upgrade request for `path` on the configured daemon."""
    url = httpx.URL(config.api_url)
    tls = url.scheme == "https"
    port = url.port or (443 if tls else 80)
    target = url.raw_path.decode().rstrip("/") + path + ("?" + urlencode(query) if query else "")
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {url.host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ] + [f"{k}: {v}" for k, v in config.headers().items()]
    return Endpoint(url.host, port, tls, ("\r\n".join(lines) + "\r\n\r\n").encode(), key)


@dataclass(frozen=True)
class Handshake:
    """A good upgrade answer: how many bytes of the buffer its head took, and its headers
    (names in lower case)."""

    length: int
    headers: dict[str, str]

    def pid(self) -> int:
        """The terminal's pid, from `X-Sandcell-Pid`."""
        value = self.headers.get(PID_HEADER, "")
        if not value.isdigit():
            raise SandcellError(
                f"the terminal's upgrade answer has no pid ({PID_HEADER}: {value!r}): the daemon "
                "is older than this SDK",
                code="internal",
            )
        return int(value)


def parse_handshake(buf: bytes, key: str) -> Handshake | None:
    """Once the answer's head is in `buf`: the `Handshake`, after a good upgrade.

    An error answer raises its `SandcellError` when its whole body is there; None means "read
    more".
    """
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buf) > _MAX_HEADER:
            raise SandcellError("the terminal's answer has no end of headers", code="internal")
        return None
    lines = buf[:head_end].decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    body_start = head_end + 4
    if status != 101:
        length = int(headers.get("content-length", "0"))
        if len(buf) < body_start + length:
            return None
        raw = buf[body_start : body_start + length]
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        raise error_from_body(body, status, headers.get("x-request-id"))
    expected = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
    if headers.get("sec-websocket-accept") != expected:
        raise SandcellError("the terminal's upgrade answer has a wrong accept key", code="internal")
    return Handshake(body_start, headers)


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """One final, masked frame (a client must mask what it sends)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


@dataclass
class FrameReader:
    """Reassembles the frames of a byte stream (fragmented messages included)."""

    _buf: bytearray = field(default_factory=bytearray)
    _parts: list[bytes] = field(default_factory=list)
    _opcode: int = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Takes bytes read; returns the whole messages and control frames they complete."""
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while True:
            frame = self._next()
            if frame is None:
                return out
            fin, opcode, payload = frame
            if opcode >= OP_CLOSE:
                out.append((opcode, payload))
                continue
            if opcode != OP_CONT:
                self._opcode, self._parts = opcode, []
            self._parts.append(payload)
            if fin:
                out.append((self._opcode, b"".join(self._parts)))
                self._parts = []

    def _next(self) -> tuple[bool, int, bytes] | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        fin, opcode = bool(buf[0] & 0x80), buf[0] & 0x0F
        masked, n = bool(buf[1] & 0x80), buf[1] & 0x7F
        pos = 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, pos = struct.unpack("!H", buf[2:4])[0], 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, pos = struct.unpack("!Q", buf[2:10])[0], 10
        mask = b""
        if masked:
            mask, pos = bytes(buf[pos : pos + 4]), pos + 4
        if len(buf) < pos + n:
            return None
        payload = bytes(buf[pos : pos + n])
        if masked:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        del buf[: pos + n]
        return fin, opcode, payload


@dataclass
class TerminalProtocol:
    """What the terminal's frames mean: output bytes, the process's exit, an error."""

    reader: FrameReader = field(default_factory=FrameReader)
    exit: ExitStatus | None = None
    closed: bool = False
    lost_bytes: int = 0

    def receive(self, data: bytes) -> tuple[bytes, bytes]:
        """Takes bytes read; returns (terminal output, bytes to send back: pongs, close)."""
        output, reply = bytearray(), bytearray()
        if not data:
            self.closed = True
        for opcode, payload in self.reader.feed(data):
            if opcode == OP_BINARY:
                output += payload
            elif opcode == OP_TEXT:
                self._message(json.loads(payload))
            elif opcode == OP_PING:
                reply += encode_frame(OP_PONG, payload)
            elif opcode == OP_CLOSE:
                if not self.closed:
                    reply += encode_frame(OP_CLOSE, payload[:2])
                self.closed = True
        return bytes(output), bytes(reply)

    def _message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "exit":
            self.exit = ExitStatus.from_json({"exit_code": msg.get("exit_code"), **(msg.get("result") or {})})
        elif kind == "lost":
            self.lost_bytes += int(msg.get("bytes", 0))
        elif kind == "error":
            raise error_from_body(msg, None)


def input_frame(data: str | bytes) -> bytes:
    """Keystrokes, as a binary frame."""
    return encode_frame(OP_BINARY, data.encode() if isinstance(data, str) else data)


def resize_frame(rows: int, cols: int) -> bytes:
    """A resize message."""
    return encode_frame(OP_TEXT, json.dumps({"type": "resize", "rows": rows, "cols": cols}).encode())


def close_frame() -> bytes:
    """A normal close (1000)."""
    return encode_frame(OP_CLOSE, struct.pack("!H", 1000))
