/** The transport: `fetch` with the key, deadlines, and API errors turned into error classes. */

import { authenticationHint, resolveConfig, type ClientOptions, type ResolvedConfig } from "./config.js";
import {
  AuthenticationError,
  ConnectionError,
  SandcellError,
  TimeoutError,
  errorFromBody,
  isErrorBody,
} from "./errors.js";

/** Query parameters; arrays become repeated parameters, `undefined` ones are left out. */
export type Query = Record<string, string | number | boolean | readonly string[] | undefined>;

/** A request body: JSON (any plain value), or bytes sent as they are (streamed bodies: upload.ts). */
export type Body = { json: unknown } | { bytes: Uint8Array };

/** What one request needs besides its method and path. */
export interface RequestSpec {
  /** Query parameters. */
  query?: Query;
  /** The body. */
  body?: Body;
  /** Seconds before the answer's headers must have come; `null`: none; default: the client's. */
  timeout?: number | null;
  /** Cancels the request (and a stream being read). */
  signal?: AbortSignal;
  /** Headers besides the key and the body's type (lowercase names; `accept` replaces the JSON default). */
  headers?: Record<string, string>;
}

/** Whether a request's deadline passed, and what it was. */
interface Deadline {
  timedOut: () => boolean;
  timeout: number | null;
}

/** A request whose answer's headers are in. */
interface Sent {
  response: Response;
  deadline: Deadline;
  /** Stops the deadline timer. */
  clearDeadline: () => void;
  /** Detaches the caller's abort signal. */
  release: () => void;
}

/** One daemon's HTTP client. */
export class HttpClient {
  constructor(readonly config: ResolvedConfig) {}

  /** The absolute URL of `path` with `query`. */
  url(path: string, query?: Query): string {
    const url = new URL(this.config.apiUrl + path);
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) url.searchParams.append(key, v);
      else url.searchParams.set(key, String(value));
    }
    return url.toString();
  }

  /** Sends a request and returns its JSON answer (`undefined` for 204 No Content). */
  async json<T>(method: string, path: string, spec: RequestSpec = {}): Promise<T> {
    const sent = await this.send(method, path, spec);
    try {
      if (sent.response.status === 204) return undefined as T;
      return (await sent.response.json()) as T;
    } catch (e) {
      throw this.transportError(e, spec, sent.deadline);
    } finally {
      sent.clearDeadline();
      sent.release();
    }
  }

  /**
   * Sends a request and returns the response once its headers are in, for the caller to read
   * as a stream; the deadline stops at the headers, so a long download or event stream is
   * never cut by it.
   */
  async stream(method: string, path: string, spec: RequestSpec = {}): Promise<Response> {
    const sent = await this.send(method, path, spec);
    // The caller's signal stays attached: aborting it ends the stream being read.
    sent.clearDeadline();
    return sent.response;
  }

  private async send(method: string, path: string, spec: RequestSpec): Promise<Sent> {
    const headers: Record<string, string> = { accept: "application/json", ...spec.headers };
    if (this.config.apiKey !== undefined) headers["x-api-key"] = this.config.apiKey;
    let body: RequestInit["body"];
    if (spec.body !== undefined && "json" in spec.body) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(spec.body.json);
    } else if (spec.body !== undefined) {
      headers["content-type"] = "application/octet-stream";
      body = spec.body.bytes;
    }

    const controller = new AbortController();
    const onAbort = (): void => controller.abort(spec.signal?.reason);
    if (spec.signal?.aborted) onAbort();
    spec.signal?.addEventListener("abort", onAbort, { once: true });
    const timeout = spec.timeout === undefined ? this.config.requestTimeout : spec.timeout;
    let timedOut = false;
    const timer =
      timeout === null
        ? undefined
        : setTimeout(() => {
            timedOut = true;
            controller.abort();
          }, timeout * 1000);
    const clearDeadline = (): void => clearTimeout(timer);
    const release = (): void => spec.signal?.removeEventListener("abort", onAbort);
    const deadline: Deadline = { timedOut: () => timedOut, timeout };

    let response: Response;
    try {
      response = await fetch(this.url(path, spec.query), { method, headers, body, signal: controller.signal });
    } catch (e) {
      clearDeadline();
      release();
      throw this.transportError(e, spec, deadline);
    }
    if (!response.ok) {
      try {
        throw await this.apiError(response);
      } finally {
        clearDeadline();
        release();
      }
    }
    return { response, deadline, clearDeadline, release };
  }

  /** The error for a non-2xx answer. */
  private async apiError(response: Response): Promise<SandcellError> {
    const requestId = response.headers.get("x-request-id") ?? undefined;
    const text = await response.text().catch(() => "");
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    const body = isErrorBody(parsed)
      ? parsed
      : { code: `http_${response.status}`, message: `HTTP ${response.status} ${response.statusText}: ${text.slice(0, 200)}` };
    return this.explain(errorFromBody(body, response.status, requestId));
  }

  /** `err`, with how to configure a key when the daemon refused the one sent (or none). */
  explain(err: SandcellError): SandcellError {
    if (err instanceof AuthenticationError) err.message = `${err.message}; ${authenticationHint(this.config)}`;
    return err;
  }

  /** The error for a request that got no answer (or whose answer broke off). */
  transportError(e: unknown, spec: RequestSpec, deadline?: Deadline): unknown {
    if (e instanceof SandcellError) return e;
    // A caller's own abort stays what it was: the caller asked for it.
    if (spec.signal?.aborted) return spec.signal.reason ?? e;
    if (deadline?.timedOut()) {
      return new TimeoutError(`no answer from ${this.config.apiUrl} within ${deadline.timeout} s`, {
        code: "timeout",
        cause: e,
      });
    }
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    const why = cause?.code ?? cause?.message ?? (e instanceof Error ? e.message : String(e));
    return new ConnectionError(`cannot reach the Sandcell daemon at ${this.config.apiUrl} (${why})`, {
      code: "connection_failed",
      cause: e,
    });
  }
}

/** A client for the daemon these options (and the environment) point at. */
export function clientFor(options: ClientOptions = {}): HttpClient {
  return new HttpClient(resolveConfig(options));
}
