"""Memories through the SDK, sync and async, against the session daemon: a search ranks the
memory that matches best first (stemmed words, each hit with its score), filters by category
and limit; a sandbox's memories (`sb.memory`) and the owner's own (`client.memory`) are
separate scopes, except that the owner's get and delete reach a sandbox's memory by id; a
listing pages with its cursor; a deleted memory is gone from get, search and listing; bad
input is the daemon's InvalidArgumentError. Against daemons of their own pointed at the test
kit's scripted model: hybrid search finds a memory by meaning, and says it ranked by words
only when the embeddings endpoint fails; infer jobs add the model's facts, fail on output that
is not a JSON list, and are refused at once without a model."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sandcell import (
    AsyncMemories,
    AsyncSandbox,
    AsyncSandcell,
    InferJob,
    InvalidArgumentError,
    Memories,
    Memory,
    MemoryList,
    MemorySearch,
    NotFoundError,
    Sandbox,
    Sandcell,
)

from .conftest import AgentDaemon


def word() -> str:
    """A word no other test's memory holds (the session daemon's owner memories are shared)."""
    return "w" + uuid.uuid4().hex[:12]


def test_a_search_ranks_the_best_match_first(bare: Sandbox) -> None:
    assert isinstance(bare.memory, Memories) and bare.memory.sandbox_id == bare.id
    deploys = bare.memory.add(
        "Deploys go out on Fridays after the release review",
        category="ops",
        metadata={"source": "wiki", "team": "infra"},
    )
    assert isinstance(deploys, Memory) and deploys.id.startswith("mem-")
    assert (deploys.scope, deploys.sandbox_id, deploys.category) == ("sandbox", bare.id, "ops")
    assert deploys.metadata == {"source": "wiki", "team": "infra"}
    assert deploys.created_at and deploys.score is None
    lunch = bare.memory.add("Lunch is at noon on Fridays")
    assert (lunch.category, lunch.metadata) == ("general", {})
    bare.memory.add("The release notes live in docs/releases")

    # Stemmed: "deploying" finds "Deploys"; the memory matching more words comes first.
    hits = bare.memory.search("deploying on friday")
    assert [h.id for h in hits][0] == deploys.id, [(h.text, h.score) for h in hits]
    assert lunch.id in [h.id for h in hits]
    assert all(h.score is not None for h in hits)
    scores = [h.score for h in hits if h.score is not None]
    assert scores == sorted(scores, reverse=True)
    assert hits[0].text == deploys.text and hits[0].metadata == deploys.metadata

    # Filtered by category, and limited.
    assert [h.id for h in bare.memory.search("fridays", category="ops")] == [deploys.id]
    assert len(bare.memory.search("fridays release", limit=1)) == 1
    # Words only: search syntax is not syntax, and nothing matching finds nothing.
    assert bare.memory.search('"release" OR NEAR(') != []
    assert bare.memory.search("zebra") == []

    # By id, whole.
    again = bare.memory.get(deploys.id)
    assert again == deploys


def test_a_sandbox_and_its_owner_keep_separate_memories(bare: Sandbox, client: Sandcell) -> None:
    w = word()
    assert isinstance(client.memory, Memories) and client.memory.sandbox_id is None
    mine = bare.memory.add(f"sandbox fact {w}")
    owned = client.memory.add(f"owner fact {w}", category="facts")
    try:
        assert (owned.scope, owned.sandbox_id) == ("owner", None)
        # Each scope's search and listing hold only its own.
        assert [m.id for m in bare.memory.search(w)] == [mine.id]
        assert [m.id for m in client.memory.search(w)] == [owned.id]
        assert mine.id in [m.id for m in bare.memory.list()]
        assert mine.id not in [m.id for m in client.memory.list(limit=1000)]
        # The sandbox's scope does not reach the owner's memory …
        with pytest.raises(NotFoundError):
            bare.memory.get(owned.id)
        with pytest.raises(NotFoundError):
            bare.memory.delete(owned)
        # … but the owner's reaches the sandbox's by id (its sandbox_id says whose).
        via_owner = client.memory.get(mine.id)
        assert (via_owner.id, via_owner.scope, via_owner.sandbox_id) == (mine.id, "sandbox", bare.id)
        # Another sandbox sees neither.
        with Sandbox.create(ephemeral=True) as other:
            assert other.memory.search(w) == []
            with pytest.raises(NotFoundError):
                other.memory.get(mine)
    finally:
        client.memory.delete(owned)
    with pytest.raises(NotFoundError):
        client.memory.get(owned.id)


def test_a_listing_pages_newest_first_and_a_deleted_memory_is_gone(bare: Sandbox) -> None:
    w = word()
    made = [bare.memory.add(f"note {i} {w}", category="notes") for i in range(3)]
    other = bare.memory.add(f"todo {w}", category="todo")

    page = bare.memory.list(limit=2)
    assert isinstance(page, MemoryList) and len(page) == 2 and page.next_cursor
    assert [m.id for m in page] == [other.id, made[2].id]  # newest first
    rest = bare.memory.list(limit=2, cursor=page.next_cursor)
    assert [m.id for m in rest] == [made[1].id, made[0].id]
    assert rest.next_cursor is None
    assert [m.id for m in bare.memory.list(category="todo")] == [other.id]

    bare.memory.delete(made[1].id)
    with pytest.raises(NotFoundError):
        bare.memory.get(made[1].id)
    with pytest.raises(NotFoundError):
        bare.memory.delete(made[1])
    assert made[1].id not in [m.id for m in bare.memory.search(w)]
    assert [m.id for m in bare.memory.list(category="notes")] == [made[2].id, made[0].id]


def test_bad_memory_input_is_the_daemons_invalid_argument(bare: Sandbox, client: Sandcell) -> None:
    for scope in (bare.memory, client.memory):
        for text, category, field in [
            ("   ", None, "text"),
            ("ok", "Not A Category", "category"),
            ("nul\x00byte", None, "text"),
        ]:
            with pytest.raises(InvalidArgumentError) as e:
                scope.add(text, category=category)
            assert (e.value.code, e.value.status) == ("invalid_argument", 400)
            assert field in e.value.message, e.value.message
        with pytest.raises(InvalidArgumentError, match="limit"):
            scope.search("anything", limit=0)
        with pytest.raises(InvalidArgumentError, match="limit"):
            scope.search("anything", limit=101)
        with pytest.raises(InvalidArgumentError):
            scope.search("   ")
        with pytest.raises(InvalidArgumentError, match="cursor"):
            scope.list(cursor="not-a-cursor")
        with pytest.raises(InvalidArgumentError):
            scope.get("not-a-memory-id")
    # No such memory, and no such sandbox to hold one: 404s.
    with pytest.raises(NotFoundError):
        client.memory.get("mem-0000000000000000")
    with pytest.raises(NotFoundError):
        Memories(client, "sb-nosuchsandbox").add("x")


async def test_async_memories_add_search_delete(asb: AsyncSandbox) -> None:
    assert isinstance(asb.memory, AsyncMemories)
    w = word()
    first = await asb.memory.add(f"the kernel is python {w}", metadata={"k": "v"})
    second = await asb.memory.add(f"the kernel is fast python python {w}")
    hits = await asb.memory.search(f"fast python {w}")
    assert [h.id for h in hits] == [second.id, first.id]
    async with AsyncSandcell() as client:
        owned = await client.memory.add(f"async owner {w}")
        assert [m.id for m in await client.memory.search(w)] == [owned.id]
        assert (await client.memory.get(first)).metadata == {"k": "v"}
        await client.memory.delete(owned.id)
        assert await client.memory.search(w) == []
    await asb.memory.delete(first)
    assert [m.id for m in (await asb.memory.list())] == [second.id]


# --- hybrid search and infer, against the scripted model ---------------------------------

EMBEDDINGS = {"synonyms": [["automobile", "car", "vehicle"]]}


def test_the_session_daemon_ranks_by_words_and_has_no_model_to_infer_with(client: Sandcell) -> None:
    w = word()
    m = client.memory.add(f"plain {w}")
    try:
        found = client.memory.search(w)
        assert isinstance(found, MemorySearch) and (found.ranking, found.warning) == ("fts", None)
        assert [h.matched_by for h in found] == ["fts"]
        with pytest.raises(InvalidArgumentError, match="infer_model"):
            client.memory.add("I moved to Lisbon", infer=True)
    finally:
        client.memory.delete(m)


def test_hybrid_search_finds_by_meaning_and_says_when_it_could_not(
    agent_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_MEMORY_EMBEDDING_MODEL", "openai/test-embed")
    up: AgentDaemon = agent_daemon({"turns": [], "embeddings": EMBEDDINGS})
    down: AgentDaemon = agent_daemon(
        {"turns": [], "embeddings": {**EMBEDDINGS, "fault": {"status": 500, "message": "embedder down"}}}
    )
    with Sandcell(up.url, up.key) as client:
        car = client.memory.add("The automobile needs new tyres")
        assert car.warning is None
        client.memory.add("Lunch is at noon on Fridays")
        found = client.memory.search("vehicle")
        assert (found.ranking, found.warning) == ("hybrid", None)
        assert [h.id for h in found] == [car.id]
        assert found[0].matched_by == "semantic"
        assert found[0].similarity is not None and found[0].similarity > 0.3
        embedded = [r["body"]["input"] for r in up.model.requests() if r["path"] == "/v1/embeddings"]
        assert embedded[-1] == ["vehicle"]
    with Sandcell(down.url, down.key) as client:
        kept = client.memory.add("The car is parked in the garage")
        assert kept.warning is not None and "embedder down" in kept.warning
        assert client.memory.get(kept.id).text == kept.text
        found = client.memory.search("vehicle garage")
        assert found.ranking == "fts"
        assert found.warning is not None and "embeddings endpoint failed" in found.warning
        assert [h.id for h in found] == [kept.id] and found[0].matched_by == "fts"
        assert client.memory.search("vehicle") == []


async def test_infer_jobs_add_the_models_facts_or_fail_saying_why(
    agent_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_AGENT_MODEL", "openai/test-model")
    d: AgentDaemon = agent_daemon(
        [
            {"text": '["The user lives in Lisbon", "The user drinks green tea"]'},
            {"text": "Sure! The user lives in Lisbon."},
            {"text": '["The deploy key is in the vault"]'},
        ]
    )
    with Sandcell(d.url, d.key) as client:
        job = client.memory.add("I moved to Lisbon. I drink green tea.", category="profile", infer=True)
        assert isinstance(job, InferJob) and job.id.startswith("inf-")
        assert job.status in ("queued", "running", "succeeded") and job.model == "openai/test-model"
        done = client.memory.wait_infer(job, timeout=30)
        assert (done.status, done.error, len(done.memories)) == ("succeeded", None, 2)
        first = client.memory.get(done.memories[0])
        assert (first.text, first.category, first.metadata) == (
            "The user lives in Lisbon",
            "profile",
            {"source": "infer"},
        )
        assert client.memory.search("green tea")[0].id == done.memories[1]

        bad = client.memory.wait_infer(client.memory.add("More.", infer=True), timeout=30)
        assert bad.status == "failed" and bad.done
        assert bad.error is not None and "not a JSON list of strings" in bad.error
        assert [j.id for j in client.memory.infer_jobs()][:2] == [bad.id, job.id]
        with pytest.raises(InvalidArgumentError):
            client.memory.infer_status("inf-nope")

    async with AsyncSandcell(d.url, d.key) as aclient:
        job = await aclient.memory.add("Deploy keys live in the vault.", infer=True)
        done = await aclient.memory.wait_infer(job.id, timeout=30)
        assert done.status == "succeeded"
        assert (await aclient.memory.infer_status(job)).memories == done.memories
        found = await aclient.memory.search("deploy key")
        assert found[0].id == done.memories[0]
