"""Error answers become the right exceptions; configuration comes from arguments or the
environment."""

from __future__ import annotations

import builtins
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandcell
from sandcell import (
    AuthenticationError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    Sandcell,
    SandcellError,
)
from sandcell.errors import error_from_body

from .conftest import Daemon


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_not_found() -> None:
    with pytest.raises(NotFoundError) as e:
        Sandbox.get("sb-000000000000")
    err = e.value
    assert (err.status, err.code) == (404, "not_found") and "sb-000000000000" in err.message
    assert err.request_id and err.request_id.startswith("req-")
    assert isinstance(err, SandcellError) and "HTTP 404" in str(err)


def test_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(size="huge")
    assert (e.value.status, e.value.code) == (400, "invalid_argument") and "huge" in e.value.message
    with pytest.raises(InvalidArgumentError):
        Sandbox.get("not-an-id")
    with pytest.raises(NotFoundError):  # an unknown template is a missing thing
        Sandbox.create("no-such-template")


def test_bad_key_is_authentication_error(daemon: Daemon) -> None:
    with pytest.raises(AuthenticationError) as e:
        Sandbox.create(api_key="sk-wrong", api_url=daemon.url)
    assert (e.value.status, e.value.code) == (401, "unauthenticated")
    with Sandcell(api_key="sk-wrong") as c, pytest.raises(AuthenticationError):
        c.list_snapshots()


def test_no_daemon_is_connection_error() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(sandcell.ConnectionError) as e:
        Sandbox.create(api_url=url)
    assert url in str(e.value) and isinstance(e.value, builtins.ConnectionError)
    with pytest.raises(builtins.ConnectionError):
        Sandbox.list(api_url=url)


def test_silent_server_is_timeout_error() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with Sandcell(url, "k", request_timeout=0.3) as impatient, pytest.raises(sandcell.TimeoutError) as e:
            impatient.system()
    assert isinstance(e.value, builtins.TimeoutError) and e.value.code == "timeout"


def test_configuration_precedence(daemon: Daemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    c = Sandcell()
    assert (c.config.api_url, c.config.api_key) == (daemon.url, daemon.key)
    c.close()
    explicit = Sandcell("http://example.invalid:1/", "k", request_timeout=3, connect_timeout=1)
    assert (explicit.config.api_url, explicit.config.api_key) == ("http://example.invalid:1", "k")
    assert (explicit.config.request_timeout, explicit.config.connect_timeout) == (3, 1)
    explicit.close()
    monkeypatch.delenv("SANDCELL_API_URL")
    monkeypatch.delenv("SANDCELL_API_KEY")
    monkeypatch.setenv("SANDCELL_HOME", str(tmp_path))  # a home no daemon ever used
    default = Sandcell()
    assert default.config.api_url == sandcell.DEFAULT_API_URL and default.config.api_key is None
    default.close()


def test_configuration_from_the_daemons_home(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    # As the CLI does: with neither variable set, the URL from <home>/daemon.json and the admin
    # key from <home>/admin.key, where <home> is $SANDCELL_HOME.
    monkeypatch.delenv("SANDCELL_API_URL")
    monkeypatch.delenv("SANDCELL_API_KEY")
    monkeypatch.setenv("SANDCELL_HOME", str(daemon.home))
    with Sandcell() as c:
        assert (c.config.api_url, c.config.api_key) == (daemon.url, daemon.key)
        assert c.system()["caller"]["admin"] is True
    with Sandbox.create(ephemeral=True) as sb:
        assert sb.exec("echo found").stdout == "found\n"
    # Arguments and variables still win, each on its own.
    monkeypatch.setenv("SANDCELL_API_URL", "http://127.0.0.1:1")
    with Sandcell(api_key="sk-given") as c:
        assert (c.config.api_url, c.config.api_key) == ("http://127.0.0.1:1", "sk-given")
    monkeypatch.setenv("SANDCELL_API_KEY", "sk-env")
    with Sandcell(daemon.url) as c:
        assert (c.config.api_url, c.config.api_key) == (daemon.url, "sk-env")


def test_no_key_says_how_to_configure_one(
    daemon: Daemon, bare: Sandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SANDCELL_API_KEY")
    monkeypatch.setenv("SANDCELL_HOME", str(tmp_path))
    (tmp_path / "admin.key").mkdir()  # there, but not readable as a file: no key
    with Sandcell() as c:
        assert c.config.api_key is None
        with pytest.raises(AuthenticationError) as e:
            c.system()
        assert "SANDCELL_API_KEY" in e.value.message and "api_key=" in e.value.message
        assert str(tmp_path / "admin.key") in e.value.message
        # The terminal's WebSocket says the same.
        with pytest.raises(AuthenticationError) as ws:
            Sandbox(bare.info, c).pty()
        assert "SANDCELL_API_KEY" in ws.value.message
        with pytest.raises(AuthenticationError, match="SANDCELL_API_KEY"):  # and a stream
            list(Sandbox(bare.info, c).exec_stream("true"))
    # A wrong key read from a home: the error says where it came from.
    (tmp_path / "admin.key").rmdir()
    (tmp_path / "admin.key").write_text("sk-stale\n")
    with Sandcell() as c, pytest.raises(AuthenticationError) as stale:
        c.system()
    assert c.config.api_key == "sk-stale" and str(tmp_path / "admin.key") in stale.value.message


def test_mapping_of_codes_and_statuses() -> None:
    cases = {
        ("sandbox_gone", 409): sandcell.SandboxGoneError,
        ("limit_exceeded", 429): sandcell.LimitExceededError,
        ("no_space", 507): sandcell.LimitExceededError,
        ("permission_denied", 403): sandcell.PermissionDeniedError,
        ("invalid_state", 409): sandcell.ConflictError,
        ("unresponsive", 504): sandcell.TimeoutError,
        ("unavailable", 503): sandcell.ConflictError,
        ("internal", 500): sandcell.ServerError,
        ("some_new_conflict", 409): sandcell.ConflictError,
        ("some_new_failure", 502): sandcell.ServerError,
    }
    for (code, status), cls in cases.items():
        err = error_from_body({"code": code, "message": "m", "details": {"k": 1}}, status)
        assert type(err) is cls and err.code == code and err.details == {"k": 1}
    assert isinstance(error_from_body("<html>", 502), sandcell.ServerError)
    assert issubclass(sandcell.SandboxGoneError, sandcell.ConflictError)


def _texts(sb: Sandbox, stream: str) -> Iterator[str]:
    if stream == "exec":
        yield from (ev.data for ev in sb.exec_stream("echo started; sleep 10"))
    elif stream == "code":
        yield from (ev.text for ev in sb.run_code_stream("print('started')\nimport time; time.sleep(10)"))
    else:
        yield from (ev.data for ev in sb.start_process("echo started; sleep 10").stream())


def test_error_events_mid_stream_raise() -> None:
    for stream in ("exec", "code", "process"):
        sb = Sandbox.create("python", ephemeral=True)
        seen: list[str] = []
        killer = threading.Timer(0.5, sb.kill)
        killer.start()
        with pytest.raises(sandcell.SandboxGoneError) as e:
            for text in _texts(sb, stream):
                seen.append(text)
        killer.join()
        sb.close()
        assert seen == ["started\n"], stream
        assert e.value.code == "sandbox_gone" and "destroyed" in e.value.message, stream
