"""Durable runs through the SDK, sync and async, against daemons whose runs ask the test kit's
scripted model: a run kept with all its step snapshots is forked from its first and its
second step (the fork's kernel holds the variable as it was then, the original is untouched,
`forked_from` says where it came from), and opened as a sandbox at a step without a run; a
run without step snapshots cannot be; an ended run is not resumed (409); threads are made,
listed, renamed and deleted, and a second run on a thread sees the first one's conversation
and works in its sandbox."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from sandcell import (
    AsyncSandbox,
    AsyncSandcell,
    AsyncThreads,
    ConflictError,
    ForkedFrom,
    InvalidArgumentError,
    NotFoundError,
    Run,
    RunEvent,
    Sandbox,
    Sandcell,
    StepSandbox,
    ThreadInfo,
    Threads,
)

from .conftest import AgentDaemon
from .test_runs import MODEL, code, contiguous, tool_texts

# The original sets x at step 1 and again at step 2, then answers; the first fork (from step
# 1) prints x, the second (from step 2) too; a last run, without step snapshots, sets y.
SCRIPT: list[Any] = [
    code("x = 1"),
    code("x = 2"),
    {"text": "x is 2"},
    code("print(x)"),
    {"text": "x was 1"},
    code("print(x)"),
    {"text": "x was 2"},
    code("y = 1"),
    {"text": "y is 1"},
]


def of_type(events: list[RunEvent], kind: str) -> list[RunEvent]:
    return [e for e in events if e.type == kind]


def kernel_x(client: Sandcell, made: StepSandbox) -> str | None:
    """The `x` of the Python kernel of the sandbox `step_sandbox` opened (deleted after)."""
    with Sandbox.get(made.sandbox_id, client=client) as sb:
        return sb.run_code("x").text


def test_a_run_is_forked_and_opened_at_its_steps_and_an_ended_one_is_not_resumed(
    agent_daemon: Any,
) -> None:
    d: AgentDaemon = agent_daemon(SCRIPT)
    with Sandcell(d.url, d.key) as client:
        original = client.runs.run("Set x, twice.", model=MODEL, keep_snapshots=True, timeout=120)
        assert (original.status, original.answer, original.usage.steps) == ("succeeded", "x is 2", 2)
        assert original.forked_from is None
        events = client.runs.get(original.id).list_events()
        # Each step ran code, so each has its snapshot (the default policy, on_mutation).
        committed = of_type(events, "step_committed")
        assert [e.step for e in committed] == [1, 2]
        assert all(e["snapshot"]["snapshot_id"] for e in committed), committed

        # Forked from step 1, waiting for the fork's end: x is as step 1 left it.
        fork = client.runs.fork(original.id, 1, task="Print x.", wait=True)
        assert isinstance(fork, Run) and fork.id != original.id
        assert fork.info.done and (fork.info.status, fork.info.answer) == ("succeeded", "x was 1")
        assert fork.info.forked_from == ForkedFrom(original.id, 1)
        assert fork.info.model == MODEL  # the original's
        fork_events = fork.list_events()
        contiguous(fork_events)
        assert fork_events[0]["forked_from"] == {"run_id": original.id, "step": 1}
        (forked,) = of_type(fork_events, "forked")
        assert (forked["from_run_id"], forked["from_step"]) == (original.id, 1)
        assert "Print x." in json.dumps(d.model.requests()[3]["body"]["messages"])
        assert tool_texts(fork_events)[-1].strip() == "1", tool_texts(fork_events)

        # Forked from step 2, answered at once and waited for: x is as step 2 left it.
        second = client.runs.fork(original.id, 2, task="Print x again.", budgets={"max_iterations": 4})
        assert second.info.status == "running" and second.info.forked_from == ForkedFrom(original.id, 2)
        assert second.info.budgets.max_iterations == 4
        done = second.wait(timeout=120)
        assert (done.status, done.answer) == ("succeeded", "x was 2")
        assert tool_texts(second.list_events())[-1].strip() == "2"

        # The original is never changed.
        again = client.runs.get(original.id).info
        assert (again.answer, again.usage, again.forked_from) == (original.answer, original.usage, None)
        assert client.runs.get(original.id).list_events() == events

        # A sandbox at each step, without a run: the kernel as that step left it.
        at_one = client.runs.step_sandbox(original.id, 1)
        assert isinstance(at_one, StepSandbox) and at_one.sandbox_id.startswith("sb-")
        assert (at_one.snapshot_step, at_one.snapshot_id) == (1, committed[0]["snapshot"]["snapshot_id"])
        assert isinstance(at_one.not_carried, list)
        assert kernel_x(client, at_one) == "1"
        at_two = client.runs.step_sandbox(original.id, 2)
        assert at_two.snapshot_step == 2 and at_two.sandbox_id != at_one.sandbox_id
        assert kernel_x(client, at_two) == "2"
        with pytest.raises(InvalidArgumentError):
            client.runs.step_sandbox(original.id, 9)  # no such committed step

        # A run that has ended is not resumed.
        with pytest.raises(ConflictError) as e:
            client.runs.resume(original.id)
        assert e.value.status == 409
        with pytest.raises(NotFoundError):
            client.runs.resume("run-0000000000000000")

        # Without step snapshots, no step can be restored (nor forked).
        bare = client.runs.run("Set y.", model=MODEL, snapshots="off", timeout=120)
        assert (bare.status, bare.answer) == ("succeeded", "y is 1")
        committed = of_type(client.runs.get(bare.id).list_events(), "step_committed")
        assert committed and all(e.get("snapshot") is None for e in committed), committed
        with pytest.raises(ConflictError) as e:
            client.runs.step_sandbox(bare.id, 1)
        assert e.value.status == 409
        with pytest.raises(ConflictError):
            client.runs.fork(bare.id, 1)
        assert len(d.model.requests()) == len(SCRIPT)


def test_threads_are_made_listed_renamed_and_deleted(client: Sandcell) -> None:
    # The session daemon: no run needed.
    assert isinstance(client.threads, Threads)
    name = f"notes-{uuid.uuid4().hex[:8]}"
    made = client.threads.create(name)
    assert isinstance(made, ThreadInfo) and made.id.startswith("th-")
    assert (made.name, made.runs, made.sandbox_id, made.last_run_id) == (name, 0, None, None)
    assert made.created_at and made.updated_at
    unnamed = client.threads.create()
    assert unnamed.name == unnamed.id  # named after its id
    assert client.threads.get(made.id) == made
    listed = client.threads.list(limit=1000)
    assert {made.id, unnamed.id} <= {t.id for t in listed}
    assert len(client.threads.list(limit=1)) == 1

    renamed = client.threads.rename(made.id, name + "-b")
    assert (renamed.id, renamed.name) == (made.id, name + "-b")
    assert client.threads.get(made.id).name == name + "-b"
    # Names are unique among the key's threads.
    with pytest.raises(ConflictError):
        client.threads.create(name + "-b")
    with pytest.raises(ConflictError):
        client.threads.rename(unnamed.id, name + "-b")

    for thread in (made, unnamed):
        client.threads.delete(thread.id)
        with pytest.raises(NotFoundError):
            client.threads.get(thread.id)
    with pytest.raises(NotFoundError):
        client.threads.delete(made.id)
    with pytest.raises(InvalidArgumentError):
        client.threads.list(limit=0)


async def test_a_second_run_on_a_thread_sees_the_first_and_works_in_its_sandbox(
    agent_daemon: Any,
) -> None:
    d: AgentDaemon = agent_daemon(
        [code("x = 41"), {"text": "x is 41"}, code("print(x + 1)"), {"text": "x + 1 is 42"}]
    )
    async with AsyncSandcell(d.url, d.key) as client:
        assert isinstance(client.threads, AsyncThreads)
        thread = await client.threads.create("work")
        first = await client.runs.run("Set x to 41.", model=MODEL, thread_id=thread.id, timeout=120)
        assert (first.status, first.answer) == ("succeeded", "x is 41") and first.sandbox_id
        after_one = await client.threads.get(thread.id)
        assert (after_one.runs, after_one.last_run_id) == (1, first.id)
        assert after_one.sandbox_id == first.sandbox_id

        run = await client.runs.start("Add one to x.", model=MODEL, thread_id=thread.id)
        second = await run.wait(timeout=120)
        assert (second.status, second.answer) == ("succeeded", "x + 1 is 42")
        # The second run's first model request holds the first run's task and answer.
        requests = d.model.requests()
        assert len(requests) == 4
        messages = [json.dumps(m) for m in requests[2]["body"]["messages"]]
        told_at = [i for i, m in enumerate(messages) if "Set x to 41." in m]
        answered_at = [i for i, m in enumerate(messages) if "x is 41" in m]
        assert told_at and answered_at, messages
        # … before the new task, which comes last.
        assert "Add one to x." in messages[-1] and told_at[0] < answered_at[-1] < len(messages) - 1
        events = await run.list_events()
        contiguous(events)
        (told,) = of_type(events, "thread_history")
        assert (told["thread_id"], told["from_run_id"]) == (thread.id, first.id)
        # In the thread's sandbox, whose kernel kept x.
        assert second.sandbox_id == first.sandbox_id
        assert tool_texts(events)[-1].strip() == "42"
        after_two = await client.threads.get(thread.id)
        assert (after_two.runs, after_two.last_run_id) == (2, second.id)
        assert thread.id in [t.id for t in await client.threads.list()]

        # Deleting the thread deletes its sandbox; its runs stay.
        await client.threads.delete(thread.id)
        with pytest.raises(NotFoundError):
            await client.threads.get(thread.id)
        assert (await client.runs.get(first.id)).info.answer == "x is 41"
        assert first.sandbox_id is not None
        gone = await AsyncSandbox.get(first.sandbox_id, client=client)
        assert gone.info.state in ("stopped", "deleted"), gone.info.state
