"""A real `sandcell serve` for the whole session (temp home, free port, admin key), and
sandboxes made through the SDK under test."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def serve(
    home: Path, allowed: Path, *settings: str, env: dict[str, str] | None = None
) -> Iterator[Daemon]:
    """`sandcell serve` on `home` and a free port, with these `--set` settings; stopped after.
    `allowed` is the host folder it imports files from and mounts into sandboxes
    (`import.allowed_paths`, `mounts.allowed_paths`)."""
    binary = Path(os.environ.get("SANDCELL_BIN") or REPO / "target/release/sandcell")
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"no sandcell binary at {binary}: build it (cargo build --release) or set SANDCELL_BIN",
            pytrace=False,
        )
    log = home / "daemon.log"
    args = [str(binary), "serve", "--home", str(home), "--listen", "127.0.0.1:0"]
    defaults = (
        "shutdown.sandboxes=stop",
        f"import.allowed_paths={allowed}",
        f"mounts.allowed_paths={allowed}",
    )
    for setting in (*defaults, *settings):
        args += ["--set", setting]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=None if env is None else os.environ | env
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


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serve(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("import-allowed")) as d:
        yield d


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


# --- agent runs: the test kit's scripted model, and a daemon whose runs ask it ----------------


@dataclass
class ScriptedModel:
    """`scripted-llm` serving one script: `base_url` is its OpenAI base (with /v1)."""

    base_url: str
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        """The requests it has answered, oldest first."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def scripted_model(script: list[Any], folder: Path) -> Iterator[ScriptedModel]:
    """The test kit's scripted OpenAI / Anthropic server on a free port of 127.0.0.1, answering
    the turns of `script` in order (`{"text": …}`, `{"tool_calls": […]}`, `{"slow": …}`), then
    its small deterministic agent. `scripts/test.sh` (and this suite's test.sh) builds it."""
    binary = Path(os.environ.get("SANDCELL_SCRIPTED_LLM") or REPO / "target/debug/scripted-llm")
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"no scripted-llm at {binary}: build it with `cargo build -p sandcell-testkit --features llm "
            "--bin scripted-llm`, or set SANDCELL_SCRIPTED_LLM",
            pytrace=False,
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "script.json").write_text(json.dumps(script))
    out, log = folder / "llm.out", folder / "requests.jsonl"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [str(binary), "--port", "0", "--script", str(folder / "script.json"), "--log", str(log)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            text = out.read_text(errors="replace")
            if text.startswith("listening on ") and text.endswith("\n"):
                yield ScriptedModel(text.split()[2] + "/v1", log)
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"scripted-llm did not start: {_tail(out)}", pytrace=False)
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()


@dataclass
class AgentDaemon:
    """A daemon of its own whose runs ask a scripted model."""

    daemon: Daemon
    model: ScriptedModel

    @property
    def url(self) -> str:
        return self.daemon.url

    @property
    def key(self) -> str:
        return self.daemon.key


@pytest.fixture
def agent_daemon(tmp_path: Path) -> Iterator[Callable[[list[Any]], AgentDaemon]]:
    """Makes a scripted model serving a script, and a daemon pointed at it (as
    OPENAI_BASE_URL / OPENAI_API_KEY would point it; the key is a test key); both stop at the
    end of the test."""
    with contextlib.ExitStack() as stack:
        made = 0

        def make(script: list[Any]) -> AgentDaemon:
            nonlocal made
            made += 1
            model = stack.enter_context(scripted_model(script, tmp_path / f"model-{made}"))
            home, allowed = tmp_path / f"home-{made}", tmp_path / f"allowed-{made}"
            home.mkdir()
            allowed.mkdir()
            env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "sk-test"}
            return AgentDaemon(stack.enter_context(serve(home, allowed, env=env)), model)

        yield make


# --- package installs: the test kit's fake package registries ---------------------------------


@dataclass
class FakeRegistries:
    """`fake-registries` serving: its HTTPS and plain-HTTP addresses (`127.0.0.1:P`) and the
    test CA its certificate is signed by."""

    https: str
    http: str
    ca: Path

    @property
    def https_port(self) -> int:
        return int(self.https.rsplit(":", 1)[1])


@contextlib.contextmanager
def fake_registries(folder: Path, *names: str) -> Iterator[FakeRegistries]:
    """The test kit's fake package registries on 127.0.0.1 (a PEP 503 index and an npm
    registry, each with `sandcell-fake`), their certificate covering `names`; stopped (SIGTERM,
    so they remove their files) after. `test.sh` builds them (`cargo build -p sandcell-testkit
    --features registries --bin fake-registries`); `$SANDCELL_FAKE_REGISTRIES` names another
    build."""
    binary = Path(os.environ.get("SANDCELL_FAKE_REGISTRIES") or REPO / "target/debug/fake-registries")
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"no fake-registries at {binary}: build it with `cargo build -p sandcell-testkit --features "
            "registries --bin fake-registries`, or set SANDCELL_FAKE_REGISTRIES",
            pytrace=False,
        )
    folder.mkdir(parents=True, exist_ok=True)
    errors = folder / "fake-registries.err"
    args = [str(binary)] + [a for name in names for a in ("--name", name)]
    with open(errors, "wb") as sink:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=sink)
    try:
        assert proc.stdout is not None
        # One JSON line once both ports accept connections; nothing after it.
        line = b""
        deadline = time.monotonic() + 20
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    pytest.fail(f"fake-registries did not start in 20 s: {_tail(errors)}", pytrace=False)
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    pytest.fail(f"fake-registries exited with {proc.wait()}: {_tail(errors)}", pytrace=False)
                line += chunk
        ready = json.loads(line)
        yield FakeRegistries(ready["https"], ready["http"], Path(ready["ca"]))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
