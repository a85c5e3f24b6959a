"""The MCP agent tools (agent_run, agent_status, agent_cancel) driven by the official MCP
client, against a daemon whose runs ask the test kit's scripted model (the Rust test,
runs_api.rs, serves it: four turns per scenario — set x, double it, answer, then a slow one).

Usage: agent.py http <url of /mcp> <api key>
       agent.py stdio-daemon <sandcell binary> <url> <api key>
Prints one JSON line per check; exits non-zero on the first failure.
"""
import asyncio
import json
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import check, text_of

MODEL = "openai/test-model"


async def status(session, run):
    r = await session.call_tool("agent_status", {"run_id": run})
    if r.is_error:
        check("agent_status answers", False, text_of(r))
    return json.loads(text_of(r))


async def scenario(session):
    await session.initialize()
    names = {t.name for t in (await session.list_tools()).tools}
    check("agent tools listed", {"agent_run", "agent_status", "agent_cancel"} <= names, sorted(names))

    r = await session.call_tool("agent_run", {
        "task": "Set x to 21 in Python, then double it.", "model": MODEL, "max_iterations": 5})
    started = json.loads(text_of(r)) if not r.is_error else {}
    check("agent_run answers at once", not r.is_error and started.get("status") == "running"
          and started.get("run_id", "").startswith("run-"), text_of(r))
    run = started["run_id"]
    deadline = time.monotonic() + 120
    st = await status(session, run)
    while st["status"] == "running" and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        st = await status(session, run)
    check("the run succeeded", st["status"] == "succeeded" and st["answer"] == "the answer is 42"
          and st["usage"]["llm_calls"] == 3, st)
    recent = st.get("recent_events", [])
    check("recent events", any("DOUBLE 42" in line for line in recent)
          and recent[-1].endswith("run_finished: succeeded (text)"), recent)

    # The next model call is slow: the run waits in it until cancelled.
    r = await session.call_tool("agent_run", {"task": "Wait for it.", "model": MODEL})
    slow = json.loads(text_of(r))["run_id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = await status(session, slow)
        if any(" llm_request" in line for line in st.get("recent_events", [])):
            break
        await asyncio.sleep(0.1)
    asked = time.monotonic()
    r = await session.call_tool("agent_cancel", {"run_id": slow})
    took = time.monotonic() - asked
    ended = json.loads(text_of(r)) if not r.is_error else {}
    check("cancelled at once", not r.is_error and ended.get("status") == "cancelled" and took < 2,
          f"{took:.2f} s: {text_of(r)}")
    st = await status(session, slow)
    check("cancelled stays cancelled", st["status"] == "cancelled", st)

    r = await session.call_tool("agent_status", {"run_id": "run-0000000000000000"})
    check("unknown run", r.is_error and text_of(r).startswith("not_found: "), text_of(r))
    r = await session.call_tool("agent_run", {"task": "x", "budgets": {}})
    check("bad argument", r.is_error and text_of(r).startswith("invalid_argument: "), text_of(r))


async def main():
    mode = sys.argv[1]
    if mode == "stdio-daemon":
        params = StdioServerParameters(command=sys.argv[2], args=[
            "mcp", "--daemon", sys.argv[3], "--api-key", sys.argv[4]])
        async with stdio_client(params) as (read, write):
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
