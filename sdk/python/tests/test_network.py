"""A sandbox's network policy: allow rules at creation, the egress proxy inside the sandbox,
live changes, the egress events, and the policies the daemon refuses."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sandcell import (
    AsyncSandbox,
    EgressEvent,
    InvalidArgumentError,
    NetworkInfo,
    Sandbox,
)

GREETING = "hello from the host"
PROXY = "http://127.0.0.1:3128"


class _Greeter(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = GREETING.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def host_port() -> Iterator[int]:
    """A tiny HTTP server on the host's 127.0.0.1 answering GREETING; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Greeter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _other_port(taken: int) -> int:
    """A port of 127.0.0.1 no rule names (nothing listens there either)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != taken:
            return port


def _through_proxy(sb: Sandbox, port: int) -> tuple[str, str]:
    """GET http://127.0.0.1:port/ from inside the sandbox through its HTTP proxy (NO_PROXY
    names 127.0.0.1, hence `--noproxy ''`): the body and the status."""
    out = sb.exec(
        f"curl -sS --noproxy '' -x {PROXY} -w '\\n%{{http_code}}' http://127.0.0.1:{port}/"
    )
    body, _, status = out.stdout.rpartition("\n")
    return body, status


def _events_until(sb: Sandbox, count: int) -> list[EgressEvent]:
    """The sandbox's egress events once there are `count` (an allowed one is recorded when
    its connection ends, a moment after the client has its answer)."""
    deadline = time.monotonic() + 10
    while True:
        events = sb.egress_events().events
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def test_allow_rule_reaches_the_host_through_the_proxy_and_changes_live(host_port: int) -> None:
    rule = f"127.0.0.1:{host_port}"
    other = _other_port(host_port)
    with Sandbox.create(network={"allow": [rule]}, ephemeral=True) as sb:
        assert sb.info.network == {"allow": [rule]}
        # The proxy variables are set for the sandbox's programs.
        env = sb.exec("echo $HTTP_PROXY $HTTPS_PROXY").stdout.split()
        assert env == [PROXY, PROXY]

        assert _through_proxy(sb, host_port) == (GREETING, "200")
        assert _through_proxy(sb, other)[1] == "403"

        info = sb.network()
        assert isinstance(info, NetworkInfo)
        assert info.network == {"allow": [rule]}
        assert info.http_proxy == PROXY and info.socks_proxy == "socks5h://127.0.0.1:1080"
        assert info.bytes > len(GREETING) and info.open_connections == 0

        events = _events_until(sb, 2)
        assert [(e.decision, e.host, e.port) for e in events] == [
            ("denied", "127.0.0.1", other),
            ("allowed", "127.0.0.1", host_port),
        ], events
        denied, allowed = events
        assert denied.id > allowed.id and denied.protocol == allowed.protocol == "http"
        assert denied.reason and "not allowed" in denied.reason
        assert allowed.reason is None and allowed.address == rule
        assert allowed.bytes_down > len(GREETING) and allowed.bytes_up > 0
        assert allowed.at.endswith("Z")

        # From the next connection on, loopback refuses what the rule let through.
        changed = sb.set_network("loopback")
        assert changed.network == "loopback" and changed.http_proxy == PROXY
        assert sb.info.network == "loopback" and sb.refresh().network == "loopback"
        assert _through_proxy(sb, host_port)[1] == "403"
        refused = _events_until(sb, 3)[0]
        assert (refused.decision, refused.port) == ("denied", host_port)
        assert refused.reason and "loopback" in refused.reason

        # A list of rules is an allow policy.
        assert sb.set_network([rule]).network == {"allow": [rule]}
        assert _through_proxy(sb, host_port) == (GREETING, "200")

        # `off` is chosen when a sandbox is made, never on a running one.
        with pytest.raises(InvalidArgumentError) as e:
            sb.set_network("off")
        assert e.value.code == "invalid_argument" and e.value.status == 400
        assert "off" in e.value.message
        assert sb.network().network == {"allow": [rule]}

        # Pages, newest first, linked by next_before; the iterator reads them all.
        every = _events_until(sb, 4)
        assert len(every) == 4 and [e.id for e in every] == sorted((e.id for e in every), reverse=True)
        first = sb.egress_events(limit=1)
        assert [e.id for e in first] == [every[0].id] and first.next_before == every[0].id
        second = sb.egress_events(limit=2, before=first.next_before)
        assert [e.id for e in second] == [every[1].id, every[2].id]
        assert [e.id for e in sb.iter_egress_events(page_size=1)] == [e.id for e in every]
        assert sb.egress_events(before=every[-1].id).events == []


def test_policies_the_daemon_refuses_at_creation() -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(network={"allow": ["http://x"]}, ephemeral=True)
    assert e.value.code == "invalid_argument" and "URL" in e.value.message
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(network=[], ephemeral=True)
    assert "at least one rule" in e.value.message
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(network="wide", ephemeral=True)
    assert "not a network policy" in e.value.message
    with pytest.raises(TypeError, match="allow rules"):
        Sandbox.create(network=3, ephemeral=True)  # type: ignore[arg-type]


def test_off_has_no_proxy() -> None:
    with Sandbox.create(network="off", ephemeral=True) as sb:
        info = sb.network()
        assert info.network == "off" and info.http_proxy is None and info.socks_proxy is None
        with pytest.raises(InvalidArgumentError):
            sb.set_network("loopback")


async def test_async_network() -> None:
    async with await AsyncSandbox.create(ephemeral=True) as sb:
        assert (await sb.refresh()).network == "loopback"
        assert (await sb.network()).network == "loopback"
        assert (await sb.set_network(["*.example.org:443"])).network == {"allow": ["*.example.org:443"]}
        assert sb.info.network == {"allow": ["*.example.org:443"]}
        refused = await sb.exec(f"curl -sS -o /dev/null -w '%{{http_code}}' -x {PROXY} http://example.net/")
        assert refused.stdout == "403"
        page = await sb.egress_events(limit=10)
        assert [(e.decision, e.host, e.port) for e in page] == [("denied", "example.net", 80)]
        assert [e.id async for e in sb.iter_egress_events()] == [page.events[0].id]
        with pytest.raises(InvalidArgumentError) as e:
            await sb.set_network("off")
        assert e.value.code == "invalid_argument"
