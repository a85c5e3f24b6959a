"""The MCP memory tools (memory_add, memory_search, memory_list, memory_delete) driven by the
official MCP client: a session's memories ranked by search, the owner's own kept apart from
them, a fork of the session's snapshot remembering what the session did, deletes, and bad
arguments as tool errors. It leaves one owner memory ("the kept memory for the test") for the
Rust test (tests/suite/mcp.rs) to find through the REST API, and no session.

Usage: memory.py stdio <sandcell binary> <home>            (engine embedded in `sandcell mcp`)
       memory.py stdio-daemon <sandcell binary> <url> <key> (`sandcell mcp --daemon URL`)
       memory.py http <url of /mcp> <api key>              (streamable HTTP on the daemon)
Prints one JSON line per check; exits non-zero on the first failure.
"""
import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import check, text_of

FACTS = [
    "The staging database is PostgreSQL 16 listening on port 5433",
    "Deploys go out on Tuesdays after the standup",
    "The user prefers dark mode in every editor",
    "Database backups run nightly at two",
]


async def call(session, tool, args):
    r = await session.call_tool(tool, args)
    if r.is_error:
        check(f"{tool} answers", False, text_of(r))
    return json.loads(text_of(r))


async def scenario(session):
    await session.initialize()
    names = {t.name for t in (await session.list_tools()).tools}
    check("memory tools listed",
          {"memory_add", "memory_search", "memory_list", "memory_delete"} <= names, sorted(names))

    r = await session.call_tool("create_session", {"runtime": "python"})
    check("create_session", not r.is_error, text_of(r))
    sid = text_of(r).split("session_id: ")[1].split()[0]

    ids = []
    for i, fact in enumerate(FACTS):
        args = {"session_id": sid, "text": fact}
        if i == 0:
            args.update({"category": "infra", "metadata": {"source": "runbook"}})
        m = await call(session, "memory_add", args)
        ids.append(m["memory_id"])
    check("memory_add in a session", all(i.startswith("mem-") for i in ids)
          and m["scope"] == "session" and m["session_id"] == sid, m)
    own = await call(session, "memory_add", {"text": "Answers should use British English spelling"})
    check("memory_add for the owner", own["scope"] == "owner" and "session_id" not in own, own)

    found = await call(session, "memory_search", {"session_id": sid, "query": "staging database port"})
    results = found["results"]
    check("search ranks the relevant one first",
          [x["memory_id"] for x in results][:1] == [ids[0]] and len(results) == 2
          and results[0]["rank"] == 1 and results[0]["score"] > results[1]["score"]
          and results[0]["metadata"] == {"source": "runbook"}, results)
    found = await call(session, "memory_search",
                       {"session_id": sid, "query": "database", "category": "infra"})
    check("search by category", [x["memory_id"] for x in found["results"]] == [ids[0]], found)

    found = await call(session, "memory_search", {"query": "database"})
    check("owner memory is separate from session memory (owner side)", found["results"] == [], found)
    found = await call(session, "memory_search", {"query": "British spelling"})
    check("owner search finds the owner's",
          [x["memory_id"] for x in found["results"]] == [own["memory_id"]], found)
    found = await call(session, "memory_search", {"session_id": sid, "query": "British spelling"})
    check("owner memory is separate from session memory (session side)", found["results"] == [], found)

    listed = await call(session, "memory_list", {"session_id": sid, "limit": 3})
    check("memory_list newest first, a page at a time",
          [x["memory_id"] for x in listed["memories"]] == ids[::-1][:3] and "next_cursor" in listed, listed)
    listed = await call(session, "memory_list",
                        {"session_id": sid, "limit": 3, "cursor": listed["next_cursor"]})
    check("the next page", [x["memory_id"] for x in listed["memories"]] == [ids[0]]
          and "next_cursor" not in listed, listed)

    # A session made from the session's snapshot remembers what the session did.
    snap = await call(session, "snapshot_session", {"session_id": sid})
    forked = await call(session, "fork_snapshot", {"snapshot_id": snap["id"]})
    fork = forked["sandboxes"][0]["sandbox"]["id"]
    found = await call(session, "memory_search", {"session_id": fork, "query": "deploys Tuesdays"})
    check("a fork remembers its origin's memories",
          [x["text"] for x in found["results"]] == [FACTS[1]]
          and found["results"][0]["session_id"] == fork, found)

    r = await session.call_tool("memory_delete", {"memory_id": ids[0]})
    check("memory_delete", not r.is_error and text_of(r) == f"memory {ids[0]} deleted", text_of(r))
    found = await call(session, "memory_search", {"session_id": sid, "query": "staging"})
    check("deleted is forgotten", found["results"] == [], found)
    r = await session.call_tool("memory_delete", {"memory_id": ids[0]})
    check("deleting again is not_found", r.is_error and text_of(r).startswith("not_found: "), text_of(r))
    r = await session.call_tool("memory_delete", {"memory_id": own["memory_id"]})
    check("the owner's memory deleted", not r.is_error, text_of(r))

    for name, tool, args, code in [
        ("empty text is a tool error", "memory_add", {"session_id": sid, "text": "   "}, "invalid_argument: "),
        ("missing text is a tool error", "memory_add", {"session_id": sid}, "invalid_argument: "),
        ("a bad category is a tool error", "memory_add", {"text": "x", "category": "Not Valid"}, "invalid_argument: "),
        ("a bad session id is a tool error", "memory_add", {"text": "x", "session_id": "nope"}, "invalid_argument: "),
        ("an unknown session is a tool error", "memory_add",
         {"text": "x", "session_id": "sb-0123456789abcdef"}, "not_found: "),
        ("an empty query is a tool error", "memory_search", {"query": ""}, "invalid_argument: "),
        ("a bad limit is a tool error", "memory_list", {"limit": 0}, "invalid_argument: "),
        ("a bad memory id is a tool error", "memory_delete", {"memory_id": "not-a-memory"}, "invalid_argument: "),
        ("an unknown memory id is a tool error", "memory_delete",
         {"memory_id": "mem-0123456789abcdef"}, "not_found: "),
    ]:
        r = await session.call_tool(tool, args)
        check(name, r.is_error and text_of(r).startswith(code), text_of(r))

    kept = await call(session, "memory_add", {"text": "the kept memory for the test", "category": "e2e"})
    check("one owner memory kept", kept["category"] == "e2e", kept)
    for s in (sid, fork):
        r = await session.call_tool("destroy_session", {"session_id": s})
        check("destroy", not r.is_error, text_of(r))


async def main():
    mode = sys.argv[1]
    if mode in ("stdio", "stdio-daemon"):
        args = (["mcp", "--home", sys.argv[3]] if mode == "stdio"
                else ["mcp", "--daemon", sys.argv[3], "--api-key", sys.argv[4]])
        async with stdio_client(StdioServerParameters(command=sys.argv[2], args=args)) as (read, write):
            async with ClientSession(read, write) as session:
                await scenario(session)
    else:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        client = httpx2.AsyncClient(headers={"X-API-Key": sys.argv[3]}, timeout=60)
        async with streamable_http_client(sys.argv[2], http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await scenario(session)
    print(json.dumps({"done": True}), flush=True)


asyncio.run(main())
