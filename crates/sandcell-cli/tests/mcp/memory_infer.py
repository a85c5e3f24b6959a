"""memory_add with infer: true and memory_infer_status driven by the official MCP client,
against a server whose model is the test kit's scripted one (the Rust test,
tests/suite/mcp.rs, serves it, scripts its answer and says whether the server has a model).

infer: the server has a model (agent.model) and an embedding model (memory.embedding_model,
the scripted server's words-as-vectors, "automobile", "car" and "vehicle" one word). On a
session, memory_add with infer answers at once with a queued job; memory_infer_status is
polled until the job succeeded; the model's two facts ("The user lives in Lisbon", "The user
drives an automobile to work") are the session's memories, with source: infer; memory_search
ranks them (ranking: hybrid, each result's rank, score and matched_by), finds the automobile
by meaning alone for "vehicle" (matched_by: semantic, with its similarity), and bad or unknown
job ids are tool errors.

no-model: the server has no model to infer with; memory_add with infer is a tool error naming
the setting (invalid_argument), nothing is added, and the server goes on serving.

Usage: memory_infer.py infer|no-model http <url of /mcp> <api key>
       memory_infer.py infer stdio <sandcell binary> <home> <model base url>
       memory_infer.py no-model stdio <sandcell binary> <home>
Prints one JSON line per check; exits non-zero on the first failure.
"""
import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import check, text_of

TEXT = "I moved to Lisbon last year, and I drive my automobile to work every day."
LISBON = "The user lives in Lisbon"
AUTOMOBILE = "The user drives an automobile to work"


async def call(session, tool, args):
    r = await session.call_tool(tool, args)
    if r.is_error:
        check(f"{tool} answers", False, text_of(r))
    return json.loads(text_of(r))


async def new_session(session):
    r = await session.call_tool("create_session", {"runtime": "python"})
    check("create_session", not r.is_error, text_of(r))
    return text_of(r).split("session_id: ")[1].split()[0]


async def infer_scenario(session):
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    check("infer tools listed", "memory_infer_status" in tools
          and "infer" in tools["memory_add"].input_schema.get("properties", {}), sorted(tools))
    sid = await new_session(session)

    job = await call(session, "memory_add", {"session_id": sid, "text": TEXT, "infer": True,
                                             "category": "profile", "metadata": {"by": "mcp"}})
    check("memory_add with infer answers at once with a queued job",
          job["job_id"].startswith("inf-") and job["status"] == "queued"
          and job["memory_ids"] == [] and job["scope"] == "session"
          and job["session_id"] == sid and job["category"] == "profile"
          and "memory_infer_status" in job.get("next", ""), job)

    deadline = time.monotonic() + 60
    st = await call(session, "memory_infer_status", {"job_id": job["job_id"]})
    seen = {st["status"]}
    while st["status"] in ("queued", "running") and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        st = await call(session, "memory_infer_status", {"job_id": job["job_id"]})
        seen.add(st["status"])
    check("memory_infer_status until succeeded",
          st["status"] == "succeeded" and len(st["memory_ids"]) == 2
          and all(i.startswith("mem-") for i in st["memory_ids"])
          and "error" not in st and "next" not in st, st)
    check("the job's model", st["model"] == "openai/test-model", st)
    lisbon_id, automobile_id = st["memory_ids"]

    listed = await call(session, "memory_list", {"session_id": sid})
    by_id = {m["memory_id"]: m for m in listed["memories"]}
    check("the facts are the session's memories",
          sorted(by_id) == sorted(st["memory_ids"])
          and by_id[lisbon_id]["text"] == LISBON and by_id[automobile_id]["text"] == AUTOMOBILE
          and all(m["category"] == "profile" and m["scope"] == "session"
                  and m["metadata"] == {"by": "mcp", "source": "infer"}
                  for m in by_id.values()), listed)

    found = await call(session, "memory_search", {"session_id": sid, "query": "where does the user live"})
    results = found["results"]
    check("memory_search finds an inferred fact, ranked",
          found.get("ranking") == "hybrid" and "warning" not in found
          and results and results[0]["memory_id"] == lisbon_id and results[0]["text"] == LISBON
          and [x["rank"] for x in results] == list(range(1, len(results) + 1))
          and all(results[i]["score"] >= results[i + 1]["score"] for i in range(len(results) - 1))
          and results[0]["matched_by"] == "both", found)

    found = await call(session, "memory_search", {"session_id": sid, "query": "vehicle"})
    results = found["results"]
    check("hybrid ranking finds a fact by meaning alone",
          found.get("ranking") == "hybrid"
          and [x["memory_id"] for x in results] == [automobile_id]
          and results[0]["rank"] == 1 and results[0]["matched_by"] == "semantic"
          and results[0]["similarity"] > 0.3, found)

    for name, args, code in [
        ("a bad job id is a tool error", {"job_id": "not-a-job"}, "invalid_argument: "),
        ("an unknown job id is a tool error", {"job_id": "inf-0123456789abcdef"}, "not_found: "),
        ("job_id is required", {}, "invalid_argument: "),
    ]:
        r = await session.call_tool("memory_infer_status", args)
        check(name, r.is_error and text_of(r).startswith(code), text_of(r))

    r = await session.call_tool("destroy_session", {"session_id": sid})
    check("destroy", not r.is_error, text_of(r))


async def no_model_scenario(session):
    await session.initialize()
    sid = await new_session(session)
    for where, args in [("session", {"session_id": sid}), ("owner", {})]:
        r = await session.call_tool("memory_add", {**args, "text": TEXT, "infer": True})
        check(f"infer without a model is a tool error naming the setting ({where})",
              r.is_error and text_of(r).startswith("invalid_argument: ")
              and "memory.infer_model" in text_of(r), text_of(r))
    listed = await call(session, "memory_list", {"session_id": sid})
    check("nothing was added", listed["memories"] == [], listed)
    # The server goes on serving: a plain memory_add still works.
    m = await call(session, "memory_add", {"session_id": sid, "text": "kept as it is", "infer": False})
    check("the server keeps serving", m["memory_id"].startswith("mem-") and m["text"] == "kept as it is", m)
    r = await session.call_tool("destroy_session", {"session_id": sid})
    check("destroy", not r.is_error, text_of(r))


async def main():
    what, mode = sys.argv[1], sys.argv[2]
    scenario = infer_scenario if what == "infer" else no_model_scenario
    if mode == "stdio":
        args = ["mcp", "--home", sys.argv[4]]
        if what == "infer":
            args += ["--set", f"agent.openai.base_url={sys.argv[5]}",
                     "--set", "agent.model=openai/test-model",
                     "--set", "memory.embedding_model=openai/test-embed"]
        async with stdio_client(StdioServerParameters(command=sys.argv[3], args=args)) as (read, write):
            async with ClientSession(read, write) as session:
                await scenario(session)
    else:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        client = httpx2.AsyncClient(headers={"X-API-Key": sys.argv[4]}, timeout=60)
        async with streamable_http_client(sys.argv[3], http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await scenario(session)
    print(json.dumps({"done": True}), flush=True)


asyncio.run(main())
