"""The names users of other sandbox SDKs already write, over the SDK's own methods, sync and
async: each check fails if its alias stops reaching the method it stands for."""

from __future__ import annotations

import pytest

from sandcell import (
    AsyncSandbox,
    AsyncSandcell,
    AutoSnapshot,
    NotFoundError,
    RunOnceMetrics,
    Sandbox,
    Sandcell,
)


def test_auto_snapshot_in_minutes(sb: Sandbox) -> None:
    on = sb.enable_auto_snapshot(interval_mins=10)
    assert on == AutoSnapshot(interval_secs=600, keep=3, before_reclaim=False)
    assert sb.get_auto_snapshot() == on
    assert sb.enable_auto_snapshot(0.5, keep=2, before_reclaim=True) == AutoSnapshot(30, 2, True)
    off = sb.disable_auto_snapshot()
    assert off.interval_secs is None and off.before_reclaim is False
    assert sb.get_auto_snapshot() == off


def test_get_processes_and_kill_process(bare: Sandbox) -> None:
    job = bare.start_process("sleep 60")
    listed = {p.pid: p for p in bare.get_processes()}
    assert job.pid in listed and not listed[job.pid].exited and "sleep 60" in listed[job.pid].cmdline
    # The alias lists what processes() lists; compared on the job only, since the sandbox's
    # own short-lived processes may come and go between the two listings.
    again = {p.pid: p for p in bare.processes()}
    assert again[job.pid].cmdline == listed[job.pid].cmdline
    bare.kill_process(job.pid)
    assert job.wait().signal_name == "SIGKILL"
    assert next(p for p in bare.get_processes() if p.pid == job.pid).exited


def test_close_and_delete_end_the_sandbox_and_disconnect_keeps_it(client: Sandcell) -> None:
    kept = Sandbox.create()
    # disconnect() lets go of the connection only: the sandbox runs on.
    kept.disconnect()
    assert kept.client._http._client.is_closed
    again = Sandbox.get(kept.id)
    assert again.is_running()
    # delete() ends it (a record stays: it was not ephemeral) and closes the connection.
    again.delete()
    assert again.client._http._client.is_closed
    assert Sandbox.get(kept.id, client=client).info.state == "stopped"
    gone = Sandbox.create(ephemeral=True)
    gone.delete()
    with pytest.raises(NotFoundError):
        Sandbox.get(gone.id, client=client)
    # close() ends it too, as other SDKs' close() does; closing twice is fine.
    closed = Sandbox.create(ephemeral=True)
    closed.close()
    assert closed.client._http._client.is_closed
    with pytest.raises(NotFoundError):
        Sandbox.get(closed.id, client=client)
    closed.close()


def test_run_once_output_and_metrics() -> None:
    out = Sandbox.run_once("print('once')\n6 * 7")
    assert out.output == "once\n" == out.stdout and out.text == "42"
    m = out.metrics
    assert isinstance(m, RunOnceMetrics)
    assert (m.startup_ms, m.run_ms, m.cleanup_ms, m.total_ms) == (
        out.create_ms,
        out.run_ms,
        out.delete_ms,
        out.total_ms,
    )
    assert m.execution_ms == out.execution.done.duration_ms
    assert 0 < m.startup_ms < m.total_ms and 0 < m.execution_ms <= m.run_ms < m.total_ms


async def test_async_aliases() -> None:
    asb = await AsyncSandbox.create("python")
    assert (await asb.enable_auto_snapshot(interval_mins=2)).interval_secs == 120
    assert (await asb.get_auto_snapshot()).interval_secs == 120
    assert (await asb.disable_auto_snapshot()).interval_secs is None
    job = await asb.start_process("sleep 60")
    assert job.pid in {p.pid for p in await asb.get_processes()}
    await asb.kill_process(job.pid)
    assert (await job.wait()).signal_name == "SIGKILL"
    await asb.disconnect()
    assert asb.client._http._client.is_closed
    again = await AsyncSandbox.get(asb.id)
    assert await again.is_running()
    await again.close()
    assert again.client._http._client.is_closed
    assert (await AsyncSandbox.get(asb.id)).info.state == "stopped"
    async with AsyncSandcell() as c:
        assert (await AsyncSandbox.get(asb.id, client=c)).info.state == "stopped"
    out = await AsyncSandbox.run_once("print('async once')")
    assert out.output == "async once\n"
    assert out.metrics.startup_ms == out.create_ms and out.metrics.total_ms == out.total_ms
