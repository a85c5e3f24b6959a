"""Previews, sync and async, against the session's daemon: a `python3 -m http.server` inside a
sandbox (default network) serves a page; `preview_url` gives URLs a plain HTTP client opens
without the API key, on the path route and on the host route (sent to the daemon's address
with the URL's `Host`, since `*.localhost` may not resolve here), the latter setting the token's
cookie; without a token the port is refused, `public=True` opens it and `public=False` closes
it again; a port nothing listens on is a 502 `port_closed`; `get_host` is made from the
sandbox's info and the client's URL; a sandbox with network `off` is a 409."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timezone
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from sandcell import AsyncSandbox, InvalidArgumentError, PreviewInfo, Sandbox, _api

from .conftest import Daemon

PAGE = "hello from a server inside\n"
SERVE = "cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1"
UP = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 1).close()' 2>&1 && echo up"


def start_server(sb: Sandbox) -> None:
    """Serves PAGE at / on 127.0.0.1:8000 inside `sb`; returns once it answers there."""
    sb.exec("mkdir -p /workspace/www")
    sb.write_file("/workspace/www/index.html", PAGE)
    sb.start_process(SERVE)
    deadline = time.monotonic() + 20
    while not (out := sb.exec(UP).stdout).endswith("up\n"):
        assert time.monotonic() < deadline, f"the server inside did not start: {out}"
        time.sleep(0.1)


async def astart_server(sb: AsyncSandbox) -> None:
    """The same, for the async client."""
    await sb.exec("mkdir -p /workspace/www")
    await sb.write_file("/workspace/www/index.html", PAGE)
    await sb.start_process(SERVE)
    deadline = time.monotonic() + 20
    while not (out := (await sb.exec(UP)).stdout).endswith("up\n"):
        assert time.monotonic() < deadline, f"the server inside did not start: {out}"
        await asyncio.sleep(0.1)


def via_host(daemon: Daemon, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GETs a host-route URL by connecting to the daemon's own address with the URL's host and
    port as the `Host` header (as a browser resolving `*.localhost` to loopback would)."""
    parts = urlsplit(url)
    target = f"{daemon.url}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    return httpx.get(target, headers={"Host": parts.netloc, **(headers or {})})


def error_code(resp: httpx.Response) -> str:
    return str(resp.json()["code"])


def test_previews_reach_a_server_inside(daemon: Daemon) -> None:
    daemon_port = urlsplit(daemon.url).port
    with Sandbox.create(ephemeral=True) as sb:
        start_server(sb)
        host = f"8000-{sb.id}.localhost"
        # No request: made from the sandbox's info and the client's URL.
        assert sb.info.preview_host == f"{{port}}-{sb.id}.localhost"
        assert sb.info.preview_path == f"/v1/sandboxes/{sb.id}/ports/{{port}}/"
        assert sb.get_host(8000) == f"{host}:{daemon_port}"

        # A token for the port, typed.
        info = sb.preview(8000, ttl_secs=60)
        assert isinstance(info, PreviewInfo)
        assert (info.port, info.path, info.host, info.public) == (
            8000,
            f"/v1/sandboxes/{sb.id}/ports/8000/",
            host,
            False,
        )
        expires = datetime.fromisoformat(info.expires_at.replace("Z", "+00:00"))
        left = (expires - datetime.now(timezone.utc)).total_seconds()
        assert 30 < left <= 61, info.expires_at

        # The path route, with no API key: the token in the URL is enough.
        page = f"{daemon.url}/v1/sandboxes/{sb.id}/ports/8000/"
        url = sb.preview_url(8000, route="path")
        assert re.fullmatch(re.escape(page) + r"\?sandcell_token=[^&]+", url), url
        r = httpx.get(url)
        assert (r.status_code, r.text) == (200, PAGE)
        # The same path without the token is refused, as is a wrong token.
        r = httpx.get(page)
        assert (r.status_code, error_code(r)) == (401, "unauthenticated"), r.text
        assert httpx.get(url + "x").status_code == 401

        # The host route: the token in the URL, then kept in a cookie for the page's assets.
        url = sb.preview_url(8000)
        assert re.fullmatch(rf"http://{re.escape(host)}:{daemon_port}/\?sandcell_token=[^&]+", url), url
        r = via_host(daemon, url)
        assert (r.status_code, r.text) == (200, PAGE), r.text
        cookie = r.headers.get("set-cookie", "")
        token = parse_qs(urlsplit(url).query)["sandcell_token"][0]
        assert cookie.startswith(f"sandcell_token={token};"), cookie
        r = via_host(daemon, f"http://{host}:{daemon_port}/index.html", {"Cookie": cookie.split(";")[0]})
        assert (r.status_code, r.text) == (200, PAGE)
        assert via_host(daemon, f"http://{host}:{daemon_port}/").status_code == 401

        # Public: no token needed on either route; private again: refused again.
        assert sb.preview(8000, public=True).public is True
        assert httpx.get(page).text == PAGE
        assert via_host(daemon, f"http://{host}:{daemon_port}/").status_code == 200
        assert sb.preview(8000, public=False).public is False
        r = httpx.get(page)
        assert (r.status_code, error_code(r)) == (401, "unauthenticated")
        assert via_host(daemon, f"http://{host}:{daemon_port}/").status_code == 401

        # Nothing listens on port 9: said plainly, with a valid token.
        r = httpx.get(sb.preview_url(9, route="path"))
        assert (r.status_code, error_code(r)) == (502, "port_closed"), r.text

        # Bad input: checked here (no request) or by the daemon.
        with pytest.raises(ValueError, match="route"):
            sb.preview_url(8000, route="nowhere")  # type: ignore[arg-type]
        for bad in (0, 65536):
            with pytest.raises(ValueError, match="port"):
                sb.get_host(bad)
        with pytest.raises(InvalidArgumentError):
            sb.preview(0)
        with pytest.raises(InvalidArgumentError) as too_long:
            sb.preview(8000, ttl_secs=8 * 24 * 3600)
        assert "ttl_secs" in too_long.value.message


async def test_async_previews_and_a_sandbox_without_network(daemon: Daemon) -> None:
    daemon_port = urlsplit(daemon.url).port
    async with await AsyncSandbox.create(ephemeral=True) as sb:
        await astart_server(sb)
        assert sb.get_host(8000) == f"8000-{sb.id}.localhost:{daemon_port}"
        info = await sb.preview(8000)
        assert info.path == sb.info.preview_path.replace("{port}", "8000")
        assert info.host == sb.info.preview_host.replace("{port}", "8000")
        async with httpx.AsyncClient() as http:
            r = await http.get(await sb.preview_url(8000, route="path", ttl_secs=30))
            assert (r.status_code, r.text) == (200, PAGE)
            r = await http.get(f"{daemon.url}{info.path}", headers={"X-Sandcell-Token": info.token})
            assert (r.status_code, r.text) == (200, PAGE)
        url = await sb.preview_url(8000)
        r = via_host(daemon, url)
        assert (r.status_code, r.text) == (200, PAGE)
        assert r.headers.get("set-cookie", "").startswith("sandcell_token=")

    # With the network off nothing inside can listen: the route says so.
    async with await AsyncSandbox.create(ephemeral=True, network="off") as off:
        r = httpx.get(await off.preview_url(8000, route="path"))
        assert (r.status_code, error_code(r)) == (409, "invalid_state"), r.text


def test_hosts_and_urls_follow_the_clients_url() -> None:
    """No daemon needed: the daemon's port and scheme come from the client's URL (none when it
    names none), a path prefix is kept on the path route, the token is quoted."""
    info = PreviewInfo(
        port=3000,
        path="/v1/sandboxes/sb-x1/ports/3000/",
        host="3000-sb-x1.localhost",
        token="12.a/b+c",
        expires_at="2026-01-01T00:00:00Z",
    )
    assert _api.preview_host("{port}-sb-x1.localhost", "sb-x1", 3000, "http://127.0.0.1:7070") == (
        "3000-sb-x1.localhost:7070"
    )
    # An older daemon sent no template: made from the id.
    assert _api.preview_host("", "sb-x1", 80, "https://sandcell.example") == "80-sb-x1.localhost"
    assert _api.preview_url(info, "https://sandcell.example:8443/api", "host") == (
        "https://3000-sb-x1.localhost:8443/?sandcell_token=12.a%2Fb%2Bc"
    )
    assert _api.preview_url(info, "https://sandcell.example:8443/api", "path") == (
        "https://sandcell.example:8443/api/v1/sandboxes/sb-x1/ports/3000/?sandcell_token=12.a%2Fb%2Bc"
    )
