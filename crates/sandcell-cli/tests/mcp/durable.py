"""The MCP tools of durable runs (agent_fork, agent_resume, agent_run's keep_snapshots) driven
by the official MCP client, against runs that ask the test kit's scripted model (the Rust test,
tests/suite/mcp.rs, serves it and says which turns it scripted).

fork: a run of three code steps (x = 1, 2, 3) and an answer, started with keep_snapshots; a
fork from step 2 with a new task goes on with the history and step 2's session (its code
prints x: the script answers `print('X IS', x)`, then "fork done"). Then the errors: a step the
run does not have, an unknown run, resuming a run that ended.

resume: `sandcell mcp` with the engine embedded on a home: a run sets x = 21 and then waits in
a slow model call when this client closes the server; a second `sandcell mcp` on the same home
finds it failed (interrupted), agent_resume takes it up from step 1's snapshot, and it ends
with the scripted answer, x still 21 (the script: `print('DOUBLE', x * 2)`, "the answer is 42").

Usage: durable.py fork http <url of /mcp> <api key>
       durable.py fork stdio-daemon <sandcell binary> <url> <api key>
       durable.py resume <sandcell binary> <home> <model base url>
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


async def ended(session, run, seconds=120):
    deadline = time.monotonic() + seconds
    st = await status(session, run)
    while st["status"] == "running" and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        st = await status(session, run)
    return st


async def fork_scenario(session):
    await session.initialize()
    names = {t.name for t in (await session.list_tools()).tools}
    check("durable run tools listed", {"agent_fork", "agent_resume"} <= names, sorted(names))

    r = await session.call_tool("agent_run", {"task": "Count to three in x.", "model": MODEL,
                                              "keep_snapshots": True})
    check("agent_run with keep_snapshots", not r.is_error, text_of(r))
    original = json.loads(text_of(r))["run_id"]
    st = await ended(session, original)
    check("the original succeeded", st["status"] == "succeeded"
          and st["answer"] == "original done" and st["usage"]["llm_calls"] == 4, st)

    r = await session.call_tool("agent_fork", {"run_id": original, "from_step": 2,
                                               "task": "Print x."})
    started = json.loads(text_of(r)) if not r.is_error else {}
    check("agent_fork answers at once with the new run", not r.is_error
          and started.get("status") == "running" and started.get("run_id", original) != original
          and started.get("forked_from") == {"run_id": original, "step": 2}, text_of(r))
    fork = started["run_id"]
    st = await ended(session, fork)
    check("the fork succeeded", st["status"] == "succeeded" and st["answer"] == "fork done", st)
    check("the fork goes on from step 2's session",
          any("X IS 2" in line for line in st.get("recent_events", [])), st)
    st = await status(session, original)
    check("the original is unchanged", st["status"] == "succeeded"
          and st["answer"] == "original done", st)

    for name, args, code in [
        ("a step the run does not have", {"run_id": original, "from_step": 9}, "invalid_argument: "),
        ("from_step is required", {"run_id": original}, "invalid_argument: "),
        ("an unknown run", {"run_id": "run-0000000000000000", "from_step": 1}, "not_found: "),
    ]:
        r = await session.call_tool("agent_fork", args)
        check(f"agent_fork: {name}", r.is_error and text_of(r).startswith(code), text_of(r))
    r = await session.call_tool("agent_resume", {"run_id": original})
    check("agent_resume of an ended run", r.is_error
          and text_of(r).startswith("invalid_state: ") and "fork it" in text_of(r), text_of(r))
    r = await session.call_tool("agent_resume", {"run_id": "run-0000000000000000"})
    check("agent_resume of an unknown run", r.is_error and text_of(r).startswith("not_found: "),
          text_of(r))
    print(json.dumps({"fork": fork, "original": original}), flush=True)


def embedded(binary, home, base):
    return StdioServerParameters(command=binary, args=[
        "mcp", "--home", home, "--set", f"agent.openai.base_url={base}"])


async def resume_scenario(binary, home, base):
    async with stdio_client(embedded(binary, home, base)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("agent_run", {"task": "Set x to 21, then double it.",
                                                      "model": MODEL})
            check("agent_run", not r.is_error, text_of(r))
            run = json.loads(text_of(r))["run_id"]
            # Step 1 committed (x = 21, its snapshot), step 2 waiting in the slow model call.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                st = await status(session, run)
                lines = st.get("recent_events", [])
                if any("step 2 llm_request" in line for line in lines):
                    break
                await asyncio.sleep(0.1)
            check("in step 2's model call", any("step 2 llm_request" in line for line in lines), st)
    # The server is gone with the run unfinished; another one on the same home.
    async with stdio_client(embedded(binary, home, base)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            st = await status(session, run)
            check("the stop interrupted it", st["status"] == "failed"
                  and st["reason"] == "interrupted", st)
            r = await session.call_tool("agent_resume", {"run_id": run})
            resumed = json.loads(text_of(r)) if not r.is_error else {}
            check("agent_resume answers at once", not r.is_error
                  and resumed.get("run_id") == run and resumed.get("status") == "running", text_of(r))
            st = await ended(session, run)
            check("the resumed run succeeded", st["status"] == "succeeded"
                  and st["answer"] == "the answer is 42", st)
            check("x came back from step 1's snapshot",
                  any("DOUBLE 42" in line for line in st.get("recent_events", [])), st)
            r = await session.call_tool("agent_resume", {"run_id": run})
            check("resuming it again is refused", r.is_error
                  and text_of(r).startswith("invalid_state: "), text_of(r))


async def main():
    what, mode = sys.argv[1], sys.argv[2]
    if what == "resume":
        await resume_scenario(sys.argv[2], sys.argv[3], sys.argv[4])
    elif mode == "stdio-daemon":
        params = StdioServerParameters(command=sys.argv[3], args=[
            "mcp", "--daemon", sys.argv[4], "--api-key", sys.argv[5]])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await fork_scenario(session)
    else:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        client = httpx2.AsyncClient(headers={"X-API-Key": sys.argv[4]}, timeout=60)
        async with streamable_http_client(sys.argv[3], http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await fork_scenario(session)
    print(json.dumps({"done": True}), flush=True)


asyncio.run(main())
