/**
 * Errors: one base class carrying the API's `{code, message, details}`, and a subclass per
 * kind of failure a caller may want to catch on its own.
 */

import { type BuildInfo, type StepReport } from "./types.js";

/** Any failure the SDK reports: an error answer of the API, or a transport failure. */
export class SandcellError extends Error {
  /** The API's machine-readable code (`not_found`, `invalid_argument`, …), or the SDK's own (`connection_failed`, `timeout`). */
  readonly code: string;
  /** The HTTP status, when the error came as an HTTP answer. */
  readonly status: number | undefined;
  /** More about it, as the API gave it (e.g. the children of a snapshot that cannot be deleted). */
  readonly details: Record<string, unknown> | undefined;
  /** The `X-Request-Id` of the request, to find it in the daemon's log. */
  readonly requestId: string | undefined;

  constructor(
    message: string,
    init: { code: string; status?: number; details?: Record<string, unknown>; requestId?: string; cause?: unknown },
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.status = init.status;
    this.details = init.details;
    this.requestId = init.requestId;
  }
}

/** 401: no API key, or one the daemon does not know (revoked, mistyped). */
export class AuthenticationError extends SandcellError {}

/** 403: the key may not do this (another owner's keys, an import path outside the allowed ones, a bad signed link). */
export class PermissionDeniedError extends SandcellError {}

/** 404: no such sandbox, snapshot, export, file, context or process — or it belongs to another owner. */
export class NotFoundError extends SandcellError {}

/** 400: the request is malformed (bad field, bad id, path outside the sandbox, …). */
export class InvalidArgumentError extends SandcellError {}

/** 409: the request conflicts with the current state (already exists, not empty, busy context, snapshot with children, …); 503 `unavailable`: for a moment (a sandbox being snapshotted; `Retry-After` says when to ask again). */
export class ConflictError extends SandcellError {}

/** 409 `sandbox_gone`: the sandbox stopped, failed or was lost; the message says why. */
export class SandboxGoneError extends SandcellError {}

/** A cap was reached: 429 `limit_exceeded` (sandboxes in all or per owner; `details` has the numbers), 413 `body_too_large`, 507 `no_space`. */
export class LimitExceededError extends SandcellError {}

/** The daemon failed: 500 `internal`, or another 5xx answer. */
export class ServerError extends SandcellError {}

/** No answer in time: the client's request deadline passed, or the daemon found the sandbox unresponsive (504). */
export class TimeoutError extends SandcellError {}

/** The daemon could not be reached at all (not running, wrong URL, connection cut). */
export class ConnectionError extends SandcellError {}

/**
 * A template build that ended without making its template: `build.wait()` (and
 * `Template.waitForBuild`) throws it when the build ended `failed` (code `build_failed`) or
 * `cancelled` (code `build_cancelled`). `exitCode` is the failing step's exit code and `step`
 * that step's report (null when no command failed: a missing base, a `COPY` source the context
 * lacks, a cancel), `error` the daemon's reason, `info` the build as it ended; its log
 * (`build.logs()`) has the output. Not an HTTP answer: `status` is undefined.
 */
export class BuildError extends SandcellError {
  /** The build (`bld-…`). */
  readonly buildId: string;
  /** How it ended: `failed` or `cancelled`. */
  readonly state: "failed" | "cancelled";
  /** The failing step's exit code, when a command failed. */
  readonly exitCode: number | null;
  /** The failing step's report, when a command failed. */
  readonly step: StepReport | null;
  /** Why it failed, as the daemon says. */
  readonly error: string | null;
  /** The build as it ended. */
  readonly info: BuildInfo;

  constructor(info: BuildInfo) {
    const state = info.state === "cancelled" ? "cancelled" : "failed";
    const step = state === "cancelled" ? null : info.stepReports.find((s) => s.exitCode !== null && s.exitCode !== 0) ?? null;
    const exitCode = info.exitCode ?? step?.exitCode ?? null;
    let message = `build ${info.id} of ${info.name} ${state === "cancelled" ? "was cancelled" : "failed"}`;
    if (state === "failed") {
      if (step !== null) message += ` at step ${step.index}/${info.steps} (line ${step.line}: ${step.text})`;
      if (exitCode !== null) message += ` with exit code ${exitCode}`;
      if (info.error !== null) message += `: ${info.error}`;
    }
    super(message, {
      code: state === "cancelled" ? "build_cancelled" : "build_failed",
      details: { build_id: info.id, state, exit_code: exitCode, error: info.error },
    });
    this.buildId = info.id;
    this.state = state;
    this.exitCode = exitCode;
    this.step = step;
    this.error = info.error;
    this.info = info;
  }
}

type ErrorClass = new (message: string, init: ConstructorParameters<typeof SandcellError>[1]) => SandcellError;

/** The class for each code the API documents; codes not listed fall back to the status. */
const BY_CODE: Record<string, ErrorClass> = {
  unauthenticated: AuthenticationError,
  permission_denied: PermissionDeniedError,
  not_found: NotFoundError,
  no_such_process: NotFoundError,
  invalid_argument: InvalidArgumentError,
  path_outside_sandbox: InvalidArgumentError,
  not_a_directory: InvalidArgumentError,
  is_a_directory: InvalidArgumentError,
  method_not_allowed: InvalidArgumentError,
  unsupported_media_type: InvalidArgumentError,
  spawn_failed: InvalidArgumentError,
  sandbox_gone: SandboxGoneError,
  already_exists: ConflictError,
  directory_not_empty: ConflictError,
  invalid_state: ConflictError,
  has_children: ConflictError,
  snapshot_corrupt: ConflictError,
  unsupported: ConflictError,
  limit_exceeded: LimitExceededError,
  body_too_large: LimitExceededError,
  no_space: LimitExceededError,
  unresponsive: TimeoutError,
  unavailable: ConflictError,
  internal: ServerError,
};

/** So that a code this SDK does not know yet still lands in the right family. */
const BY_STATUS: Record<number, ErrorClass> = {
  400: InvalidArgumentError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: LimitExceededError,
  422: InvalidArgumentError,
  429: LimitExceededError,
  504: TimeoutError,
};

/** The API's error body. */
export interface ErrorBody {
  /** Machine-readable code. */
  code: string;
  /** For people. */
  message: string;
  /** More, where there is more. */
  details?: Record<string, unknown>;
}

/** Builds the error for an API error body (from an HTTP answer, or an `error` event of a stream). */
export function errorFromBody(body: ErrorBody, status?: number, requestId?: string): SandcellError {
  const cls =
    BY_CODE[body.code] ??
    (status === undefined ? undefined : BY_STATUS[status] ?? (status >= 500 ? ServerError : undefined)) ??
    SandcellError;
  return new cls(body.message, { code: body.code, status, details: body.details, requestId });
}

/** Whether a parsed JSON value has the shape of an API error body. */
export function isErrorBody(value: unknown): value is ErrorBody {
  if (typeof value !== "object" || value === null) return false;
  const v = value as Record<string, unknown>;
  return typeof v["code"] === "string" && typeof v["message"] === "string";
}
