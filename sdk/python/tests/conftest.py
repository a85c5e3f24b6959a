"""A real `sandcell serve` for the whole session (temp home, free port, admin key), and
sandboxes made through the SDK under test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandcell import AsyncSandbox, Sandbox, Sandcell

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Daemon:
    url: str
    key: str
    home: Path
    allowed: Path
    log: Path


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    binary = Path(os.environ.get("SANDCELL_BIN") or REPO / "target/release/sandcell")
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"no sandcell binary at {binary}: build it (cargo build --release) or set SANDCELL_BIN",
            pytrace=False,
        )
    home = tmp_path_factory.mktemp("home")
    allowed = tmp_path_factory.mktemp("import-allowed")
    log = home / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                "serve",
                "--home",
                str(home),
                "--listen",
                "127.0.0.1:0",
                "--set",
                "shutdown.sandboxes=stop",
                "--set",
                f"import.allowed_paths={allowed}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = _wait_ready(proc, home, log)
        key = (home / "admin.key").read_text().strip()
        yield Daemon(url, key, home, allowed, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], home: Path, log: Path) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"sandcell serve exited with {proc.returncode}:\n{_tail(log)}", pytrace=False)
        try:
            url = str(json.loads((home / "daemon.json").read_text())["url"])
            if (home / "admin.key").exists() and httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return url
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.05)
    pytest.fail(f"sandcell serve did not get ready in 20 s:\n{_tail(log)}", pytrace=False)


@pytest.fixture(autouse=True)
def sandcell_env(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK finds the daemon the way users' programs do: from the environment."""
    monkeypatch.setenv("SANDCELL_API_URL", daemon.url)
    monkeypatch.setenv("SANDCELL_API_KEY", daemon.key)


@pytest.fixture
def sb() -> Iterator[Sandbox]:
    with Sandbox.create("python", ephemeral=True) as sandbox:
        yield sandbox


@pytest.fixture
def bare() -> Iterator[Sandbox]:
    """A sandbox without a kernel started (template `default`)."""
    with Sandbox.create(ephemeral=True) as sandbox:
        yield sandbox


@pytest.fixture
def client() -> Iterator[Sandcell]:
    with Sandcell() as c:
        yield c


@pytest.fixture
async def asb() -> AsyncIterator[AsyncSandbox]:
    async with await AsyncSandbox.create("python", ephemeral=True) as sandbox:
        yield sandbox
