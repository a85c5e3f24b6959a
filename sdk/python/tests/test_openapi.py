"""The SDK against the committed OpenAPI document (docs/openapi.json, generated from the server;
$SANDCELL_OPENAPI names another copy, such as a newer daemon's /openapi.json), with no
daemon: every request `_api` builds goes to a path and method the document has, with
query parameters it lists and a body its request schema accepts (the server refuses unknown
keys); every answer is parsed from a sample made from its response schema, and each key the
SDK reads must be a property of that schema; each result model's fields have types compatible
with the schema's properties, and each required property is read or deliberately ignored."""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import json
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandcell import _api, _models
from sandcell._models import AutoSnapshot
from sandcell.errors import error_from_body

DOC_PATH = Path(
    os.environ.get("SANDCELL_OPENAPI") or Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
)
DOC: dict[str, Any] = json.loads(DOC_PATH.read_text())
SCHEMAS: dict[str, Any] = DOC["components"]["schemas"]


@pytest.fixture(autouse=True)
def sandcell_env() -> None:
    """Overrides conftest's fixture of the same name: these checks need no daemon."""


# --- the document's schemas ---------------------------------------------------------------


def _ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with `$ref` followed, `allOf` merged and a `oneOf [X, null]` made a nullable X.
    A part of an `allOf` that has several shapes (a `oneOf` of objects: a build event of any
    kind, numbered) brings the properties of every shape, none of them required (which are
    depends on the shape)."""
    name = _ref_name(schema)
    if name is not None:
        return resolve(SCHEMAS[name])
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            r = resolve(part)
            for shape in r.get("oneOf", []):
                merged["properties"].update(resolve(shape).get("properties", {}))
            merged["properties"].update(r.get("properties", {}))
            merged["required"] += r.get("required", [])
        return merged
    if "oneOf" in schema:
        branches = [b for b in schema["oneOf"] if b.get("type") != "null"]
        if len(branches) == 1 and len(branches) < len(schema["oneOf"]):
            inner = dict(resolve(branches[0]))
            inner["type"] = [*_types(inner), "null"]
            return inner
    return schema


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else list(t)


def json_types(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types a value of `schema` may have (None: any)."""
    ts = _types(resolve(schema))
    return set(ts) if ts else None


def properties(name: str) -> tuple[dict[str, Any], set[str]]:
    r = resolve(SCHEMAS[name])
    return r.get("properties", {}), set(r.get("required", []))


# --- samples of answers, recording what the SDK reads ---------------------------------------

@dataclass
class Read:
    """The keys the SDK looked up in objects of one schema, and the properties it has."""

    properties: set[str]
    keys: set[str] = field(default_factory=set)


Reads = dict[str, Read]


class Recording(dict[str, Any]):
    """A JSON object of schema `label` that records each key looked up in it."""

    def __init__(self, label: str, props: set[str], reads: Reads, items: dict[str, Any]) -> None:
        super().__init__(items)
        self.read = reads.setdefault(label, Read(props))

    def _note(self, key: object) -> None:
        self.read.keys.add(str(key))

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)


def _schema_name(schema: dict[str, Any]) -> str | None:
    """The component `schema` refers to, directly or as the one non-null branch of a `oneOf`."""
    branches = [b for b in schema.get("oneOf", []) if b.get("type") != "null"]
    return _ref_name(branches[0] if len(branches) == 1 else schema)


def sample(schema: dict[str, Any], reads: Reads, *, full: bool, label: str = "") -> Any:
    """A value of `schema`: `full` gives every property a value, else only the required ones
    (and nullable ones are null)."""
    label = _schema_name(schema) or label
    r = resolve(schema)
    ts = _types(r)
    if "null" in ts and not full:
        return None
    shapes = [b for b in r.get("oneOf", []) if b.get("type") != "null"]
    if shapes and not ts:
        # A value of several shapes (a network policy: a name or {"allow": [...]}): the
        # richest one with every property, the first one else.
        return sample(shapes[-1] if full else shapes[0], reads, full=full, label=label)
    if "enum" in r:
        return r["enum"][0]
    if "properties" in r:
        required = set(r.get("required", []))
        items = {
            k: sample(p, reads, full=full, label=f"{label}.{k}")
            for k, p in r["properties"].items()
            if full or k in required
        }
        return Recording(label, set(r["properties"]), reads, items)
    for t in ts:
        if t == "string":
            return "2026-01-01T00:00:00Z"
        if t == "integer":
            return 7
        if t == "number":
            return 1.5
        if t == "boolean":
            return True
        if t == "array":
            return [sample(r["items"], reads, full=full, label=label)] if "items" in r else []
        if t == "object":
            extra = r.get("additionalProperties")
            if isinstance(extra, dict):
                return {"key": sample(extra, reads, full=full, label=label)}
            return {}
    return {}


class FakeResponse:
    """What a `Call`'s parser reads of an answer."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.content = b""

    def json(self) -> Any:
        return self.body


# --- the requests the SDK sends ------------------------------------------------------------


def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)))


TEMPLATES = sorted(DOC["paths"], key=lambda t: -len(re.sub(r"\{[^}]+\}", "", t)))


def operation(method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The document's template and operation for a concrete path."""
    for template in TEMPLATES:
        if _template_regex(template).fullmatch(path):
            ops = DOC["paths"][template]
            assert method.lower() in ops, f"{method} {path}: the document has {template} but not {method}"
            return template, ops[method.lower()]
    raise AssertionError(f"{method} {path}: no path of the document matches")


def validate(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    """Why `value` does not fit `schema` (empty: it fits)."""
    if "oneOf" in schema and _ref_name(schema) is None:
        tries = [validate(value, b, where) for b in schema["oneOf"]]
        return [] if any(not t for t in tries) else [e for t in tries for e in t]
    r = resolve(schema)
    if "oneOf" in r and r is not schema:
        # A reference to a schema of several shapes.
        return validate(value, r, where)
    ts = set(_types(r))
    actual = _json_type(value)
    if ts and actual not in ts and not (actual == "integer" and "number" in ts):
        return [f"{where}: sent a {actual}, the schema wants {sorted(ts)}"]
    if "enum" in r and value not in r["enum"]:
        return [f"{where}: {value!r} is not one of {r['enum']}"]
    errors: list[str] = []
    if isinstance(value, dict):
        props = r.get("properties", {})
        extra = r.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                errors += validate(v, props[k], f"{where}.{k}")
            elif extra is False:
                errors.append(f"{where}: key {k!r} is not a property (the server refuses it)")
            elif isinstance(extra, dict):
                errors += validate(v, extra, f"{where}.{k}")
        errors += [f"{where}: required {k!r} not sent" for k in r.get("required", []) if k not in value]
    if isinstance(value, list) and "items" in r:
        for i, v in enumerate(value):
            errors += validate(v, r["items"], f"{where}[{i}]")
    return errors


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


SB = "sb-0123456789ab"
RUN = "run-0123456789abcdef"
SNAP = "snap-0123456789ab"
EXPORT = "exp-0123456789ab"
THREAD = "th-0123456789abcdef"
MEMORY = "mem-0123456789abcdef"
INFER_JOB = "inf-0123456789abcdef"
BUILD = "bld-0123456789ab"
AUTO = AutoSnapshot(interval_secs=60, keep=2, before_reclaim=True)


def every_call() -> Iterator[tuple[str, _api.Call[Any] | _api.StreamCall[Any]]]:
    """Each request builder with every option given (so every key it can send is sent)."""
    yield (
        "create_sandbox",
        _api.create_sandbox(
            template="python",
            size="small",
            timeout=60,
            ttl=None,
            idle_timeout=30,
            ephemeral=True,
            labels={"a": "b"},
            metadata={"c": "d"},
            env={"E": "1"},
            network={"allow": ["example.org", "*.example.net:443", "[::1]:8080"]},
            packages={"pip": ["numpy", "pandas==2.2.2"], "npm": ["@scope/name@1.2.3"], "r": ["ggplot2"]},
            secrets=[
                _models.Secret("API_TOKEN", "t0ken", ["api.example.org", "*.example.net:443"]),
                {"name": "OTHER", "value": "v", "hosts": ("example.com",)},
            ],
            mounts=[
                _models.Mount.from_host("/srv/data", "/workspace/data"),
                _models.Mount.from_volume("cache", "/home/sandbox/cache", "rw"),
                {"host_path": "/srv/src", "path": "/tmp/src", "mode": "overlay"},
                {"volume": "out", "path": "/workspace"},
            ],
            snapshot_id=None,
            backend="process",
            limits={"memory_mb": 256, "cpus": 0.5},
            kernels=["python", "node"],
            checkpointable=True,
            auto_snapshot=AUTO,
        ),
    )
    for network in ("off", "loopback", "full", ["example.org:443"]):
        yield (
            "create_sandbox",
            _api.create_sandbox(
                template=None,
                size=None,
                timeout=None,
                ttl=None,
                idle_timeout=None,
                ephemeral=False,
                labels=None,
                metadata=None,
                env=None,
                network=network,
                packages=None,
                secrets=None,
                mounts=None,
                snapshot_id=None,
                backend=None,
                limits=None,
                kernels=None,
                checkpointable=False,
                auto_snapshot=None,
            ),
        )
    for packages in (_models.Packages(pip=("requests[socks]>=2",)), {"npm": ["left-pad"]}, {}):
        yield (
            "create_sandbox",
            _api.create_sandbox(
                template=None,
                size=None,
                timeout=None,
                ttl=None,
                idle_timeout=None,
                ephemeral=False,
                labels=None,
                metadata=None,
                env=None,
                network="full",
                packages=packages,
                secrets=[] if packages else None,
                mounts=[] if packages else None,
                snapshot_id=None,
                backend=None,
                limits=None,
                kernels=None,
                checkpointable=False,
                auto_snapshot=None,
            ),
        )
    yield "get_sandbox", _api.get_sandbox(SB)
    yield (
        "list_sandboxes",
        _api.list_sandboxes(label={"a": "b"}, metadata="c:d", state=["running"], cursor="x"),
    )
    yield "delete_sandbox", _api.delete_sandbox(SB)
    yield "sandbox_action", _api.sandbox_action(SB, "pause")
    yield "sandbox_action", _api.sandbox_action(SB, "resume")
    yield "set_timeout", _api.set_timeout(SB, 90)
    yield "metrics", _api.metrics(SB)
    yield "get_network", _api.get_network(SB)
    yield "set_network", _api.set_network(SB, "full")
    yield "set_network", _api.set_network(SB, ["example.org", "127.0.0.1:8080"])
    yield "set_network", _api.set_network(SB, {"allow": ("a.example.org",)})
    yield "get_secrets", _api.get_secrets(SB)
    yield (
        "set_secrets",
        _api.set_secrets(
            SB, [_models.Secret("TOKEN", "v", ["api.example.org"]), {"name": "B", "value": "w", "hosts": ("b.example.org",)}]
        ),
    )
    yield "set_secrets", _api.set_secrets(SB, [])
    yield "egress_events", _api.egress_events(SB, limit=50, before=12)
    yield "egress_events", _api.egress_events(SB, limit=None, before=None)
    yield (
        "git_clone",
        _api.git_clone(
            SB,
            "https://git.example.org/team/repo.git",
            path="/workspace/src",
            branch="main",
            depth=1,
            username="me",
            password="token",
        ),
    )
    yield (
        "git_clone",
        _api.git_clone(
            SB,
            "https://me:token@git.example.org/repo",
            path=None,
            branch=None,
            depth=None,
            username=None,
            password=None,
        ),
    )
    yield "create_preview", _api.create_preview(SB, 8000, ttl_secs=60, public=True)
    yield "create_preview", _api.create_preview(SB, 3000, ttl_secs=None, public=False)
    yield "create_preview", _api.create_preview(SB, 65535, ttl_secs=None, public=None)
    yield "system", _api.system()
    yield (
        "exec_command",
        _api.exec_command(SB, "ls", env={"E": "1"}, cwd="/", timeout=5.5, stdin="x", default_timeout=None),
    )
    yield (
        "exec_command",
        _api.exec_command(
            SB, ["ls", "-l"], env=None, cwd=None, timeout=None, stdin=None, default_timeout=None
        ),
    )
    yield "exec_stream", _api.exec_stream(SB, "ls", env={"E": "1"}, cwd="/", timeout=5.5, stdin="x")
    yield (
        "start_process",
        _api.start_process(
            SB, "top", env={"E": "1"}, cwd="/", timeout=5.5, stdin=True, pty=(24, 80), buffer_bytes=4096
        ),
    )
    yield "process_stream", _api.process_stream(SB, 12, 1, 2)
    yield "process_output", _api.process_output(SB, 12, 1, 2)
    yield "process_stdin", _api.process_stdin(SB, 12, "x", True)
    yield "process_resize", _api.process_resize(SB, 12, 30, 100)
    yield "list_processes", _api.list_processes(SB)
    yield "kill_process", _api.kill_process(SB, 12, "SIGTERM", True)
    yield (
        "run_code",
        _api.run_code(SB, "1", language="python", context="ctx", timeout=2.5, default_timeout=None),
    )
    yield "run_code_stream", _api.run_code_stream(SB, "1", language="python", context="ctx", timeout=2.5)
    yield "create_context", _api.create_context(SB, "python", "/", {"E": "1"})
    yield "list_contexts", _api.list_contexts(SB)
    yield "delete_context", _api.delete_context(SB, "ctx")
    yield "interrupt", _api.interrupt(SB, "ctx")
    yield "restart", _api.restart(SB, "ctx")
    yield "get_variables", _api.get_variables(SB, "ctx", ["a", "b"])
    yield "set_variables", _api.set_variables(SB, "ctx", {"a": 1})
    yield "clear_variables", _api.clear_variables(SB, "ctx", ["a"])
    yield "upload", _api.upload(SB, "/x", 0o644, True, b"x")
    yield "file_content", _api.file_content(SB, "/x")
    yield "list_dir", _api.list_dir(SB, "/")
    yield "stat", _api.stat(SB, "/x")
    yield "mkdir", _api.mkdir(SB, "/d")
    yield "rename", _api.rename(SB, "/a", "/b")
    yield "remove", _api.remove(SB, "/x", True)
    for source in ({"text": "t"}, {"data": b"d"}, {"host_path": "/h"}, {"export_id": EXPORT}):
        kwargs: dict[str, Any] = {"text": None, "data": None, "host_path": None, "export_id": None}
        yield "import_files", _api.import_files(SB, "/x", mode=0o755, **(kwargs | source))
    yield "create_export", _api.create_export(SB, "/x")
    yield "list_exports", _api.list_exports(SB)
    yield "get_export", _api.get_export(EXPORT)
    yield "delete_export", _api.delete_export(EXPORT)
    yield "export_content", _api.export_content(EXPORT)
    yield "artifacts", _api.artifacts(SB)
    yield "create_snapshot", _api.create_snapshot(SB, "n", "d", {"t": "v"}, volumes="copy")
    yield "create_snapshot", _api.create_snapshot(SB, None, None, None)
    yield "list_snapshots", _api.list_snapshots(SB)
    yield "get_snapshot", _api.get_snapshot(SNAP)
    yield "delete_snapshot", _api.delete_snapshot(SNAP)
    yield (
        "fork",
        _api.fork(
            SNAP, count=2, labels={"a": "b"}, metadata={"c": "d"}, timeout=60, idle_timeout=30, ephemeral=True
        ),
    )
    yield (
        "fork",
        _api.fork(
            SNAP,
            count=1,
            labels=None,
            metadata=None,
            timeout=None,
            idle_timeout=None,
            ephemeral=False,
            secrets=[_models.Secret("TOKEN", "v", ["api.example.org"])],
        ),
    )
    yield "get_auto_snapshot", _api.get_auto_snapshot(SB)
    yield "set_auto_snapshot", _api.set_auto_snapshot(SB, AUTO)
    yield "set_auto_snapshot", _api.set_auto_snapshot(SB, AutoSnapshot())
    every_budget = _models.Budgets(
        max_iterations=5,
        max_depth=2,
        max_sub_calls=3,
        token_budget=10_000,
        cost_limit_usd=0.5,
        timeout_secs=60.5,
        cell_timeout_secs=10,
        max_output_tokens=512,
    )
    yield (
        "start_run",
        _api.start_run(
            "task",
            model="openai/m",
            mode="tools",
            sandbox_id=SB,
            template="python",
            context="c",
            budgets=every_budget,
            keep_sandbox=True,
            validate=_models.Validate("python3 -m pytest -q", timeout_s=30.5, max_attempts=2),
            snapshots="every_step",
            keep_snapshots=True,
            thread_id=THREAD,
        ),
    )
    yield (
        "start_run",
        _api.start_run(
            "task",
            model=None,
            mode=None,
            sandbox_id=None,
            template=None,
            context=None,
            budgets={"max_iterations": 3, "timeout_secs": 30.0},
            keep_sandbox=False,
            validate={"command": "test -f done.txt", "max_attempts": 3},
            snapshots=None,
            keep_snapshots=False,
            thread_id=None,
        ),
    )
    yield (
        "start_run",
        _api.start_run(
            "task",
            model=None,
            mode=None,
            sandbox_id=None,
            template=None,
            context=None,
            budgets=None,
            keep_sandbox=False,
            validate="true",
            snapshots="off",
            keep_snapshots=False,
            thread_id=None,
        ),
    )
    yield "get_run", _api.get_run(RUN)
    yield "list_runs", _api.list_runs(10)
    yield "cancel_run", _api.cancel_run(RUN)
    yield "run_event_list", _api.run_event_list(RUN, 3)
    yield "follow_run", _api.follow_run(RUN, after=3)
    yield "follow_run", _api.follow_run(RUN, last_event_id=7)
    yield "resume_run", _api.resume_run(RUN)
    yield (
        "fork_run",
        _api.fork_run(
            RUN,
            from_step=2,
            task="go on",
            model="openai/m",
            budgets=every_budget,
            validate=_models.Validate("true", timeout_s=5, max_attempts=1),
            keep_sandbox=True,
            wait=True,
        ),
    )
    yield (
        "fork_run",
        _api.fork_run(
            RUN,
            from_step=1,
            task=None,
            model=None,
            budgets=None,
            validate=None,
            keep_sandbox=False,
            wait=False,
        ),
    )
    yield "step_sandbox", _api.step_sandbox(RUN, 3)
    yield "create_thread", _api.create_thread("work")
    yield "create_thread", _api.create_thread(None)
    yield "list_threads", _api.list_threads(10)
    yield "get_thread", _api.get_thread(THREAD)
    yield "rename_thread", _api.rename_thread(THREAD, "renamed")
    yield "delete_thread", _api.delete_thread(THREAD)
    # Both scopes: a sandbox's memories and the owner's own.
    for scope in (SB, None):
        yield (
            "add_memory",
            _api.add_memory(scope, "remember", category="notes", metadata={"k": "v"}),
        )
        yield "add_memory", _api.add_memory(scope, "remember", category=None, metadata=None)
        yield "search_memories", _api.search_memories(scope, "words", limit=5, category="notes")
        yield "list_memories", _api.list_memories(scope, limit=5, cursor="12", category="notes")
        yield "get_memory", _api.get_memory(scope, MEMORY)
        yield "delete_memory", _api.delete_memory(scope, MEMORY)
        yield (
            "infer_memories",
            _api.infer_memories(scope, "facts", category="notes", metadata={"k": "v"}),
        )
        yield "infer_memories", _api.infer_memories(scope, "facts", category=None, metadata=None)
        yield "get_infer_job", _api.get_infer_job(scope, INFER_JOB)
        yield "list_infer_jobs", _api.list_infer_jobs(scope, limit=5)
    yield (
        "start_build",
        _api.start_build(
            "app:v1",
            dockerfile="FROM tiny:v1\nRUN echo hi\n",
            context=b"\x1f\x8b not really gzip",
            build_args={"WHO": "me"},
            no_cache=True,
            allow_hosts=["example.org", "*.example.net:443"],
            offline=True,
            wait=True,
        ),
    )
    yield (
        "start_build",
        _api.start_build(
            "app",
            dockerfile="FROM tiny:v1\n",
            context=None,
            build_args=None,
            no_cache=False,
            allow_hosts=None,
            offline=False,
            wait=False,
        ),
    )
    yield "list_builds", _api.list_builds()
    yield "get_build", _api.get_build(BUILD)
    yield "cancel_build", _api.cancel_build(BUILD)
    yield "build_log_list", _api.build_log_list(BUILD, 3)
    yield "follow_build", _api.follow_build(BUILD, after=3)
    yield "follow_build", _api.follow_build(BUILD, last_event_id=7)
    yield "list_templates", _api.list_templates()
    for name in ("tiny", "tiny:v1"):
        yield "get_template", _api.get_template(name)
        yield "delete_template", _api.delete_template(name)
    yield "create_volume", _api.create_volume("cache")
    yield "list_volumes", _api.list_volumes()
    yield "get_volume", _api.get_volume("cache")
    yield "delete_volume", _api.delete_volume("cache")


CALLS = list(every_call())


def _builders() -> set[str]:
    """`_api`'s functions that build a request (their answer is a Call or a StreamCall)."""
    return {
        name
        for name, fn in inspect.getmembers(_api, inspect.isfunction)
        if fn.__module__ == _api.__name__
        and re.match(r"(Stream)?Call\[", str(fn.__annotations__.get("return", "")))
    }


def test_every_request_builder_is_checked() -> None:
    missing = _builders() - {name for name, _ in CALLS}
    assert not missing, f"_api request builders not exercised by test_openapi.every_call: {sorted(missing)}"


# Operations of the document no builder sends, and why.
NOT_BUILT = {
    "GET /v1/keys": "keys are managed with the CLI; the SDK has no method for them",
    "POST /v1/keys": "keys are managed with the CLI; the SDK has no method for them",
    "DELETE /v1/keys/{key_id}": "keys are managed with the CLI; the SDK has no method for them",
    "GET /v1/sandboxes/{id}/pty": "a WebSocket: pty_path and pty_query (checked below)",
}


def test_every_documented_operation_has_a_builder() -> None:
    built = {"{} {}".format(c.method, operation(c.method, c.path)[0]) for _, c in CALLS}
    documented = {f"{m.upper()} {t}" for t, ops in DOC["paths"].items() for m in ops}
    missed = sorted(documented - built - set(NOT_BUILT))
    assert not missed, f"operations of the document no _api builder sends (nor listed in NOT_BUILT): {missed}"


@pytest.mark.parametrize(("name", "call"), CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CALLS)])
def test_request_fits_the_document(name: str, call: _api.Call[Any] | _api.StreamCall[Any]) -> None:
    template, op = operation(call.method, call.path)
    where = f"{name}: {call.method} {template}"
    allowed = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
    unknown = sorted({k for k, _ in call.params} - allowed)
    assert not unknown, f"{where}: query parameters {unknown} are not in the document ({sorted(allowed)})"
    if isinstance(call, _api.StreamCall):
        # `Accept` is HTTP's own; any other header must be a parameter of the operation.
        headers = {p["name"].lower() for p in op.get("parameters", []) if p["in"] == "header"} | {"accept"}
        extra = sorted({k for k, _ in call.headers if k.lower() not in headers})
        assert not extra, f"{where}: headers {extra} are not in the document"
    body = op.get("requestBody", {}).get("content", {})
    if call.json is not None:
        takes = sorted(body) or "no body"
        assert "application/json" in body, f"{where}: sends a JSON body, the document takes {takes}"
        errors = validate(call.json, body["application/json"]["schema"], name)
        assert not errors, f"{where}: the body does not fit the request schema:\n  " + "\n  ".join(errors)
    elif isinstance(call, _api.Call) and call.content is not None:
        takes = sorted(body) or "no body"
        assert "application/octet-stream" in body, f"{where}: sends bytes, the document takes {takes}"


def test_pty_query_fits_the_document() -> None:
    _, op = operation("GET", _api.pty_path(SB))
    allowed = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
    for query in (_api.pty_query(cmd="sh", cwd="/", rows=30, cols=100), _api.pty_query(pid=12)):
        unknown = sorted(set(query) - allowed)
        assert not unknown, f"pty_query: query parameters {unknown} are not in the document"


def _answer_schema(op: dict[str, Any]) -> dict[str, Any] | None:
    for code, resp in op.get("responses", {}).items():
        if code.startswith("2"):
            content = resp.get("content", {})
            if "application/json" in content:
                return dict(content["application/json"]["schema"])
    return None


JSON_CALLS = [(n, c) for n, c in CALLS if isinstance(c, _api.Call)]


@pytest.mark.parametrize(
    ("name", "call"), JSON_CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(JSON_CALLS)]
)
@pytest.mark.parametrize("full", [True, False], ids=["every-property", "required-only"])
def test_answer_reads_only_what_the_schema_has(name: str, call: _api.Call[Any], full: bool) -> None:
    """The parser gets a sample of the answer's schema (every property set, or only the required
    ones): it must not fail on it, and must read no key the schema lacks."""
    _, op = operation(call.method, call.path)
    schema = _answer_schema(op)
    if schema is None:
        return
    reads: Reads = {}
    call.parse(FakeResponse(sample(schema, reads, full=full, label=name)))  # type: ignore[arg-type]
    for label, read in reads.items():
        unknown = sorted(read.keys - read.properties - TOLERATED.get(label, set()))
        assert not unknown, f"{name}: reads {unknown} of {label}, which has no such property"


def test_error_body_reads_only_what_the_schema_has() -> None:
    reads: Reads = {}
    err = error_from_body(sample({"$ref": "#/components/schemas/ErrorBody"}, reads, full=True), 400)
    assert err.code == "2026-01-01T00:00:00Z"
    unknown = sorted(reads["ErrorBody"].keys - reads["ErrorBody"].properties)
    assert not unknown, f"error_from_body reads {unknown}, which ErrorBody has not"


# --- the result models -----------------------------------------------------------------------


@dataclass
class Model:
    """An SDK result model and the schema it is parsed from."""

    cls: type
    schema: str
    # SDK field -> the property it is read from, where the names differ.
    renamed: dict[str, str] = field(default_factory=dict)
    # SDK fields not read from this schema, and why.
    not_in_schema: dict[str, str] = field(default_factory=dict)
    # Required properties the SDK does not read, and why.
    ignored: dict[str, str] = field(default_factory=dict)


EXIT_EVENT = "also parsed from the `exit` stream event, which is ExecOutput without the output"
MODELS = [
    Model(_models.SandboxInfo, "SandboxInfo"),
    Model(_models.Limits, "LimitsInfo"),
    Model(_models.ExitStatus, "ExecOutput", ignored={"stdout": EXIT_EVENT, "stderr": EXIT_EVENT}),
    Model(_models.CommandResult, "ExecOutput"),
    Model(_models.ProcessOutput, "ProcessOutput"),
    Model(_models.ProcessInfo, "ProcessView"),
    Model(_models.Metrics, "SandboxUsage"),
    Model(_models.FileInfo, "FileInfo"),
    Model(_models.ImportResult, "ImportResult"),
    Model(_models.ExportInfo, "ExportInfo"),
    Model(_models.Artifact, "Artifact"),
    Model(
        _models.Artifact,
        "ArtifactInfo",
        not_in_schema={"mtime": "a code run's artifacts have no mtime (None); the artifacts listing has"},
    ),
    Model(_models.SnapshotInfo, "SnapshotInfo"),
    Model(_models.VolumeCopy, "VolumeCopyInfo"),
    Model(_models.AutoSnapshot, "AutoSnapshot"),
    Model(_models.Context, "ContextView"),
    Model(_models.Variables, "VariablesView"),
    Model(_models.Result, "RichOutput"),
    Model(_models.ExecutionError, "CodeErrorInfo"),
    Model(_models.ExecutionDone, "CodeDoneInfo"),
    Model(_models.Execution, "CodeResult", renamed={"results": "outputs"}),
    Model(_models.RunInfo, "RunInfo"),
    Model(_models.ForkedFrom, "ForkedFrom"),
    Model(_models.StepSandbox, "StepSandbox"),
    Model(_models.ThreadInfo, "ThreadInfo"),
    Model(_models.Memory, "Memory"),
    Model(_models.MemoryList, "MemoryList"),
    Model(_models.InferJob, "InferJob"),
    Model(_models.RunUsage, "RunUsage"),
    Model(_models.NetworkInfo, "NetworkInfo"),
    Model(_models.SecretState, "SecretState"),
    Model(_models.EgressEvent, "EgressEventInfo"),
    Model(_models.EgressEventList, "EgressEventList"),
    Model(_models.GitCloneResult, "GitCloneResult"),
    Model(_models.PreviewInfo, "PreviewInfo"),
    Model(_models.PackagesReport, "PackagesReport"),
    Model(_models.Budgets, "Budgets"),
    Model(_models.StepReport, "StepReport"),
    Model(_models.BuiltImage, "BuiltImage"),
    Model(_models.BuildInfo, "BuildInfo"),
    Model(_models.TemplateInfo, "TemplateInfo"),
    Model(_models.VolumeInfo, "VolumeInfo"),
    # Every kind's fields in one model (None where a kind has none): the union of BuildEvent's
    # shapes, numbered.
    Model(
        _models.BuildEvent,
        "NumberedBuildEvent",
        renamed={"kind": "event"},
        not_in_schema={"data": "the whole event as sent, kept as it came"},
    ),
    # Read from `run_started`'s `validate`, as sent (the schema of StartRun.validate).
    Model(_models.Validate, "Validate"),
]

# Models parsed from answers whose schema the document does not spell out, and why.
UNSCHEMED = {
    _models.RunEvent: "a trajectory event is an untyped object in RunEventList (its fields depend on its "
    "type: docs/agent.md); RunEvent reads seq, type, ts, run_id, step and depth, and keeps the rest in data",
}


# Keys a shared model reads though this schema lacks them (listed in MODELS with a reason).
TOLERATED: dict[str, set[str]] = {}
for _m in MODELS:
    TOLERATED.setdefault(_m.schema, set()).update(_m.renamed.get(f, f) for f in _m.not_in_schema)


def _accepts(annotation: Any) -> set[str] | None:
    """The JSON types a field of this annotation holds (None: any)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        out: set[str] = set()
        for arg in typing.get_args(annotation):
            part = _accepts(arg)
            if part is None:
                return None
            out |= part
        return out
    if annotation is type(None):
        return {"null"}
    if annotation is Any:
        return None
    if origin is typing.Literal:
        return {_json_type(a) for a in typing.get_args(annotation)}
    base = origin or annotation
    simple = {str: {"string"}, bool: {"boolean"}, int: {"integer"}, float: {"number", "integer"}}
    if base in simple:
        return simple[base]
    if base is list:
        return {"array"}
    if base is dict or dataclasses.is_dataclass(base) or typing.is_typeddict(base):
        return {"object"}
    raise AssertionError(f"test_openapi: no JSON type known for {annotation!r}")


@pytest.mark.parametrize("model", MODELS, ids=[f"{m.cls.__name__}-{m.schema}" for m in MODELS])
def test_model_fields_fit_the_schema(model: Model) -> None:
    props, required = properties(model.schema)
    hints = typing.get_type_hints(model.cls)
    read = set()
    for f in dataclasses.fields(model.cls):
        if f.name in model.not_in_schema:
            continue
        prop = model.renamed.get(f.name, f.name)
        where = f"{model.cls.__name__}.{f.name}"
        assert prop in props, f"{where}: {model.schema} has no property {prop!r} (the server never sends it)"
        read.add(prop)
        sent = json_types(props[prop])
        accepted = _accepts(hints[f.name])
        if sent is None or accepted is None:
            continue
        wrong = sorted(sent - accepted)
        assert not wrong, (
            f"{where}: {model.schema}.{prop} may be {sorted(sent)}, the field holds only {sorted(accepted)}"
        )
    missing = sorted(required - read - set(model.ignored))
    assert not missing, (
        f"{model.cls.__name__}: required properties {missing} of {model.schema} are neither read nor "
        "listed as ignored (with a reason) in test_openapi.MODELS"
    )
    stale = sorted(set(model.ignored) - required)
    assert not stale, f"{model.cls.__name__}: ignored {stale} are not required properties of {model.schema}"


def test_every_model_is_in_the_table() -> None:
    parsed = {
        cls
        for _, cls in inspect.getmembers(_models, inspect.isclass)
        if dataclasses.is_dataclass(cls) and cls.__module__ == _models.__name__ and "from_json" in vars(cls)
    }
    missing = sorted(c.__name__ for c in parsed - {m.cls for m in MODELS} - set(UNSCHEMED))
    assert not missing, f"models parsed from answers but not in test_openapi.MODELS: {missing}"


def test_budgets_fit_both_schemas() -> None:
    """`Budgets` is sent as BudgetsInput and read as Budgets: each field is a property of both."""
    asked, _ = properties("BudgetsInput")
    names = {f.name for f in dataclasses.fields(_models.Budgets)}
    assert names == set(asked), f"Budgets {sorted(names)} vs BudgetsInput {sorted(asked)}"


def test_packages_fit_the_schema() -> None:
    """`Packages` (a TypedDict: sent, never parsed) has the installers the Packages schema has,
    each a list; the create request names that schema for its `packages`."""
    props, _ = properties("Packages")
    hints = typing.get_type_hints(_models.Packages)
    assert set(hints) == set(props), f"Packages {sorted(hints)} vs the schema's {sorted(props)}"
    for name, hint in hints.items():
        assert typing.get_origin(hint) is collections.abc.Sequence, f"Packages.{name}: {hint!r}"
        assert json_types(props[name]) == {"array"}, f"Packages.{name}: {props[name]}"
    create, _ = properties("CreateSandbox")
    assert _schema_name(create["packages"]) == "Packages"


def test_secrets_fit_the_schema() -> None:
    """`Secret` (sent, never parsed) has the fields the SecretInput schema has, all of them
    required there, `hosts` a list; the create request names that schema for its `secrets`."""
    props, required = properties("SecretInput")
    names = [f.name for f in dataclasses.fields(_models.Secret)]
    assert set(names) == set(props) == required, f"Secret {names} vs the schema's {sorted(props)}"
    assert json_types(props["hosts"]) == {"array"}
    create, _ = properties("CreateSandbox")
    assert json_types(create["secrets"]) == {"array"}
    assert _schema_name(create["secrets"]["items"]) == "SecretInput"


def test_mounts_fit_the_schema() -> None:
    """`Mount` (sent, never parsed) has the fields the MountInput schema has, only `path`
    required there; its modes are MountMode's; the create request names that schema for its
    `mounts`, and a mount is sent with only what it gives (no `mode`: the daemon's default)."""
    props, required = properties("MountInput")
    names = [f.name for f in dataclasses.fields(_models.Mount)]
    assert set(names) == set(props), f"Mount {names} vs the schema's {sorted(props)}"
    assert required == {"path"}
    modes = typing.get_args(_models.MountMode)
    assert list(modes) == SCHEMAS["MountMode"]["enum"]
    create, _ = properties("CreateSandbox")
    assert json_types(create["mounts"]) == {"array"}
    assert _schema_name(create["mounts"]["items"]) == "MountInput"
    sent = _api._mounts(
        [_models.Mount.from_volume("v", "/tmp/v"), {"host_path": Path("/srv"), "path": "/tmp/s"}]
    )
    assert sent == [{"volume": "v", "path": "/tmp/v"}, {"host_path": "/srv", "path": "/tmp/s"}]


def test_volume_carry_fits_the_schema() -> None:
    """`create_snapshot`'s `volumes` takes VolumeCarry's values, and is sent only when given."""
    assert list(typing.get_args(_models.VolumeCarry)) == SCHEMAS["VolumeCarry"]["enum"]
    create, _ = properties("CreateSnapshot")
    assert _schema_name(create["volumes"]) == "VolumeCarry"
    assert _api.create_snapshot(SB, None, None, None).json == {}
    assert _api.create_snapshot(SB, None, None, None, volumes="mount").json == {"volumes": "mount"}


def _create_with(secrets: Any) -> _api.Call[Any]:
    return _api.create_sandbox(
        template=None, size=None, timeout=None, ttl=None, idle_timeout=None, ephemeral=False,
        labels=None, metadata=None, env=None, network=["api.example.org"], packages=None,
        secrets=secrets, mounts=None, snapshot_id=None, backend=None, limits=None, kernels=None,
        checkpointable=False, auto_snapshot=None,
    )


def test_secrets_are_sent_as_the_api_takes_them() -> None:
    """A `Secret` and a mapping are sent alike, their hosts made lists; none, nothing sent."""
    sent = _create_with(
        [_models.Secret("A", "v1", ("h.example.org",)), {"name": "B", "value": "v2", "hosts": ["x"]}]
    )
    assert sent.json["secrets"] == [
        {"name": "A", "value": "v1", "hosts": ["h.example.org"]},
        {"name": "B", "value": "v2", "hosts": ["x"]},
    ]
    assert "secrets" not in _create_with(None).json


VALUE = "do-not-print-me-7f3a"


@pytest.mark.parametrize(
    ("secrets", "error", "match"),
    [
        ({"name": "A", "value": VALUE, "hosts": ["h"]}, TypeError, "secrets is a list"),
        (_models.Secret("A", VALUE, ["h"]), TypeError, "secrets is a list"),
        ("A", TypeError, "secrets is a list"),
        ([("A", VALUE, ["h"])], TypeError, r"secrets\[0\] is a Secret or a mapping, not tuple"),
        ([{"name": "A", "value": VALUE, "host": ["h"]}], ValueError, "unknown: 'host'; missing: 'hosts'"),
        ([{"name": "A", "value": VALUE}], ValueError, "missing: 'hosts'"),
        ([{"name": "A", "value": VALUE, "hosts": "h"}], TypeError, r"secrets\[0\] \('A'\): hosts is a list"),
        ([{"name": "A", "value": VALUE, "hosts": [1]}], TypeError, "each host is a str, not int"),
        ([{"name": "A", "value": 7, "hosts": ["h"]}], TypeError, "value is a str, not int"),
        ([{"name": None, "value": VALUE, "hosts": ["h"]}], TypeError, "name is a str, not NoneType"),
        ([_models.Secret("A", VALUE, ["h"]), {"name": "B", "value": b"v", "hosts": []}], TypeError,
         r"secrets\[1\] \('B'\): value is a str, not bytes"),
    ],
)
def test_malformed_secrets_are_refused_before_sending(
    secrets: Any, error: type[Exception], match: str
) -> None:
    """Only the shape is checked here (the rest is the daemon's); no message holds a value."""
    with pytest.raises(error, match=match) as e:
        _create_with(secrets)
    assert VALUE not in str(e.value)


def test_a_secret_never_shows_its_value() -> None:
    """A `Secret`'s repr and str leave the value out (so a log of one leaks nothing); it is
    frozen, with its hosts a tuple, and a lone host string is refused."""
    secret = _models.Secret("API_TOKEN", VALUE, ["api.example.org"])
    for shown in (repr(secret), str(secret), f"{secret}", repr([secret])):
        assert VALUE not in shown, shown
        assert "API_TOKEN" in shown and "api.example.org" in shown, shown
    assert secret.hosts == ("api.example.org",)
    assert hash(secret) == hash(_models.Secret("API_TOKEN", VALUE, ("api.example.org",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        secret.value = "x"  # type: ignore[misc]
    with pytest.raises(TypeError, match="hosts is a list of host rules"):
        _models.Secret("A", VALUE, "api.example.org")


def test_preview_options_are_the_create_preview_schema() -> None:
    """`preview(port, ttl_secs=, public=)` sends every property of CreatePreview when given, and
    with none an empty object (the document requires a body); the sandbox's info carries both
    preview templates (`get_host` reads `preview_host` without a request)."""
    props, _ = properties("CreatePreview")
    assert set(_api.create_preview(SB, 80, ttl_secs=1, public=True).json) == set(props)
    assert _api.create_preview(SB, 80, ttl_secs=None, public=None).json == {}
    op = DOC["paths"]["/v1/sandboxes/{id}/previews/{port}"]["post"]
    assert op["requestBody"]["required"] is True
    _, required = properties("SandboxInfo")
    assert {"preview_host", "preview_path"} <= required
    assert {f.name for f in dataclasses.fields(_models.SandboxInfo)} >= {"preview_host", "preview_path"}


def test_create_with_packages_waits_for_the_install() -> None:
    """An install takes as long as it takes (the daemon bounds it): no client read timeout then."""

    def create(packages: _models.PackagesInput | None) -> _api.Call[Any]:
        return _api.create_sandbox(
            template=None, size=None, timeout=None, ttl=None, idle_timeout=None, ephemeral=False,
            labels=None, metadata=None, env=None, network=None, packages=packages, secrets=None, mounts=None,
            snapshot_id=None, backend=None, limits=None, kernels=None, checkpointable=False,
            auto_snapshot=None,
        )

    assert create({"pip": ["six"]}).read_timeout is None
    assert create({"pip": ("six",)}).json == {"packages": {"pip": ["six"]}}
    assert create(None).read_timeout is _api.Default.TIMEOUT and "packages" not in create(None).json
    with pytest.raises(TypeError, match="list of package names"):
        create({"pip": "six"})
    with pytest.raises(TypeError, match="mapping"):
        create(["six"])  # type: ignore[arg-type]


def test_schema_names_exist() -> None:
    unknown = sorted({m.schema for m in MODELS} - set(SCHEMAS))
    assert not unknown, f"test_openapi.MODELS names schemas the document has not: {unknown}"



def test_each_build_event_kind_is_parsed() -> None:
    """Every shape of BuildEvent (with its `seq`), as the log sends it: its kind, each of its
    fields in the model's field of that name, the whole event in `data`; no key read that no
    shape has."""
    shapes = SCHEMAS["BuildEvent"]["oneOf"]
    fields = {f.name for f in dataclasses.fields(_models.BuildEvent)}
    every = {"seq"} | {p for shape in shapes for p in resolve(shape)["properties"]}
    kinds = []
    for shape in shapes:
        props = resolve(shape)["properties"]
        (kind,) = props["event"]["enum"]
        kinds.append(kind)
        reads: Reads = {}
        body = sample(shape, reads, full=True, label=kind)
        body["seq"] = 5
        event = _models.BuildEvent.from_json(body)
        assert (event.seq, event.kind, event.data) == (5, kind, dict(body)), kind
        for prop in set(props) - {"event"}:
            assert prop in fields, f"BuildEvent has no field for {kind}.{prop}"
            value = getattr(event, prop)
            if prop == "step":
                assert isinstance(value, _models.StepReport) and value.index == 7, kind
            else:
                assert value == body[prop], f"{kind}.{prop}"
        unknown = sorted(reads[kind].keys - every)
        assert not unknown, f"{kind}: reads {unknown}, which no build event has"
    assert kinds == [
        "warning", "base", "step_started", "output", "network", "step_finished", "smoke", "finished"
    ]


def test_a_build_is_sent_as_the_api_takes_it() -> None:
    """The context is base64 of the bytes given; defaults send nothing; waiting for the end
    has no read timeout; a lone host where a list belongs is refused."""
    sent = _api.start_build(
        "app", dockerfile="FROM x\n", context=b"tar", build_args={"A": "1"}, no_cache=False,
        allow_hosts=("h.example.org",), offline=False, wait=True,
    )
    assert sent.json == {
        "name": "app", "dockerfile": "FROM x\n", "context": "dGFy", "build_args": {"A": "1"},
        "allow_hosts": ["h.example.org"], "wait": True,
    }
    assert sent.read_timeout is None
    bare = _api.start_build(
        "app", dockerfile="FROM x\n", context=None, build_args=None, no_cache=False,
        allow_hosts=None, offline=False, wait=False,
    )
    assert bare.json == {"name": "app", "dockerfile": "FROM x\n"}
    assert bare.read_timeout is _api.Default.TIMEOUT
    with pytest.raises(TypeError, match="allow_hosts is a list"):
        _api.start_build(
            "app", dockerfile="FROM x\n", context=None, build_args=None, no_cache=False,
            allow_hosts="h.example.org", offline=False, wait=False,
        )
    assert _api.get_template("tiny:v1").path == "/v1/templates/tiny%3Av1"
