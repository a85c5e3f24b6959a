"""Creating, finding, pausing, timing out and ending sandboxes; metrics; run_once."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

import sandcell
from sandcell import NotFoundError, Sandbox, SandboxGoneError, Sandcell


def test_create_with_every_setting_and_read_it_back() -> None:
    with Sandbox.create(
        "python",
        size="nano",
        timeout=600,
        idle_timeout=120,
        ephemeral=True,
        labels={"team": "sdk-py", "case": "settings"},
        metadata={"run": "42"},
        env={"GREETING": "hello"},
        network="off",
        backend="process",
        limits={"memory_mb": 256, "pids": 128, "exec_timeout_secs": 60},
        kernels=["python"],
        auto_snapshot=sandcell.AutoSnapshot(before_reclaim=True),
    ) as sb:
        info = sb.info
        assert sb.id.startswith("sb-") and info.state == "running"
        assert (info.template, info.network, info.backend, info.ephemeral) == (
            "python",
            "off",
            "process",
            True,
        )
        assert info.labels == {"team": "sdk-py", "case": "settings"} and info.metadata == {"run": "42"}
        assert (
            info.limits.memory_mb == 256 and info.limits.pids == 128 and info.limits.exec_timeout_secs == 60
        )
        assert info.idle_timeout_secs == 120 and info.expires_at is not None
        assert sb.exec("echo $GREETING").stdout == "hello\n"
        assert sb.get_auto_snapshot().before_reclaim is True
        assert "Sandbox" in repr(sb) and sb.id in repr(sb)


def test_ttl_is_the_lifetime_and_excludes_timeout() -> None:
    with Sandbox.create(ttl=timedelta(minutes=5), ephemeral=True) as sb:
        expires = datetime.fromisoformat(sb.info.expires_at.replace("Z", "+00:00"))  # type: ignore[union-attr]
        created = datetime.fromisoformat(sb.info.created_at.replace("Z", "+00:00"))
        assert abs((expires - created).total_seconds() - 300) < 2
    with pytest.raises(ValueError, match="timeout or ttl"):
        Sandbox.create(timeout=10, ttl=10)


def test_get_list_kill_and_context_manager() -> None:
    label = {"case": "get-list"}
    a = Sandbox.create(ephemeral=True, labels=label, metadata={"n": "1"})
    b = Sandbox.create(labels=label, metadata={"n": "2"})
    try:
        again = Sandbox.get(a.id)
        assert again.id == a.id and again.info.labels == label
        again.disconnect()
        assert {i.id for i in Sandbox.list(label=label)} == {a.id, b.id}
        assert [i.id for i in Sandbox.list(label="case:get-list", metadata={"n": "2"})] == [b.id]
        assert Sandbox.list(label={"case": "nothing-has-this"}) == []
        assert a.is_running()
    finally:
        a.kill()
        b.kill()
    # An ephemeral sandbox leaves no record; another keeps one, stopped.
    with pytest.raises(NotFoundError):
        a.refresh()
    assert b.refresh().state == "stopped"
    assert b.id in {i.id for i in Sandbox.list(label=label, state="all")}
    assert b.id in {i.id for i in Sandbox.list(label=label, state=["stopped"])}
    assert b.id not in {i.id for i in Sandbox.list(label=label)}
    # A stopped sandbox says so when asked to work.
    with pytest.raises(SandboxGoneError) as gone:
        b.exec("true")
    assert gone.value.status == 409 and gone.value.code == "sandbox_gone"
    b.close()

    with Sandbox.create(ephemeral=True) as sb:
        kept = sb.id
    with pytest.raises(NotFoundError):
        Sandbox.get(kept)
    # Killing it inside the block is fine too.
    with Sandbox.create(ephemeral=True) as sb:
        sb.kill()


def test_shared_client_is_not_closed_by_sandboxes(client: Sandcell) -> None:
    with Sandbox.create(ephemeral=True, client=client) as sb:
        assert sb.client is client
    assert client.system()["caller"]["admin"] is True
    assert client.system()["version"]


def test_pause_resume_keeps_state(sb: Sandbox) -> None:
    sb.run_code("counter = 41")
    assert sb.pause().state == "paused"
    assert sb.refresh().state == "paused"
    assert sb.resume().state == "running"
    assert sb.run_code("counter + 1").text == "42"
    # Work on a paused sandbox wakes it.
    sb.pause()
    assert sb.exec("echo awake").stdout == "awake\n"
    assert sb.refresh().state == "running"


def test_set_timeout_moves_the_end(sb: Sandbox) -> None:
    before = sb.info.expires_at
    info = sb.set_timeout(90)
    assert info.expires_at != before and sb.info.expires_at == info.expires_at
    expires = datetime.fromisoformat(info.expires_at.replace("Z", "+00:00"))  # type: ignore[union-attr]
    left = expires.timestamp() - time.time()
    assert 60 < left <= 91


def test_metrics(sb: Sandbox) -> None:
    sb.exec("python3 -c 'x = bytearray(30 * 1024 * 1024); import time; time.sleep(0.2)'")
    m = sb.metrics()
    assert m.memory_limit_bytes == 512 * 1024 * 1024
    assert m.memory_peak_bytes is not None and m.memory_peak_bytes > 30 * 1024 * 1024
    assert m.pids is not None and m.pids >= 1 and m.pids_limit == 256
    assert m.cpu_seconds is not None and m.cpu_seconds > 0
    assert m.oom_kills == 0


def test_run_once_times_and_deletes() -> None:
    out = Sandbox.run_once("import sys\nprint('once')\nsys.version_info[0]")
    assert out.ok and out.stdout == "once\n" and out.text == "3"
    assert 0 < out.create_ms < out.total_ms and 0 < out.run_ms < out.total_ms and out.delete_ms > 0
    with pytest.raises(NotFoundError):
        Sandbox.get(out.sandbox_id)
    node = Sandbox.run_once("[1, 2, 3].map(x => x * 2)", template="node", language="node")
    assert node.text == "[ 2, 4, 6 ]"
