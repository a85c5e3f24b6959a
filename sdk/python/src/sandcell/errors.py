"""The exceptions the SDK raises, one class per family of the API's error `code`."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._models import BuildInfo, StepReport


class SandcellError(Exception):
    """Base of every Sandcell error: the API's `code`, `message`, HTTP `status` and `details`."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "internal",
        status: int | None = None,
        details: Any = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details = details
        self.request_id = request_id

    def __str__(self) -> str:
        where = f" (HTTP {self.status}, request {self.request_id})" if self.status else ""
        return f"{self.code}: {self.message}{where}"


class AuthenticationError(SandcellError):
    """The API key is missing, wrong or revoked (401 `unauthenticated`)."""


class PermissionDeniedError(SandcellError):
    """The key may not do this (403 `permission_denied`)."""


class NotFoundError(SandcellError):
    """No such sandbox, snapshot, export, file or process for this key (404)."""


class InvalidArgumentError(SandcellError):
    """The request was refused as malformed (400: `invalid_argument`, `path_outside_sandbox`, …)."""


class ConflictError(SandcellError):
    """The thing is in a state that refuses this (409: `already_exists`, `invalid_state`, …), or
    refuses it for a moment (503 `unavailable`, with `Retry-After`: a sandbox being snapshotted)."""


class SandboxGoneError(ConflictError):
    """The sandbox stopped, failed or was lost (409 `sandbox_gone`); the message says why."""


class LimitExceededError(SandcellError):
    """A cap was reached (429 `limit_exceeded`, 413 `body_too_large`, 507 `no_space`)."""


class TimeoutError(SandcellError, builtins.TimeoutError):
    """The daemon or the sandbox did not answer in time (504 `unresponsive`, or a client timeout)."""


class ConnectionError(SandcellError, builtins.ConnectionError):
    """No Sandcell daemon answers at the configured URL."""


class ServerError(SandcellError):
    """The daemon failed (500 `internal`, or an answer that is not Sandcell's)."""


class BuildError(SandcellError):
    """A template build ended without making its template (raised by `Build.wait`): `state` is
    `failed` (code `build_failed`) or `cancelled` (`build_cancelled`); `exit_code` is the
    failing step's exit code and `step` that step's `StepReport` (None when no command
    failed: a bad base, a `COPY` of a missing file, a cancel), `error` the daemon's reason,
    `info` the build's `BuildInfo` as it ended. Its log (`Build.logs()`) has the output."""

    def __init__(self, info: BuildInfo) -> None:
        step = info.failed_step
        self.info = info
        self.build_id = info.id
        self.state = info.state
        self.exit_code = info.exit_code if info.exit_code is not None else (step.exit_code if step else None)
        self.step: StepReport | None = step
        self.error = info.error
        if info.state == "cancelled":
            message, code = f"build {info.id} of {info.name} was cancelled", "build_cancelled"
        else:
            message, code = f"build {info.id} of {info.name} failed", "build_failed"
            if step is not None:
                message += f" at step {step.index}/{info.steps} (line {step.line}: {step.text})"
            if self.exit_code is not None:
                message += f" with exit code {self.exit_code}"
            if info.error:
                message += f": {info.error}"
        super().__init__(message, code=code, details={"build_id": info.id, "state": info.state})


_BY_CODE: dict[str, type[SandcellError]] = {
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "no_such_process": NotFoundError,
    "invalid_argument": InvalidArgumentError,
    "path_outside_sandbox": InvalidArgumentError,
    "not_a_directory": InvalidArgumentError,
    "is_a_directory": InvalidArgumentError,
    "method_not_allowed": InvalidArgumentError,
    "unsupported_media_type": InvalidArgumentError,
    "spawn_failed": InvalidArgumentError,
    "sandbox_gone": SandboxGoneError,
    "already_exists": ConflictError,
    "directory_not_empty": ConflictError,
    "invalid_state": ConflictError,
    "has_children": ConflictError,
    "snapshot_corrupt": ConflictError,
    "unsupported": ConflictError,
    "limit_exceeded": LimitExceededError,
    "body_too_large": LimitExceededError,
    "no_space": LimitExceededError,
    "unresponsive": TimeoutError,
    "unavailable": ConflictError,
    "internal": ServerError,
}

# For codes this SDK does not know yet: the family of their status.
_BY_STATUS: dict[int, type[SandcellError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: LimitExceededError,
    429: LimitExceededError,
    504: TimeoutError,
}


def error_from_body(body: Any, status: int | None, request_id: str | None = None) -> SandcellError:
    """The exception for an API error body `{"code", "message", "details"}`."""
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        text = str(body)[:500] if body else "no error body"
        return ServerError(
            f"unexpected answer: {text}", code="internal", status=status, request_id=request_id
        )
    code: str = body["code"]
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status or 0, SandcellError)
    if cls is SandcellError and status is not None and status >= 500:
        cls = ServerError
    return cls(
        str(body.get("message", code)),
        code=code,
        status=status,
        details=body.get("details"),
        request_id=request_id,
    )
