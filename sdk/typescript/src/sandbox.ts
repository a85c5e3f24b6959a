/** The `Sandbox` class: one isolated, stateful sandbox on a Sandcell daemon, and every operation on it. */

import { clientFor, type HttpClient } from "./http.js";
import { type ClientOptions } from "./config.js";
import { NotFoundError, SandboxGoneError } from "./errors.js";
import * as commands from "./commands.js";
import * as code from "./code.js";
import * as files from "./files.js";
import * as git from "./git.js";
import { Memories } from "./memory.js";
import * as network from "./network.js";
import * as previews from "./previews.js";
import { Commands, Files } from "./namespaces.js";
import { Terminal, type AttachTerminalOptions, type TerminalOptions } from "./pty.js";
import {
  Snapshot,
  forkSnapshot,
  fromAutoSnapshot,
  listSnapshots,
  toAutoSnapshot,
  type AutoSnapshotSettings,
  type CreateSnapshotOptions,
  type ForkOptions,
  type WireAutoSnapshot,
} from "./snapshots.js";
import {
  fromLimits,
  fromMounts,
  fromNetworkPolicy,
  fromPackages,
  fromSecrets,
  toNetworkPolicy,
  toSandboxInfo,
  type Language,
  type LimitsInput,
  type Mount,
  type NetworkPolicyInput,
  type Packages,
  type SandboxInfo,
  type SandboxState,
  type Secret,
  type Size,
  type StringMap,
  type WireSandbox,
} from "./types.js";

/** Options of `Sandbox.create`. */
export interface CreateSandboxOptions extends ClientOptions {
  /** `default` (the host's system), or `python`, `node`, `bash`, `r` (that kernel started during creation). */
  template?: string;
  /** A named size (default `small`). */
  size?: Size;
  /** Limits overriding the size's. */
  limits?: LimitsInput;
  /** Environment variables of every command and kernel. */
  env?: StringMap;
  /** Labels (filterable in `Sandbox.list`). */
  labels?: StringMap;
  /** Metadata (filterable in `Sandbox.list`). */
  metadata?: StringMap;
  /** Lifetime in seconds from now (default: the daemon's, 2 h). */
  timeoutSecs?: number;
  /** Stopped after this many seconds without a request (default: the daemon's, 30 min). */
  idleTimeoutSecs?: number;
  /** Forget its record when it stops. */
  ephemeral?: boolean;
  /**
   * What its network reaches: `loopback` (the default), `off`, `full`, or allow rules
   * (`["example.org", "*.example.net:443", "127.0.0.1:8080"]`, the same as `{ allow: [...] }`);
   * a bad rule is an `InvalidArgumentError`.
   */
  network?: NetworkPolicyInput;
  /**
   * Packages installed while it is made (`{ pip: [...], npm: [...], r: [...] }`), from the
   * registries the daemon's operator configured, or unpacked from the cache of an earlier
   * install of the same lists; `info.packages` says which. An install that failed is an
   * `InvalidArgumentError` naming the package (no sandbox is left), as are packages with
   * network `off`.
   */
  packages?: Packages;
  /**
   * Secrets that never enter it (`[{ name, value, hosts }]`): each `name` is an environment
   * variable holding a placeholder, which its egress proxy replaces with the value in the
   * headers and query of requests to `hosts` only (so `network` must let it reach them; not
   * with `off`). A malformed one is a `TypeError` before anything is sent, a bad name, value
   * or host rule an `InvalidArgumentError`. With `snapshotId`: values for the snapshot's
   * secrets by name, which keep their placeholders (needed after the daemon restarted, as it
   * keeps values in memory only; otherwise they replace the values the restore would get); a
   * name the snapshot lacks is an `InvalidArgumentError`.
   */
  secrets?: readonly Secret[];
  /**
   * Host folders and named volumes mounted into it (`[Mount.fromHost(hostPath, path),
   * Mount.fromVolume(name, path)]`, or `{ hostPath, path, mode }` / `{ volume, path, mode }`),
   * each at `path`: `/workspace` or a folder below `/workspace`, `/home/sandbox` or `/tmp`. A
   * host folder must lie inside the daemon's `mounts.allowed_paths` (else a
   * `PermissionDeniedError`) and is read-only unless `mode` is `rw` or `overlay` (writes go to
   * a scratch layer of the sandbox's own; process backend only); a volume is made on first use
   * and is read-write unless `mode` says otherwise. A malformed mount is a `TypeError` before
   * anything is sent, a bad path, name or mode an `InvalidArgumentError`. Not with
   * `checkpointable`.
   */
  mounts?: readonly Mount[];
  /** Kernels to start during creation, so the first code in them runs at once. */
  kernels?: Language[];
  /** The isolation backend (`process` by default, `gvisor` where available). */
  backend?: string;
  /** Process backend with a working CRIU: snapshots keep every process. */
  checkpointable?: boolean;
  /** Automatic snapshots. */
  autoSnapshot?: Partial<AutoSnapshotSettings>;
  /** Restore this snapshot instead (then only labels, metadata, timeouts, `ephemeral` and `secrets` may be given). */
  snapshotId?: string;
}

/** Options of `Sandbox.list`. */
export interface ListSandboxesOptions extends ClientOptions {
  /** Labels that must all match. */
  label?: StringMap;
  /** Metadata that must all match. */
  metadata?: StringMap;
  /** Only these states, or `all` (default: creating, running, paused). */
  state?: SandboxState | "all" | (SandboxState | "all")[];
}

/** CPU, memory and process counts of a sandbox (null where the host has no such cgroup figure). */
export interface SandboxMetrics {
  /** CPU use since the previous call, in percent of one CPU (200 = two CPUs busy). */
  cpuPercent: number | null;
  /** CPU time used since it started, in seconds. */
  cpuSeconds: number | null;
  /** Its CPU limit. */
  cpuLimit: number | null;
  /** Memory in use, in bytes (page cache included). */
  memoryBytes: number | null;
  /** The highest memory use seen. */
  memoryPeakBytes: number | null;
  /** Its memory limit. */
  memoryLimitBytes: number | null;
  /** Processes and threads now. */
  pids: number | null;
  /** Its process limit. */
  pidsLimit: number | null;
  /** Processes the OOM killer ended so far. */
  oomKills: number | null;
  /** Forks refused by the process limit so far. */
  pidsLimitHits: number | null;
}

/** Options of `Sandbox.runOnce`. */
export interface RunOnceOptions extends ClientOptions {
  /** The template (default `python`). */
  template?: string;
  /** The language (default: the template's, else `python`). */
  language?: Language;
  /** A named size. */
  size?: Size;
  /** Environment variables. */
  env?: StringMap;
  /** Seconds before the execution is interrupted. */
  timeout?: number;
}

/** Timings of a one-shot run, in milliseconds. */
export interface RunOnceMetrics {
  /** Creating the sandbox (request to answer). */
  startupMs: number;
  /** Running the code (request to answer). */
  runMs: number;
  /** The execution as the kernel measured it. */
  executionMs: number;
  /** Deleting the sandbox. */
  cleanupMs: number;
  /** All of it. */
  totalMs: number;
}

/** What a one-shot run gives back: the execution and how long each step took. */
export interface RunOnceResult {
  /** The execution (output, results, error, status). */
  execution: code.Execution;
  /** What the code printed: `execution.stdout`, under other sandbox SDKs' name. */
  output: string;
  /** The sandbox it ran in (deleted since). */
  sandboxId: string;
  /** Timings. */
  metrics: RunOnceMetrics;
}

/** Options of `enableAutoSnapshot`. */
export interface EnableAutoSnapshotOptions {
  /** One snapshot every this many minutes while it runs. */
  intervalMins: number;
  /** Interval snapshots kept (default 3, at most 100). */
  keep?: number | null;
  /** One snapshot just before it is stopped for idleness or its lifetime. */
  beforeReclaim?: boolean;
}

interface WireMetrics {
  cpu_percent?: number | null;
  cpu_seconds?: number | null;
  cpu_limit?: number | null;
  memory_bytes?: number | null;
  memory_peak_bytes?: number | null;
  memory_limit_bytes?: number | null;
  pids?: number | null;
  pids_limit?: number | null;
  oom_kills?: number | null;
  pids_limit_hits?: number | null;
}

const TEMPLATE_LANGUAGES: Record<string, Language> = { python: "python", node: "node", bash: "bash", r: "r" };

/**
 * One sandbox. Make one with `Sandbox.create()`, reach an existing one with `Sandbox.get(id)`;
 * end it with `kill()` — or let `await using sb = await Sandbox.create()` end it at the end
 * of the block.
 */
export class Sandbox {
  /** Its id (`sb-…`). */
  readonly id: string;
  /** What the API last said about it (refreshed by `refresh`, `pause`, `resume`, `setTimeout`; `setNetwork` updates its `network`). */
  info: SandboxInfo;
  /** E2B's names for the command calls: `run`, `list`, `kill`, `connect`, `sendStdin`. */
  readonly commands: Commands;
  /** E2B's names for the file calls: `write`, `read`, `list`, `getInfo`, `exists`, `makeDir`, `remove`, `rename`. */
  readonly files: Files;
  /** Its memories: `add`, `search`, `list`, `get`, `delete` (a sandbox made from a snapshot of it starts with copies of them). */
  readonly memory: Memories;

  /** Wraps a sandbox the API described; use `Sandbox.create` or `Sandbox.get` instead. */
  constructor(private readonly http: HttpClient, info: SandboxInfo) {
    this.id = info.id;
    this.info = info;
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.memory = new Memories(http, info.id);
  }

  /** Creates a sandbox (or restores one from `snapshotId`) and returns it running. */
  static async create(options: CreateSandboxOptions = {}): Promise<Sandbox> {
    const http = clientFor(options);
    const body = {
      template: options.template,
      size: options.size,
      limits: options.limits === undefined ? undefined : fromLimits(options.limits),
      env: options.env,
      labels: options.labels,
      metadata: options.metadata,
      timeout_secs: options.timeoutSecs,
      idle_timeout_secs: options.idleTimeoutSecs,
      ephemeral: options.ephemeral,
      network: options.network === undefined ? undefined : fromNetworkPolicy(options.network),
      packages: options.packages === undefined ? undefined : fromPackages(options.packages),
      secrets: options.secrets === undefined ? undefined : fromSecrets(options.secrets),
      mounts: options.mounts === undefined ? undefined : fromMounts(options.mounts),
      kernels: options.kernels,
      backend: options.backend,
      checkpointable: options.checkpointable,
      auto_snapshot: options.autoSnapshot === undefined ? undefined : fromAutoSnapshot(options.autoSnapshot),
      snapshot_id: options.snapshotId,
    };
    // No client deadline: a restore of a large snapshot, a gVisor start or a package install
    // may take a while (the daemon bounds an install itself).
    const s = await http.json<WireSandbox>("POST", "/v1/sandboxes", { body: { json: body }, timeout: null });
    return new Sandbox(http, toSandboxInfo(s));
  }

  /** Reaches an existing sandbox by id. */
  static async get(id: string, options: ClientOptions = {}): Promise<Sandbox> {
    const http = clientFor(options);
    return new Sandbox(http, toSandboxInfo(await http.json<WireSandbox>("GET", `/v1/sandboxes/${id}`)));
  }

  /** Lists your sandboxes (every page), filtered by labels, metadata and state. */
  static async list(options: ListSandboxesOptions = {}): Promise<SandboxInfo[]> {
    const http = clientFor(options);
    const pairs = (m: StringMap | undefined): string[] => Object.entries(m ?? {}).map(([k, v]) => `${k}:${v}`);
    const states = options.state === undefined ? undefined : [options.state].flat().join(",");
    const items: SandboxInfo[] = [];
    let cursor: string | undefined;
    do {
      const page: { items: WireSandbox[]; next_cursor?: string | null } = await http.json("GET", "/v1/sandboxes", {
        query: { label: pairs(options.label), metadata: pairs(options.metadata), state: states, cursor },
      });
      items.push(...page.items.map(toSandboxInfo));
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
    return items;
  }

  /** Makes `count` new sandboxes from a snapshot (all or none). */
  static async fork(snapshotId: string, options: ForkOptions & ClientOptions = {}): Promise<Sandbox[]> {
    return forkSnapshot(clientFor(options), snapshotId, options);
  }

  /**
   * Runs code once in a fresh ephemeral sandbox, which is deleted afterwards (also when the
   * run fails), and says how long each step took.
   */
  static async runOnce(source: string, options: RunOnceOptions = {}): Promise<RunOnceResult> {
    const template = options.template ?? "python";
    const t0 = performance.now();
    const sandbox = await Sandbox.create({ ...options, template, ephemeral: true });
    const t1 = performance.now();
    let t2 = t1;
    try {
      const execution = await sandbox.runCode(source, {
        language: options.language ?? TEMPLATE_LANGUAGES[template] ?? "python",
        timeout: options.timeout,
      });
      t2 = performance.now();
      await sandbox.kill();
      const t3 = performance.now();
      return {
        execution,
        output: execution.stdout,
        sandboxId: sandbox.id,
        metrics: {
          startupMs: t1 - t0,
          runMs: t2 - t1,
          executionMs: execution.done.durationMs,
          cleanupMs: t3 - t2,
          totalMs: t3 - t0,
        },
      };
    } catch (e) {
      await sandbox.kill().catch(() => undefined);
      throw e;
    }
  }

  // ---- lifecycle ----

  /** Reads its current description. */
  async refresh(): Promise<SandboxInfo> {
    return this.update(await this.http.json<WireSandbox>("GET", this.path()));
  }

  /** Stops it and frees everything it holds; a sandbox already gone is not an error. */
  async kill(): Promise<void> {
    try {
      await this.http.json<void>("DELETE", this.path());
    } catch (e) {
      if (!(e instanceof NotFoundError || e instanceof SandboxGoneError)) throw e;
    }
  }

  /** Ends it at the end of an `await using` block. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }

  /** `kill()`, under other sandbox SDKs' name. */
  delete(): Promise<void> {
    return this.kill();
  }

  /** `kill()`, for code that closes what it opened (this client holds no connection of its own). */
  close(): Promise<void> {
    return this.kill();
  }

  /** Sets a new lifetime, in seconds from now. */
  async setTimeout(timeoutSecs: number): Promise<SandboxInfo> {
    return this.update(
      await this.http.json<WireSandbox>("POST", this.path("/timeout"), { body: { json: { timeout_secs: timeoutSecs } } }),
    );
  }

  /** Freezes every process (no CPU; memory and state kept, clocks stopped); any later request resumes it. */
  async pause(): Promise<SandboxInfo> {
    return this.update(await this.http.json<WireSandbox>("POST", this.path("/pause")));
  }

  /** Lets a paused sandbox go on where it stopped. */
  async resume(): Promise<SandboxInfo> {
    return this.update(await this.http.json<WireSandbox>("POST", this.path("/resume")));
  }

  /** CPU, memory and process counts. */
  async metrics(): Promise<SandboxMetrics> {
    const m = await this.http.json<WireMetrics>("GET", this.path("/metrics"));
    return {
      cpuPercent: m.cpu_percent ?? null,
      cpuSeconds: m.cpu_seconds ?? null,
      cpuLimit: m.cpu_limit ?? null,
      memoryBytes: m.memory_bytes ?? null,
      memoryPeakBytes: m.memory_peak_bytes ?? null,
      memoryLimitBytes: m.memory_limit_bytes ?? null,
      pids: m.pids ?? null,
      pidsLimit: m.pids_limit ?? null,
      oomKills: m.oom_kills ?? null,
      pidsLimitHits: m.pids_limit_hits ?? null,
    };
  }

  // ---- network ----

  /**
   * Its network policy now, the proxies its programs reach the outside through (`httpProxy`,
   * `socksProxy`: their `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`), and what its egress
   * proxy has carried.
   */
  network(): Promise<network.NetworkInfo> {
    return network.getNetwork(this.http, this.id);
  }

  /**
   * Changes what it reaches, from its next connection (or plain-HTTP request) on; tunnels
   * open now stay open. `off` is only chosen at creation: a change to or from it is an
   * `InvalidArgumentError`, as is a bad rule. Updates `info.network`.
   */
  async setNetwork(policy: NetworkPolicyInput): Promise<network.NetworkInfo> {
    const info = await network.setNetwork(this.http, this.id, policy);
    this.info.network = toNetworkPolicy(info.network);
    return info;
  }

  /**
   * Its secrets: names, placeholders, hosts, and whether the daemon holds each value (`held`
   * is false after the daemon restarted, as it keeps values in memory only: until the value
   * is given again with `setSecrets`, requests carrying the placeholder are refused). Never a
   * value.
   */
  secrets(): Promise<network.SecretState[]> {
    return network.getSecrets(this.http, this.id);
  }

  /**
   * Replaces its secrets, from its next request on: a name it has keeps its placeholder (so
   * a value is rotated, or given again after the daemon restarted, without touching what
   * runs inside); a new name gets a new placeholder, which processes already running lack
   * in their environment (`secrets()` shows it); a name left out is forgotten, and its
   * placeholder then passes unreplaced. A malformed list is a `TypeError` before anything is
   * sent; a bad name, value or host rule, or network `off`, an `InvalidArgumentError` that
   * names the secret, never its value (nothing is changed then).
   */
  setSecrets(secrets: readonly Secret[]): Promise<network.SecretState[]> {
    return network.setSecrets(this.http, this.id, secrets);
  }

  /**
   * One page of its egress events, newest first: each connection its proxy allowed or
   * denied. Pass the page's `nextBefore` as `before` for the next (null: it was the last).
   * They are audit entries, so they outlive the sandbox.
   */
  egressEvents(options?: network.EgressEventsOptions): Promise<network.EgressEventPage> {
    return network.egressEvents(this.http, this.id, options);
  }

  /** Every egress event, newest first, read a page at a time as the iteration gets to it. */
  iterEgressEvents(options?: network.IterEgressEventsOptions): AsyncGenerator<network.EgressEvent, void, undefined> {
    return network.iterEgressEvents(this.http, this.id, options);
  }

  // ---- previews ----

  /**
   * Makes a server listening on `port` inside the sandbox (on its loopback) reachable through
   * the daemon: the answer has a token for that port, valid `ttlSecs` (default 3600, at most 7
   * days), and where the port is reached (`path` on the daemon, `host` on the daemon's port).
   * Requests there carry the API key, or the token (`?sandcell_token=…`, the
   * `X-Sandcell-Token` header, or on the host route the cookie a URL with the token sets), or
   * nothing once `public: true` (`public: false` makes the port private again). Its own
   * network policy is unchanged. A port outside 1 to 65535 or a `ttlSecs` outside 1 s to 7
   * days is an `InvalidArgumentError`. Nothing listening on the port is answered there with
   * 502 `port_closed`; a sandbox with network `off` (nothing inside can listen), with 409
   * `invalid_state`.
   */
  preview(port: number, options?: previews.PreviewOptions): Promise<previews.PreviewInfo> {
    return previews.createPreview(this.http, this.id, port, options);
  }

  /**
   * `{port}-{id}.localhost:{daemon port}`: the host at which a server on `port` inside the
   * sandbox is reached through the daemon (browsers resolve `*.localhost` to this machine's
   * loopback, so it serves a browser on the daemon's machine, or one the daemon's port is
   * forwarded to). Made from `info.previewHost` and the client's URL, with no request;
   * reaching it takes the API key, a token (`previewUrl`) or a public port. A port outside 1
   * to 65535 is a `RangeError`.
   */
  getHost(port: number): string {
    return previews.previewHost(this.info.previewHost, this.id, port, this.http.config.apiUrl);
  }

  /**
   * A URL of the server on `port` inside the sandbox, to open in a browser or fetch with no
   * API key: a new token (valid `ttlSecs`, default 3600) is in its query. `route: "host"` (the
   * default) gives `http://{port}-{id}.localhost:{daemon port}/?sandcell_token=…` (the daemon
   * keeps the token in a cookie, so the page's own links work too; see `getHost` for where
   * that name resolves); `route: "path"` gives the daemon's URL with
   * `/v1/sandboxes/{id}/ports/{port}/?sandcell_token=…`, which works wherever the daemon's URL
   * does (the page's absolute links then miss the prefix). Another route is a `TypeError`.
   */
  async previewUrl(port: number, options: previews.PreviewUrlOptions = {}): Promise<string> {
    const route = previews.checkRoute(options.route ?? "host");
    const info = await previews.createPreview(this.http, this.id, port, { ttlSecs: options.ttlSecs });
    return previews.previewUrl(info, this.http.config.apiUrl, route);
  }

  // ---- commands and processes ----

  /**
   * Runs a command (a shell line, or an argv array) and waits for it; with `onStdout` /
   * `onStderr` its output goes to them as it comes.
   */
  exec(cmd: commands.Command, options?: commands.ExecOptions & commands.ExecCallbacks): Promise<commands.ExecResult> {
    return commands.exec(this.http, this.id, cmd, options);
  }

  /** Runs a command and yields `stdout`/`stderr` events as written, then `done`. */
  execStream(cmd: commands.Command, options?: commands.ExecOptions): AsyncGenerator<commands.ExecEvent, void, undefined> {
    return commands.execStream(this.http, this.id, cmd, options);
  }

  /** Starts a command in the background and returns a handle to follow it. */
  startProcess(cmd: commands.Command, options?: commands.StartProcessOptions): Promise<commands.BackgroundProcess> {
    return commands.startProcess(this.http, this.id, cmd, options);
  }

  /** A handle on a background process by pid (to reconnect to one started earlier). */
  process(pid: number): commands.BackgroundProcess {
    return new commands.BackgroundProcess(this.http, this.id, pid);
  }

  /** Every process in the sandbox. */
  processes(): Promise<commands.ProcessInfo[]> {
    return commands.listProcesses(this.http, this.id);
  }

  /** `processes()`, under other sandbox SDKs' name. */
  getProcesses(): Promise<commands.ProcessInfo[]> {
    return this.processes();
  }

  /** Sends a signal (default KILL) to a process. */
  killProcess(pid: number, options?: commands.KillOptions): Promise<void> {
    return commands.killProcess(this.http, this.id, pid, options);
  }

  /** Starts a command (default a login shell) on a new terminal and connects to it. */
  openTerminal(options?: TerminalOptions): Promise<Terminal> {
    return Terminal.open(this.http, this.id, options);
  }

  /** Connects to a running terminal process again (its recent output is replayed). */
  attachTerminal(pid: number, options?: AttachTerminalOptions): Promise<Terminal> {
    return Terminal.attach(this.http, this.id, pid, options);
  }

  // ---- code ----

  /** Runs code in a kernel whose state persists; streamed to the callbacks when given. */
  runCode(source: string, options?: code.RunCodeOptions): Promise<code.Execution> {
    return code.runCode(this.http, this.id, source, options);
  }

  /** Runs Python code (in the default Python context unless one is given). */
  runPython(source: string, options?: Omit<code.RunCodeOptions, "language">): Promise<code.Execution> {
    return code.runCode(this.http, this.id, source, { ...options, language: "python" });
  }

  /** Runs JavaScript in the Node.js kernel (in the default Node context unless one is given). */
  runNode(source: string, options?: Omit<code.RunCodeOptions, "language">): Promise<code.Execution> {
    return code.runCode(this.http, this.id, source, { ...options, language: "node" });
  }

  /** Starts a new context: a kernel with state of its own. */
  createContext(options?: code.CreateContextOptions): Promise<code.ContextInfo> {
    return code.createContext(this.http, this.id, options);
  }

  /** Lists its contexts. */
  listContexts(): Promise<code.ContextInfo[]> {
    return code.listContexts(this.http, this.id);
  }

  /** Ends a context. */
  deleteContext(context: code.ContextRef): Promise<void> {
    return code.deleteContext(this.http, this.id, context);
  }

  /** Interrupts a context's running execution (default: the Python one); its state stays. */
  interrupt(context: code.ContextRef = "python"): Promise<void> {
    return code.interrupt(this.http, this.id, context);
  }

  /** Restarts a context's kernel with clean state (default: the Python one). */
  restartContext(context: code.ContextRef = "python"): Promise<code.ContextInfo> {
    return code.restartContext(this.http, this.id, context);
  }

  /** Reads a context's variables (default: all of the Python context's). */
  getVariables(options?: code.VariablesOptions): Promise<code.Variables> {
    return code.getVariables(this.http, this.id, options);
  }

  /** Sets variables in a context from JSON values; returns their names. */
  setVariables(values: Record<string, unknown>, options?: Pick<code.VariablesOptions, "context">): Promise<string[]> {
    return code.setVariables(this.http, this.id, values, options);
  }

  /** Deletes variables of a context (default: all); returns the names deleted. */
  clearVariables(options?: code.VariablesOptions): Promise<string[]> {
    return code.clearVariables(this.http, this.id, options);
  }

  // ---- files ----

  /** Writes a file from text or bytes (parents are created). */
  writeFile(path: string, data: string | Uint8Array, options?: files.WriteOptions): Promise<files.FileInfo> {
    return files.writeFile(this.http, this.id, path, data, options);
  }

  /** Reads a file as text (UTF-8), or as bytes with `{ format: "bytes" }`. */
  readFile(path: string, options?: { format?: "text" }): Promise<string>;
  readFile(path: string, options: { format: "bytes" }): Promise<Uint8Array>;
  async readFile(path: string, options: { format?: "text" | "bytes" } = {}): Promise<string | Uint8Array> {
    const bytes = await files.readBytes(this.http, this.id, path);
    return options.format === "bytes" ? bytes : new TextDecoder().decode(bytes);
  }

  /** Lists a directory (default `/workspace`). */
  ls(path?: string): Promise<files.FileInfo[]> {
    return files.ls(this.http, this.id, path);
  }

  /** Describes one path. */
  stat(path: string): Promise<files.FileInfo> {
    return files.stat(this.http, this.id, path);
  }

  /** Whether a path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await files.stat(this.http, this.id, path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Creates a directory and its parents. */
  mkdir(path: string): Promise<files.FileInfo> {
    return files.mkdir(this.http, this.id, path);
  }

  /** Removes a file, or a directory (`recursive` for a non-empty one). */
  remove(path: string, options?: { recursive?: boolean }): Promise<void> {
    return files.remove(this.http, this.id, path, options);
  }

  /** Moves a file or directory. */
  rename(from: string, to: string): Promise<files.FileInfo> {
    return files.rename(this.http, this.id, from, to);
  }

  /** Uploads a local file (by path) or a byte stream, streamed: any size, never held whole in memory. */
  upload(source: files.UploadSource, remotePath: string, options?: files.WriteOptions): Promise<files.FileInfo> {
    return files.upload(this.http, this.id, source, remotePath, options);
  }

  /** Downloads a file to a local path, streamed; returns the bytes written. */
  async download(remotePath: string, localPath: string): Promise<number> {
    return files.saveStream(await files.downloadStream(this.http, this.id, remotePath), localPath);
  }

  /** Opens a file as a web byte stream, read at the caller's pace. */
  downloadStream(remotePath: string, options: { signal?: AbortSignal } = {}): Promise<ReadableStream<Uint8Array>> {
    return files.downloadStream(this.http, this.id, remotePath, options.signal);
  }

  /** Puts files in from an allowed host path, inline text or base64, or an export. */
  importFiles(path: string, source: files.ImportSource, options?: { mode?: number }): Promise<files.ImportResult> {
    return files.importFiles(this.http, this.id, path, source, options);
  }

  /** Copies a file or folder out into the service's keeping (it outlives the sandbox). */
  exportFiles(path: string): Promise<files.FileExport> {
    return files.exportFiles(this.http, this.id, path);
  }

  /** Lists the files code left in `/workspace/outputs`. */
  artifacts(): Promise<files.Artifact[]> {
    return files.artifacts(this.http, this.id);
  }

  // ---- git ----

  /**
   * Clones a repository (an `https://` or `http://` URL) into the sandbox, at `path` (default
   * `/workspace/<repository name>`), which must not exist or be empty. The clone runs on the
   * daemon's host, through a proxy that reaches the repository's host only, whatever the
   * sandbox's own network policy; credentials (`https://user:token@host/…`, or `username` and
   * `password`) are used there and never enter the sandbox: its `.git/config` holds the URL
   * without them. A bad URL, branch or depth, or a clone that failed (the message quotes git),
   * is an `InvalidArgumentError`; a `path` that is not empty, a `ConflictError`
   * (`already_exists`).
   */
  gitClone(url: string, options?: git.GitCloneOptions): Promise<git.GitCloneResult> {
    return git.gitClone(this.http, this.id, url, options);
  }

  // ---- snapshots ----

  /** Takes a durable snapshot (files, and the kernels' variables). */
  createSnapshot(options?: CreateSnapshotOptions): Promise<Snapshot> {
    return Snapshot.take(this.http, this.id, options);
  }

  /** Lists this sandbox's snapshots, oldest first. */
  listSnapshots(): Promise<Snapshot[]> {
    return listSnapshots(this.http, this.id);
  }

  /** Reads its automatic-snapshot settings. */
  async getAutoSnapshot(): Promise<AutoSnapshotSettings> {
    return toAutoSnapshot(await this.http.json<WireAutoSnapshot>("GET", this.path("/auto-snapshot")));
  }

  /** Replaces its automatic-snapshot settings. */
  async setAutoSnapshot(settings: Partial<AutoSnapshotSettings>): Promise<AutoSnapshotSettings> {
    const a = await this.http.json<WireAutoSnapshot>("PUT", this.path("/auto-snapshot"), {
      body: { json: fromAutoSnapshot(settings) },
    });
    return toAutoSnapshot(a);
  }

  /**
   * `setAutoSnapshot({ intervalSecs: intervalMins * 60, … })`: other sandbox SDKs' name, with
   * the interval in minutes (rounded to whole seconds); the settings are replaced.
   */
  enableAutoSnapshot(options: EnableAutoSnapshotOptions): Promise<AutoSnapshotSettings> {
    const { intervalMins, ...rest } = options;
    return this.setAutoSnapshot({ ...rest, intervalSecs: Math.round(intervalMins * 60) });
  }

  /** `setAutoSnapshot({})`: no automatic snapshots from now on (those taken stay). */
  disableAutoSnapshot(): Promise<AutoSnapshotSettings> {
    return this.setAutoSnapshot({});
  }

  private path(rest = ""): string {
    return `/v1/sandboxes/${this.id}${rest}`;
  }

  private update(s: WireSandbox): SandboxInfo {
    this.info = toSandboxInfo(s);
    return this.info;
  }
}
