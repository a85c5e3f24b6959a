/**
 * `sb.commands` and `sb.files`: the command and file calls under E2B's names, so code written
 * for E2B moves over with few changes. Each one hands over to a `Sandbox` method; nothing
 * here has logic of its own.
 */

import { NotFoundError } from "./errors.js";
import type { BackgroundProcess, Command, ExecResult, KillOptions, ProcessInfo } from "./commands.js";
import type { FileInfo, WriteOptions } from "./files.js";
import type { Sandbox } from "./sandbox.js";
import type { StringMap } from "./types.js";

/** Options of `commands.run`: E2B's names (`envs`), durations in seconds. */
export interface RunCommandOptions {
  /** Start it in the background and return its handle at once (default: wait for it). */
  background?: boolean;
  /** Environment variables added to the sandbox's. */
  envs?: StringMap;
  /** Working directory (default `/workspace`). */
  cwd?: string;
  /** Seconds before its whole process tree is killed (a foreground command's default: the sandbox's exec timeout, 300 s; a background one's: none). */
  timeout?: number;
  /** Keep a background command's stdin open for `sendStdin` / `write` (background only). */
  stdin?: boolean;
  /** Called with each piece of stdout as it is written (foreground only). */
  onStdout?: (text: string) => void;
  /** Called with each piece of stderr as it is written (foreground only). */
  onStderr?: (text: string) => void;
}

/** `sb.commands`: `run`, `list`, `kill`, `connect`, `sendStdin` over `exec`, `startProcess`, `processes`, `killProcess`, `process`. */
export class Commands {
  constructor(private readonly sandbox: Sandbox) {}

  /**
   * Runs a command and waits for it (`exec`; a non-zero exit is `result.ok === false`, not an
   * exception), or with `background: true` starts it (`startProcess`) and returns its handle.
   */
  run(cmd: Command, options: RunCommandOptions & { background: true; onStdout?: undefined; onStderr?: undefined }): Promise<BackgroundProcess>;
  run(cmd: Command, options?: RunCommandOptions & { background?: false }): Promise<ExecResult>;
  run(cmd: Command, options?: RunCommandOptions): Promise<ExecResult | BackgroundProcess>;
  async run(cmd: Command, options: RunCommandOptions = {}): Promise<ExecResult | BackgroundProcess> {
    const common = { env: options.envs, cwd: options.cwd, timeout: options.timeout };
    if (options.background !== true) {
      return this.sandbox.exec(cmd, { ...common, onStdout: options.onStdout, onStderr: options.onStderr });
    }
    if (options.onStdout !== undefined || options.onStderr !== undefined) {
      throw new TypeError(
        "onStdout/onStderr follow a command run in the foreground; follow a background one with process.stream()",
      );
    }
    return this.sandbox.startProcess(cmd, { ...common, stdin: options.stdin });
  }

  /** `processes()`: every process in the sandbox, exited background ones included. */
  list(): Promise<ProcessInfo[]> {
    return this.sandbox.processes();
  }

  /** `killProcess(pid)` (default signal KILL); false when there is no such process (any more). */
  async kill(pid: number, options?: KillOptions): Promise<boolean> {
    try {
      await this.sandbox.killProcess(pid, options);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** `process(pid)`: a handle on a background process started earlier (by anyone). */
  connect(pid: number): BackgroundProcess {
    return this.sandbox.process(pid);
  }

  /** `process(pid).write(data)`: writes to a background process's stdin. */
  sendStdin(pid: number, data: string | Uint8Array): Promise<void> {
    return this.sandbox.process(pid).write(data);
  }
}

/** `sb.files`: `write`, `read`, `list`, `getInfo`, `exists`, `makeDir`, `remove`, `rename` over the `Sandbox` file methods. */
export class Files {
  constructor(private readonly sandbox: Sandbox) {}

  /** `writeFile`: text or bytes (parents are created). */
  write(path: string, data: string | Uint8Array, options?: WriteOptions): Promise<FileInfo> {
    return this.sandbox.writeFile(path, data, options);
  }

  /** `readFile`: text (UTF-8), or bytes with `{ format: "bytes" }`. */
  read(path: string, options?: { format?: "text" }): Promise<string>;
  read(path: string, options: { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, options: { format?: "text" | "bytes" } = {}): Promise<string | Uint8Array> {
    return options.format === "bytes" ? this.sandbox.readFile(path, { format: "bytes" }) : this.sandbox.readFile(path);
  }

  /** `ls`: a directory's entries (default `/workspace`). */
  list(path?: string): Promise<FileInfo[]> {
    return this.sandbox.ls(path);
  }

  /** `stat`: one path. */
  getInfo(path: string): Promise<FileInfo> {
    return this.sandbox.stat(path);
  }

  /** `exists`. */
  exists(path: string): Promise<boolean> {
    return this.sandbox.exists(path);
  }

  /** `mkdir`: a directory and its parents (one already there is fine). */
  makeDir(path: string): Promise<FileInfo> {
    return this.sandbox.mkdir(path);
  }

  /** `remove`: a file, or a directory (`recursive` for one with contents). */
  remove(path: string, options?: { recursive?: boolean }): Promise<void> {
    return this.sandbox.remove(path, options);
  }

  /** `rename`: moves a file or directory (the target must not exist). */
  rename(oldPath: string, newPath: string): Promise<FileInfo> {
    return this.sandbox.rename(oldPath, newPath);
  }
}
