"""The argument shapes other agent setups send, through the official MCP client: dependencies
as a map of name to version, export_files with files=[{"source": …}], import_files with
{source, destination} and {session_id, path, destination} entries; and the errors of shapes
that fit none.

Usage: shapes.py http <url of /mcp> <api key>   (SANDCELL_TEST_HOST_FILE: a host file inside
the daemon's import allow-list, holding "from the host\\n")
Prints one JSON line per check; exits non-zero on the first failure.
"""
import asyncio
import json
import os
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from checks import check, text_of


def session_id(result):
    return text_of(result).split("session_id: ")[1].split()[0]


def resolve(schema, node):
    ref = node.get("$ref")
    return schema["$defs"][ref.rsplit("/", 1)[1]] if ref else node


async def scenario(s):
    await s.initialize()
    tools = {t.name: t.input_schema for t in (await s.list_tools()).tools}
    # What a client sees: both shapes of dependencies, three of an import entry, two of export.
    create = tools["create_session"]
    deps = [resolve(create, n) for n in create["properties"]["dependencies"]["anyOf"]]
    kinds = sorted(k.get("type") for d in deps for k in d.get("anyOf", [d]) if k.get("type") != "null")
    check("schema: dependencies as a list or a map", kinds == ["array", "object"], deps)
    imp = tools["import_files"]
    entry = resolve(imp, imp["properties"]["files"]["items"])
    shapes = sorted(sorted(resolve(imp, v)["required"]) for v in entry["anyOf"])
    check("schema: three import shapes", shapes == [["destination", "path", "session_id"],
                                                    ["destination", "source"], ["path"]], shapes)
    exp = tools["export_files"]
    check("schema: export paths or files", exp["required"] == ["session_id"]
          and {"paths", "files"} <= set(exp["properties"]), exp)

    # Dependencies as a map: "" is any version, a version must be the installed one.
    r = await s.call_tool("create_session", {"runtime": "python",
                                             "dependencies": {"pandas": "", "matplotlib": ""}})
    check("create_session with a map of dependencies", not r.is_error, text_of(r))
    a = session_id(r)
    r = await s.call_tool("execute_code", {"session_id": a, "code":
                                           "import importlib.metadata as m\nprint(m.version('pandas'))"})
    version = text_of(r).split("stdout:\n")[-1].split()[0]
    check("pandas has a version", version[:1].isdigit(), text_of(r))
    r = await s.call_tool("execute_code", {"session_id": a, "code": "sorted(k for k in globals() if 'sandcell' in k)"})
    check("the dependency check leaves nothing in the namespace", "result:\n[]" in text_of(r), text_of(r))
    r = await s.call_tool("create_session", {"dependencies": {"pandas": version, "matplotlib": ""}})
    check("a pinned version that is installed passes", not r.is_error, text_of(r))
    await s.call_tool("destroy_session", {"session_id": session_id(r)})
    r = await s.call_tool("create_session", {"dependencies": {"pandas": "==" + version}})
    check("a pin written ==version passes", not r.is_error, text_of(r))
    await s.call_tool("destroy_session", {"session_id": session_id(r)})
    r = await s.call_tool("create_session", {"dependencies": {"pandas": "0.0.1", "matplotlib": "",
                                                              "no-such-package-xyz": ""}})
    check("another version fails and is named",
          r.is_error and "missing_dependencies: no-such-package-xyz, pandas==0.0.1 (installed: "
          f"{version})" in text_of(r), text_of(r))
    r = await s.call_tool("create_session", {"dependencies": {"pandas": ">=1.0"}})
    check("a range is refused", r.is_error and text_of(r).startswith("invalid_argument: pandas: \">=1.0\" is a range"), text_of(r))
    r = await s.call_tool("create_session", {"dependencies": "pandas"})
    check("a string is neither shape", r.is_error and "invalid_argument" in text_of(r)
          and "a list of package names, or a map of package name to version" in text_of(r), text_of(r))
    r = await s.call_tool("create_session", {"runtime": "bash", "dependencies": {"bash": "5"}})
    check("bash commands have no version to pin", r.is_error and "bash dependencies are commands" in text_of(r), text_of(r))
    r = await s.call_tool("create_session", {"runtime": "bash", "dependencies": {"bash": "", "no-such-cmd-xyz": ""}})
    check("bash commands by map", r.is_error and "missing_dependencies: no-such-cmd-xyz not" in text_of(r), text_of(r))

    # Node: a module's version from its package.json (found even when its exports hide it),
    # in a session restored from a snapshot (which takes the snapshot's runtime).
    r = await s.call_tool("create_session", {"runtime": "node"})
    n = session_id(r)
    r = await s.call_tool("import_files", {"session_id": n, "files": [
        {"path": "node_modules/@acme/foo/package.json", "text": json.dumps(
            {"name": "@acme/foo", "version": "1.2.3", "exports": {".": "./lib/index.js"}})},
        {"path": "node_modules/@acme/foo/lib/index.js", "text": "module.exports = 1"}]})
    check("a node module written", not r.is_error, text_of(r))
    r = await s.call_tool("snapshot_session", {"session_id": n})
    snap = json.loads(text_of(r))["id"]
    await s.call_tool("destroy_session", {"session_id": n})
    r = await s.call_tool("create_session", {"snapshot_id": snap, "dependencies": {"@acme/foo": "1.2.3"}})
    check("node: the pinned version passes in a restored session", not r.is_error and "restored" in text_of(r), text_of(r))
    await s.call_tool("destroy_session", {"session_id": session_id(r)})
    r = await s.call_tool("create_session", {"snapshot_id": snap, "dependencies": {"@acme/foo": "2.0.0", "fs": ""}})
    check("node: another version is named", r.is_error and
          "missing_dependencies: @acme/foo==2.0.0 (installed: 1.2.3) not installed for node" in text_of(r), text_of(r))

    # export_files with files=[{"source": …}].
    r = await s.call_tool("import_files", {"session_id": a, "files": [{"path": "data.csv", "text": "a,b\n1,2\n"}]})
    check("file written", not r.is_error, text_of(r))
    r = await s.call_tool("export_files", {"session_id": a, "files": [{"source": "data.csv"}], "include_content": True})
    check("export_files with files=[{source}]", not r.is_error and '"path":"/workspace/data.csv"' in text_of(r)
          and "a,b\n1,2\n" in text_of(r), text_of(r))
    # Changed after the export: another session importing it gets the exported copy.
    await s.call_tool("execute_terminal", {"session_id": a, "command": "echo changed > data.csv; echo live > live.txt"})

    r = await s.call_tool("create_session", {})
    b = session_id(r)
    r = await s.call_tool("import_files", {"session_id": b, "files": [
        {"session_id": a, "path": "data.csv", "destination": "in/data.csv"},
        {"session_id": a, "path": "/workspace/live.txt", "destination": "/tmp/live.txt"}]})
    check("import_files with {session_id, path, destination}", not r.is_error, text_of(r))
    r = await s.call_tool("execute_terminal", {"session_id": b, "command": "cat in/data.csv; cat /tmp/live.txt"})
    check("the exported copy and a live file arrived", text_of(r).count("a,b\n1,2\nlive\n") == 1, text_of(r))
    # Exported again: the newest copy is the one taken.
    r = await s.call_tool("export_files", {"session_id": a, "paths": ["data.csv"]})
    check("exported again", not r.is_error, text_of(r))
    r = await s.call_tool("import_files", {"session_id": b, "files": [
        {"session_id": a, "path": "./data.csv", "destination": "newest.csv"}]})
    r = await s.call_tool("execute_terminal", {"session_id": b, "command": "cat newest.csv"})
    check("the newest export arrived", "stdout:\nchanged\n" in text_of(r), text_of(r))

    host_file = os.environ["SANDCELL_TEST_HOST_FILE"]
    r = await s.call_tool("import_files", {"session_id": b, "files": [{"source": host_file, "destination": "host.txt"}]})
    check("import_files with {source, destination}", not r.is_error, text_of(r))
    r = await s.call_tool("execute_terminal", {"session_id": b, "command": "cat host.txt"})
    check("the host file arrived", "from the host" in text_of(r), text_of(r))
    r = await s.call_tool("import_files", {"session_id": b, "files": [{"source": "/etc/passwd", "destination": "p"}]})
    check("a source outside the allow-list is refused", r.is_error and "permission_denied" in text_of(r), text_of(r))

    # The exporting session is gone: its export is still there to import.
    await s.call_tool("destroy_session", {"session_id": a})
    r = await s.call_tool("import_files", {"session_id": b, "files": [
        {"session_id": a, "path": "data.csv", "destination": "again.csv"}]})
    check("import from an ended session's export", not r.is_error, text_of(r))
    r = await s.call_tool("execute_terminal", {"session_id": b, "command": "cat again.csv"})
    check("its copy arrived", "stdout:\nchanged\n" in text_of(r), text_of(r))
    r = await s.call_tool("import_files", {"session_id": b, "files": [
        {"session_id": a, "path": "live.txt", "destination": "x"}]})
    check("a file an ended session never exported is an API error", r.is_error and "sandbox_gone" in text_of(r), text_of(r))

    # Shapes that fit none: tool errors saying what is wrong.
    bad = [
        ({"files": [{}]}, "files[0]: an empty file entry"),
        ({"files": [{"path": "x"}]}, "give exactly one of text, base64, host_path, export_id (got none)"),
        ({"files": [{"path": "x", "text": "t"}, {"source": host_file}]}, "files[1]: a file given as {source, destination}: missing field `destination`"),
        ({"files": [{"destination": "x", "text": "t"}]}, "destination goes with source"),
        ({"files": [{"session_id": a, "path": "x", "destination": "y", "text": "t"}]}, "unknown field `text`"),
    ]
    for args, wanted in bad:
        r = await s.call_tool("import_files", {"session_id": b, **args})
        check(f"import error: {wanted}", r.is_error and text_of(r).startswith("invalid_argument:") and wanted in text_of(r), text_of(r))
    r = await s.call_tool("export_files", {"session_id": b, "files": []})
    check("export of nothing", r.is_error and "invalid_argument: nothing to export" in text_of(r), text_of(r))
    r = await s.call_tool("export_files", {"session_id": b, "files": [{"path": "x"}]})
    check("export entry without source", r.is_error and "unknown field `path`, expected `source`" in text_of(r), text_of(r))
    r = await s.call_tool("export_files", {"session_id": b, "paths": ["host.txt"]})
    check("export by paths as before", not r.is_error and '"path":"/workspace/host.txt"' in text_of(r), text_of(r))

    r = await s.call_tool("destroy_session", {"session_id": b})
    check("done with the sessions", not r.is_error, text_of(r))


async def main():
    if sys.argv[1] != "http":
        raise SystemExit("usage: shapes.py http <url of /mcp> <api key>")
    client = httpx2.AsyncClient(headers={"X-API-Key": sys.argv[3]}, timeout=60)
    async with streamable_http_client(sys.argv[2], http_client=client) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await scenario(session)
    print(json.dumps({"done": True}), flush=True)


asyncio.run(main())
