"""A real MCP client (the official Python SDK) driving Sandcell's MCP server.

Usage: client.py stdio <sandcell binary> <home>            (engine embedded in `sandcell mcp`)
       client.py stdio-daemon <sandcell binary> <url> <key> (`sandcell mcp --daemon URL`)
       client.py http <url of /mcp> <api key>              (streamable HTTP on the daemon)
Runs every check and prints one JSON line per check; exits non-zero on the first failure.
"""
import asyncio
import base64
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import check, text_of


async def scenario(session):
    init = await session.initialize()
    check("initialize", init.server_info.name == "sandcell", init.server_info)
    tools = (await session.list_tools()).tools
    names = {t.name for t in tools}
    expected = {"create_session", "execute_code", "execute_python", "execute_terminal",
                "get_repl_context", "set_repl_context", "clear_repl_context", "list_sessions",
                "destroy_session", "import_files", "export_files", "pause_session",
                "resume_session", "snapshot_session", "fork_snapshot", "list_snapshots", "stop_session"}
    check("tools listed", expected <= names, sorted(names))
    from jsonschema import Draft202012Validator  # in the tools venv (schemathesis needs it)
    for t in tools:
        schema = t.input_schema
        Draft202012Validator.check_schema(schema)  # raises on an invalid schema
        check(f"schema {t.name}", schema.get("type") == "object" and t.description
              and all(p.get("description") for p in schema.get("properties", {}).values()), schema)

    r = await session.call_tool("create_session", {"runtime": "python", "dependencies": ["no-such-package-xyz", "pandas"]})
    check("a missing dependency is named", r.is_error and "missing_dependencies: no-such-package-xyz not" in text_of(r), text_of(r))
    r = await session.call_tool("create_session", {"runtime": "python", "dependencies": ["matplotlib", "pandas"]})
    check("create_session", not r.is_error, text_of(r))
    sid = text_of(r).split("session_id: ")[1].split()[0]

    r = await session.call_tool("execute_code", {"session_id": sid, "code": "x = 21\nprint('set')"})
    check("first execution", not r.is_error and "set" in text_of(r), text_of(r))
    r = await session.call_tool("execute_python", {"session_id": sid, "code": "x * 2"})
    check("state kept", "42" in text_of(r), text_of(r))

    r = await session.call_tool("set_repl_context", {"session_id": sid, "variables": {"greeting": "hi", "n": [1, 2]}})
    check("set variables", not r.is_error, text_of(r))
    r = await session.call_tool("get_repl_context", {"session_id": sid, "names": ["greeting", "n", "x"]})
    got = json.loads(text_of(r))
    check("get variables", got["values"] == {"greeting": "hi", "n": [1, 2], "x": 21}, got)
    r = await session.call_tool("clear_repl_context", {"session_id": sid, "names": ["greeting"]})
    check("clear variables", not r.is_error, text_of(r))
    r = await session.call_tool("get_repl_context", {"session_id": sid, "names": ["greeting"]})
    check("cleared", json.loads(text_of(r))["missing"] == ["greeting"], text_of(r))

    r = await session.call_tool("execute_terminal", {"session_id": sid, "command": "echo from-shell; exit 3"})
    check("terminal", "from-shell" in text_of(r) and "exit_code: 3" in text_of(r), text_of(r))

    payload = base64.b64encode(bytes(range(256))).decode()
    r = await session.call_tool("import_files", {"session_id": sid, "files": [
        {"path": "notes.txt", "text": "hello file"},
        {"path": "/workspace/blob.bin", "base64": payload}]})
    check("import", not r.is_error, text_of(r))
    r = await session.call_tool("execute_terminal", {"session_id": sid, "command": "cat notes.txt; wc -c < blob.bin"})
    check("imported contents", "hello file" in text_of(r) and "256" in text_of(r), text_of(r))
    host_file = os.environ.get("SANDCELL_TEST_HOST_FILE")
    if host_file:
        # From the server's host: inside the import allow-list, and refused outside it.
        r = await session.call_tool("import_files", {"session_id": sid, "files": [
            {"path": "from-host.txt", "host_path": host_file}]})
        check("import a host path", not r.is_error, text_of(r))
        r = await session.call_tool("execute_terminal", {"session_id": sid, "command": "cat from-host.txt"})
        check("host file arrived", "from the host" in text_of(r), text_of(r))
        r = await session.call_tool("import_files", {"session_id": sid, "files": [
            {"path": "passwd", "host_path": "/etc/passwd"}]})
        check("a host path outside the allow-list is refused", r.is_error and "permission_denied" in text_of(r), text_of(r))
    r = r_export = await session.call_tool("export_files", {"session_id": sid, "paths": ["notes.txt"], "include_content": True})
    check("export", not r.is_error and "hello file" in text_of(r) and "ex-" in text_of(r), text_of(r))
    if HTTP:
        # Served by the daemon: a signed link that needs no key.
        export = json.loads(r.content[0].text)
        import urllib.request
        with urllib.request.urlopen(export["download_url"]) as resp:
            check("download link", resp.read() == b"hello file", export["download_url"])

    code = ("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
    r = await session.call_tool("execute_python", {"session_id": sid, "code": code})
    images = [c for c in r.content if getattr(c, "type", "") == "image"]
    check("plot as image content", images and images[0].mime_type == "image/png"
          and base64.b64decode(images[0].data)[:8] == b"\x89PNG\r\n\x1a\n", text_of(r))

    r = await session.call_tool("execute_python", {"session_id": sid, "code": "print('y' * 60000)"})
    check("long output truncated", "truncated" in text_of(r), text_of(r)[-200:])

    r = await session.call_tool("list_sessions", {})
    check("list sessions", sid in text_of(r), text_of(r))

    # Another session takes the export; pause, resume, snapshot and fork.
    export_id = json.loads(r_export.content[0].text)["id"]
    r = await session.call_tool("execute_python", {"code": "import os; os.getcwd()"})
    check("execute_python makes a session", "session_id: sb-" in text_of(r) and "/workspace" in text_of(r), text_of(r))
    other = text_of(r).split("session_id: ")[1].split()[0]
    r = await session.call_tool("execute_python", {"code": "y = 6 * 7"})
    r = await session.call_tool("execute_terminal", {"command": "echo terminal-default"})
    check("calls without a session use the default one", "session_id" not in text_of(r)
          and "terminal-default" in text_of(r), text_of(r))
    r = await session.call_tool("execute_code", {"code": "y", "language": "python"})
    check("the default session keeps its state", "42" in text_of(r), text_of(r))
    r = await session.call_tool("import_files", {"session_id": other, "files": [{"path": "copy.txt", "export_id": export_id}]})
    check("import another session's export", not r.is_error, text_of(r))
    r = await session.call_tool("execute_terminal", {"session_id": other, "command": "cat copy.txt"})
    check("export arrived", "hello file" in text_of(r), text_of(r))
    r = await session.call_tool("pause_session", {"session_id": other})
    check("pause", not r.is_error and "paused" in text_of(r), text_of(r))
    r = await session.call_tool("resume_session", {"session_id": other})
    check("resume", not r.is_error and "running" in text_of(r), text_of(r))
    r = await session.call_tool("execute_python", {"session_id": other, "code": "kept = 'across a fork'"})
    r = await session.call_tool("snapshot_session", {"session_id": other, "name": "before-fork",
                                                     "tags": {"stage": "1"}})
    check("snapshot", not r.is_error and "sn-" in text_of(r)
          and json.loads(text_of(r))["tags"] == {"stage": "1"}, text_of(r))
    snap = json.loads(text_of(r))["id"]
    r = await session.call_tool("list_snapshots", {"session_id": other})
    check("list snapshots", snap in text_of(r), text_of(r))
    r = await session.call_tool("fork_snapshot", {"snapshot_id": snap, "count": 2})
    check("fork", not r.is_error, text_of(r))
    forks = [s["sandbox"]["id"] for s in json.loads(text_of(r))["sandboxes"]]
    check("two forks", len(forks) == 2, forks)
    for f in forks:
        r = await session.call_tool("execute_python", {"session_id": f, "code": "kept"})
        check("fork has the state", "across a fork" in text_of(r), text_of(r))
        await session.call_tool("destroy_session", {"session_id": f})
    r = await session.call_tool("stop_session", {"session_id": other})
    check("stop_session", not r.is_error and "destroyed" in text_of(r), text_of(r))
    if os.environ.get("SANDCELL_TEST_CRIU"):
        # The server has a working CRIU: a checkpointable session's snapshot keeps processes.
        r = await session.call_tool("create_session", {"checkpointable": True})
        check("checkpointable session", not r.is_error, text_of(r))
        cid = text_of(r).split("session_id: ")[1].split()[0]
        r = await session.call_tool("snapshot_session", {"session_id": cid})
        check("process-fidelity snapshot", '"fidelity":"process"' in text_of(r), text_of(r)[:300])
        await session.call_tool("destroy_session", {"session_id": cid})
    return sid


async def reconnected(session, sid, new_connection):
    if new_connection:
        await session.initialize()
    r = await session.call_tool("execute_python", {"session_id": sid, "code": "x"})
    what = "reconnect to a session by id" if new_connection else "same session later"
    check(what, "21" in text_of(r), text_of(r))
    # Errors: tool errors with clear messages, and the server keeps serving.
    r = await session.call_tool("execute_code", {"session_id": sid})
    check("missing argument is a tool error", r.is_error and "code" in text_of(r), text_of(r))
    r = await session.call_tool("execute_code", {"session_id": "sb-doesnotexist", "code": "1"})
    check("unknown session is a tool error", r.is_error and "not_found" in text_of(r), text_of(r))
    r = await session.call_tool("create_session", {"memory_mb": "lots"})
    check("wrong type is a tool error", r.is_error and "invalid_argument" in text_of(r), text_of(r))

    r = await session.call_tool("destroy_session", {"session_id": sid})
    check("destroy", not r.is_error, text_of(r))
    r = await session.call_tool("execute_code", {"session_id": sid, "code": "1"})
    check("destroyed session refuses", r.is_error, text_of(r))

HTTP = sys.argv[1] == "http"


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        # Embedded: sessions live as long as this one server process.
        params = StdioServerParameters(command=sys.argv[2], args=["mcp", "--home", sys.argv[3]])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                sid = await scenario(session)
                await reconnected(session, sid, False)
    elif mode == "stdio-daemon":
        params = StdioServerParameters(command=sys.argv[2], args=[
            "mcp", "--daemon", sys.argv[3], "--api-key", sys.argv[4]])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                sid = await scenario(session)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await reconnected(session, sid, True)
    else:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        client = httpx2.AsyncClient(headers={"X-API-Key": sys.argv[3]}, timeout=60)
        async with streamable_http_client(sys.argv[2], http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                sid = await scenario(session)
        async with streamable_http_client(sys.argv[2], http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await reconnected(session, sid, True)
    print(json.dumps({"done": True}), flush=True)


asyncio.run(main())
