"""Streaming a long command: print its output line by line as it comes, and how it ended;
then the same as a background process that we leave and rejoin.

    python stream_command.py   # next to `sandcell serve`: found as the CLI finds it
    SANDCELL_API_URL=http://host:7070 SANDCELL_API_KEY=sk-... python stream_command.py
"""

from __future__ import annotations

import time

from sandcell import Sandbox

LONG = "for i in $(seq 1 5); do echo step $i; sleep 0.2; done; echo warning >&2; echo finished"


def show(prefix: str, text: str) -> None:
    """Prints each line of a chunk (a chunk may hold several lines, or part of one)."""
    for line in text.splitlines(keepends=True):
        print(f"{prefix} {line}", end="", flush=True)


def main() -> None:
    with Sandbox.create(ephemeral=True) as sb:
        started = time.monotonic()
        for event in sb.exec_stream(LONG):
            at = f"[{time.monotonic() - started:4.1f}s]"
            if event.type == "stdout":
                show(at, event.data)
            elif event.type == "stderr":
                show(at + " (stderr)", event.data)
            elif event.exit is not None:
                print(f"{at} done: {event.exit.message}")

        # A background process keeps running while nobody watches; come back to it later.
        job = sb.start_process(LONG)
        for event in job.stream():
            if event.type == "stdout":
                show("(first look)", event.data)
                break
        time.sleep(0.5)
        for event in job.reconnect():
            if event.type in ("stdout", "stderr"):
                show(f"(rejoined, {event.type} byte {event.offset})", event.data)
            elif event.exit is not None:
                print(f"background job: {event.exit.message}")


if __name__ == "__main__":
    main()
