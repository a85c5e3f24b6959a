/**
 * Templates: images of the daemon's store that sandboxes start from
 * (`Sandbox.create({ template: "name:tag" })`), built from a Dockerfile and a build context
 * (docs/templates.md). A build is a job of the daemon: start one with `Template.build`,
 * follow its log live, wait for its end, cancel it; list, show and delete templates.
 */

import { clientFor, type HttpClient, type Query } from "./http.js";
import { type ClientOptions } from "./config.js";
import { BuildError, ConnectionError, TimeoutError, errorFromBody, isErrorBody } from "./errors.js";
import { isDropped, sleep } from "./runs.js";
import { sseRequest } from "./sse.js";
import {
  toBuildInfo,
  toStepReport,
  toTemplateInfo,
  type BuildEvent,
  type BuildInfo,
  type BuildState,
  type StringMap,
  type WireBuildInfo,
  type WireStepReport,
  type TemplateInfo,
  type WireTemplateInfo,
} from "./types.js";

/** Options of `Template.build`. */
export interface BuildTemplateOptions extends ClientOptions {
  /**
   * The Dockerfile's text (not a path). Left out: the `Dockerfile` of the `context` folder.
   * A bad one is an `InvalidArgumentError` naming its line, before anything is built.
   */
  dockerfile?: string;
  /**
   * The build context, what `COPY` and `ADD` read: a local folder (packed here as a gzip
   * tar, in memory: files, folders and symbolic links), or the bytes of a tar archive (plain
   * or gzip) made elsewhere. Left out: an empty context. It travels base64-encoded in the
   * JSON request, so a context over the daemon's `limits.max_request_bytes` (16 MiB of JSON
   * by default) is a `LimitExceededError`.
   */
  context?: string | Uint8Array;
  /** `--build-arg`s: values of the Dockerfile's `ARG`s. */
  buildArgs?: StringMap;
  /** Run every step, even those whose layer is in the build cache. */
  noCache?: boolean;
  /** Hosts `RUN` steps may reach besides the machine's package registries. */
  allowHosts?: readonly string[];
  /** No network for `RUN` steps. */
  offline?: boolean;
  /**
   * Answer once the build has ended (its `lastInfo` says how; `wait()` then returns at once,
   * or throws `BuildError`) instead of at once.
   */
  wait?: boolean;
}

/** Options of `build.wait()` (and `Template.waitForBuild`). */
export interface WaitBuildOptions {
  /** Seconds to wait before failing with `TimeoutError` (the build goes on); default: until it ends. */
  timeout?: number;
  /** Stops waiting (the build goes on). */
  signal?: AbortSignal;
}

/** Options of `build.logs()` (and `Template.logs`). */
export interface BuildLogsOptions {
  /** Only events numbered after this one (default 0: all). */
  after?: number;
  /** Stops following (leaving the loop does too). */
  signal?: AbortSignal;
}

/** A broken log stream is followed again this many times in a row (no event in between) before its error is thrown. */
const RECONNECTS = 5;
/** Seconds `wait` asks again for the image of a build that has just succeeded, at most (the daemon records it a moment after the build's end). */
const IMAGE_WAIT = 10;
/** The longest delay `setTimeout` takes (a longer one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** Most events one `format=json` answer holds (the route's own cap). */
const EVENTS_PAGE = 1000;

function num(v: unknown): number {
  return typeof v === "number" ? v : 0;
}

function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

function strOrNull(v: unknown): string | null {
  return typeof v === "string" ? v : null;
}

/** Maps a build event from the wire (`seq`, `event` and its fields); undefined for a kind this SDK does not know. */
function toBuildEvent(e: Record<string, unknown>): BuildEvent | undefined {
  const seq = num(e["seq"]);
  switch (e["event"]) {
    case "warning":
      return { seq, type: "warning", line: num(e["line"]), message: str(e["message"]), data: e };
    case "base": {
      const madeMs = e["made_ms"];
      return { seq, type: "base", name: str(e["name"]), digest: str(e["digest"]), madeMs: typeof madeMs === "number" ? madeMs : null, data: e };
    }
    case "step_started":
      return { seq, type: "step_started", index: num(e["index"]), total: num(e["total"]), line: num(e["line"]), text: str(e["text"]), data: e };
    case "output":
      return { seq, type: "output", index: num(e["index"]), stream: str(e["stream"]), text: str(e["text"]), data: e };
    case "network":
      return {
        seq,
        type: "network",
        index: num(e["index"]),
        host: str(e["host"]),
        port: num(e["port"]),
        outcome: str(e["outcome"]),
        reason: strOrNull(e["reason"]),
        data: e,
      };
    case "step_finished":
      return { seq, type: "step_finished", step: toStepReport(e["step"] as WireStepReport), data: e };
    case "smoke":
      return { seq, type: "smoke", kernel: str(e["kernel"]), ok: e["ok"] === true, detail: str(e["detail"]), data: e };
    case "finished":
      return { seq, type: "finished", state: str(e["state"]) as BuildState, error: strOrNull(e["error"]), data: e };
    default:
      return undefined;
  }
}

/** Bytes as base64, with Node's `Buffer` where there is one, else `btoa`. */
function toBase64(bytes: Uint8Array): string {
  if (typeof Buffer !== "undefined") return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

/** The Dockerfile's text and the context as sent (base64), from `Template.build`'s options. */
async function buildSource(options: BuildTemplateOptions): Promise<{ dockerfile: string; context: string | undefined }> {
  let dockerfile = options.dockerfile;
  let archive: Uint8Array | undefined;
  const context = options.context;
  if (typeof context === "string") {
    // Loaded when first used: the rest of the SDK needs nothing but fetch.
    const { packFolder } = await import("./tar.js");
    if (dockerfile === undefined) {
      const { readFile } = await import("node:fs/promises");
      const { join } = await import("node:path");
      const path = join(context, "Dockerfile");
      try {
        dockerfile = await readFile(path, "utf8");
      } catch (e) {
        throw new TypeError(`no dockerfile was given and ${path} cannot be read (${(e as Error).message})`, { cause: e });
      }
    }
    archive = await packFolder(context);
  } else if (context instanceof Uint8Array) {
    archive = context;
  } else if (context !== undefined) {
    throw new TypeError(`context is a folder's path or the bytes of a tar archive, not ${typeof context}`);
  }
  if (dockerfile === undefined) {
    throw new TypeError("Template.build needs a dockerfile (its text), or a context folder holding a Dockerfile");
  }
  return { dockerfile, context: archive === undefined ? undefined : toBase64(archive) };
}

/**
 * A build's log from event `after` on: the stored events, then the live ones until
 * `finished`. A connection that drops on the way (or ends before `finished`) is followed
 * again from the last event given (`Last-Event-ID`), so no event comes twice or goes missing.
 */
async function* followBuild(
  http: HttpClient,
  buildId: string,
  after: number,
  signal: AbortSignal | undefined,
  load: () => Promise<BuildInfo>,
): AsyncGenerator<BuildEvent, void, undefined> {
  let last = after;
  let resuming = false;
  let failures = 0;
  for (;;) {
    // The first request asks `after`; a reconnect says where it got, as an EventSource would.
    const headers: Record<string, string> = { accept: "text/event-stream" };
    const query: Query = {};
    if (resuming) headers["last-event-id"] = String(last);
    else if (last > 0) query["after"] = last;
    resuming = true;
    let finished = false;
    let progressed = false;
    try {
      const stream = sseRequest(http, "GET", `/v1/builds/${encodeURIComponent(buildId)}/logs`, { query, headers, signal });
      for await (const message of stream) {
        const data = message.data;
        if (typeof data !== "object" || data === null || Array.isArray(data)) continue;
        if (message.event === "error" && isErrorBody(data)) throw errorFromBody(data);
        const record = data as Record<string, unknown>;
        const seq = num(record["seq"]);
        // Already given (a server that replayed from earlier).
        if (seq <= last) continue;
        last = seq;
        failures = 0;
        progressed = true;
        const event = toBuildEvent(record);
        if (event === undefined) continue;
        if (event.type === "finished") finished = true;
        yield event;
        if (finished) return;
      }
    } catch (e) {
      // Stopped on purpose: not a connection to follow again.
      if (signal?.aborted || !isDropped(e) || failures >= RECONNECTS) throw e;
      failures++;
      await sleep(Math.min(0.2 * 2 ** (failures - 1), 5), signal);
      continue;
    }
    // Ended before `finished`: the connection was cut (the daemon ends the stream only after
    // it). A build that has ended and whose stream gave nothing more has no more to give.
    if ((await load()).done && !progressed) return;
    if (failures >= RECONNECTS) {
      throw new ConnectionError(`the log stream of build ${buildId} keeps ending before the build does`, {
        code: "connection_failed",
      });
    }
    failures++;
    await sleep(Math.min(0.2 * 2 ** (failures - 1), 5), signal);
  }
}

/** A build's stored events after `after`, read at once (page by page). */
async function listBuildLogs(http: HttpClient, buildId: string, after: number): Promise<BuildEvent[]> {
  const found: BuildEvent[] = [];
  for (;;) {
    const page = await http.json<{ events: Record<string, unknown>[] }>("GET", `/v1/builds/${encodeURIComponent(buildId)}/logs`, {
      query: { format: "json", after, limit: EVENTS_PAGE },
    });
    for (const e of page.events) {
      const event = toBuildEvent(e);
      if (event !== undefined) found.push(event);
    }
    if (page.events.length < EVENTS_PAGE) return found;
    after = num(page.events[page.events.length - 1]!["seq"]);
  }
}

/** `GET /v1/builds/{id}`. */
async function getBuildInfo(http: HttpClient, buildId: string, signal?: AbortSignal): Promise<BuildInfo> {
  return toBuildInfo(await http.json<WireBuildInfo>("GET", `/v1/builds/${encodeURIComponent(buildId)}`, { signal }));
}

/**
 * One template build, a job of the daemon. Start one with `Template.build(name, options)`;
 * reach one with `Template.getBuild(id)`. Builds are kept in the daemon's memory (the last
 * 100), not across its restarts.
 */
export class Build {
  /** Its id (`bld-…`). */
  readonly id: string;
  /** The template it makes (`name[:tag]`, as asked). */
  readonly name: string;
  /** What the API last said about it (refreshed by `info`, `wait`, `cancel`). */
  lastInfo: BuildInfo;
  /** The last event a `wait` saw: the next one follows on from there. */
  private seen = 0;

  /** Wraps a build the API described; use `Template.build` or `Template.getBuild` instead. */
  constructor(private readonly http: HttpClient, info: BuildInfo) {
    this.id = info.id;
    this.name = info.name;
    this.lastInfo = info;
  }

  /** Reads its state now: the step running, the steps that ended, the image once it succeeded. */
  info(): Promise<BuildInfo> {
    return this.load();
  }

  private async load(signal?: AbortSignal): Promise<BuildInfo> {
    this.lastInfo = await getBuildInfo(this.http, this.id, signal);
    return this.lastInfo;
  }

  /**
   * Waits for it to end, following its log (a build that has ended: at once), and returns it
   * as it ended, with its `image`. A build that failed or was cancelled is a
   * `BuildError` (`exitCode` and `step`: the failing step's; `info`: the `BuildInfo`). Fails with
   * `TimeoutError` when it still runs after `timeout` seconds, and with the signal's reason
   * when `signal` aborts: the build goes on (wait again, or `cancel()` it).
   */
  async wait(options: WaitBuildOptions = {}): Promise<BuildInfo> {
    const { timeout, signal } = options;
    if (signal?.aborted) throw signal.reason;
    // One signal for the caller's and the deadline's: either stops the stream being read.
    const stop = new AbortController();
    const onAbort = (): void => stop.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    const timer =
      timeout === undefined || timeout * 1000 > MAX_TIMER_MS
        ? undefined
        : setTimeout(() => {
            stop.abort(new TimeoutError(`build ${this.id} is still running after ${timeout} s`, { code: "timeout" }));
          }, timeout * 1000);
    let info: BuildInfo;
    try {
      info = await this.followToEnd(stop.signal);
    } catch (e) {
      // Whichever stopped it first, as it was given (whatever the step it stopped failed with).
      throw stop.signal.aborted ? stop.signal.reason : e;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
    if (!info.ok) throw new BuildError(info);
    return info;
  }

  /** `wait` without its deadline: the log from the last event a wait saw until `finished`, then the build as it ended. */
  private async followToEnd(signal: AbortSignal): Promise<BuildInfo> {
    let info = this.lastInfo;
    if (!info.done) {
      for await (const event of followBuild(this.http, this.id, this.seen, signal, () => this.load(signal))) this.seen = event.seq;
      info = await this.load(signal);
    }
    // The daemon records the image a moment after the build's `finished` event.
    let pause = 0.05;
    for (let waited = 0; info.ok && info.image === null && waited < IMAGE_WAIT; waited += pause) {
      await sleep(pause, signal);
      pause = Math.min(pause * 1.5, 1);
      info = await this.load(signal);
    }
    return info;
  }

  /**
   * Follows its log: the events numbered after `after` (default: all), the stored ones then
   * the live ones as they happen, ending with `finished`. A connection that drops on the way
   * is followed again from the last event given (`Last-Event-ID`). Leaving the loop stops
   * following (the build goes on).
   */
  logs(options: BuildLogsOptions = {}): AsyncGenerator<BuildEvent, void, undefined> {
    return followBuild(this.http, this.id, options.after ?? 0, options.signal, () => this.load(options.signal));
  }

  /** Its stored log events numbered after `after` (default: all), read at once; a build going on has more later. */
  listLogs(options: { after?: number } = {}): Promise<BuildEvent[]> {
    return listBuildLogs(this.http, this.id, options.after ?? 0);
  }

  /**
   * Cancels it: its running step is killed (a queued build never starts). Answers once it has
   * ended (`cancelled`); a build that had ended is answered as it ended.
   */
  async cancel(): Promise<BuildInfo> {
    this.lastInfo = toBuildInfo(await this.http.json<WireBuildInfo>("POST", `/v1/builds/${encodeURIComponent(this.id)}/cancel`));
    return this.lastInfo;
  }
}

/**
 * The daemon's templates: build one from a Dockerfile (`Template.build`), follow and wait for
 * builds, list, show and delete templates. Every method is static and takes the client
 * options last. Building, cancelling and deleting take an admin key (templates are shared by
 * every owner): another key is a `PermissionDeniedError`.
 */
export class Template {
  private constructor() {}

  /**
   * Starts building the template `name` (`name[:tag]`; `name` is `name:latest`) and returns
   * the `Build` at once (`lastInfo.state`: `queued`, or `running`), or with `wait: true` once
   * it has ended. Each step runs in a build sandbox; its changes become a cached layer of the
   * daemon's image store. Builds run one at a time, in order. A bad name or Dockerfile is an
   * `InvalidArgumentError` (naming the Dockerfile's line) before anything runs.
   */
  static async build(name: string, options: BuildTemplateOptions = {}): Promise<Build> {
    const http = clientFor(options);
    const source = await buildSource(options);
    // Only the fields the server takes: it refuses any other key, and `options` carries the client's.
    const body = {
      name,
      dockerfile: source.dockerfile,
      context: source.context,
      build_args: options.buildArgs,
      no_cache: options.noCache,
      allow_hosts: options.allowHosts === undefined ? undefined : [...options.allowHosts],
      offline: options.offline,
      wait: options.wait,
    };
    // With `wait` no client deadline: the answer comes when the build has ended.
    const b = await http.json<WireBuildInfo>("POST", "/v1/templates", {
      body: { json: body },
      timeout: options.wait === true ? null : undefined,
    });
    return new Build(http, toBuildInfo(b));
  }

  /** `build.wait(options)` of a build given by id (or a `Build`): the build as it ended, or a `BuildError`. */
  static async waitForBuild(build: string | Build, options: WaitBuildOptions & ClientOptions = {}): Promise<BuildInfo> {
    const b = typeof build === "string" ? await Template.getBuild(build, options) : build;
    return b.wait({ timeout: options.timeout, signal: options.signal });
  }

  /** `build.logs(options)` of a build given by id (or a `Build`): its log events, the live ones until `finished`. */
  static logs(build: string | Build, options: BuildLogsOptions & ClientOptions = {}): AsyncGenerator<BuildEvent, void, undefined> {
    if (typeof build !== "string") return build.logs(options);
    const http = clientFor(options);
    return followBuild(http, build, options.after ?? 0, options.signal, () => getBuildInfo(http, build, options.signal));
  }

  /** Reaches a build by id (`NotFoundError` if the daemon has none of that id). */
  static async getBuild(id: string, options: ClientOptions = {}): Promise<Build> {
    const http = clientFor(options);
    return new Build(http, await getBuildInfo(http, id));
  }

  /** The builds the daemon keeps (those since it started, at most 100), newest first. */
  static async listBuilds(options: ClientOptions = {}): Promise<BuildInfo[]> {
    const list = await clientFor(options).json<{ builds: WireBuildInfo[] }>("GET", "/v1/builds");
    return list.builds.map(toBuildInfo);
  }

  /** `build.cancel()` of a build given by id: the build once it has ended. */
  static async cancelBuild(id: string, options: ClientOptions = {}): Promise<BuildInfo> {
    const http = clientFor(options);
    return toBuildInfo(await http.json<WireBuildInfo>("POST", `/v1/builds/${encodeURIComponent(id)}/cancel`));
  }

  /** The templates: every image of the daemon's store, built or imported, by name. */
  static async list(options: ClientOptions = {}): Promise<TemplateInfo[]> {
    const list = await clientFor(options).json<{ templates: WireTemplateInfo[] }>("GET", "/v1/templates");
    return list.templates.map(toTemplateInfo);
  }

  /** One template (`name[:tag]`; `NotFoundError` if the store has none of that name). */
  static async get(name: string, options: ClientOptions = {}): Promise<TemplateInfo> {
    const t = await clientFor(options).json<WireTemplateInfo>("GET", `/v1/templates/${encodeURIComponent(name)}`);
    return toTemplateInfo(t);
  }

  /**
   * Deletes a template's name (its layers go at the daemon's next garbage collection). While
   * sandboxes run on it: a `ConflictError` (409 `invalid_state`); no such template: a
   * `NotFoundError`.
   */
  static async delete(name: string, options: ClientOptions = {}): Promise<void> {
    await clientFor(options).json<void>("DELETE", `/v1/templates/${encodeURIComponent(name)}`);
  }
}
