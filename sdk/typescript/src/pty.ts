/**
 * Terminals: a process on a pseudo-terminal, driven over the `/pty` WebSocket (keystrokes
 * in, screen bytes out, resizes). One upgrade starts the process and connects to it (its
 * `101` answer names the pid in `X-Sandcell-Pid`); with `env`, which that route does not
 * take, the process is started through `POST /processes` first and the socket joins it,
 * replaying what it wrote since it started.
 */

import { type HttpClient, type Query } from "./http.js";
import { SandcellError, errorFromBody, isErrorBody } from "./errors.js";
import { killProcess, startProcess } from "./commands.js";
import { AsyncQueue } from "./queue.js";
import { toExitInfo, type ExitInfo, type StringMap, type WireExit } from "./types.js";
import { type WebSocketConnection } from "./ws.js";

/** Options of `openTerminal`. */
export interface TerminalOptions {
  /** The command line (default `exec bash -l`, an interactive login shell). */
  cmd?: string;
  /** Working directory (default `/workspace`). */
  cwd?: string;
  /** Environment variables added to the sandbox's. */
  env?: StringMap;
  /** Rows (default 24). */
  rows?: number;
  /** Columns (default 80). */
  cols?: number;
  /** Receives the terminal's output as it comes, instead of iterating the terminal. */
  onData?: (data: Uint8Array) => void;
}

/** Options of `attachTerminal`. */
export type AttachTerminalOptions = Pick<TerminalOptions, "onData">;

/**
 * A live terminal: iterate it (`for await (const bytes of term)`) or pass `onData` to read
 * what it shows; `write` types into it. Closing the connection leaves the process running:
 * `sandbox.attachTerminal(term.pid)` joins it again.
 */
export class Terminal implements AsyncIterable<Uint8Array> {
  private readonly output = new AsyncQueue<Uint8Array>();
  private readonly exited: Promise<ExitInfo | null>;

  private constructor(
    private readonly http: HttpClient,
    private readonly sandboxId: string,
    /** The terminal process's pid in the sandbox. */
    readonly pid: number,
    private readonly socket: WebSocketConnection,
    onData: ((data: Uint8Array) => void) | undefined,
  ) {
    const deliver = onData ?? ((data: Uint8Array) => this.output.push(data));
    this.exited = this.pump(deliver);
    // `wait()` is optional: its failure must not become an unhandled rejection.
    this.exited.catch(() => undefined);
  }

  /** Starts a process on a new terminal and connects to it. */
  static async open(http: HttpClient, sandboxId: string, options: TerminalOptions = {}): Promise<Terminal> {
    const cmd = options.cmd ?? "exec bash -l";
    const rows = options.rows ?? 24;
    const cols = options.cols ?? 80;
    if (options.env !== undefined) {
      // The WebSocket route takes no environment: start the process, then join it.
      const process = await startProcess(http, sandboxId, cmd, { cwd: options.cwd, env: options.env, pty: { rows, cols } });
      return Terminal.attach(http, sandboxId, process.pid, options);
    }
    const socket = await Terminal.connect(http, sandboxId, { cmd, cwd: options.cwd, rows, cols });
    const pid = Number(socket.headers["x-sandcell-pid"]);
    if (!Number.isInteger(pid) || pid <= 0) {
      socket.close();
      throw new SandcellError("the daemon's terminal answer has no X-Sandcell-Pid header (a daemon older than this SDK?)", {
        code: "protocol_error",
      });
    }
    return new Terminal(http, sandboxId, pid, socket, options.onData);
  }

  /** Connects to a running terminal process (its recent output is replayed first). */
  static async attach(
    http: HttpClient,
    sandboxId: string,
    pid: number,
    options: AttachTerminalOptions = {},
  ): Promise<Terminal> {
    const socket = await Terminal.connect(http, sandboxId, { pid });
    return new Terminal(http, sandboxId, pid, socket, options.onData);
  }

  /** Opens the `/pty` WebSocket with `query`, the key sent as a header. */
  private static async connect(http: HttpClient, sandboxId: string, query: Query): Promise<WebSocketConnection> {
    // Loaded when first used: the rest of the SDK needs nothing but fetch.
    const { WebSocketConnection } = await import("./ws.js");
    const headers: Record<string, string> = {};
    if (http.config.apiKey !== undefined) headers["x-api-key"] = http.config.apiKey;
    try {
      return await WebSocketConnection.connect(http.url(`/v1/sandboxes/${sandboxId}/pty`, query), headers);
    } catch (e) {
      throw e instanceof SandcellError ? http.explain(e) : e;
    }
  }

  private async pump(deliver: (data: Uint8Array) => void): Promise<ExitInfo | null> {
    try {
      for await (const message of this.socket) {
        if (message.type === "binary") {
          deliver(message.data);
          continue;
        }
        const event = JSON.parse(message.text) as { type: string } & Record<string, unknown>;
        if (event["type"] === "exit") {
          this.output.end();
          const exitCode = (event["exit_code"] as number | null | undefined) ?? null;
          // `ok` is in the frame itself (a daemon older than it: the API's rule, exit code 0).
          const ok = typeof event["ok"] === "boolean" ? event["ok"] : exitCode === 0;
          return toExitInfo({ ...(event["result"] as WireExit), exit_code: exitCode, ok });
        }
        if (event["type"] === "error" && isErrorBody(event)) throw errorFromBody(event);
        // `lost` (output that left the buffer before a join) carries no bytes to show.
      }
      this.output.end();
      return null;
    } catch (e) {
      this.output.end(e);
      throw e;
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    return this.output[Symbol.asyncIterator]();
  }

  /** Types into the terminal. */
  write(data: string | Uint8Array): void {
    this.socket.sendBinary(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  /** Resizes the terminal. */
  resize(rows: number, cols: number): void {
    this.socket.sendText(JSON.stringify({ type: "resize", rows, cols }));
  }

  /** Resolves when the process ends (with how it ended), or with null when the connection closed first. */
  wait(): Promise<ExitInfo | null> {
    return this.exited;
  }

  /** Closes the connection; the process runs on. */
  close(): void {
    this.socket.close();
  }

  /** Kills the terminal's process and its descendants; `wait()` then gives how it ended and the connection closes. */
  async kill(): Promise<void> {
    await killProcess(this.http, this.sandboxId, this.pid, { tree: true });
  }
}
