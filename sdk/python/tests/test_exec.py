"""Commands, streamed commands, background processes (reconnect, stdin, signals) and terminals."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import sandcell
from sandcell import ConflictError, InvalidArgumentError, NotFoundError, OutputEvent, Sandbox, Sandcell

INTERLEAVED = "for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done; exit 4"


def test_exec_result(bare: Sandbox) -> None:
    r = bare.exec("echo hi; echo oops >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("hi\n", "oops\n", 3, False)
    assert r.cause == "exited" and r.message == "exited with code 3" and r.duration_ms > 0
    ok = bare.exec(["printf", "%s|", "a b", "c"])
    assert ok.ok and ok.stdout == "a b|c|" and ok.exit_code == 0


def test_exec_env_cwd_stdin(bare: Sandbox) -> None:
    bare.mkdir("sub")
    r = bare.exec("echo $A-$B; pwd; cat", env={"A": "1", "B": "2"}, cwd="/workspace/sub", stdin="fed\n")
    assert r.stdout == "1-2\n/workspace/sub\nfed\n"


def test_exec_causes_timeout_oom_signal(bare: Sandbox) -> None:
    slow = bare.exec("sleep 5", timeout=0.3)
    assert (slow.cause, slow.timed_out, slow.ok, slow.exit_code) == ("timeout", True, False, None)
    assert slow.signal_name == "SIGKILL"
    killed = bare.exec("kill -TERM $$")
    assert killed.cause == "signaled" and killed.signal == 15


def test_exec_oom_is_reported() -> None:
    with Sandbox.create(ephemeral=True, limits={"memory_mb": 64}) as sb:
        r = sb.exec(["python3", "-c", "x = bytearray(300 * 1024 * 1024)"])
        assert r.cause == "oom_killed" and r.oom_killed and not r.ok
        assert "memory" in r.message
        # A shell line: the shell reports its child's kill as 137.
        shell = sb.exec("python3 -c 'x = bytearray(300 * 2**20)'")
        assert (shell.exit_code, shell.cause, shell.oom_killed, shell.ok) == (137, "oom_killed", True, False)
        # A line that carries on exits 0, and still says a process was killed meanwhile.
        on = sb.exec("python3 -c 'x = bytearray(300 * 2**20)'; echo after")
        assert (on.exit_code, on.cause, on.oom_killed, on.ok) == (0, "exited", True, True)
        assert on.stdout == "after\n"
        assert "oom" in on.message
        streamed = list(sb.exec_stream("python3 -c 'x = bytearray(300 * 2**20)'"))[-1].exit
        assert streamed is not None and streamed.cause == "oom_killed" and streamed.oom_killed
        assert (sb.metrics().oom_kills or 0) >= 4
        assert not sb.exec("true").oom_killed


def test_exec_stream_order_and_done_last(bare: Sandbox) -> None:
    events = list(bare.exec_stream(INTERLEAVED))
    assert [(e.type, e.data) for e in events[:-1]] == [
        (kind, f"{short}{i}\n") for i in (1, 2, 3) for kind, short in (("stdout", "out"), ("stderr", "err"))
    ]
    done = events[-1]
    assert done.type == "done" and done.exit is not None
    assert (done.exit.exit_code, done.exit.ok, done.exit.cause) == (4, False, "exited")


def test_exec_stream_stdin_and_timeout(bare: Sandbox) -> None:
    events = list(bare.exec_stream("cat; sleep 5", stdin="piped\n", timeout=0.5))
    assert events[0].type == "stdout" and events[0].data == "piped\n"
    assert events[-1].exit is not None and events[-1].exit.cause == "timeout"


def test_exec_stream_refused_before_it_starts(bare: Sandbox) -> None:
    with pytest.raises(InvalidArgumentError):
        list(bare.exec_stream("true", timeout=-1))


def test_background_process_reconnects_from_offsets(bare: Sandbox) -> None:
    proc = bare.start_process("for i in 1 2 3 4; do echo line$i; sleep 0.15; done; echo bye >&2")
    assert proc.pid > 1 and proc.exec_id is not None
    seen: list[OutputEvent] = []
    for event in proc.stream():
        seen.append(event)
        if event.type == "stdout" and "line2" in event.data:
            break  # the client goes away mid-stream
    assert proc.offsets.stdout is not None and proc.offsets.stdout >= 12
    rest = list(proc.reconnect())
    text = "".join(e.data for e in seen + rest if e.type == "stdout")
    assert text == "line1\nline2\nline3\nline4\n"  # nothing twice, nothing missing
    assert rest[-1].type == "done" and rest[-1].exit is not None and rest[-1].exit.ok
    assert any(e.type == "stderr" and e.data == "bye\n" for e in rest)
    # A fresh handle on the same pid (another client) reads from any offset, after the end too.
    again = bare.process(proc.pid)
    assert (
        "".join(e.data for e in again.stream(stdout_from=6) if e.type == "stdout") == "line2\nline3\nline4\n"
    )
    out = again.wait(stdout_from=12)
    assert out.stdout == "line3\nline4\n" and out.stderr == "bye\n" and out.ok and out.stdout_lost == 0
    listed = {p.pid: p for p in bare.processes()}
    assert listed[proc.pid].background and listed[proc.pid].exited and listed[proc.pid].exit_code == 0


def test_background_process_lost_bytes(bare: Sandbox) -> None:
    proc = bare.start_process("head -c 200000 /dev/zero | tr '\\0' a", buffer_bytes=65536)
    proc.wait()
    events = list(proc.stream(stdout_from=0))
    lost = [e for e in events if e.type == "lost"]
    assert lost and lost[0].channel == "stdout" and lost[0].offset == 0 and lost[0].bytes
    got = sum(len(e.data) for e in events if e.type == "stdout")
    assert lost[0].bytes + got == 200000
    assert proc.wait(stdout_from=0).stdout_lost == lost[0].bytes


def test_background_stdin_and_kill(bare: Sandbox) -> None:
    cat = bare.start_process("cat", stdin=True)
    cat.send_stdin("one\n")
    cat.send_stdin(b"two\n", close=True)
    out = cat.wait()
    assert out.stdout == "one\ntwo\n" and out.ok
    second = bare.start_process(["sh", "-c", "read x; echo got:$x"], stdin=True)
    # It ends as soon as it read the line: when that happens before the write is confirmed,
    # the answer is 409 invalid_state (the line may still have been read, as here).
    with contextlib.suppress(ConflictError):
        second.send_stdin("v\n")
    assert second.wait().stdout == "got:v\n"
    with pytest.raises(ConflictError) as ended:
        second.send_stdin("late\n")
    assert ended.value.code == "invalid_state"

    sleeper = bare.start_process("sleep 60")
    sleeper.kill("TERM")
    ended = sleeper.wait()
    assert ended.cause == "signaled" and ended.signal_name == "SIGTERM"
    tree = bare.start_process("sleep 60 & sleep 60 & wait")
    time.sleep(0.1)
    bare.kill_process(tree.pid, tree=True)
    assert tree.wait().cause in ("signaled", "killed")
    assert not [p for p in bare.processes() if "sleep 60" in p.cmdline and not p.exited]
    with pytest.raises(NotFoundError) as e:
        bare.kill_process(99999)
    assert e.value.code == "no_such_process"


def test_stdin_write_racing_the_process_end_is_answered(bare: Sandbox) -> None:
    # The process exits right after the line it reads: each write is answered promptly, either
    # delivered or refused (409 invalid_state) when the process ended before it was confirmed.
    with Sandcell(request_timeout=10) as impatient:
        sb = Sandbox.get(bare.id, client=impatient)
        for _ in range(20):
            proc = sb.start_process(["sh", "-c", "read x; echo got:$x"], stdin=True)
            for data in ("v\n", "late\n"):
                started = time.monotonic()
                try:
                    proc.send_stdin(data)
                except ConflictError as e:
                    assert e.code == "invalid_state" and e.status == 409
                assert time.monotonic() - started < 5
            assert proc.wait().stdout == "got:v\n"
            with pytest.raises(ConflictError):
                proc.send_stdin("after the end\n")


def test_background_timeout(bare: Sandbox) -> None:
    proc = bare.start_process("sleep 30", timeout=0.3)
    out = proc.wait()
    assert out.cause == "timeout" and out.timed_out


def test_rest_terminal_process(bare: Sandbox) -> None:
    term = bare.start_process("stty size; read go; stty size; read end; exit 7", pty=(30, 100))
    for event in term.stream():
        if "30 100" in event.data:
            break
    term.resize(40, 120)
    term.send_stdin("go\n")
    for event in term.reconnect():
        if "40 120" in event.data:
            break
    term.close_stdin()  # ^D: `read end` sees the end of input
    out = term.wait()
    assert "30 100" in out.stdout and "40 120" in out.stdout and out.exit_code == 7
    assert any(p.pid == term.pid and p.pty for p in bare.processes())


def test_pty_websocket(bare: Sandbox) -> None:
    with bare.pty("bash --norc --noprofile -i", rows=30, cols=90) as t:
        t.send("stty size\n")
        assert b"30 90" in t.read_until("30 90", timeout=10)
        t.resize(50, 132)
        t.send("stty size; echo $((6 * 7))\n")
        assert b"42" in t.read_until("42\r\n", timeout=10)
        t.send("exit 5\n")
        status = t.wait(timeout=10)
        assert status.exit_code == 5 and not status.ok and t.exit == status
        assert t.read(timeout=1) == b""


def test_pty_survives_a_dropped_connection(bare: Sandbox) -> None:
    first = bare.pty("bash --norc --noprofile -i", cwd="/tmp")
    # One request started it; the daemon named its pid in the upgrade's answer.
    pid = first.pid
    assert pid > 1 and any(p.pid == pid and p.pty and not p.exited for p in bare.processes())
    first.send("export MARK=kept; pwd\n")
    first.read_until("/tmp\r\n", timeout=10)
    first.close()
    time.sleep(0.2)
    assert any(p.pid == pid and not p.exited for p in bare.processes())  # it ran on, alone
    with bare.pty(pid=pid) as again:
        again.send("echo mark:$MARK\n")
        assert b"mark:kept" in again.read_until("mark:kept\r\n", timeout=10)
        assert again.pid == pid
        again.send("exit\n")
        assert again.wait(timeout=10).ok
    # With an environment the terminal is started as a process first, then joined.
    with bare.pty("echo env:$WHO; sleep 60", env={"WHO": "me"}) as envd:
        assert b"env:me" in envd.read_until("env:me", timeout=10)
        assert any(p.pid == envd.pid and p.pty for p in bare.processes())
        bare.kill_process(envd.pid, "TERM")
        assert envd.wait(timeout=10).cause == "signaled"
    proc = bare.start_process("bash --norc --noprofile -i", pty=(24, 80))
    with proc.terminal() as t:
        t.send("exit 0\n")
        assert t.wait(timeout=10).ok
    with pytest.raises(NotFoundError):
        bare.pty(pid=99999)


def test_pty_exit_after_last_keystroke() -> None:
    # The shell ends on the last keystroke: its exit frame must still come. Four sandboxes at
    # a time made the race this guards against show (a few sessions in a hundred).
    def sessions() -> None:
        with Sandbox.create(ephemeral=True) as sb:
            for _ in range(30):
                with sb.pty("echo ready; read x; exit 3") as t:
                    t.read_until("ready", timeout=10)
                    t.send("\n")
                    assert t.wait(timeout=10).exit_code == 3

    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(sessions) for _ in range(4)]:
            done.result()


def test_pty_read_timeout(bare: Sandbox) -> None:
    with bare.pty("sleep 30") as t:
        with pytest.raises(TimeoutError):  # sandcell.TimeoutError is a builtin TimeoutError too
            t.read_until("never", timeout=0.3)
        t.send("\x03")  # Ctrl-C
        assert t.wait(timeout=10).cause in ("signaled", "exited")
