"""Sandcell's Python SDK: stateful isolated sandboxes for AI agents, over `sandcell serve`'s API.

from sandcell import Sandbox

with Sandbox.create(template="python") as sb:
    print(sb.run_code("1 + 1").text)
"""

from ._http import DEFAULT_API_URL, VERSION
from ._models import (
    Artifact,
    AutoSnapshot,
    CodeEvent,
    CommandResult,
    Context,
    Execution,
    ExecutionDone,
    ExecutionError,
    ExitStatus,
    ExportInfo,
    FileInfo,
    ImportResult,
    Limits,
    Metrics,
    Offsets,
    OutputEvent,
    ProcessInfo,
    ProcessOutput,
    Result,
    RunOnceMetrics,
    RunOnceResult,
    SandboxInfo,
    SnapshotInfo,
    Variables,
)
from .async_sandbox import AsyncCommands, AsyncFiles, AsyncProcess, AsyncSandbox, AsyncSandcell
from .errors import (
    AuthenticationError,
    ConflictError,
    ConnectionError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    PermissionDeniedError,
    SandboxGoneError,
    SandcellError,
    ServerError,
    TimeoutError,
)
from .sandbox import Commands, Files, Process, Sandbox, Sandcell
from .terminal import AsyncTerminal, Terminal

__version__ = VERSION

__all__ = [
    "DEFAULT_API_URL",
    "Artifact",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncSandbox",
    "AsyncSandcell",
    "AsyncTerminal",
    "AuthenticationError",
    "AutoSnapshot",
    "CodeEvent",
    "CommandResult",
    "Commands",
    "ConflictError",
    "ConnectionError",
    "Context",
    "Execution",
    "ExecutionDone",
    "ExecutionError",
    "ExitStatus",
    "ExportInfo",
    "FileInfo",
    "Files",
    "ImportResult",
    "InvalidArgumentError",
    "LimitExceededError",
    "Limits",
    "Metrics",
    "NotFoundError",
    "Offsets",
    "OutputEvent",
    "PermissionDeniedError",
    "Process",
    "ProcessInfo",
    "ProcessOutput",
    "Result",
    "RunOnceMetrics",
    "RunOnceResult",
    "Sandbox",
    "SandboxGoneError",
    "SandboxInfo",
    "Sandcell",
    "SandcellError",
    "ServerError",
    "SnapshotInfo",
    "Terminal",
    "TimeoutError",
    "Variables",
]
