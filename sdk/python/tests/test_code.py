"""Code in kernels: results as MIME bundles, streaming and callbacks, contexts, variables,
interrupt, restart, timeouts."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sandcell import ConflictError, ExecutionError, NotFoundError, Result, Sandbox

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT = """
import matplotlib.pyplot as plt
import pandas as pd
df = pd.DataFrame({"x": [1, 2, 3], "y": [2, 4, 9]})
plt.plot(df.x, df.y)
print("rows", len(df))
df
"""


def test_run_code_state_and_result(sb: Sandbox) -> None:
    assert sb.run_code("x = 41").ok
    run = sb.run_code("x + 1")
    assert run.text == "42" and run.result is not None and run.result.kind == "result"
    assert run.status == "ok" and run.done.context == "python" and run.done.execution_count >= 2
    assert run.done.duration_ms >= 0 and run.error is None


def test_rich_results_and_png(sb: Sandbox, tmp_path: Path) -> None:
    run = sb.run_code(PLOT)
    assert run.ok and run.stdout == "rows 3\n"
    figure = next(r for r in run.results if r.kind == "display")
    assert figure.png is not None and figure.png.startswith(PNG_MAGIC)
    assert "image/png" in figure.formats and figure.text is not None
    table = run.result
    assert table is not None and table.html is not None and "<table" in table.html
    run.save_png(tmp_path / "plot.png")
    figure.save_png(tmp_path / "figure.png")
    assert (tmp_path / "plot.png").read_bytes() == figure.png == run.png
    with pytest.raises(ValueError):
        table.save_png(tmp_path / "none.png")
    shown = sb.run_code("display({'a': 1})")
    assert [r.kind for r in shown.results] == ["display"] and shown.results[0].text == "{'a': 1}"
    custom = sb.run_code(
        "class M:\n"
        "    def _repr_markdown_(self): return '**b**'\n"
        "    def _repr_json_(self): return {'k': [1]}\n"
        "    def _repr_svg_(self): return '<svg/>'\n"
        "M()"
    )
    assert custom.result is not None
    assert (custom.result.markdown, custom.result.json, custom.result.svg) == ("**b**", {"k": [1]}, "<svg/>")
    assert custom.result.jpeg is None


def test_errors_are_results_not_exceptions(sb: Sandbox) -> None:
    run = sb.run_code("print('before')\n1 / 0")
    assert not run.ok and run.status == "error" and run.stdout == "before\n"
    assert run.error is not None and run.error.name == "ZeroDivisionError"
    assert run.error.value == "division by zero" and "1 / 0" in str(run.error)


def test_stream_order_and_callbacks(sb: Sandbox) -> None:
    code = (
        "import sys, time\n"
        "print('a'); sys.stdout.flush(); time.sleep(0.05)\n"
        "print('b', file=sys.stderr); sys.stderr.flush(); time.sleep(0.05)\n"
        "display('shown'); time.sleep(0.05)\n"
        "print('c'); sys.stdout.flush(); time.sleep(0.05)\n"
        "7 * 6"
    )
    events = list(sb.run_code_stream(code))
    assert [(e.type, e.text or (e.result.text if e.result else None)) for e in events[:-1]] == [
        ("stdout", "a\n"),
        ("stderr", "b\n"),
        ("display", "'shown'"),
        ("stdout", "c\n"),
        ("result", "42"),
    ]
    assert events[-1].type == "done" and events[-1].done is not None and events[-1].done.status == "ok"

    seen: list[tuple[str, str]] = []
    run = sb.run_code(
        code + "\nraise KeyError('k')",
        on_stdout=lambda t: seen.append(("out", t)),
        on_stderr=lambda t: seen.append(("err", t)),
        on_result=lambda r: seen.append((r.kind, r.text or "")),
        on_error=lambda e: seen.append(("error", e.name)),
    )
    assert seen == [
        ("out", "a\n"),
        ("err", "b\n"),
        ("display", "'shown'"),
        ("out", "c\n"),
        ("error", "KeyError"),
    ]
    assert run.stdout == "a\nc\n" and run.stderr == "b\n" and run.status == "error"
    assert isinstance(run.error, ExecutionError) and all(isinstance(r, Result) for r in run.results)


def test_run_python_and_node(sb: Sandbox) -> None:
    assert sb.run_python("import math; math.factorial(5)").text == "120"
    sb.run_node("let greeting = 'hi'")
    node = sb.run_node("await Promise.resolve(greeting + '!')")
    assert node.text == "'hi!'" and node.done.language == "node"
    bash = sb.run_code("echo from-bash; false", language="bash")
    assert bash.stdout == "from-bash\n" and bash.done.exit_code == 1


def test_contexts_are_separate(sb: Sandbox) -> None:
    ctx = sb.create_context("python", cwd="/tmp", env={"CTX": "yes"})
    assert ctx.language == "python" and ctx.id != "python"
    sb.run_code("v = 'default'")
    sb.run_code("v = 'own'", context=ctx)
    assert sb.run_code("v").text == "'default'"
    assert (
        sb.run_code("import os; (v, os.getcwd(), os.environ['CTX'])", context=ctx.id).text
        == "('own', '/tmp', 'yes')"
    )
    ids = {c.id for c in sb.list_contexts()}
    assert {"python", ctx.id} <= ids
    sb.delete_context(ctx)
    assert ctx.id not in {c.id for c in sb.list_contexts()}
    with pytest.raises(NotFoundError):
        sb.run_code("1", context=ctx)


def test_variables(sb: Sandbox) -> None:
    names = sb.set_variables({"cfg": {"n": 3, "tags": ["a"]}, "count": 7})
    assert sorted(names) == ["cfg", "count"]
    assert sb.run_code("cfg['n'] * count").text == "21"
    sb.run_code("s = {1, 2}")
    got = sb.get_variables()
    assert got.values["cfg"] == {"n": 3, "tags": ["a"]} and got.values["count"] == 7
    assert got.unrepresentable["s"]["type"] == "set"
    some = sb.get_variables(["count", "missing"])
    assert some.values == {"count": 7} and some.missing == ["missing"]
    assert sb.clear_variables(["count"]) == ["count"]
    assert "count" not in sb.get_variables().values
    assert set(sb.clear_variables()) >= {"cfg", "s"}
    assert sb.get_variables().values == {}
    node = sb.create_context("node")
    sb.set_variables({"n": 5}, context=node)
    assert sb.run_code("n * 2", context=node).text == "10"
    assert sb.get_variables(context=node.id).values == {"n": 5}


def test_interrupt_keeps_state(sb: Sandbox) -> None:
    sb.run_code("kept = 'yes'")
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(sb.run_code("while True: pass").status))
    worker.start()
    deadline = time.monotonic() + 10
    while not any(c.busy for c in sb.list_contexts()) and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(ConflictError):  # one execution at a time per context
        sb.run_code("1")
    sb.interrupt()
    worker.join(10)
    assert result == ["interrupted"]
    assert sb.run_code("kept").text == "'yes'"


def test_restart_and_timeout(sb: Sandbox) -> None:
    sb.run_code("gone = 1")
    ctx = sb.restart()
    assert ctx.id == "python"
    assert sb.run_code("gone").error is not None
    slow = sb.run_code("import time; time.sleep(10)", timeout=0.5)
    assert slow.status == "timeout" and not slow.ok
    crashed = sb.run_code("import os; os._exit(3)")
    assert crashed.status == "crashed" and crashed.done.state_lost and "3" in (crashed.done.crash or "")
    after = sb.run_code("1 + 1")
    assert after.text == "2" and after.done.kernel_restarted and after.done.notice
