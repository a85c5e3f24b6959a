"""Writes `src/sandcell/sandbox.py`, the synchronous client, from `src/sandcell/async_sandbox.py`,
so that the two can never drift: edit the async client, then run

    python3 sdk/python/scripts/gen_sync.py

`tests/test_sync_client.py` fails while the generated file is stale (`--check` says the same).

The rewrite is by words, as `unasync` does: `async def` -> `def`, `await x` -> `x`, `async for`
-> `for`, `AsyncSandbox` -> `Sandbox` and the other names in `RENAMES`, and a few phrases of the
docstrings. Two comments steer it where words are not enough: a line ending in `# async only`
is left out, and a line ending in `# sync: CODE` becomes CODE (same indentation)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sandcell"
SOURCE = PACKAGE / "async_sandbox.py"
TARGET = PACKAGE / "sandbox.py"

HEADER = '''"""The synchronous client: `Sandcell` (a connection to the daemon), `Sandbox` and `Process`.
`async_sandbox` has the same shape with `async`; both only send what `_api` builds.

Generated from `async_sandbox.py` by `scripts/gen_sync.py`: edit that file, not this one."""
'''

# Whole words, async name -> sync name.
RENAMES = {
    "AsyncSandcell": "Sandcell",
    "AsyncSandbox": "Sandbox",
    "AsyncProcess": "Process",
    "AsyncCommands": "Commands",
    "AsyncFiles": "Files",
    "AsyncRuns": "Runs",
    "AsyncRun": "Run",
    "AsyncThreads": "Threads",
    "AsyncMemories": "Memories",
    "AsyncTemplates": "Templates",
    "AsyncTemplate": "Template",
    "AsyncBuild": "Build",
    "AsyncVolumes": "Volumes",
    "AsyncVolume": "Volume",
    "AsyncTerminal": "Terminal",
    "AsyncTransport": "SyncTransport",
    "AsyncIterator": "Iterator",
    "aread_chunks": "read_chunks",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}

# Phrases of docstrings and comments, applied before the words above.
PHRASES = [
    ("an `async with`", "a `with`"),
    ("an `AsyncSandbox`", "a `Sandbox`"),
    (" for asyncio,", ","),
    (", for asyncio", ""),
    (", plain or async,", ","),
]

ASYNC_ONLY = re.compile(r"\s*# async only$")
SYNC_AS = re.compile(r"^(\s*).*?\s*# sync: (.*)$")
KEYWORDS = [
    (re.compile(r"\basync (def|with|for)\b"), r"\1"),
    (re.compile(r"\bawait "), ""),
]
WORDS = re.compile(r"\b(" + "|".join(map(re.escape, RENAMES)) + r")\b")
FROM_IMPORT = re.compile(r"^(from \S+ import )([\w, ]+)$")


def _import_order(name: str) -> tuple[int, str]:
    """Constants, then classes, then the rest, each alphabetical (isort's order by type)."""
    if name.isupper():
        return (0, name)
    return (1 if name[:1].isupper() else 2, name)


def _sorted_import(line: str) -> str:
    """A one-line `from x import a, b` with its names in order again after renaming."""
    m = FROM_IMPORT.match(line)
    if not m:
        return line
    names = sorted((n.strip() for n in m.group(2).split(",")), key=_import_order)
    return m.group(1) + ", ".join(names)


def _module_docstring_end(text: str) -> int:
    if not text.startswith('"""'):
        raise SystemExit(f"{SOURCE.name} must start with its docstring")
    return text.index('"""', 3) + 3


def generate(source: str) -> str:
    """The synchronous client's source, from the async client's."""
    body = source[_module_docstring_end(source) :].lstrip("\n")
    out = []
    for line in body.splitlines():
        if ASYNC_ONLY.search(line):
            continue
        steered = SYNC_AS.match(line)
        if steered:
            out.append(steered.group(1) + steered.group(2))
            continue
        for old, new in PHRASES:
            line = line.replace(old, new)
        for pattern, repl in KEYWORDS:
            line = pattern.sub(repl, line)
        renamed = WORDS.sub(lambda m: RENAMES[m.group(1)], line)
        out.append(_sorted_import(renamed) if renamed != line else renamed)
    return HEADER + "\n" + "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if sandbox.py is stale, write nothing")
    args = parser.parse_args()
    wanted = generate(SOURCE.read_text())
    if args.check:
        if TARGET.read_text() != wanted:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
