/** Commands: run one and wait, stream one, or start one in the background and follow it. */

import { type HttpClient } from "./http.js";
import { sseRequest, type SseMessage } from "./sse.js";
import { errorFromBody, isErrorBody } from "./errors.js";
import { toExitInfo, type ExitInfo, type StringMap, type WireExit } from "./types.js";

/** A command: a shell line for `/bin/sh -c`, or an argument vector run as it is. */
export type Command = string | readonly string[];

/** Options of `exec` and `execStream`. */
export interface ExecOptions {
  /** Environment variables added to the sandbox's. */
  env?: StringMap;
  /** Working directory (default `/workspace`). */
  cwd?: string;
  /** Seconds before the whole process tree is killed (default: the sandbox's exec timeout, 300 s). */
  timeout?: number;
  /** Text written to the command's stdin, which is then closed. */
  stdin?: string;
  /** Cancels the request (a streamed command's connection is dropped; the command runs to its end). */
  signal?: AbortSignal;
}

/** Callbacks that make `exec` stream: each gets the output as it comes, in the order written. */
export interface ExecCallbacks {
  /** Called with each piece of stdout as it is written. */
  onStdout?: (text: string) => void;
  /** Called with each piece of stderr as it is written. */
  onStderr?: (text: string) => void;
}

/** A finished command: its output and how it ended. */
export interface ExecResult extends ExitInfo {
  /** Its stdout (invalid UTF-8 replaced; cut at the exec output limit). */
  stdout: string;
  /** Its stderr. */
  stderr: string;
}

/** One event of `execStream`, in the order the command wrote: output chunks, then `done`. */
export type ExecEvent =
  | { type: "stdout"; data: string }
  | { type: "stderr"; data: string }
  | { type: "done"; result: ExitInfo };

/** Options of `startProcess`. */
export interface StartProcessOptions {
  /** Environment variables added to the sandbox's. */
  env?: StringMap;
  /** Working directory (default `/workspace`). */
  cwd?: string;
  /** Seconds before its tree is killed (default: none). */
  timeout?: number;
  /** Keep its stdin open for `write()` (a terminal always has input). */
  stdin?: boolean;
  /** Run it on a terminal of this size. */
  pty?: { rows: number; cols: number };
  /** Bytes of each stream kept for reading later (default 1 MiB, at most 64 MiB). */
  bufferBytes?: number;
}

/** Byte offsets to read a background process's output from (default: all still buffered). */
export interface OutputFrom {
  /** Stdout offset. */
  stdoutFrom?: number;
  /** Stderr offset. */
  stderrFrom?: number;
}

/** One event of a background process's stream. */
export type ProcessEvent =
  | { type: "stdout" | "stderr"; data: string; offset: number; bytes: number }
  | { type: "lost"; channel: "stdout" | "stderr"; offset: number; bytes: number }
  | { type: "done"; result: ExitInfo };

/** Everything a background process wrote (from the offsets asked), once it ended. */
export interface ProcessOutput extends ExitInfo {
  /** Stdout. */
  stdout: string;
  /** Stderr. */
  stderr: string;
  /** Stdout bytes no longer buffered when asked for. */
  stdoutLost: number;
  /** Stderr bytes no longer buffered when asked for. */
  stderrLost: number;
}

/** One process of a sandbox, as `processes()` lists it. */
export interface ProcessInfo {
  /** Pid inside the sandbox. */
  pid: number;
  /** Parent pid. */
  ppid: number;
  /** Process group. */
  pgid: number;
  /** State letter (R, S, D, Z, T, X once exited). */
  state: string;
  /** Command line. */
  cmdline: string;
  /** Resident memory in bytes. */
  rssBytes: number;
  /** Started by an exec or a background start (its output can be followed). */
  tracked: boolean;
  /** Started in the background. */
  background: boolean;
  /** Runs on a terminal. */
  pty: boolean;
  /** It has ended (kept so its output and exit can still be read). */
  exited: boolean;
  /** The exec that started its tree, when known. */
  execId: number | null;
  /** Its exit code, once it exited. */
  exitCode: number | null;
  /** The signal that ended it. */
  exitSignal: number | null;
  /** When it started. */
  startedAt: Date | null;
  /** Stdout bytes written so far. */
  stdoutBytes: number | null;
  /** Stderr bytes written so far. */
  stderrBytes: number | null;
}

/** How to signal a process. */
export interface KillOptions {
  /** `TERM`, `KILL` (the default), `INT`, `HUP`… or a number. */
  signal?: string | number;
  /** Its descendants too. */
  tree?: boolean;
}

interface WireProcess {
  pid: number;
  ppid: number;
  pgid: number;
  state: string;
  cmdline: string;
  rss_bytes: number;
  tracked: boolean;
  background: boolean;
  pty: boolean;
  exited: boolean;
  exec_id?: number | null;
  exit_code?: number | null;
  exit_signal?: number | null;
  started_at_ms?: number | null;
  stdout_bytes?: number | null;
  stderr_bytes?: number | null;
}

interface WireProcessOutput extends WireExit {
  stdout: string;
  stderr: string;
  stdout_lost: number;
  stderr_lost: number;
}

/** Seconds a waiting call's client deadline runs past the command's own timeout. */
const GRACE_SECS = 30;

/** The client deadline of a call that waits for a command: none, or its timeout and some slack. */
export function waitDeadline(timeout: number | undefined): number | null {
  return timeout === undefined ? null : timeout + GRACE_SECS;
}

function commandBody(cmd: Command, options: ExecOptions | StartProcessOptions): Record<string, unknown> {
  return {
    ...(typeof cmd === "string" ? { cmd } : { argv: [...cmd] }),
    env: options.env,
    cwd: options.cwd,
    timeout_secs: options.timeout,
  };
}

/** A stream's `error` event as the error it reports. */
function streamFailure(message: SseMessage): unknown {
  return isErrorBody(message.data)
    ? errorFromBody(message.data)
    : new Error(`unexpected error event: ${JSON.stringify(message.data)}`);
}

/**
 * Runs a command and waits for it. With `onStdout` / `onStderr` the command is streamed and
 * each piece goes to its callback as it comes; the result is the same.
 */
export async function exec(
  http: HttpClient,
  id: string,
  cmd: Command,
  options: ExecOptions & ExecCallbacks = {},
): Promise<ExecResult> {
  if (options.onStdout !== undefined || options.onStderr !== undefined) {
    let stdout = "";
    let stderr = "";
    for await (const event of execStream(http, id, cmd, options)) {
      if (event.type === "stdout") {
        stdout += event.data;
        options.onStdout?.(event.data);
      } else if (event.type === "stderr") {
        stderr += event.data;
        options.onStderr?.(event.data);
      } else {
        return { stdout, stderr, ...event.result };
      }
    }
    throw new Error("the command's stream ended without its `exit` event");
  }
  const out = await http.json<WireExit & { stdout: string; stderr: string }>("POST", `/v1/sandboxes/${id}/exec`, {
    body: { json: { ...commandBody(cmd, options), stdin: options.stdin } },
    timeout: waitDeadline(options.timeout),
    signal: options.signal,
  });
  return { stdout: out.stdout, stderr: out.stderr, ...toExitInfo(out) };
}

/** Runs a command and yields its output as it comes, then `done`. */
export async function* execStream(
  http: HttpClient,
  id: string,
  cmd: Command,
  options: ExecOptions = {},
): AsyncGenerator<ExecEvent, void, undefined> {
  const events = sseRequest(http, "POST", `/v1/sandboxes/${id}/exec/stream`, {
    body: { json: { ...commandBody(cmd, options), stdin: options.stdin } },
    timeout: null,
    signal: options.signal,
  });
  for await (const message of events) {
    const data = message.data as { data: string } & WireExit;
    switch (message.event) {
      case "stdout":
      case "stderr":
        yield { type: message.event, data: data.data };
        break;
      case "exit":
        yield { type: "done", result: toExitInfo(data) };
        return;
      case "error":
        throw streamFailure(message);
    }
  }
}

/** Starts a command in the background; the handle follows it. */
export async function startProcess(
  http: HttpClient,
  id: string,
  cmd: Command,
  options: StartProcessOptions = {},
): Promise<BackgroundProcess> {
  const started = await http.json<{ pid: number; exec_id: number }>("POST", `/v1/sandboxes/${id}/processes`, {
    body: {
      json: {
        ...commandBody(cmd, options),
        stdin: options.stdin,
        // Rows and columns only: the server refuses any other key of the terminal size.
        pty: options.pty === undefined ? undefined : { rows: options.pty.rows, cols: options.pty.cols },
        buffer_bytes: options.bufferBytes,
      },
    },
  });
  return new BackgroundProcess(http, id, started.pid, started.exec_id);
}

/** Lists every process of a sandbox (its agent excluded). */
export async function listProcesses(http: HttpClient, id: string): Promise<ProcessInfo[]> {
  const list = await http.json<{ processes: WireProcess[] }>("GET", `/v1/sandboxes/${id}/processes`);
  return list.processes.map((p) => ({
    pid: p.pid,
    ppid: p.ppid,
    pgid: p.pgid,
    state: p.state,
    cmdline: p.cmdline,
    rssBytes: p.rss_bytes,
    tracked: p.tracked,
    background: p.background,
    pty: p.pty,
    exited: p.exited,
    execId: p.exec_id ?? null,
    exitCode: p.exit_code ?? null,
    exitSignal: p.exit_signal ?? null,
    startedAt: p.started_at_ms === null || p.started_at_ms === undefined ? null : new Date(p.started_at_ms),
    stdoutBytes: p.stdout_bytes ?? null,
    stderrBytes: p.stderr_bytes ?? null,
  }));
}

/** Sends a signal to a process of a sandbox. */
export async function killProcess(http: HttpClient, id: string, pid: number, options: KillOptions = {}): Promise<void> {
  await http.json<void>("DELETE", `/v1/sandboxes/${id}/processes/${pid}`, {
    query: { signal: options.signal === undefined ? undefined : String(options.signal), tree: options.tree },
  });
}

/**
 * A background process (or terminal process): follow its output, feed its stdin, signal it.
 * It outlives this object and the connection: `sandbox.process(pid)` makes a new handle for
 * it, from anywhere, at any time.
 */
export class BackgroundProcess {
  /** Stdout offset of the next byte not yet seen through `stream()` (undefined: none seen yet). */
  stdoutOffset: number | undefined;
  /** Stderr offset of the next byte not yet seen through `stream()`. */
  stderrOffset: number | undefined;

  constructor(
    private readonly http: HttpClient,
    /** The sandbox it runs in. */
    readonly sandboxId: string,
    /** Its pid in the sandbox: the handle for its output, stdin, terminal and signals. */
    readonly pid: number,
    /** The exec id its processes carry (`SANDCELL_EXEC_ID`), when it was started by this handle. */
    readonly execId?: number,
  ) {}

  private get path(): string {
    return `/v1/sandboxes/${this.sandboxId}/processes/${this.pid}`;
  }

  /**
   * Follows its output until it ends. Starts where the last stream of this handle stopped
   * (or, the first time, at the oldest byte still buffered), so breaking off and calling
   * `stream()` again neither repeats nor skips bytes; bytes that left the buffer meanwhile
   * come as a `lost` event. `from` overrides the offsets.
   */
  async *stream(from: OutputFrom & { signal?: AbortSignal } = {}): AsyncGenerator<ProcessEvent, void, undefined> {
    const events = sseRequest(this.http, "GET", `${this.path}/stream`, {
      query: {
        stdout_from: from.stdoutFrom ?? this.stdoutOffset,
        stderr_from: from.stderrFrom ?? this.stderrOffset,
      },
      timeout: null,
      signal: from.signal,
    });
    for await (const message of events) {
      switch (message.event) {
        case "stdout":
        case "stderr": {
          const chunk = message.data as { data: string; offset: number; bytes: number };
          this.advance(message.event, chunk.offset + chunk.bytes);
          yield { type: message.event, ...chunk };
          break;
        }
        case "lost": {
          const lost = message.data as { channel: "stdout" | "stderr"; offset: number; bytes: number };
          this.advance(lost.channel, lost.offset + lost.bytes);
          yield { type: "lost", ...lost };
          break;
        }
        case "exit":
          yield { type: "done", result: toExitInfo(message.data as WireExit) };
          return;
        case "error":
          throw streamFailure(message);
      }
    }
  }

  private advance(channel: "stdout" | "stderr", next: number): void {
    if (channel === "stdout") this.stdoutOffset = Math.max(this.stdoutOffset ?? 0, next);
    else this.stderrOffset = Math.max(this.stderrOffset ?? 0, next);
  }

  /** Waits for it to end and returns its output (default: all still buffered). */
  async output(from: OutputFrom = {}): Promise<ProcessOutput> {
    const out = await this.http.json<WireProcessOutput>("GET", `${this.path}/output`, {
      query: { stdout_from: from.stdoutFrom, stderr_from: from.stderrFrom },
      timeout: null,
    });
    return {
      stdout: out.stdout,
      stderr: out.stderr,
      stdoutLost: out.stdout_lost,
      stderrLost: out.stderr_lost,
      ...toExitInfo(out),
    };
  }

  /**
   * Writes to its stdin (or types into its terminal), and resolves once the bytes are
   * written. Fails with `ConflictError` (409 `invalid_state`) when the process ended or
   * closed its stdin before the write was confirmed — which can happen although the process
   * did read the bytes (one that exits right after reading its input): a write that may end
   * the process should allow for it.
   */
  async write(data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.http.json<void>("POST", `${this.path}/stdin`, { body: { bytes } });
  }

  /** Closes its stdin (end of input). */
  async closeStdin(): Promise<void> {
    await this.http.json<void>("POST", `${this.path}/stdin`, { query: { close: true } });
  }

  /** Resizes its terminal. */
  async resize(rows: number, cols: number): Promise<void> {
    await this.http.json<void>("POST", `${this.path}/resize`, { body: { json: { rows, cols } } });
  }

  /** Sends it a signal (default KILL). */
  async kill(options: KillOptions = {}): Promise<void> {
    await killProcess(this.http, this.sandboxId, this.pid, options);
  }
}
