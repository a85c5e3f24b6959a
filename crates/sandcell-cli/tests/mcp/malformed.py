"""Malformed JSON-RPC to Sandcell's MCP server: each bad frame gets a JSON-RPC error (or is
dropped when it cannot be answered), and the server keeps serving the good ones after.

Usage: malformed.py stdio <sandcell binary> <home>
       malformed.py http <url of /mcp> <api key>
"""
import json
import subprocess
import sys
import urllib.error
import urllib.request

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "malformed-test", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
BAD = [
    ("not json", b"{this is not json"),
    ("unknown method", json.dumps({"jsonrpc": "2.0", "id": 3, "method": "no/such/method"}).encode()),
    ("wrong params type", json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": 5}).encode()),
    ("unknown tool", json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                 "params": {"name": "no_such_tool", "arguments": {}}}).encode()),
]


def check(name, ok, detail=""):
    print(json.dumps({"check": name, "ok": bool(ok), "detail": str(detail)[:500]}), flush=True)
    if not ok:
        raise SystemExit(f"check failed: {name}: {detail}")


def stdio(binary, home):
    p = subprocess.Popen([binary, "mcp", "--home", home], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(raw):
        p.stdin.write(raw + b"\n")
        p.stdin.flush()

    def answer(want_id):
        while True:
            line = p.stdout.readline()
            if not line:
                raise SystemExit("the server closed stdout")
            msg = json.loads(line)
            if msg.get("id") == want_id or (want_id is None and "error" in msg):
                return msg

    send(json.dumps(INIT).encode())
    check("initialize", "result" in answer(1))
    send(json.dumps(INITIALIZED).encode())
    for name, raw in BAD:
        send(raw)
        want = json.loads(raw).get("id") if raw.startswith(b"{\"") else None
        if want is None:
            # An unparsable line has no id: the error names none, and the server goes on.
            msg = answer(None)
            check(f"{name}: parse error", msg["error"]["code"] == -32700 and msg["id"] is None, msg)
            send(json.dumps(LIST).encode())
            msg = answer(9)
            check(f"{name}: still serving", "result" in msg, msg)
            continue
        msg = answer(want)
        check(f"{name}: JSON-RPC error", "error" in msg or msg.get("result", {}).get("isError"), msg)
    send(json.dumps(LIST).encode())
    check("tools/list after the bad frames", len(answer(9)["result"]["tools"]) >= 17)
    p.stdin.close()
    p.wait(timeout=30)


def http(url, key):
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "x-api-key": key, "mcp-protocol-version": "2025-06-18"}

    def post(raw, extra=None):
        req = urllib.request.Request(url, data=raw, headers={**headers, **(extra or {})}, method="POST")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def messages(body):
        out = []
        for line in body.splitlines():
            if line.startswith("data:") and line[5:].strip():
                out.append(json.loads(line[5:]))
        return out or ([json.loads(body)] if body.strip().startswith("{") else [])

    status, h, body = post(json.dumps(INIT).encode())
    check("initialize", status == 200, (status, body))
    session = {k.lower(): v for k, v in h.items()}.get("mcp-session-id")
    extra = {"mcp-session-id": session} if session else {}
    post(json.dumps(INITIALIZED).encode(), extra)
    for name, raw in BAD:
        status, _, body = post(raw, extra)
        msgs = messages(body)
        ok = any("error" in m or m.get("result", {}).get("isError") for m in msgs) or status in (400, 404, 422)
        check(f"{name}: error answer", ok, (status, body))
    status, _, body = post(json.dumps(LIST).encode(), extra)
    tools = [m for m in messages(body) if m.get("id") == 9]
    check("tools/list after the bad frames", status == 200 and len(tools[0]["result"]["tools"]) >= 17, body[:300])
    status, _, body = post(json.dumps(LIST).encode(), {"x-api-key": "sc_wrong"})
    check("a wrong key is refused", status == 401, (status, body))


if sys.argv[1] == "stdio":
    stdio(sys.argv[2], sys.argv[3])
else:
    http(sys.argv[2], sys.argv[3])
print(json.dumps({"done": True}))
