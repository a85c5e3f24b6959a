"""Agent runs through the SDK, sync and async, against real daemons whose runs ask the test
kit's scripted model (a daemon and a model per test, each with the script the test needs): a
run answers, with its usage; its trajectory is followed, resumed, read whole, and followed
again across a connection cut in the middle; a run stuck in a slow model call is cancelled; a
wait follows the run's events (it sees an end it was not told of at once, with one stream and
no polling; a run that has ended returns at once; a daemon without the run's live events is
asked instead); a kept sandbox holds the run's state and takes another run; a run with a
validation command is sent back to work by a failed check and ends `validated` once it passes,
or `validation_failed` when its attempts are spent; errors map as everywhere else."""

from __future__ import annotations

import asyncio
import http.server
import re
import socket
import threading
import time
from typing import Any

import httpx
import pytest

import sandcell
from sandcell import (
    AsyncRun,
    AsyncSandcell,
    Budgets,
    InvalidArgumentError,
    NotFoundError,
    Run,
    RunEvent,
    RunInfo,
    Sandbox,
    Sandcell,
    Validate,
)

from .conftest import AgentDaemon

MODEL = "openai/test-model"
TASK = "Set x to 21 in Python, then print x * 2."


def code(source: str) -> dict[str, Any]:
    """A model turn that calls the `execute_code` tool."""
    return {"tool_calls": [{"name": "execute_code", "arguments": {"code": source}}]}


# Set x, double it (the kernel keeps x), answer.
DOUBLING: list[Any] = [code("x = 21"), code("print(x * 2)"), {"text": "the answer is 42"}]


def contiguous(events: list[RunEvent], first: int = 1) -> None:
    """The events are numbered from `first` without a gap, and the last is `run_finished`."""
    assert [e.seq for e in events] == list(range(first, first + len(events))), events
    assert all(e.seq == e["seq"] and e.type == e["type"] for e in events)
    assert events[-1].type == "run_finished", events[-1]


def tool_texts(events: list[RunEvent]) -> list[str]:
    return [str(e["text"]) for e in events if e.type == "tool_result"]


def test_a_run_answers_with_its_usage_and_its_trajectory_resumes(
    agent_daemon: Any,
) -> None:
    d: AgentDaemon = agent_daemon(DOUBLING)
    with Sandcell(d.url, d.key) as client:
        run = client.runs.start(TASK, model=MODEL, budgets=Budgets(max_iterations=5, timeout_secs=120))
        assert isinstance(run, Run) and run.id.startswith("run-")
        assert run.info.status == "running" and not run.info.done
        assert (run.info.task, run.info.model, run.info.mode) == (TASK, MODEL, "tools")

        info = run.wait(timeout=120)
        assert info is run.info and isinstance(info, RunInfo)
        assert (info.status, info.reason, info.answer) == ("succeeded", "text", "the answer is 42")
        assert info.ok and info.done and info.ended_at and info.sandbox_id
        # Every scripted answer counts 100 input and 10 output tokens.
        u = info.usage
        assert (u.input_tokens, u.output_tokens, u.llm_calls, u.tool_calls, u.steps) == (300, 30, 3, 2, 2)
        assert u.sub_calls == 0 and not u.estimated
        # The limits asked for, and the daemon's defaults for the others.
        assert (info.budgets.max_iterations, info.budgets.timeout_secs) == (5, 120.0)
        assert info.budgets.max_depth == 4 and info.budgets.token_budget is None
        assert len(d.model.requests()) == 3

        # The trajectory: every event once, in order, run_finished last; the kernel kept x.
        events = list(run.events())
        contiguous(events)
        assert events[0].type == "run_started" and events[0]["task"] == TASK
        finished = events[-1]
        assert (finished["status"], finished["answer"]) == ("succeeded", "the answer is 42")
        assert finished["usage"]["input_tokens"] == 300
        assert "42" in tool_texts(events)[-1]
        # Resumed after event 3: the same events from 4; and read whole, at once.
        resumed = list(run.events(after=3))
        contiguous(resumed, 4)
        assert resumed == events[3:]
        assert run.list_events() == events
        assert run.list_events(after=3) == events[3:]

        # Found again, and listed.
        again = client.runs.get(run.id)
        assert again.info == info
        listed = client.runs.list(limit=10)
        assert run.id in [r.id for r in listed] and all(isinstance(r, RunInfo) for r in listed)
        # The sandbox it made is deleted with its end (nobody asked to keep it).
        state = Sandbox.get(info.sandbox_id, client=client).info.state
        assert state in ("stopped", "deleted"), state


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of the daemon that cuts the first answer to an events
    request after `cut` bytes (in the middle of the stream), and records what the client sent
    on each connection."""

    def __init__(self, upstream: str, cut: int) -> None:
        url = httpx.URL(upstream)
        self.upstream = (url.host, url.port or 80)
        self.cut = cut
        self.cut_done = False
        self.sent: list[bytearray] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:  # the builtin: socket.timeout
                continue
            except OSError:
                return
            self.sent.append(bytearray())
            threading.Thread(target=self._serve, args=(conn, self.sent[-1]), daemon=True).start()

    def _serve(self, conn: socket.socket, record: bytearray) -> None:
        up = socket.create_connection(self.upstream)
        # Armed once this connection carries the first events request: what the daemon sends
        # after it is that request's answer (HTTP/1.1 answers in order).
        budget: list[int | None] = [None]

        def forward() -> None:
            try:
                while chunk := conn.recv(65536):
                    record.extend(chunk)
                    if not self.cut_done and budget[0] is None and b"/events" in chunk:
                        budget[0] = self.cut
                    up.sendall(chunk)
            except OSError:
                pass

        threading.Thread(target=forward, daemon=True).start()
        try:
            while chunk := up.recv(65536):
                left = budget[0]
                if left is not None:
                    chunk = chunk[:left]
                    budget[0] = left - len(chunk)
                conn.sendall(chunk)
                if budget[0] == 0:
                    self.cut_done = True
                    break
        except OSError:
            pass
        for s in (conn, up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def test_a_dropped_event_stream_is_followed_again_from_the_last_event(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon(DOUBLING)
    with Sandcell(d.url, d.key) as client:
        info = client.runs.run(TASK, model=MODEL, timeout=120)
        assert info.status == "succeeded"
        expected = client.runs.get(info.id).list_events()
        contiguous(expected)
        # The whole answer's size, to cut it in the middle.
        with httpx.stream(
            "GET", f"{d.url}/v1/runs/{info.id}/events", headers={"X-API-Key": d.key}
        ) as resp:
            size = sum(len(c) for c in resp.iter_raw())

    proxy = CuttingProxy(d.url, cut=size // 2)
    try:
        with Sandcell(proxy.url, d.key) as through:
            got = list(through.runs.get(info.id).events())
    finally:
        proxy.close()
    assert got == expected  # nothing twice, nothing lost
    requests = [r for s in proxy.sent for r in bytes(s).lower().split(b"get /v1/runs/") if b"/events" in r]
    # Two requests (connections may be opened in any order): the first from the start, the
    # second for what came after the last whole event of the first.
    assert len(requests) == 2, requests
    resumes = [r for r in requests if b"last-event-id" in r]
    assert len(resumes) == 1, requests
    resumed_after = int(resumes[0].split(b"last-event-id: ")[1].split(b"\r\n")[0])
    assert 1 <= resumed_after < len(expected)


async def test_a_run_stuck_in_a_slow_model_call_is_cancelled_at_once(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon([{"slow": {"delay_ms": 30_000, "then": {"text": "too late"}}}])
    async with AsyncSandcell(d.url, d.key) as client:
        run = await client.runs.start("Wait for it.", model=MODEL, budgets={"timeout_secs": 120})
        assert isinstance(run, AsyncRun)
        deadline = time.monotonic() + 60
        while not any(e.type == "llm_request" for e in await run.list_events()):
            assert time.monotonic() < deadline, await run.list_events()
            await asyncio.sleep(0.05)
        # Still running: a wait with a deadline gives up, and the run goes on.
        with pytest.raises(sandcell.TimeoutError):
            await run.wait(timeout=0.3)
        assert (await run.refresh()).status == "running"

        asked = time.monotonic()
        ended = await run.cancel()
        assert time.monotonic() - asked < 5
        assert (ended.status, ended.reason, ended.ok) == ("cancelled", "cancelled", False)
        assert run.info is ended and (await run.wait()).status == "cancelled"
        events = [e async for e in run.events()]
        contiguous(events)
        assert events[-1]["status"] == "cancelled"
        # Cancelling a run that has ended answers it as it is.
        assert (await run.cancel()).status == "cancelled"


# A model call that takes longer than any test: the run stays in it, sending no event, until
# it is cancelled.
STUCK: list[Any] = [{"slow": {"delay_ms": 60_000, "then": {"text": "too late"}}}]


def stuck_in_model_call(client: Sandcell) -> Run:
    """A run started and waited for until it is in its (slow) model call."""
    run = client.runs.start("Wait for it.", model=MODEL, budgets={"timeout_secs": 120})
    deadline = time.monotonic() + 60
    while not any(e.type == "llm_request" for e in run.list_events()):
        assert time.monotonic() < deadline, run.list_events()
        time.sleep(0.05)
    return run


def run_requests(sent: list[bytearray], run_id: str) -> list[str]:
    """The requests of run `run_id` that went through a proxy, as `METHOD /path` (the query
    left out), in order per connection."""
    pattern = re.compile(rb"(GET|POST) /v1/runs/" + re.escape(run_id.encode()) + rb"(/\w+)?[? ]")
    return [
        f"{m.group(1).decode()} /{(m.group(2) or b'').decode().lstrip('/')}"
        for conn in sent
        for m in pattern.finditer(bytes(conn))
    ]


def test_a_wait_follows_the_events_and_sees_an_end_it_was_not_told_of_at_once(
    agent_daemon: Any,
) -> None:
    d: AgentDaemon = agent_daemon(STUCK)
    # The waiting handle's requests go through a proxy that records them (and never cuts).
    proxy = CuttingProxy(d.url, cut=1 << 40)
    try:
        with Sandcell(d.url, d.key) as client, Sandcell(proxy.url, d.key) as through:
            run = stuck_in_model_call(client)
            waiting = through.runs.get(run.id)
            # No event comes while the model thinks: the deadline is kept all the same.
            asked = time.monotonic()
            with pytest.raises(sandcell.TimeoutError):
                waiting.wait(timeout=0.3)
            assert 0.3 <= time.monotonic() - asked < 1.5
            assert waiting.info.status == "running"

            returned: list[float] = []
            results: list[RunInfo] = []

            def wait() -> None:
                results.append(waiting.wait(timeout=60))
                returned.append(time.monotonic())

            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            # Long enough for a poller to be asking once a second by now.
            time.sleep(2.5)
            assert not returned
            # Ended through another handle: the waiting one is not told, it must see it.
            ended = client.runs.get(run.id).cancel()
            cancelled = time.monotonic()
            waiter.join(30)
            assert results and returned, "the wait did not return"
            assert returned[0] - cancelled < 0.25, f"{returned[0] - cancelled:.3f} s after the end"
            assert results[0] is waiting.info
            assert (results[0].status, results[0].reason) == ("cancelled", "cancelled") == (
                ended.status,
                ended.reason,
            )
    finally:
        proxy.close()
    # One events stream, kept across the two waits, and the record read once at the end: a
    # poller would have read it every second.
    requests = run_requests(proxy.sent, run.id)
    assert sorted(requests) == ["GET /", "GET /", "GET /events"], requests


async def test_an_async_wait_sees_the_end_at_once_and_resumes_after_a_deadline(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon(STUCK)
    proxy = CuttingProxy(d.url, cut=1 << 40)
    try:
        async with AsyncSandcell(d.url, d.key) as client, AsyncSandcell(proxy.url, d.key) as through:
            started = await client.runs.start("Wait for it.", model=MODEL, budgets={"timeout_secs": 120})
            deadline = time.monotonic() + 60
            while not any(e.type == "llm_request" for e in await started.list_events()):
                assert time.monotonic() < deadline, await started.list_events()
                await asyncio.sleep(0.05)
            run = await through.runs.get(started.id)
            # A wait given up at its deadline (the stored events came in the meantime) …
            with pytest.raises(sandcell.TimeoutError):
                await run.wait(timeout=1.0)
            seen = len(await started.list_events())
            assert seen >= 2  # run_started … llm_request
            # … and one that goes on from the last event it saw, until an end it is not told of.
            waiting = asyncio.ensure_future(run.wait())
            await asyncio.sleep(2.5)
            assert not waiting.done()
            ended = await started.cancel()
            cancelled = time.monotonic()
            info = await asyncio.wait_for(waiting, 30)
            assert time.monotonic() - cancelled < 0.25, f"{time.monotonic() - cancelled:.3f} s after the end"
            assert (info.status, info.reason, info.ended_at) == (ended.status, ended.reason, ended.ended_at)
            assert info.status == "cancelled" and run.info is info
    finally:
        proxy.close()
    streams = [
        bytes(r).split(b" HTTP/1.1")[0].decode()
        for conn in proxy.sent
        for r in re.findall(rb"GET /v1/runs/[^ ]+/events[^ ]* HTTP/1.1", bytes(conn))
    ]
    assert sorted(streams) == [
        f"GET /v1/runs/{started.id}/events",
        f"GET /v1/runs/{started.id}/events?after={seen}",
    ], streams


def test_a_wait_on_a_run_that_has_ended_returns_at_once(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon(DOUBLING)
    with Sandcell(d.url, d.key) as client:
        run = client.runs.start(TASK, model=MODEL)
        done = client.runs.get(run.id).wait(timeout=120)
        assert done.status == "succeeded"
        # A handle that knows it has ended answers without asking, whatever the timeout.
        ended = client.runs.get(run.id)
        asked = time.monotonic()
        assert ended.wait(timeout=0) is ended.info and ended.info.status == "succeeded"
        assert time.monotonic() - asked < 0.1
        # A handle that still says `running` finds the end in the stored events at once.
        assert run.info.status == "running"
        asked = time.monotonic()
        info = run.wait(timeout=10)
        assert time.monotonic() - asked < 1.0
        assert (info.status, info.answer) == ("succeeded", "the answer is 42")
        assert run._seen == len(run.list_events())


class EmptyEventsProxy:
    """An HTTP proxy on 127.0.0.1 in front of the daemon that answers every events stream with
    one that ends at once, as a daemon does for a run that goes on in another process (it has
    none of its live events), and passes every other request on."""

    def __init__(self, upstream: str) -> None:
        proxy = self
        self.paths: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                proxy.paths.append(f"{self.command} {self.path}")
                if self.command == "GET" and "/events" in self.path and "format=json" not in self.path:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                keep = {"x-api-key", "content-type", "accept"}
                headers = {k: v for k, v in self.headers.items() if k.lower() in keep}
                resp = httpx.request(self.command, upstream + self.path, headers=headers, content=body)
                self.send_response(resp.status_code)
                self.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(resp.content)))
                self.end_headers()
                self.wfile.write(resp.content)

            do_GET = do_POST = _relay

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_wait_asks_for_the_run_when_the_daemon_has_none_of_its_live_events(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon(STUCK)
    proxy = EmptyEventsProxy(d.url)
    try:
        with Sandcell(d.url, d.key) as client, Sandcell(proxy.url, d.key) as through:
            run = stuck_in_model_call(client)
            waiting = through.runs.get(run.id)
            results: list[RunInfo] = []
            waiter = threading.Thread(target=lambda: results.append(waiting.wait(timeout=60)), daemon=True)
            waiter.start()
            # Longer than a stream followed again and again would take to give up (0.2 s
            # doubling, five times).
            time.sleep(7)
            assert not results and waiter.is_alive()
            client.runs.get(run.id).cancel()
            cancelled = time.monotonic()
            waiter.join(30)
            assert results, "the wait did not return"
            # Asked for every second at most.
            assert time.monotonic() - cancelled < 1.5
            assert results[0].status == "cancelled"
    finally:
        proxy.close()
    gets = [p for p in proxy.paths if p == f"GET /v1/runs/{run.id}"]
    streams = [p for p in proxy.paths if p.startswith(f"GET /v1/runs/{run.id}/events")]
    # One stream, which ended at once, then the record asked for about once a second.
    assert len(streams) == 1, proxy.paths
    assert 6 <= len(gets) <= 20, proxy.paths


async def test_a_kept_sandbox_holds_the_runs_state_and_takes_another_run(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon([*DOUBLING, code("print(x + 1)"), {"text": "x + 1 is 22"}])
    async with AsyncSandcell(d.url, d.key) as client:
        info = await client.runs.run(TASK, model=MODEL, keep_sandbox=True, template="python", timeout=120)
        assert (info.status, info.answer) == ("succeeded", "the answer is 42")
        run = await client.runs.get(info.id)
        async with await run.sandbox() as sb:
            assert sb.id == info.sandbox_id
            assert (await sb.run_code("x")).text == "21"
            # A run in an existing sandbox starts from its kernels' state.
            second = await client.runs.start("Add one to x.", model=MODEL, sandbox=sb)
            done = await second.wait(timeout=120)
            assert (done.status, done.answer, done.sandbox_id) == ("succeeded", "x + 1 is 22", sb.id)
            texts = tool_texts([e async for e in second.events()])
            assert texts and "22" in texts[-1]
            # A sandbox given to a run is never deleted by it.
            assert await sb.is_running()


def final(answer: str) -> dict[str, Any]:
    """A model turn that answers with the `final_answer` tool."""
    return {"tool_calls": [{"name": "final_answer", "arguments": {"answer": answer}}]}


# Answers before doing the work (the check fails), does it, answers again (the check passes).
HASTY: list[Any] = [final("done"), code("open('done.txt', 'w').write('x')"), final("done.txt is written")]


def checks(events: list[RunEvent]) -> list[RunEvent]:
    return [e for e in events if e.type == "validation"]


def test_a_failed_check_sends_the_run_back_to_work_until_it_passes(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon(HASTY)
    with Sandcell(d.url, d.key) as client:
        # A command alone: the daemon's defaults for the rest (60 s, 3 attempts).
        run = client.runs.start(TASK, model=MODEL, validate="test -f done.txt")
        info = run.wait(timeout=120)
        assert (info.status, info.reason, info.answer) == ("succeeded", "validated", "done.txt is written")
        assert info.ok and info.usage.llm_calls == 3

        events = run.list_events()
        contiguous(events)
        assert Validate.from_json(events[0]["validate"]) == Validate("test -f done.txt")
        first, second = checks(events)
        fields = ("attempt", "max_attempts", "passed", "exit_code")
        assert [first[f] for f in fields] == [1, 3, False, 1]
        assert [second[f] for f in fields] == [2, 3, True, 0]
        assert first["command"] == second["command"] == "test -f done.txt"
        assert isinstance(first["duration_ms"], int) and "output_tail" in first.data and "cause" in first.data
        # The failed check came back to the model as its final_answer call's result.
        told = str(d.model.requests()[1])
        assert "the check failed (attempt 1 of 3)" in told and "exited with code 1" in told, told
        # The check ran after the code that made the file, before the run ended.
        kinds = [e.type for e in events]
        assert kinds.index("tool_result") < kinds.index("validation", kinds.index("validation") + 1)
        assert events[-1]["reason"] == "validated"


async def test_an_answer_that_never_passes_ends_the_run_validation_failed(agent_daemon: Any) -> None:
    d: AgentDaemon = agent_daemon([final("first try"), final("second try")])
    async with AsyncSandcell(d.url, d.key) as client:
        # The fields as a mapping (as budgets may be), with runs.run: start, then wait.
        info = await client.runs.run(
            TASK,
            model=MODEL,
            validate={"command": "test -f never.txt", "timeout_s": 10, "max_attempts": 2},
            timeout=120,
        )
        # Failed, its last answer kept.
        assert (info.status, info.reason, info.answer, info.ok) == (
            "failed",
            "validation_failed",
            "second try",
            False,
        )
        run = await client.runs.get(info.id)
        events = await run.list_events()
        contiguous(events)
        assert Validate.from_json(events[0]["validate"]) == Validate("test -f never.txt", 10.0, 2)
        assert [(c["attempt"], c["max_attempts"], c["passed"]) for c in checks(events)] == [
            (1, 2, False),
            (2, 2, False),
        ]
        assert len(d.model.requests()) == 2


def test_bad_runs_raise_the_sdks_errors() -> None:
    # The session daemon: these are refused before any model is asked.
    with Sandcell() as client:
        for model in ("nope", "bogus/model"):
            with pytest.raises(InvalidArgumentError) as e:
                client.runs.start(TASK, model=model)
            assert e.value.code == "invalid_argument" and e.value.status == 400
            assert model in e.value.message
        with pytest.raises(InvalidArgumentError, match="task"):
            client.runs.run("   ", model=MODEL)
        with pytest.raises(NotFoundError):
            client.runs.get("run-0000000000000000")
        with pytest.raises(ValueError, match="max_steps"):
            client.runs.start(TASK, model=MODEL, budgets={"max_steps": 3})
        # Validation values are the daemon's to judge: each bad one is its 400, naming the field.
        for validate, field in [
            (Validate("true", max_attempts=0), "validate.max_attempts"),
            ({"command": "true", "max_attempts": 11}, "validate.max_attempts"),
            ({"command": "true", "timeout_s": 601}, "validate.timeout_s"),
            ({"command": "true", "timeout_s": 0}, "validate.timeout_s"),
            ("   ", "validate.command"),
        ]:
            with pytest.raises(InvalidArgumentError) as e:
                client.runs.start(TASK, model=MODEL, validate=validate)
            assert (e.value.code, e.value.status) == ("invalid_argument", 400), validate
            assert field in e.value.message, (validate, e.value.message)
        with pytest.raises(InvalidArgumentError, match="validate.max_attempts"):
            client.runs.run(TASK, model=MODEL, validate={"command": "true", "max_attempts": 0})
        # Its shape is the SDK's: an unknown field, or none of the command, is refused unsent.
        with pytest.raises(ValueError, match="attempts"):
            client.runs.start(TASK, model=MODEL, validate={"command": "true", "attempts": 2})
        with pytest.raises(ValueError, match="command"):
            client.runs.start(TASK, model=MODEL, validate={"max_attempts": 2})
