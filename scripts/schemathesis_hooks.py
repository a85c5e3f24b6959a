"""Schemathesis hooks for scripts/schemathesis.sh: operations that end a resource get a live one.

A fixed id in the config would be ended by the first request and answer 404 to every later
one, so before each call to such an operation the id in its path is replaced by a resource of
its own kind that is still alive, made anew when the previous one is gone (pause and resume
get such a sandbox too). A rename gets a file to move. The daemon's address, the key and the sandbox the run works in come from the
environment the script sets.
"""

import ast
import os
import subprocess
import threading

import requests
import schemathesis

# Hypothesis parses whole source files for the repr of its lambdas. CPython 3.11 keeps the
# AST converter's depth count per interpreter, not per thread, so two workers parsing at once
# (a garbage collection inside one lets the other run) overwrite each other's count: a
# SystemError, "AST constructor recursion depth mismatch (before=66, after=58)", where `after`
# is the other thread's starting depth. It failed CI twice; parses now take turns.
_AST_LOCK = threading.RLock()
_ast_parse = ast.parse


def _parse_in_turn(*args, **kwargs):
    with _AST_LOCK:
        return _ast_parse(*args, **kwargs)


ast.parse = _parse_in_turn

BASE = os.environ["SANDCELL_FUZZ_BASE"]
SESSION = requests.Session()
SESSION.headers["X-API-Key"] = os.environ["SANDCELL_FUZZ_KEY"]
SANDBOX = os.environ["SANDCELL_FUZZ_SANDBOX"]
LOCK = threading.Lock()
# Downloads seen (see before_call).
DOWNLOADS = {"count": 0}
CURRENT: dict[str, object] = {}


def call(method, path, **kwargs):
    return SESSION.request(method, BASE + path, timeout=60, **kwargs)


def make_sandbox():
    r = call("POST", "/v1/sandboxes", json={})
    if r.status_code == 429:
        # Generated creates and forks fill the cap: end one of theirs to make room.
        listed = call("GET", "/v1/sandboxes").json()["items"]
        for sb in listed:
            if sb["id"] not in (SANDBOX, CURRENT.get("sandbox")):
                call("DELETE", f"/v1/sandboxes/{sb['id']}")
                break
        r = call("POST", "/v1/sandboxes", json={})
    return r.json()["id"] if r.ok else None


def make_export():
    # Generated removes may have taken the file away.
    path = "/workspace/seed.txt"
    call("PUT", f"/v1/sandboxes/{SANDBOX}/files/content", params={"path": path}, data=b"seed")
    r = call("POST", f"/v1/sandboxes/{SANDBOX}/exports", json={"path": path})
    return r.json()["id"] if r.ok else None


def sandbox_alive(sid):
    r = call("GET", f"/v1/sandboxes/{sid}")
    return r.ok and r.json()["state"] in ("running", "paused")


def context_alive(cid):
    r = call("GET", f"/v1/sandboxes/{SANDBOX}/contexts")
    return r.ok and any(c["id"] == cid and c["ended_at"] is None for c in r.json())


def process_alive(pid):
    r = call("GET", f"/v1/sandboxes/{SANDBOX}/processes")
    return r.ok and any(p["pid"] == pid and p["state"] != "X" for p in r.json()["processes"])


def key_alive(kid):
    r = call("GET", "/v1/keys")
    return r.ok and any(k["id"] == kid and k["revoked_at"] is None for k in r.json()["keys"])


def made(field):
    def read(r):
        return r.json()[field] if r.ok else None

    return read


def make_template():
    """A template of its own: the seed's root filesystem imported under a new name (called
    by `live`, which holds LOCK)."""
    TEMPLATES["count"] += 1
    name = f"victim-{TEMPLATES['count']}:v1"
    done = subprocess.run(
        [os.environ["SANDCELL_FUZZ_BIN"], "image", "import", os.environ["SANDCELL_FUZZ_ROOTFS"],
         "--as", name, "--home", os.environ["SANDCELL_FUZZ_HOME"]],
        capture_output=True,
    )
    return name if done.returncode == 0 else None


TEMPLATES = {"count": 0}
VOLUMES = {"count": 0}


def make_volume():
    """A volume of its own (called by `live`, which holds LOCK)."""
    VOLUMES["count"] += 1
    return made("name")(call("POST", "/v1/volumes", json={"name": f"victim-{VOLUMES['count']}"}))


# kind: (is it still there, make a new one)
KINDS = {
    "template": (lambda name: call("GET", f"/v1/templates/{name}").ok, make_template),
    "volume": (lambda name: call("GET", f"/v1/volumes/{name}").ok, make_volume),
    "sandbox": (sandbox_alive, make_sandbox),
    "context": (
        context_alive,
        lambda: made("id")(
            call("POST", f"/v1/sandboxes/{SANDBOX}/contexts", json={"language": "python"})
        ),
    ),
    "sleeper": (
        process_alive,
        lambda: made("pid")(
            call("POST", f"/v1/sandboxes/{SANDBOX}/processes", json={"cmd": "sleep 3600"})
        ),
    ),
    "terminal": (
        process_alive,
        lambda: made("pid")(
            call(
                "POST",
                f"/v1/sandboxes/{SANDBOX}/processes",
                json={"cmd": "cat", "stdin": True, "pty": {"rows": 24, "cols": 80}},
            )
        ),
    ),
    "export": (lambda eid: call("GET", f"/v1/exports/{eid}").ok, make_export),
    "snapshot": (
        lambda sid: call("GET", f"/v1/snapshots/{sid}").ok,
        lambda: made("id")(
            call("POST", f"/v1/sandboxes/{SANDBOX}/snapshots", json={"name": "victim"})
        ),
    ),
    "key": (key_alive, lambda: made("id")(call("POST", "/v1/keys", json={"name": "victim"}))),
    "sandbox_memory": (
        lambda mid: call("GET", f"/v1/sandboxes/{SANDBOX}/memories/{mid}").ok,
        lambda: made("id")(
            call("POST", f"/v1/sandboxes/{SANDBOX}/memories", json={"text": "victim"})
        ),
    ),
    "owner_memory": (
        lambda mid: call("GET", f"/v1/memories/{mid}").ok,
        lambda: made("id")(call("POST", "/v1/memories", json={"text": "victim"})),
    ),
}

# operation: (path parameter, kind of resource it ends or may end). Pause and resume go to
# a sandbox of their own too: pausing the shared one would freeze the agent under requests
# the other worker has in flight, which then wait (past the request timeout) for a resume.
ENDS = {
    "DELETE /v1/sandboxes/{id}": ("id", "sandbox"),
    "POST /v1/sandboxes/{id}/timeout": ("id", "sandbox"),
    "POST /v1/sandboxes/{id}/pause": ("id", "sandbox"),
    "POST /v1/sandboxes/{id}/resume": ("id", "sandbox"),
    "DELETE /v1/sandboxes/{id}/contexts/{context}": ("context", "context"),
    "DELETE /v1/sandboxes/{id}/processes/{pid}": ("pid", "sleeper"),
    "POST /v1/sandboxes/{id}/processes/{pid}/stdin": ("pid", "terminal"),
    "POST /v1/sandboxes/{id}/processes/{pid}/resize": ("pid", "terminal"),
    "DELETE /v1/exports/{export_id}": ("export_id", "export"),
    "DELETE /v1/snapshots/{snapshot_id}": ("snapshot_id", "snapshot"),
    "DELETE /v1/keys/{key_id}": ("key_id", "key"),
    "DELETE /v1/sandboxes/{id}/memories/{memory_id}": ("memory_id", "sandbox_memory"),
    "DELETE /v1/memories/{memory_id}": ("memory_id", "owner_memory"),
    "DELETE /v1/templates/{name}": ("name", "template"),
    "DELETE /v1/volumes/{volume}": ("volume", "volume"),
}


def live(kind):
    alive, make = KINDS[kind]
    with LOCK:
        current = CURRENT.get(kind)
        if current is None or not alive(current):
            current = make()
            CURRENT[kind] = current
        return current


@schemathesis.hook
def before_call(context, case, kwargs):
    label = f"{case.operation.method.upper()} {case.operation.path}"
    if label in ENDS and case.path_parameters:
        name, kind = ENDS[label]
        value = live(kind)
        if value is not None:
            case.path_parameters[name] = value
    elif label == "GET /v1/sandboxes/{id}/files/content" and isinstance(case.query, dict):
        # A generated path names no file: every other call, one is made there first, so the
        # download itself is reached (the others keep the 404 path).
        DOWNLOADS["count"] += 1
        path = case.query.get("path")
        if DOWNLOADS["count"] % 2 and isinstance(path, str) and path:
            call("PUT", f"/v1/sandboxes/{SANDBOX}/files/content", params={"path": path}, data=b"x")
    elif label == "POST /v1/sandboxes/{id}/files/rename" and isinstance(case.body, dict):
        source = case.body.get("from")
        if isinstance(source, str) and source:
            call("PUT", f"/v1/sandboxes/{SANDBOX}/files/content", params={"path": source}, data=b"x")
