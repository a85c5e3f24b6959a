/** Code in language kernels whose state persists: runs (collected or streamed), rich results, contexts, variables. */

import { type HttpClient } from "./http.js";
import { sseRequest } from "./sse.js";
import { errorFromBody, isErrorBody } from "./errors.js";
import { waitDeadline } from "./commands.js";
import { toDate, type Language, type StringMap } from "./types.js";

/** A MIME bundle: MIME type → content (text, base64 for images, JSON for `application/json`). */
export type MimeBundle = Record<string, unknown>;

/** A context, or its id; a language's default context is named after it (`python`). */
export type ContextRef = string | { id: string };

/** An error the code raised. */
export interface ExecutionError {
  /** Its type name (`ZeroDivisionError`). */
  name: string;
  /** Its message. */
  value: string;
  /** Traceback lines pointing at the user's code. */
  traceback: string[];
}

/** A file an execution left in `/workspace/outputs`. */
export interface ArtifactInfo {
  /** Absolute path inside the sandbox. */
  path: string;
  /** Size in bytes. */
  size: number;
  /** MIME type from its name. */
  mime: string;
}

/** How an execution ended. */
export interface CodeDone {
  /** The context it ran in. */
  context: string;
  /** Its language. */
  language: Language;
  /** `ok`, `error`, `interrupted`, `timeout` or `crashed`. */
  status: "ok" | "error" | "interrupted" | "timeout" | "crashed";
  /** Executions of this kernel so far. */
  executionCount: number;
  /** Wall time in milliseconds. */
  durationMs: number;
  /** Bash: the cell's exit status. */
  exitCode: number | null;
  /** The context's state is gone (its kernel died or was killed). */
  stateLost: boolean;
  /** This ran in a fresh kernel because the previous one had died. */
  kernelRestarted: boolean;
  /** Why the kernel died, when it did. */
  crash: string | null;
  /** A note for people (kernel restarted, output cut, …). */
  notice: string | null;
  /** Files created or changed in `/workspace/outputs`. */
  artifacts: ArtifactInfo[];
  /** Stdout bytes dropped past the 1 MiB output limit. */
  stdoutDropped: number;
  /** Stderr bytes dropped past the limit. */
  stderrDropped: number;
}

/** Options of `runCode`. */
export interface RunCodeOptions {
  /** Its language (default `python`; ignored when `context` is given). */
  language?: Language;
  /** The context to run in (default: the language's own). */
  context?: ContextRef;
  /** Seconds before the execution is interrupted (the kernel is killed if it does not yield). */
  timeout?: number;
  /** Called with each piece of stdout as it is printed (makes the run streamed). */
  onStdout?: (text: string) => void;
  /** Called with each piece of stderr as it is printed (makes the run streamed). */
  onStderr?: (text: string) => void;
  /** Called with each display and the final result as they come (makes the run streamed). */
  onResult?: (result: Result) => void;
  /** Called with the error the code raised, when it raises one (makes the run streamed). */
  onError?: (error: ExecutionError) => void;
  /** Cancels the request (a streamed run's connection is dropped; interrupt the context to stop the code). */
  signal?: AbortSignal;
}

/** A context: one kernel and its state. */
export interface ContextInfo {
  /** Its id (a language's default context is named after it). */
  id: string;
  /** Its language. */
  language: Language;
  /** The kernel's pid in the sandbox, while it runs. */
  pid: number | null;
  /** Executions so far in the current kernel. */
  executionCount: number;
  /** An execution is running. */
  busy: boolean;
  /** When it was made, as recorded. */
  createdAt: Date | null;
  /** When it ended: only in the list of a sandbox that no longer runs. */
  endedAt: Date | null;
  /** Why it ended. */
  endReason: string | null;
}

/** Options of `createContext`. */
export interface CreateContextOptions {
  /** The language of its kernel (default `python`). */
  language?: Language;
  /** Working directory of its kernel (default `/workspace`). */
  cwd?: string;
  /** Extra environment of its kernel. */
  env?: StringMap;
}

/** A context's variables. */
export interface Variables {
  /** Values that convert to JSON exactly. */
  values: Record<string, unknown>;
  /** The others: their type and repr. */
  unrepresentable: Record<string, { type: string; repr: string }>;
  /** Requested names that do not exist. */
  missing: string[];
}

/** Which context, and which variables (default: all). */
export interface VariablesOptions {
  /** The context (default `python`). */
  context?: ContextRef;
  /** Only these variables. */
  names?: readonly string[];
}

interface WireDone {
  context: string;
  language: Language;
  status: CodeDone["status"];
  execution_count: number;
  duration_ms: number;
  exit_code?: number | null;
  state_lost: boolean;
  kernel_restarted: boolean;
  crash?: string | null;
  notice?: string | null;
  artifacts: ArtifactInfo[];
  stdout_dropped: number;
  stderr_dropped: number;
}

interface WireCodeResult {
  stdout: string;
  stderr: string;
  outputs: { kind: "display" | "result"; data: MimeBundle }[];
  error?: ExecutionError | null;
  done: WireDone;
}

interface WireContext {
  id: string;
  language: Language;
  pid?: number | null;
  execution_count: number;
  busy: boolean;
  created_at?: string | null;
  ended_at?: string | null;
  end_reason?: string | null;
}

/** Decodes base64 with what every runtime has (`atob`), so images need no Node `Buffer`. */
function fromBase64(text: string): Uint8Array {
  const binary = atob(text.replace(/\s+/g, ""));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** One rich output of an execution: a display shown during it, or the value of its last expression. */
export class Result {
  constructor(
    /** `display` (shown during the run) or `result` (the last expression's value). */
    readonly kind: "display" | "result",
    /** Every representation, by MIME type. */
    readonly data: MimeBundle,
  ) {}

  private textOf(mime: string): string | undefined {
    const value = this.data[mime];
    return typeof value === "string" ? value : undefined;
  }

  /** The MIME types it comes in. */
  get formats(): string[] {
    return Object.keys(this.data);
  }

  /** `text/plain`: the repr. */
  get text(): string | undefined {
    return this.textOf("text/plain");
  }

  /** `text/html` (pandas tables, …). */
  get html(): string | undefined {
    return this.textOf("text/html");
  }

  /** `text/markdown`. */
  get markdown(): string | undefined {
    return this.textOf("text/markdown");
  }

  /** `image/svg+xml`. */
  get svg(): string | undefined {
    return this.textOf("image/svg+xml");
  }

  /** `text/latex`. */
  get latex(): string | undefined {
    return this.textOf("text/latex");
  }

  /** `application/json`, as the value. */
  get json(): unknown {
    return this.data["application/json"];
  }

  /** `image/png`, decoded to bytes. */
  get png(): Uint8Array | undefined {
    const b64 = this.textOf("image/png");
    return b64 === undefined ? undefined : fromBase64(b64);
  }

  /** `image/jpeg`, decoded to bytes. */
  get jpeg(): Uint8Array | undefined {
    const b64 = this.textOf("image/jpeg");
    return b64 === undefined ? undefined : fromBase64(b64);
  }

  /**
   * Writes its image to a local file (PNG, else JPEG, else SVG) and returns the MIME type
   * written; throws when it has no image.
   */
  async saveImage(path: string): Promise<string> {
    const { writeFile } = await import("node:fs/promises");
    for (const [mime, bytes] of [
      ["image/png", this.png],
      ["image/jpeg", this.jpeg],
    ] as const) {
      if (bytes !== undefined) {
        await writeFile(path, bytes);
        return mime;
      }
    }
    if (this.svg !== undefined) {
      await writeFile(path, this.svg, "utf8");
      return "image/svg+xml";
    }
    throw new Error(`this ${this.kind} has no image (it has ${this.formats.join(", ")})`);
  }
}

/** A finished execution: output, rich results, the error if any, and how it ended. */
export class Execution {
  constructor(
    /** Everything printed to stdout. */
    readonly stdout: string,
    /** Everything printed to stderr. */
    readonly stderr: string,
    /** Displays and the result, in the order they came. */
    readonly results: Result[],
    /** The error the code raised. */
    readonly error: ExecutionError | undefined,
    /** How it ended. */
    readonly done: CodeDone,
  ) {}

  /** The value of the last expression, if it had one. */
  get result(): Result | undefined {
    return this.results.find((r) => r.kind === "result");
  }

  /** The `text/plain` of the last expression's value. */
  get text(): string | undefined {
    return this.result?.text;
  }

  /** `ok`, `error`, `interrupted`, `timeout` or `crashed`. */
  get status(): CodeDone["status"] {
    return this.done.status;
  }

  /** It ran to its end without an error. */
  get ok(): boolean {
    return this.done.status === "ok";
  }
}

function toDone(d: WireDone): CodeDone {
  return {
    context: d.context,
    language: d.language,
    status: d.status,
    executionCount: d.execution_count,
    durationMs: d.duration_ms,
    exitCode: d.exit_code ?? null,
    stateLost: d.state_lost,
    kernelRestarted: d.kernel_restarted,
    crash: d.crash ?? null,
    notice: d.notice ?? null,
    artifacts: d.artifacts,
    stdoutDropped: d.stdout_dropped,
    stderrDropped: d.stderr_dropped,
  };
}

function toContext(c: WireContext): ContextInfo {
  return {
    id: c.id,
    language: c.language,
    pid: c.pid ?? null,
    executionCount: c.execution_count,
    busy: c.busy,
    createdAt: toDate(c.created_at),
    endedAt: toDate(c.ended_at),
    endReason: c.end_reason ?? null,
  };
}

/** The id of a context given as an id or an object. */
export function contextId(context: ContextRef): string {
  return typeof context === "string" ? context : context.id;
}

/** Runs code; streamed when a callback is given, collected otherwise — the answer is the same. */
export async function runCode(http: HttpClient, id: string, code: string, options: RunCodeOptions = {}): Promise<Execution> {
  const body = {
    code,
    language: options.context === undefined ? options.language ?? "python" : options.language,
    context: options.context === undefined ? undefined : contextId(options.context),
    timeout_secs: options.timeout,
  };
  const spec = { body: { json: body }, timeout: waitDeadline(options.timeout), signal: options.signal };
  const streamed =
    options.onStdout !== undefined ||
    options.onStderr !== undefined ||
    options.onResult !== undefined ||
    options.onError !== undefined;
  if (!streamed) {
    const r = await http.json<WireCodeResult>("POST", `/v1/sandboxes/${id}/code`, spec);
    const results = r.outputs.map((o) => new Result(o.kind, o.data));
    return new Execution(r.stdout, r.stderr, results, r.error ?? undefined, toDone(r.done));
  }

  let stdout = "";
  let stderr = "";
  const results: Result[] = [];
  let error: ExecutionError | undefined;
  for await (const message of sseRequest(http, "POST", `/v1/sandboxes/${id}/code/stream`, { ...spec, timeout: null })) {
    const data = message.data as Record<string, unknown>;
    switch (message.event) {
      case "stdout":
        stdout += data["text"] as string;
        options.onStdout?.(data["text"] as string);
        break;
      case "stderr":
        stderr += data["text"] as string;
        options.onStderr?.(data["text"] as string);
        break;
      case "display":
      case "result": {
        const result = new Result(message.event, data["data"] as MimeBundle);
        results.push(result);
        options.onResult?.(result);
        break;
      }
      case "error":
        // The same event name carries the code's own error and a failure of the run itself;
        // only the latter has an API error `code`.
        if (isErrorBody(data)) throw errorFromBody(data);
        error = data as unknown as ExecutionError;
        options.onError?.(error);
        break;
      case "done":
        return new Execution(stdout, stderr, results, error, toDone(data as unknown as WireDone));
    }
  }
  throw new Error("the code stream ended without its `done` event");
}

/** Starts a new context (a kernel of its own). */
export async function createContext(http: HttpClient, id: string, options: CreateContextOptions = {}): Promise<ContextInfo> {
  const c = await http.json<WireContext>("POST", `/v1/sandboxes/${id}/contexts`, {
    body: { json: { language: options.language ?? "python", cwd: options.cwd, env: options.env } },
  });
  return toContext(c);
}

/** Lists a sandbox's contexts (from the records, once it no longer runs). */
export async function listContexts(http: HttpClient, id: string): Promise<ContextInfo[]> {
  const list = await http.json<WireContext[]>("GET", `/v1/sandboxes/${id}/contexts`);
  return list.map(toContext);
}

/** Ends a context. */
export async function deleteContext(http: HttpClient, id: string, context: ContextRef): Promise<void> {
  await http.json<void>("DELETE", `/v1/sandboxes/${id}/contexts/${encodeURIComponent(contextId(context))}`);
}

/** Interrupts the context's running execution; its state stays. */
export async function interrupt(http: HttpClient, id: string, context: ContextRef): Promise<void> {
  await http.json<void>("POST", `/v1/sandboxes/${id}/contexts/${encodeURIComponent(contextId(context))}/interrupt`);
}

/** Replaces the context's kernel with a fresh one (clean state). */
export async function restartContext(http: HttpClient, id: string, context: ContextRef): Promise<ContextInfo> {
  const c = await http.json<WireContext>(
    "POST",
    `/v1/sandboxes/${id}/contexts/${encodeURIComponent(contextId(context))}/restart`,
  );
  return toContext(c);
}

function variablesPath(id: string, context: ContextRef | undefined): string {
  return `/v1/sandboxes/${id}/contexts/${encodeURIComponent(contextId(context ?? "python"))}/variables`;
}

/** Reads variables as JSON where they convert exactly. */
export async function getVariables(http: HttpClient, id: string, options: VariablesOptions = {}): Promise<Variables> {
  return http.json<Variables>("GET", variablesPath(id, options.context), {
    query: { names: options.names?.join(",") },
  });
}

/** Sets variables from JSON values; returns their names. */
export async function setVariables(
  http: HttpClient,
  id: string,
  values: Record<string, unknown>,
  options: Pick<VariablesOptions, "context"> = {},
): Promise<string[]> {
  const r = await http.json<{ names: string[] }>("PUT", variablesPath(id, options.context), {
    body: { json: { values } },
  });
  return r.names;
}

/** Deletes variables (all without `names`); returns the names deleted. */
export async function clearVariables(http: HttpClient, id: string, options: VariablesOptions = {}): Promise<string[]> {
  const r = await http.json<{ names: string[] }>("DELETE", variablesPath(id, options.context), {
    query: { names: options.names?.join(",") },
  });
  return r.names;
}
