"""The sync and async clients cannot drift: `sandbox.py` is generated from `async_sandbox.py`
(and must be up to date), and every public class of one has the same methods, with the same
parameters, as its twin in the other. Pure Python: no daemon needed."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sandcell import (
    AsyncBuild,
    AsyncCommands,
    AsyncFiles,
    AsyncMemories,
    AsyncProcess,
    AsyncRun,
    AsyncRuns,
    AsyncSandbox,
    AsyncSandcell,
    AsyncTemplate,
    AsyncTemplates,
    AsyncTerminal,
    AsyncThreads,
    AsyncVolume,
    AsyncVolumes,
    Build,
    Commands,
    Files,
    Memories,
    Process,
    Run,
    Runs,
    Sandbox,
    Sandcell,
    Template,
    Templates,
    Terminal,
    Threads,
    Volume,
    Volumes,
)
from sandcell._http import AsyncTransport, SyncTransport

SDK = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_sync", SDK / "scripts" / "gen_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()

# (sync, async): every public class that comes in both flavours.
TWINS = [
    (Sandcell, AsyncSandcell),
    (Sandbox, AsyncSandbox),
    (Process, AsyncProcess),
    (Commands, AsyncCommands),
    (Files, AsyncFiles),
    (Runs, AsyncRuns),
    (Run, AsyncRun),
    (Threads, AsyncThreads),
    (Memories, AsyncMemories),
    (Templates, AsyncTemplates),
    (Build, AsyncBuild),
    (Template, AsyncTemplate),
    (Volumes, AsyncVolumes),
    (Volume, AsyncVolume),
    (Terminal, AsyncTerminal),
    (SyncTransport, AsyncTransport),
]

# Async method name -> the sync method it stands for.
METHOD_TWINS = {"__aenter__": "__enter__", "__aexit__": "__exit__", "__aiter__": "__iter__"}
# Names in annotations that differ only by flavour, async -> sync.
ANNOTATION_TWINS = {**GEN.RENAMES, "AsyncIterable": "Iterable"}


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    wanted = GEN.generate(GEN.SOURCE.read_text())
    assert GEN.TARGET.read_text() == wanted, (
        "sandbox.py is stale: edit async_sandbox.py and run python3 sdk/python/scripts/gen_sync.py"
    )


def test_the_generator_rewrites_words_and_honours_its_comments() -> None:
    source = '''"""Doc."""
import inspect  # async only
class AsyncThing:
    """One thing, for asyncio: an `AsyncSandbox` in an `async with`."""
    async def __aenter__(self) -> AsyncThing:
        async for x in self.items():
            called = f(x)  # sync: f(x)
            if inspect.isawaitable(called):  # async only
                await called  # async only
        return await self.done()
'''
    out = GEN.generate(source).removeprefix(GEN.HEADER)
    assert "inspect" not in out and "await" not in out and "async" not in out
    assert "One thing: a `Sandbox` in a `with`." in out
    assert "    def __enter__(self) -> AsyncThing:" in out  # only the names in RENAMES change
    assert "        for x in self.items():\n            f(x)\n        return self.done()\n" in out


def _public(cls: type) -> dict[str, Any]:
    """The class's own public attributes (methods, properties), by their sync name."""
    names: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, value in vars(klass).items():
            sync_name = METHOD_TWINS.get(name, name)
            if name.startswith("_") and not (sync_name.startswith("__") and sync_name.endswith("__")):
                continue
            if name in {"__init__", "__repr__", "__dict__", "__weakref__", "__module__", "__doc__"}:
                continue
            if name.startswith("__") and name not in METHOD_TWINS and name not in METHOD_TWINS.values():
                continue
            names.setdefault(sync_name, value)
    return names


def _kind(value: Any) -> str:
    if isinstance(value, property):
        return "property"
    if isinstance(value, classmethod):
        return "classmethod"
    if isinstance(value, staticmethod):
        return "staticmethod"
    return "method" if callable(value) else type(value).__name__


def _annotation(text: Any) -> str:
    """An annotation as text, with the async flavour's names turned into the sync ones."""
    out = str(text)
    for old, new in ANNOTATION_TWINS.items():
        out = re.sub(rf"\b{old}\b", str(new), out)
    return out


def _shape(value: Any) -> list[tuple[str, str, str, str]]:
    func = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
    assert callable(func)
    sig = inspect.signature(func)
    params = [(p.name, p.kind.name, repr(p.default), _annotation(p.annotation)) for p in sig.parameters.values()]
    return [*params, ("->", "", "", _annotation(sig.return_annotation))]


@pytest.mark.parametrize("sync_cls, async_cls", TWINS, ids=[s.__name__ for s, _ in TWINS])
def test_twins_have_the_same_methods_and_signatures(sync_cls: type, async_cls: type) -> None:
    sync, asyn = _public(sync_cls), _public(async_cls)
    assert sorted(sync) == sorted(asyn), (
        f"only in {sync_cls.__name__}: {sorted(set(sync) - set(asyn))}; "
        f"only in {async_cls.__name__}: {sorted(set(asyn) - set(sync))}"
    )
    for name in sync:
        assert _kind(sync[name]) == _kind(asyn[name]), name
        if _kind(sync[name]) in {"property", "classmethod", "staticmethod", "method"}:
            assert _shape(sync[name]) == _shape(asyn[name]), f"{sync_cls.__name__}.{name}"


def _attributes_set_in_init(cls: type) -> dict[str, str]:
    """Public `self.NAME = CLASS(...)` in `__init__` (or `_setup`, which `Sandcell` calls from
    it): the sub-objects (`commands`, `files`, `runs`, ...) and other attributes, with the
    class each is made from."""
    tree = ast.parse(inspect.getsource(cls))
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("__init__", "_setup"):
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign | ast.AnnAssign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    for t in targets:
                        if (
                            isinstance(t, ast.Attribute)
                            and isinstance(t.value, ast.Name)
                            and t.value.id == "self"
                            and not t.attr.startswith("_")
                        ):
                            value = stmt.value
                            made = (
                                value.func.id
                                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                                else ""
                            )
                            out[t.attr] = _annotation(made)
    return out


@pytest.mark.parametrize("sync_cls, async_cls", TWINS, ids=[s.__name__ for s, _ in TWINS])
def test_twins_hold_the_same_sub_objects(sync_cls: type, async_cls: type) -> None:
    assert _attributes_set_in_init(sync_cls) == _attributes_set_in_init(async_cls)


def test_no_sync_method_is_a_coroutine_and_the_async_twins_have_some() -> None:
    for sync_cls, async_cls in TWINS:
        for name, value in _public(sync_cls).items():
            func = getattr(value, "__func__", value)
            assert not inspect.iscoroutinefunction(func), f"{sync_cls.__name__}.{name} is async"
        assert any(
            inspect.iscoroutinefunction(getattr(v, "__func__", v)) for v in _public(async_cls).values()
        ), async_cls.__name__
