"""`sb.commands` and `sb.files`: E2B's names over the SDK's own methods, sync and async; and
`exec` with output callbacks, which `commands.run` uses."""

from __future__ import annotations

import asyncio

import pytest

from sandcell import (
    AsyncProcess,
    AsyncSandbox,
    CommandResult,
    ConflictError,
    NotFoundError,
    Process,
    Sandbox,
)

from .test_exec import INTERLEAVED


def test_exec_callbacks_get_output_as_it_comes(bare: Sandbox) -> None:
    seen: list[str] = []
    r = bare.exec(
        INTERLEAVED,
        on_stdout=lambda t: seen.append("out:" + t),
        on_stderr=lambda t: seen.append("err:" + t),
    )
    assert seen == [f"{kind}:{kind}{i}\n" for i in (1, 2, 3) for kind in ("out", "err")]
    assert isinstance(r, CommandResult)
    assert (r.stdout, r.stderr, r.exit_code, r.ok, r.cause) == (
        "out1\nout2\nout3\n",
        "err1\nerr2\nerr3\n",
        4,
        False,
        "exited",
    )
    assert r.message == "exited with code 4" and r.duration_ms > 0
    # The same result as without callbacks.
    plain = bare.exec(INTERLEAVED)
    assert (plain.stdout, plain.stderr, plain.exit_code, plain.cause) == (r.stdout, r.stderr, 4, r.cause)


def test_commands_run_list_kill_connect(bare: Sandbox) -> None:
    out: list[str] = []
    r = bare.commands.run(
        "echo $A in $(pwd)", envs={"A": "a"}, cwd="/tmp", timeout=30, on_stdout=out.append
    )
    assert isinstance(r, CommandResult) and r.ok and r.stdout == "a in /tmp\n" and out == [r.stdout]
    failed = bare.commands.run(["sh", "-c", "echo bad >&2; exit 5"], on_stderr=out.append)
    assert (failed.exit_code, failed.ok) == (5, False) and out[-1] == "bad\n"  # no exception
    assert bare.commands.run("sleep 5", timeout=0.3).cause == "timeout"

    job = bare.commands.run("echo $B; sleep 60", background=True, envs={"B": "bg"}, cwd="/tmp")
    assert isinstance(job, Process) and job.pid > 1
    listed = {p.pid: p for p in bare.commands.list()}
    assert job.pid in listed and not listed[job.pid].exited and "sleep 60" in listed[job.pid].cmdline
    for event in bare.commands.connect(job.pid).stream():
        assert event.data == "bg\n"
        break
    assert bare.commands.kill(job.pid) is True
    assert job.wait().signal_name == "SIGKILL"
    assert bare.commands.kill(job.pid) is False  # ended: nothing to kill
    assert bare.commands.kill(99999, "TERM") is False
    with pytest.raises(ValueError, match="process.stream"):
        bare.commands.run("true", background=True, on_stdout=print)  # type: ignore[call-overload]


def test_files_namespace(bare: Sandbox) -> None:
    info = bare.files.write("ns/a.txt", "héllo")
    assert info.path == "/workspace/ns/a.txt" and info.size == len("héllo".encode())
    assert bare.files.write("ns/a.txt", "!", append=True).size == info.size + 1
    assert bare.files.read("ns/a.txt") == "héllo!"
    bare.files.write("/tmp/b.bin", b"\x00\xff", mode=0o600)
    assert bare.files.read("/tmp/b.bin", format="bytes") == b"\x00\xff"
    assert bare.files.get_info("/tmp/b.bin").mode == 0o600
    assert bare.files.make_dir("ns/sub/deeper").is_dir
    assert bare.files.make_dir("ns/sub").is_dir  # already there: fine
    assert {e.name for e in bare.files.list("ns")} == {"a.txt", "sub"}
    assert "ns" in {e.name for e in bare.files.list()}
    assert bare.files.rename("ns/a.txt", "ns/sub/c.txt").path == "/workspace/ns/sub/c.txt"
    assert not bare.files.exists("ns/a.txt") and bare.files.exists("ns/sub/c.txt")
    with pytest.raises(ConflictError):
        bare.files.remove("ns")
    bare.files.remove("ns/sub/c.txt")
    bare.files.remove("ns", recursive=True)
    assert not bare.files.exists("ns")
    with pytest.raises(NotFoundError):
        bare.files.read("ns/sub/c.txt")
    # The namespaces only hand over: what one writes, the other reads.
    bare.write_file("same.txt", "x")
    assert bare.files.read("same.txt") == bare.read_file("same.txt") == "x"


async def test_async_namespaces(asb: AsyncSandbox) -> None:
    seen: list[str] = []

    async def on_stdout(text: str) -> None:
        await asyncio.sleep(0)
        seen.append(text)

    r = await asb.commands.run("echo $V; echo e >&2", envs={"V": "v"}, on_stdout=on_stdout)
    assert isinstance(r, CommandResult) and (r.stdout, r.stderr, r.ok) == ("v\n", "e\n", True)
    assert seen == ["v\n"]
    streamed = await asb.exec("echo x", on_stderr=seen.append)
    assert streamed.stdout == "x\n" and seen == ["v\n"]
    job = await asb.commands.run("sleep 60", background=True, cwd="/tmp")
    assert isinstance(job, AsyncProcess)
    assert job.pid in {p.pid for p in await asb.commands.list()}
    assert await asb.commands.kill(job.pid) is True
    assert (await asb.commands.connect(job.pid).wait()).signal_name == "SIGKILL"
    assert await asb.commands.kill(job.pid) is False
    with pytest.raises(ValueError):
        await asb.commands.run("true", background=True, on_stderr=print)  # type: ignore[call-overload]

    await asb.files.write("d/t.txt", "text")
    assert await asb.files.read("d/t.txt") == "text"
    assert await asb.files.read("d/t.txt", format="bytes") == b"text"
    assert [e.name for e in await asb.files.list("d")] == ["t.txt"]
    assert (await asb.files.get_info("d/t.txt")).size == 4
    assert (await asb.files.make_dir("e")).is_dir
    assert (await asb.files.rename("d/t.txt", "e/t.txt")).path == "/workspace/e/t.txt"
    assert await asb.files.exists("e/t.txt") and not await asb.files.exists("d/t.txt")
    await asb.files.remove("d")
    await asb.files.remove("e", recursive=True)
    assert not await asb.files.exists("e")
