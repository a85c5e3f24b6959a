"""The async client does what the sync one does: the main scenarios through AsyncSandbox, and
many sandboxes at once with asyncio.gather."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from pathlib import Path

import pytest

import sandcell
from sandcell import (
    AsyncSandbox,
    AsyncSandcell,
    AuthenticationError,
    ConflictError,
    NotFoundError,
    OutputEvent,
    Result,
)

from .conftest import Daemon
from .test_exec import INTERLEAVED


async def test_lifecycle_and_context_manager() -> None:
    async with await AsyncSandbox.create(
        "python", ephemeral=True, labels={"case": "async"}, env={"E": "v"}
    ) as sb:
        assert sb.info.state == "running" and "AsyncSandbox" in repr(sb)
        assert [i.id for i in await AsyncSandbox.list(label={"case": "async"})] == [sb.id]
        again = await AsyncSandbox.get(sb.id)
        assert again.id == sb.id and await again.is_running()
        await again.disconnect()
        assert (await sb.pause()).state == "paused"
        assert (await sb.resume()).state == "running"
        assert (await sb.set_timeout(300)).expires_at
        assert (await sb.metrics()).memory_limit_bytes
        kept = sb.id
    with pytest.raises(NotFoundError):
        await AsyncSandbox.get(kept)


async def test_exec_and_stream_order(asb: AsyncSandbox) -> None:
    r = await asb.exec("echo $E-x; exit 2", env={"E": "env"})
    assert (r.stdout, r.exit_code, r.ok, r.cause) == ("env-x\n", 2, False, "exited")
    timed = await asb.exec("sleep 5", timeout=0.3)
    assert timed.cause == "timeout"
    events = [e async for e in asb.exec_stream(INTERLEAVED)]
    assert [e.data for e in events[:-1]] == ["out1\n", "err1\n", "out2\n", "err2\n", "out3\n", "err3\n"]
    assert events[-1].type == "done" and events[-1].exit is not None and events[-1].exit.exit_code == 4


async def test_processes_reconnect_stdin_kill(asb: AsyncSandbox) -> None:
    proc = await asb.start_process("for i in 1 2 3; do echo n$i; sleep 0.1; done")
    first: list[OutputEvent] = []
    async for event in proc.stream():
        first.append(event)
        break
    rest = [e async for e in proc.reconnect()]
    assert "".join(e.data for e in first + rest if e.type == "stdout") == "n1\nn2\nn3\n"
    assert (await asb.process(proc.pid).wait(stdout_from=3)).stdout == "n2\nn3\n"
    cat = await asb.start_process("cat", stdin=True)
    await cat.send_stdin("in\n", close=True)
    assert (await cat.wait()).stdout == "in\n"
    sleeper = await asb.start_process("sleep 60")
    await sleeper.kill("TERM")
    assert (await sleeper.wait()).signal_name == "SIGTERM"
    assert any(p.pid == sleeper.pid for p in await asb.processes())
    other = await asb.start_process("sleep 60")
    await asb.kill_process(other.pid, tree=True)
    assert (await other.wait()).signal_name == "SIGKILL"
    term = await asb.start_process("read go; stty size; read end", pty=(20, 70))
    await term.resize(21, 71)
    await term.send_stdin("go\n")
    await term.close_stdin()
    assert "21 71" in (await term.wait()).stdout


async def test_pty(asb: AsyncSandbox) -> None:
    async with await asb.pty("bash --norc --noprofile -i", rows=25, cols=81) as t:
        await t.send("stty size\n")
        assert b"25 81" in await t.read_until("25 81", timeout=10)
        await t.resize(26, 82)
        await t.send("stty size; exit 3\n")
        status = await t.wait(timeout=10)
        assert status.exit_code == 3 and await t.read(timeout=1) == b""
    dropped = await asb.pty("bash --norc --noprofile -i")
    await dropped.send("X=still-here\n")
    await dropped.close()
    async with await asb.pty(pid=dropped.pid) as back:
        await back.send("echo got-$X\n")
        await back.read_until("got-still-here\r\n", timeout=10)
        await back.send("exit\n")
        assert (await back.wait(timeout=10)).ok and back.pid == dropped.pid
    proc = await asb.start_process("bash --norc --noprofile -i", pty=(24, 80))
    async with await proc.terminal() as joined:
        await joined.send("echo joined\n")
        await joined.read_until("joined\r\n", timeout=10)
        await joined.send("exit\n")
        assert (await joined.wait(timeout=10)).ok


async def test_code_with_async_callbacks(asb: AsyncSandbox, tmp_path: Path) -> None:
    seen: list[str] = []

    async def on_stdout(text: str) -> None:
        await asyncio.sleep(0)
        seen.append("out:" + text)

    def on_result(result: Result) -> None:
        seen.append(result.kind)

    run = await asb.run_code(
        "import matplotlib.pyplot as plt\nprint('p')\nplt.plot([3, 1])\n2 ** 5",
        on_stdout=on_stdout,
        on_result=on_result,
        on_error=lambda e: seen.append("error"),
    )
    assert seen == ["out:p\n", "display", "result"] and run.text == "32"
    run.save_png(tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")
    events = [e.type async for e in asb.run_code_stream("print(1)\n1/0")]
    assert events == ["stdout", "error", "done"]
    assert (await asb.run_python("sum(range(4))")).text == "6"
    assert (await asb.run_node("6 * 7")).text == "42"


async def test_contexts_variables_interrupt_restart(asb: AsyncSandbox) -> None:
    ctx = await asb.create_context("python")
    await asb.set_variables({"a": [1, 2]}, context=ctx)
    assert (await asb.get_variables(["a"], context=ctx)).values == {"a": [1, 2]}
    assert await asb.clear_variables(context=ctx) == ["a"]
    assert ctx.id in {c.id for c in await asb.list_contexts()}
    await asb.delete_context(ctx)
    await asb.run_code("kept = 1")
    loop = asyncio.create_task(asb.run_code("while True: pass"))
    while not any(c.busy for c in await asb.list_contexts()):
        await asyncio.sleep(0.02)
    with pytest.raises(ConflictError):
        await asb.run_code("1")
    await asb.interrupt()
    assert (await loop).status == "interrupted"
    assert (await asb.run_code("kept")).text == "1"
    await asb.restart()
    assert (await asb.run_code("kept")).error is not None


async def test_files_streamed(asb: AsyncSandbox, tmp_path: Path) -> None:
    src = tmp_path / "mid.bin"
    src.write_bytes(os.urandom(8 * 1024 * 1024))
    assert (await asb.upload(src, "mid.bin")).size == 8 * 1024 * 1024
    assert await asb.download("mid.bin", tmp_path / "back.bin") == 8 * 1024 * 1024
    assert (
        hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest()
        == hashlib.sha256(src.read_bytes()).digest()
    )
    await asb.write_file("d/t.txt", "text")
    assert await asb.read_file("d/t.txt") == "text"
    assert await asb.read_file("d/t.txt", format="bytes") == b"text"
    assert [e.name for e in await asb.ls("d")] == ["t.txt"]
    assert (await asb.stat("d/t.txt")).size == 4 and await asb.exists("d") and not await asb.exists("nope")
    await asb.mkdir("e")
    await asb.rename("d/t.txt", "e/t.txt")
    await asb.remove("d")
    await asb.import_files("i.txt", text="imported")
    export = await asb.export_files("i.txt")
    async with AsyncSandcell() as c:
        assert export.id in {e.id for e in await c.list_exports()}
        assert (await c.get_export(export.id)).size == 8
        assert await c.download_export(export.id, tmp_path / "i.txt") == 8
        await c.delete_export(export.id)
        assert (await c.system())["version"]
    await asb.run_code("open('outputs/o.txt', 'w').write('o')")
    assert [a.path for a in await asb.artifacts()] == ["/workspace/outputs/o.txt"]


async def test_snapshot_fork(asb: AsyncSandbox) -> None:
    await asb.run_code("x = 'base'")
    snap = await asb.create_snapshot("a", description="d", tags={"t": "1"})
    assert [s.id for s in await asb.list_snapshots()] == [snap.id]
    forks = await AsyncSandbox.fork(snap.id, 2, ephemeral=True)
    try:
        await asyncio.gather(forks[0].run_code("x = 'left'"), forks[1].run_code("x = 'right'"))
        texts = await asyncio.gather(*(f.run_code("x") for f in forks))
        assert [t.text for t in texts] == ["'left'", "'right'"]
    finally:
        await asyncio.gather(*(f.kill() for f in forks))
        await asyncio.gather(*(f.close() for f in forks))
    for fork in forks:  # ephemeral: no record left
        with pytest.raises(NotFoundError):
            await AsyncSandbox.get(fork.id)
    async with await AsyncSandbox.create(snapshot_id=snap.id, ephemeral=True) as restored:
        assert (await restored.run_code("x")).text == "'base'"
    settings = await asb.set_auto_snapshot(interval=300)
    assert settings.interval_secs == 300 and (await asb.get_auto_snapshot()).interval_secs == 300
    async with AsyncSandcell() as c:
        assert (await c.get_snapshot(snap.id)).name == "a"
        assert snap.id in {s.id for s in await c.list_snapshots(asb.id)}
        await c.delete_snapshot(snap.id)


async def test_run_once_and_errors(daemon: Daemon) -> None:
    out = await AsyncSandbox.run_once("print('async once')")
    assert out.stdout == "async once\n" and out.total_ms >= out.run_ms
    with pytest.raises(NotFoundError):
        await AsyncSandbox.get("sb-000000000000")
    with pytest.raises(AuthenticationError):
        await AsyncSandbox.create(api_key="bad", api_url=daemon.url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(sandcell.ConnectionError):
        await AsyncSandbox.list(api_url=f"http://127.0.0.1:{port}")


async def test_many_sandboxes_at_once() -> None:
    async def one(i: int) -> tuple[str, str]:
        async with await AsyncSandbox.create("python", ephemeral=True, labels={"case": "gather"}) as sb:
            await sb.run_code(f"n = {i}")
            run, cmd = await asyncio.gather(sb.run_code("n * n"), sb.exec(f"echo {i}"))
            return run.text or "", cmd.stdout

    results = await asyncio.gather(*(one(i) for i in range(8)))
    assert results == [(str(i * i), f"{i}\n") for i in range(8)]
    assert await AsyncSandbox.list(label={"case": "gather"}) == []
