"""`git_clone`, sync and async, against a daemon of its own: the daemon maps the test-only name
`git.test` to 127.0.0.1 (its clone proxy refuses loopback addresses by address), and a small
static HTTP server on 127.0.0.1 serves a bare repository over git's dumb HTTP protocol,
recording the headers of each request. The clone lands in the sandbox at the default path on
`main`; the server saw the credentials of the URL; the sandbox holds none of them; a second
clone to the same path and a transport other than http(s) are refused."""

from __future__ import annotations

import base64
import http.server
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from sandcell import (
    AsyncSandbox,
    ConflictError,
    GitCloneResult,
    InvalidArgumentError,
    Sandbox,
)

from .conftest import Daemon, serve

README = "a repository served over dumb HTTP\n"
TOKEN = "t0k-3a9f1c"


def _git(cwd: Path, *args: str) -> None:
    """Runs the git CLI with no user or system configuration and a fixed author."""
    env = os.environ | {
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "-C", str(cwd), *args], env=env, check=True, capture_output=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A bare repository `repo.git` (one commit of README.md on `main`) served over dumb HTTP
    on 127.0.0.1: the port, and the headers of every request the server got."""
    root = tmp_path_factory.mktemp("git-served")
    src = root / "src"
    src.mkdir()
    _git(src, "init", "-q", "-b", "main")
    (src / "README.md").write_text(README)
    _git(src, "add", "README.md")
    _git(src, "commit", "-q", "-m", "first")
    _git(root, "clone", "-q", "--bare", "src", "repo.git")
    # Dumb HTTP reads info/refs and objects/info/packs as plain files.
    _git(root / "repo.git", "update-server-info")
    seen: list[dict[str, str]] = []

    class Recording(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            super().do_GET()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Recording, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def git_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon of its own whose egress proxies map `git.test` to 127.0.0.1 (test-only: it
    takes SANDCELL_TEST=1, and the session's daemon is left as users run it)."""
    env = {"SANDCELL_TEST": "1", "SANDCELL_TEST_RESOLVE": "git.test=127.0.0.1"}
    with serve(tmp_path_factory.mktemp("git-home"), tmp_path_factory.mktemp("git-allowed"), env=env) as d:
        yield d


def test_clone_brings_the_repository_in_and_keeps_the_credentials_out(
    git_daemon: Daemon, served: tuple[int, list[dict[str, str]]]
) -> None:
    port, seen = served
    seen.clear()
    url = f"http://me:{TOKEN}@git.test:{port}/repo.git"
    # The sandbox's own network stays at its default (loopback): the clone is the host's.
    with Sandbox.create(ephemeral=True, api_url=git_daemon.url, api_key=git_daemon.key) as sb:
        result = sb.git_clone(url)
        assert isinstance(result, GitCloneResult)
        assert result.path == "/workspace/repo"
        assert re.fullmatch(r"[0-9a-f]{40}", result.commit), result
        assert result.branch == "main"
        assert result.files > 3 and result.bytes > len(README) and result.duration_ms >= 0

        out = sb.exec("cat /workspace/repo/README.md; git -C /workspace/repo rev-parse HEAD")
        assert out.stdout == f"{README}{result.commit}\n", out.stderr

        # The credentials went to the server, preemptively, as Basic authentication ...
        basic = "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()
        assert seen and all(h.get("authorization") == basic for h in seen), seen
        # ... and nowhere into the sandbox (its origin is the URL without them).
        found = sb.exec(f"grep -r {TOKEN} /workspace")
        assert (found.exit_code, found.stdout) == (1, ""), found
        remote = sb.exec("git -C /workspace/repo remote get-url origin").stdout
        assert remote == f"http://git.test:{port}/repo.git\n"

        # The path is taken now.
        with pytest.raises(ConflictError) as conflict:
            sb.git_clone(url)
        assert conflict.value.code == "already_exists" and conflict.value.status == 409

        # Only http(s): refused before anything is fetched.
        before = len(seen)
        with pytest.raises(InvalidArgumentError) as bad:
            sb.git_clone("ssh://git.test/x")
        assert bad.value.code == "invalid_argument" and bad.value.status == 400
        assert "ssh" in bad.value.message
        assert len(seen) == before


async def test_async_clone_with_username_and_password_to_a_path(
    git_daemon: Daemon, served: tuple[int, list[dict[str, str]]]
) -> None:
    port, seen = served
    seen.clear()
    async with await AsyncSandbox.create(
        ephemeral=True, api_url=git_daemon.url, api_key=git_daemon.key
    ) as sb:
        result = await sb.git_clone(
            f"http://git.test:{port}/repo.git", "src/here", branch="main", username="you", password=TOKEN
        )
        assert (result.path, result.branch) == ("/workspace/src/here", "main")
        assert await sb.read_file("/workspace/src/here/README.md") == README
        basic = "Basic " + base64.b64encode(f"you:{TOKEN}".encode()).decode()
        assert seen and all(h.get("authorization") == basic for h in seen), seen
        found = await sb.exec(f"grep -r {TOKEN} /workspace")
        assert (found.exit_code, found.stdout) == (1, ""), found

        # A clone that fails on the host quotes git; nothing is left at its path.
        with pytest.raises(InvalidArgumentError) as failed:
            await sb.git_clone(f"http://git.test:{port}/missing.git")
        assert failed.value.code == "invalid_argument"
        assert not await sb.exists("/workspace/missing")
