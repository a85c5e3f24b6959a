/**
 * Types shared by several modules: a sandbox's description and how a process ended. The API
 * speaks snake_case JSON; each `Wire*` type is its answer as sent, each public type the
 * camelCase form this SDK hands out (mapped field by field, so user data — labels, env,
 * variables, MIME bundles — is never renamed).
 */

/** A language with a kernel. */
export type Language = "python" | "node" | "bash" | "r";

/** A named set of limits. */
export type Size = "nano" | "small" | "medium" | "large";

/**
 * A network policy that lets the sandbox reach only the hosts its rules name, through its
 * egress proxy: `"host"`, `"*.suffix"`, `"host:port"`, `"127.0.0.1:8080"`, `"[::1]:8080"` (a
 * loopback, private, link-local or metadata address only when a rule names it).
 */
export interface AllowPolicy {
  /** The rules (1 to 256). */
  allow: string[];
}

/**
 * What a sandbox's network reaches: `off` (no sockets but Unix ones), `loopback` (its own
 * loopback only: the default), `full` (any public host through its egress proxy) or
 * `{ allow: [rules] }` (only those hosts through it).
 */
export type NetworkPolicy = "off" | "loopback" | "full" | AllowPolicy;

/** A policy as `Sandbox.create` and `setNetwork` take it: a policy, or its allow rules alone (`["example.org"]` is `{ allow: ["example.org"] }`). */
export type NetworkPolicyInput = NetworkPolicy | readonly string[];

/** `NetworkPolicy`, under the name this SDK gave it before allow rules existed. */
export type Network = NetworkPolicy;

/**
 * Packages installed while a sandbox is made (`Sandbox.create({ packages })`), inside it,
 * through its egress proxy allowed only to the package registries the daemon's operator
 * configured; cached by the lists, so the next sandbox with the same lists gets them from the
 * cache. Not with network `off`.
 */
export interface Packages {
  /** Python packages as pip takes them (`numpy`, `pandas==2.2.2`), installed for the sandbox's user (`~/.local`). */
  pip?: readonly string[];
  /** npm packages (`left-pad`, `@scope/name@1.2.3`), installed globally under `~/.npm-global` (on `PATH` and `NODE_PATH`). */
  npm?: readonly string[];
  /** R packages, installed into `~/R/library` (`R_LIBS_USER`). */
  r?: readonly string[];
}

/**
 * A secret that never enters the sandbox (`Sandbox.create({ secrets })`): the sandbox gets
 * the environment variable `name` holding a placeholder (`SANDCELL_SECRET_…`), and its egress
 * proxy puts `value` in place of the placeholder in the headers (Basic auth included) and the
 * query of requests to `hosts` only, over TLS it terminates with a CA the sandbox trusts
 * (`/run/sandcell/ca.pem`). A request carrying the placeholder to another host is refused
 * (403). The value stays in the daemon's memory; no answer shows it again. Not with network
 * `off`.
 */
export interface Secret {
  /** The environment variable holding its placeholder (`A-Z`, `0-9`, `_`, not starting with a digit). */
  name: string;
  /** The value (1 to 8192 bytes, no control characters). */
  value: string;
  /** The hosts it may be sent to, as network allow rules (`api.example.com`, `*.example.com`, `api.example.com:443`); at least one. */
  hosts: readonly string[];
}

/**
 * A `Secret` whose value `console.log`, `util.inspect`, `JSON.stringify` and object spreads
 * leave out (the value is a non-enumerable property), so that logging the options of a create
 * does not leak it; frozen. `Sandbox.create({ secrets: [secret("TOKEN", value, ["api.example.com"])] })`.
 */
export function secret(name: string, value: string, hosts: readonly string[]): Secret {
  const s = { name, hosts: Object.freeze([...hosts]) };
  Object.defineProperty(s, "value", { value, enumerable: false });
  return Object.freeze(s) as Secret;
}

/**
 * How a sandbox sees a mounted folder: `ro` read-only (the default for host folders), `rw`
 * read-write (the default for volumes), or `overlay`: read-only below, with the sandbox's
 * writes going to a scratch layer of its own that goes with it (process backend only).
 */
export type MountMode = "ro" | "rw" | "overlay";

/**
 * A host folder mounted into a sandbox when it is made (`Sandbox.create({ mounts })`):
 * `hostPath` is an absolute folder inside one of the daemon's `mounts.allowed_paths` (else a
 * `PermissionDeniedError`), read-only unless `mode` says otherwise.
 */
export interface HostMount {
  /** The host folder (absolute). */
  hostPath: string;
  /** Where it appears inside: `/workspace` or a folder below `/workspace`, `/home/sandbox` or `/tmp`. */
  path: string;
  /** `ro` (the default), `rw` or `overlay`. */
  mode?: MountMode;
  volume?: never;
}

/**
 * A named volume of your key's owner mounted into a sandbox when it is made
 * (`Sandbox.create({ mounts })`): made on first use, read-write unless `mode` says otherwise;
 * it outlives the sandbox (`Volume.list`, `Volume.delete`).
 */
export interface VolumeMount {
  /** The volume's name (1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or digit). */
  volume: string;
  /** Where it appears inside: `/workspace` or a folder below `/workspace`, `/home/sandbox` or `/tmp`. */
  path: string;
  /** `rw` (the default), `ro` or `overlay`. */
  mode?: MountMode;
  hostPath?: never;
}

/** A folder mounted into a sandbox when it is made: a host folder or a named volume. */
export type Mount = HostMount | VolumeMount;

/**
 * Makes mounts: `Mount.fromHost("/srv/data", "/workspace/data")`,
 * `Mount.fromVolume("cache", "/home/sandbox/cache")` (plain objects `{ hostPath, path, mode }`
 * and `{ volume, path, mode }` are the same).
 */
export const Mount = {
  /** A host folder (absolute, inside the daemon's `mounts.allowed_paths`) at `path`; read-only unless `mode` says `rw` or `overlay`. */
  fromHost(hostPath: string, path: string, mode?: MountMode): HostMount {
    return mode === undefined ? { hostPath, path } : { hostPath, path, mode };
  },
  /** Your volume `name` (made on first use) at `path`; read-write unless `mode` says `ro` or `overlay`. */
  fromVolume(name: string, path: string, mode?: MountMode): VolumeMount {
    return mode === undefined ? { volume: name, path } : { volume: name, path, mode };
  },
};

/** How a sandbox's packages were installed (only on the answer of the create that asked for them). */
export interface PackagesReport {
  /** Served from the cache of an earlier install of the same lists (no registry reached). */
  cached: boolean;
  /** How long installing (or unpacking the cached install) took, in milliseconds. */
  durationMs: number;
  /** Files the install put into the sandbox. */
  files: number;
  /** Their bytes. */
  bytes: number;
  /** The sandbox came from a warm pool that had installed the lists while it waited. */
  fromPool: boolean;
}

/** Where a sandbox is in its life. */
export type SandboxState = "creating" | "running" | "paused" | "stopped" | "failed" | "lost";

/** String keys to string values: labels, metadata, env, tags. */
export type StringMap = Record<string, string>;

/** Limits in force in a sandbox. */
export interface SandboxLimits {
  /** Memory in MiB. */
  memoryMb: number | null;
  /** CPUs. */
  cpus: number | null;
  /** Processes and threads. */
  pids: number | null;
  /** `/workspace` size in MiB. */
  diskMb: number;
  /** `/tmp` size in MiB. */
  tmpMb: number;
  /** `/home/sandbox` size in MiB. */
  homeMb: number;
  /** Open files per process. */
  openFiles: number;
  /** Default exec timeout in seconds. */
  execTimeoutSecs: number | null;
}

/** Limits to override a size's at creation (all optional). */
export type LimitsInput = Partial<SandboxLimits>;

/** A variable a snapshot could not carry. */
export interface SkippedVariable {
  /** Its name. */
  name: string;
  /** Its type, in the language's words. */
  type: string;
  /** Why it was left out. */
  reason: string;
}

/** One kernel brought back by a restore. */
export interface KernelRestore {
  /** Its context. */
  context: string;
  /** Its language. */
  language: Language;
  /** Variables restored. */
  restored: string[];
  /** Variables that could not be, and why. */
  failed: { name: string; reason: string }[];
  /** Variables the snapshot had left out. */
  skipped: SkippedVariable[];
}

/** A new volume a restore made from a snapshot's copy of a volume (`volumes: "copy"`). */
export interface RestoredVolume {
  /** The new volume's name (`<from>-<6 hex>`), the sandbox's own. */
  volume: string;
  /** The volume the copy was taken of (left as it is). */
  from: string;
  /** Where it is mounted. */
  path: string;
}

/** What a restore from a snapshot brought back. */
export interface RestoreReport {
  /** `files`, `language` or `process`. */
  fidelity: string;
  /** The files written. */
  files: { files: number; bytes: number; skipped: string[] };
  /** The kernels restored, variable by variable. */
  kernels: KernelRestore[];
  /** What the snapshot did not carry. */
  notCarried: string[];
  /** The new volumes made from the snapshot's copies of volumes (empty when it kept none). */
  volumes: RestoredVolume[];
}

/** A sandbox as the API describes it. */
export interface SandboxInfo {
  /** Its id (`sb-…`). */
  id: string;
  /** Where it is in its life. */
  state: SandboxState;
  /** Why it stopped, failed, was lost, paused or resumed. */
  reason: string | null;
  /** When it was created. */
  createdAt: Date;
  /** When it was last used. */
  lastActiveAt: Date;
  /** When its lifetime ends, if it has an end. */
  expiresAt: Date | null;
  /** Idle timeout in seconds, if any. */
  idleTimeoutSecs: number | null;
  /** Its record goes when it stops. */
  ephemeral: boolean;
  /** Labels. */
  labels: StringMap;
  /** Metadata. */
  metadata: StringMap;
  /** Limits in force. */
  limits: SandboxLimits;
  /** What its network reaches now. */
  network: NetworkPolicy;
  /** Isolation backend (`process`, `gvisor`). */
  backend: string;
  /** The template it was made from. */
  template: string;
  /** Only right after a restore or fork: what came back. */
  restore?: RestoreReport;
  /** Only on the answer of a create with `packages`: how they were installed (null otherwise, and after `refresh`). */
  packages: PackagesReport | null;
  /** Where a server inside on port P is reached through the daemon: this host name with `{port}` replaced by P (`{port}-<id>.localhost`), on the daemon's port (`getHost` does it). */
  previewHost: string;
  /** The same as a path on the daemon (`/v1/sandboxes/<id>/ports/{port}/`). */
  previewPath: string;
}

/** How a process ended: `exited`, `signaled`, `oom_killed`, `timeout`, `pids_limit` or `killed`. */
export type ExitCause = "exited" | "signaled" | "oom_killed" | "timeout" | "pids_limit" | "killed";

/** How a command or process ended. */
export interface ExitInfo {
  /** The exit code, when it exited. */
  exitCode: number | null;
  /** Exited with code 0. */
  ok: boolean;
  /** How it ended. */
  cause: ExitCause;
  /** The signal that ended it. */
  signal: number | null;
  /** Its name (`SIGKILL`). */
  signalName: string | null;
  /** Killed by the OOM killer: the sandbox hit its memory limit. */
  oomKilled: boolean;
  /** Ran past its timeout; the whole tree was killed. */
  timedOut: boolean;
  /** The sandbox's process limit refused a fork. */
  pidsLimitHit: boolean;
  /** The cause in a sentence. */
  message: string;
  /** Stdout went over the limit and was cut. */
  stdoutTruncated: boolean;
  /** Stderr went over the limit and was cut. */
  stderrTruncated: boolean;
  /** Milliseconds from start to exit. */
  durationMs: number;
}

/** `SandboxLimits` as sent (the document lets a limit without a value be left out). */
export interface WireLimits {
  memory_mb?: number | null;
  cpus?: number | null;
  pids?: number | null;
  disk_mb: number;
  tmp_mb: number;
  home_mb: number;
  open_files: number;
  exec_timeout_secs?: number | null;
}

/** `RestoreReport` as sent. */
export interface WireRestore {
  fidelity: string;
  files: { files: number; bytes: number; skipped: string[] };
  kernels: KernelRestore[];
  not_carried: string[];
  volumes?: RestoredVolume[];
}

/** `PackagesReport` as sent. */
export interface WirePackagesReport {
  cached: boolean;
  duration_ms: number;
  files: number;
  bytes: number;
  from_pool?: boolean;
}

/** `SandboxInfo` as sent. */
export interface WireSandbox {
  id: string;
  state: SandboxState;
  reason?: string | null;
  created_at: string;
  last_active_at: string;
  expires_at?: string | null;
  idle_timeout_secs?: number | null;
  ephemeral: boolean;
  labels: StringMap;
  metadata: StringMap;
  limits: WireLimits;
  network: NetworkPolicy;
  backend: string;
  template: string;
  restore?: WireRestore | null;
  packages?: WirePackagesReport | null;
  preview_host: string;
  preview_path: string;
}

/** `ExitInfo` as sent (the exec answer, an `exit` event, a process's output). */
export interface WireExit {
  exit_code?: number | null;
  ok: boolean;
  cause: ExitCause;
  signal?: number | null;
  signal_name?: string | null;
  oom_killed: boolean;
  timed_out: boolean;
  pids_limit_hit: boolean;
  message: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  duration_ms: number;
}

/** An RFC 3339 time, or null. */
export function toDate(value: string | null | undefined): Date | null {
  return value === null || value === undefined ? null : new Date(value);
}

/** Maps a limits object from the wire. */
export function toLimits(l: WireLimits): SandboxLimits {
  return {
    memoryMb: l.memory_mb ?? null,
    cpus: l.cpus ?? null,
    pids: l.pids ?? null,
    diskMb: l.disk_mb,
    tmpMb: l.tmp_mb,
    homeMb: l.home_mb,
    openFiles: l.open_files,
    execTimeoutSecs: l.exec_timeout_secs ?? null,
  };
}

/** Maps limits to the wire (only those given). */
export function fromLimits(l: LimitsInput): Partial<WireLimits> {
  return {
    memory_mb: l.memoryMb,
    cpus: l.cpus,
    pids: l.pids,
    disk_mb: l.diskMb,
    tmp_mb: l.tmpMb,
    home_mb: l.homeMb,
    open_files: l.openFiles,
    exec_timeout_secs: l.execTimeoutSecs,
  };
}

/** Maps a network policy from the wire (a copy: the SDK's objects share no arrays with the answer). */
export function toNetworkPolicy(n: NetworkPolicy): NetworkPolicy {
  return typeof n === "string" ? n : { allow: [...(n.allow ?? [])] };
}

/**
 * A network policy as sent: a list of rules becomes `{ allow: rules }`. Only its shape is
 * made here: the rules are the daemon's to judge (a bad one is an `InvalidArgumentError`).
 */
export function fromNetworkPolicy(p: NetworkPolicyInput): NetworkPolicy {
  if (typeof p === "string") return p;
  if (Array.isArray(p)) return { allow: [...(p as readonly string[])] };
  return p as AllowPolicy;
}

/**
 * Packages as sent: each installer's list copied. Every key is sent, so one the daemon has no
 * installer for is refused (an `InvalidArgumentError`), never silently dropped.
 */
export function fromPackages(p: Packages): Record<string, string[]> {
  const sent: Record<string, string[]> = {};
  for (const [installer, names] of Object.entries(p) as [string, unknown][]) {
    if (names === undefined) continue;
    // A name where a list belongs would otherwise be refused with a less helpful message.
    if (!Array.isArray(names)) throw new TypeError(`packages.${installer} is a list of package names, not ${typeof names}`);
    sent[installer] = [...(names as string[])];
  }
  return sent;
}

/** `Secret` as sent. */
export interface WireSecret {
  name: string;
  value: string;
  hosts: string[];
}

const SECRET_KEYS = ["name", "value", "hosts"] as const;

/** What a value is, for messages (never the value itself: it may be a secret's). */
function kindOf(x: unknown): string {
  return x === null ? "null" : Array.isArray(x) ? "an array" : typeof x;
}

/**
 * Secrets as sent, `{ name, value, hosts }` each. Only their shape is checked here (for
 * JavaScript callers: a host where a list belongs, a misspelt key); the names, values and host
 * rules are the daemon's to judge (a bad one is an `InvalidArgumentError` naming the secret).
 * No message here or there holds a value.
 */
export function fromSecrets(secrets: readonly Secret[]): WireSecret[] {
  if (!Array.isArray(secrets)) throw new TypeError(`secrets is a list of { name, value, hosts }, not ${kindOf(secrets)}`);
  return (secrets as readonly unknown[]).map((secret, i) => {
    let where = `secrets[${i}]`;
    if (typeof secret !== "object" || secret === null || Array.isArray(secret)) {
      throw new TypeError(`${where} is an object { name, value, hosts }, not ${kindOf(secret)}`);
    }
    const s = secret as Record<string, unknown>;
    // Own properties, enumerable or not (`secret()` hides its value from logs that way).
    const keys = Object.getOwnPropertyNames(s).filter((k) => s[k] !== undefined);
    const unknown = keys.filter((k) => !(SECRET_KEYS as readonly string[]).includes(k));
    const missing = SECRET_KEYS.filter((k) => !keys.includes(k));
    if (unknown.length > 0 || missing.length > 0) {
      const parts = [`${where} has the keys name, value and hosts`];
      if (unknown.length > 0) parts.push(`unknown: ${unknown.join(", ")}`);
      if (missing.length > 0) parts.push(`missing: ${missing.join(", ")}`);
      throw new TypeError(parts.join("; "));
    }
    const { name, value, hosts } = s;
    if (typeof name !== "string") throw new TypeError(`${where}: name is a string, not ${kindOf(name)}`);
    where = `${where} (${name})`;
    if (typeof value !== "string") throw new TypeError(`${where}: value is a string, not ${kindOf(value)}`);
    // A lone host where a list belongs would otherwise be refused with a less helpful message.
    if (!Array.isArray(hosts)) throw new TypeError(`${where}: hosts is a list of host rules such as ["api.example.com"], not ${kindOf(hosts)}`);
    for (const host of hosts as unknown[]) {
      if (typeof host !== "string") throw new TypeError(`${where}: each host is a string, not ${kindOf(host)}`);
    }
    return { name, value, hosts: [...(hosts as string[])] };
  });
}

/** `Mount` as sent (`MountInput`). */
export interface WireMount {
  host_path?: string | null;
  volume?: string | null;
  path: string;
  mode?: MountMode | null;
}

const MOUNT_KEYS = ["hostPath", "volume", "path", "mode"] as const;

/**
 * Mounts as sent, `{ host_path or volume, path, mode }` each (no `mode`: the daemon's default
 * for the kind). Only their shape is checked here (for JavaScript callers: a lone mount where a
 * list belongs, a misspelt key, both sources or none); the folders, names, paths and modes are
 * the daemon's to judge (a bad one is an `InvalidArgumentError`, a host folder outside its
 * `mounts.allowed_paths` a `PermissionDeniedError`).
 */
export function fromMounts(mounts: readonly Mount[]): WireMount[] {
  if (!Array.isArray(mounts)) throw new TypeError(`mounts is a list of { hostPath or volume, path, mode }, not ${kindOf(mounts)}`);
  return (mounts as readonly unknown[]).map((mount, i) => {
    let where = `mounts[${i}]`;
    if (typeof mount !== "object" || mount === null || Array.isArray(mount)) {
      throw new TypeError(`${where} is an object { hostPath or volume, path, mode }, not ${kindOf(mount)}`);
    }
    const m = mount as Record<string, unknown>;
    const keys = Object.keys(m).filter((k) => m[k] !== undefined);
    const unknown = keys.filter((k) => !(MOUNT_KEYS as readonly string[]).includes(k));
    if (unknown.length > 0 || !keys.includes("path")) {
      const parts = [`${where} has the keys path, hostPath or volume, and mode`];
      if (unknown.length > 0) parts.push(`unknown: ${unknown.join(", ")}`);
      if (!keys.includes("path")) parts.push("missing: path");
      throw new TypeError(parts.join("; "));
    }
    const { hostPath, volume, path, mode } = m;
    if (typeof path !== "string") throw new TypeError(`${where}: path is a string, not ${kindOf(path)}`);
    where = `${where} (${path})`;
    if ((hostPath === undefined) === (volume === undefined)) throw new TypeError(`${where}: give hostPath or volume (exactly one)`);
    for (const [key, value] of [["hostPath", hostPath], ["volume", volume], ["mode", mode]] as const) {
      if (value !== undefined && typeof value !== "string") throw new TypeError(`${where}: ${key} is a string, not ${kindOf(value)}`);
    }
    const sent: WireMount = hostPath === undefined ? { volume: volume as string, path } : { host_path: hostPath as string, path };
    if (mode !== undefined) sent.mode = mode as MountMode;
    return sent;
  });
}

/** Maps a packages report from the wire. */
export function toPackagesReport(p: WirePackagesReport): PackagesReport {
  return {
    cached: p.cached,
    durationMs: p.duration_ms,
    files: p.files,
    bytes: p.bytes,
    fromPool: p.from_pool ?? false,
  };
}

/** Maps a restore report from the wire. */
export function toRestore(r: WireRestore): RestoreReport {
  return {
    fidelity: r.fidelity,
    files: r.files,
    kernels: r.kernels,
    notCarried: r.not_carried,
    volumes: (r.volumes ?? []).map((v) => ({ volume: v.volume, from: v.from, path: v.path })),
  };
}

/** Maps a sandbox from the wire. */
export function toSandboxInfo(s: WireSandbox): SandboxInfo {
  const info: SandboxInfo = {
    id: s.id,
    state: s.state,
    reason: s.reason ?? null,
    createdAt: new Date(s.created_at),
    lastActiveAt: new Date(s.last_active_at),
    expiresAt: toDate(s.expires_at),
    idleTimeoutSecs: s.idle_timeout_secs ?? null,
    ephemeral: s.ephemeral,
    labels: s.labels,
    metadata: s.metadata,
    limits: toLimits(s.limits),
    network: toNetworkPolicy(s.network),
    backend: s.backend,
    template: s.template,
    packages: s.packages === undefined || s.packages === null ? null : toPackagesReport(s.packages),
    // An older daemon sends neither: getHost then makes the name from the id.
    previewHost: s.preview_host ?? "",
    previewPath: s.preview_path ?? "",
  };
  if (s.restore !== undefined && s.restore !== null) info.restore = toRestore(s.restore);
  return info;
}

/** Maps how a process ended from the wire. */
export function toExitInfo(e: WireExit): ExitInfo {
  return {
    exitCode: e.exit_code ?? null,
    ok: e.ok,
    cause: e.cause,
    signal: e.signal ?? null,
    signalName: e.signal_name ?? null,
    oomKilled: e.oom_killed,
    timedOut: e.timed_out,
    pidsLimitHit: e.pids_limit_hit,
    message: e.message,
    stdoutTruncated: e.stdout_truncated,
    stderrTruncated: e.stderr_truncated,
    durationMs: e.duration_ms,
  };
}


// ---- templates and their builds ----

/** Where a template build is: `queued` → `running` → `succeeded`, `failed` or `cancelled`. */
export type BuildState = "queued" | "running" | "succeeded" | "failed" | "cancelled";

/** What happened to one step of a build. */
export interface StepReport {
  /** Its number, from 1. */
  index: number;
  /** Its line in the Dockerfile. */
  line: number;
  /** The instruction as written. */
  text: string;
  /** Its layer came from the build cache (nothing ran). */
  cached: boolean;
  /** How long it took, in milliseconds. */
  durationMs: number;
  /** Its layer's size in bytes. */
  size: number;
  /** The command's exit code (`RUN`; null for a cached or file step). */
  exitCode: number | null;
  /** The layer it made (`sha256:…`). */
  layer: string | null;
}

/** The image a build made. */
export interface BuiltImage {
  /** The name it is tagged with (`name:tag`): what `Sandbox.create({ template })` takes. */
  reference: string;
  /** Its manifest digest. */
  digest: string;
  /** Its layers, the base's included. */
  layers: number;
  /** The bytes of its layers. */
  size: number;
  /** The kernels that started in it (`python`, `node`, `bash`, `r`). */
  kernels: string[];
}

/** A template build as the API describes it. */
export interface BuildInfo {
  /** Its id (`bld-…`). */
  id: string;
  /** The template it makes (`name[:tag]`, as asked). */
  name: string;
  /** Where it is. */
  state: BuildState;
  /** The step running (from 1; 0 before the first). */
  step: number;
  /** How many steps the Dockerfile has (0 until it is planned). */
  steps: number;
  /** The steps that ended, in order. */
  stepReports: StepReport[];
  /** The failing step's exit code. */
  exitCode: number | null;
  /** Why it failed. */
  error: string | null;
  /** What it made, once it succeeded. */
  image: BuiltImage | null;
  /** When it was asked for. */
  createdAt: Date;
  /** When it ended. */
  finishedAt: Date | null;
  /** It succeeded. */
  ok: boolean;
  /** It has ended (`succeeded`, `failed` or `cancelled`). */
  done: boolean;
}

/**
 * One event of a build's log, numbered by `seq` (1, 2, 3, … without gaps), its `type` the
 * kind: `warning` (an instruction ignored), `base` (the `FROM` image found, or made now),
 * `step_started`, `output` (a step's stdout or stderr), `network` (a request of a step
 * through the build's egress proxy), `step_finished`, `smoke` (a kernel tried in the finished
 * image), and `finished` last. `data` is the event as sent (snake_case).
 */
export type BuildEvent =
  | { seq: number; type: "warning"; line: number; message: string; data: Record<string, unknown> }
  | { seq: number; type: "base"; name: string; digest: string; madeMs: number | null; data: Record<string, unknown> }
  | { seq: number; type: "step_started"; index: number; total: number; line: number; text: string; data: Record<string, unknown> }
  | { seq: number; type: "output"; index: number; stream: string; text: string; data: Record<string, unknown> }
  | {
      seq: number;
      type: "network";
      index: number;
      host: string;
      port: number;
      outcome: string;
      reason: string | null;
      data: Record<string, unknown>;
    }
  | { seq: number; type: "step_finished"; step: StepReport; data: Record<string, unknown> }
  | { seq: number; type: "smoke"; kernel: string; ok: boolean; detail: string; data: Record<string, unknown> }
  | { seq: number; type: "finished"; state: BuildState; error: string | null; data: Record<string, unknown> };

/** A template: an image of the daemon's store, built or imported. */
export interface TemplateInfo {
  /** Its name (`name:tag`). */
  name: string;
  /** Its manifest digest. */
  digest: string;
  /** Its layers. */
  layers: number;
  /** The bytes of its layers. */
  size: number;
  /** The kernels its build found starting in it (none recorded for an imported image). */
  kernels: string[];
  /** Its environment (`ENV`), name to value. */
  env: StringMap;
  /** Its `WORKDIR`. */
  workdir: string | null;
  /** Sandboxes running on it now (it cannot be deleted while there are any). */
  sandboxes: number;
}

/** `StepReport` as sent. */
export interface WireStepReport {
  index: number;
  line: number;
  text: string;
  cached: boolean;
  duration_ms: number;
  size: number;
  exit_code?: number | null;
  layer?: string | null;
}

/** `BuiltImage` as sent. */
export interface WireBuiltImage {
  reference: string;
  digest: string;
  layers: number;
  size: number;
  kernels: string[];
}

/** `BuildInfo` as sent. */
export interface WireBuildInfo {
  id: string;
  name: string;
  state: BuildState;
  step: number;
  steps: number;
  step_reports: WireStepReport[];
  exit_code?: number | null;
  error?: string | null;
  image?: WireBuiltImage | null;
  created_at: string;
  finished_at?: string | null;
}

/** `TemplateInfo` as sent. */
export interface WireTemplateInfo {
  name: string;
  digest: string;
  layers: number;
  size: number;
  kernels: string[];
  env: string[];
  workdir?: string | null;
  sandboxes: number;
}

/** Maps a step report from the wire. */
export function toStepReport(s: WireStepReport): StepReport {
  return {
    index: s.index,
    line: s.line,
    text: s.text,
    cached: s.cached,
    durationMs: s.duration_ms,
    size: s.size,
    exitCode: s.exit_code ?? null,
    layer: s.layer ?? null,
  };
}

/** Maps a build from the wire. */
export function toBuildInfo(b: WireBuildInfo): BuildInfo {
  const i = b.image;
  return {
    id: b.id,
    name: b.name,
    state: b.state,
    step: b.step,
    steps: b.steps,
    stepReports: b.step_reports.map(toStepReport),
    exitCode: b.exit_code ?? null,
    error: b.error ?? null,
    image:
      i === undefined || i === null
        ? null
        : { reference: i.reference, digest: i.digest, layers: i.layers, size: i.size, kernels: [...i.kernels] },
    createdAt: new Date(b.created_at),
    finishedAt: toDate(b.finished_at),
    ok: b.state === "succeeded",
    done: b.state === "succeeded" || b.state === "failed" || b.state === "cancelled",
  };
}

/** Maps a template from the wire; its `KEY=value` environment becomes a map. */
export function toTemplateInfo(t: WireTemplateInfo): TemplateInfo {
  const env: StringMap = {};
  for (const entry of t.env) {
    const eq = entry.indexOf("=");
    if (eq === -1) env[entry] = "";
    else env[entry.slice(0, eq)] = entry.slice(eq + 1);
  }
  return {
    name: t.name,
    digest: t.digest,
    layers: t.layers,
    size: t.size,
    kernels: [...t.kernels],
    env,
    workdir: t.workdir ?? null,
    sandboxes: t.sandboxes,
  };
}
