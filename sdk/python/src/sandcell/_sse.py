"""Server-sent events, parsed line by line (the transport feeds the lines, sync or async)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class SseEvent:
    """One event: its name and its decoded JSON data."""

    name: str
    data: Any


class SseParser:
    """Turns the lines of a `text/event-stream` into events; comments (keep-alives) are dropped."""

    def __init__(self) -> None:
        self._name = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        """Takes one line (without its end); returns the event a blank line completes."""
        if line == "":
            if not self._data:
                self._name = ""
                return None
            event = SseEvent(self._name or "message", json.loads("\n".join(self._data)))
            self._name, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        return None
