/**
 * Agent runs: a model writes code, the daemon runs it in a sandbox's live kernels and gives
 * back the result, and the model goes on until it answers, within budgets (docs/agent.md).
 * Start one, wait for its end, follow its trajectory live (resuming across dropped
 * connections), cancel it; resume one a stopped process left, fork one from any committed
 * step, or open a sandbox as it was at a step.
 */

import { clientFor, type HttpClient, type Query } from "./http.js";
import { type ClientOptions } from "./config.js";
import { ConnectionError, TimeoutError, errorFromBody, isErrorBody } from "./errors.js";
import { Sandbox } from "./sandbox.js";
import { sseRequest } from "./sse.js";
import { toDate, toSandboxInfo, type WireSandbox } from "./types.js";

/** Where a run is: `running`, then `succeeded`, `failed` or `cancelled`. */
export type RunStatus = "running" | "succeeded" | "failed" | "cancelled";

/** How the model works: `tools` (JSON tools, the default) or `repl`. */
export type RunMode = "tools" | "repl";

/**
 * When a run snapshots its sandbox at the end of a step (what a resume, a fork or
 * `stepSandbox` starts from): `on_mutation` (steps that changed something: ran code, a
 * command, an import, …), `every_step`, or `off` (the run cannot be restored to a step).
 */
export type SnapshotPolicy = "on_mutation" | "every_step" | "off";

/** Where a forked run's history comes from. */
export interface ForkedFrom {
  /** The original run. */
  runId: string;
  /** Its last step the fork's history holds. */
  step: number;
}

/** The limits a run runs under, every one resolved (`tokenBudget` null: no token limit). */
export interface Budgets {
  /** Model calls that may use tools. */
  maxIterations: number;
  /** Levels of sub-runs. */
  maxDepth: number;
  /** Sub-calls (`sub_complete`, …) in the run tree. */
  maxSubCalls: number;
  /** Input plus output tokens of the run tree. */
  tokenBudget: number | null;
  /** US dollars of the run tree. */
  costLimitUsd: number;
  /** Seconds the run may take in all. */
  timeoutSecs: number;
  /** Seconds one cell of code may run. */
  cellTimeoutSecs: number;
  /** Output tokens one model call may produce. */
  maxOutputTokens: number;
}

/**
 * Limits asked for a run; each left out takes the daemon's default (10 iterations, depth 4,
 * 12 sub-calls, no token limit, $2.00, 300 s, 30 s a cell, 4096 output tokens), and each is
 * capped by its hard maximum.
 */
export type BudgetsInput = Partial<Budgets>;

/**
 * How a run checks its final answer before it accepts it: `command` runs (`sh -c`) in the
 * run's sandbox; exit 0 ends the run `succeeded` with reason `validated`, anything else goes
 * back to the model (exit code and output tail), until `maxAttempts` answers have failed
 * (`failed`, reason `validation_failed`, the last answer kept). The daemon checks the values
 * (a bad one is an `InvalidArgumentError`).
 */
export interface Validate {
  /** The command (`python3 -m pytest -q`, `test -s out.csv`). */
  command: string;
  /** Seconds it may run (default 60, more than 0 and at most 600). */
  timeoutS?: number;
  /** Answers the model may give before the run fails (default 3, 1 to 10). */
  maxAttempts?: number;
}

/** Tokens and money a run, with its sub-calls and sub-runs, has used. */
export interface RunUsage {
  /** Input tokens the providers counted. */
  inputTokens: number;
  /** Output tokens the providers counted. */
  outputTokens: number;
  /** US dollars, from the price table; null when some model's price is unknown. */
  costUsd: number | null;
  /** Steps (model responses with their tool calls). */
  steps: number;
  /** Model calls, sub-calls included. */
  llmCalls: number;
  /** Tool calls. */
  toolCalls: number;
  /** Sub-calls. */
  subCalls: number;
  /** Some token counts are estimates (a server that reported none). */
  estimated: boolean;
}

/** A run as the API describes it. */
export interface RunInfo {
  /** Its id (`run-…`). */
  id: string;
  /** Where it is. */
  status: RunStatus;
  /**
   * Why it ended: `final`, `text`, `forced`, `validated`, `validation_failed`,
   * `budget:<which>`, `timeout`, `cancelled`, `provider_error`, `error`, `interrupted` (null
   * while it runs).
   */
  reason: string | null;
  /** Its answer, when it gave one. */
  answer: string | null;
  /** What it was asked. */
  task: string;
  /** `provider/model`. */
  model: string;
  /** `tools` or `repl`. */
  mode: RunMode;
  /** Its sandbox, once it has one. */
  sandboxId: string | null;
  /** The run that started it, for a sub-run. */
  parentId: string | null;
  /** The top of its run tree. */
  rootId: string;
  /** 0 for a top-level run. */
  depth: number;
  /** The limits it runs under. */
  budgets: Budgets;
  /** For a fork: the run and step it was forked from. */
  forkedFrom: ForkedFrom | null;
  /** What it used (so far, while it runs). */
  usage: RunUsage;
  /** When it was made. */
  createdAt: Date;
  /** When it ended. */
  endedAt: Date | null;
  /** It succeeded (it answered). */
  ok: boolean;
  /** It has ended (any status but `running`). */
  done: boolean;
}

/**
 * One event of a run's trajectory: `seq` numbers them 1, 2, 3, … without gaps; `type` is
 * `run_started`, `sandbox_ready`, `llm_request`, `llm_response`, `tool_call`, `tool_result`,
 * `step_committed`, `validation`, `warning`, `run_finished`, …; `data` is the whole event as recorded, its
 * fields named as docs/agent.md lists them (snake_case: `data.answer`, `data.usage.input_tokens`).
 */
export interface RunEvent {
  /** Its number. */
  seq: number;
  /** What happened. */
  type: string;
  /** When (RFC 3339). */
  ts: string;
  /** The run it belongs to. */
  runId: string;
  /** The step it belongs to. */
  step: number | null;
  /** The run's depth in its tree. */
  depth: number;
  /** The event as recorded. */
  data: Record<string, unknown>;
}

/** Options of `Run.start` (and `Run.run`). */
export interface StartRunOptions extends ClientOptions {
  /** `provider/model` (`openai/gpt-4o-mini`, `anthropic/claude-sonnet-4-5`; default: the daemon's `agent.model`). */
  model?: string;
  /** `tools` (default) or `repl`. */
  mode?: RunMode;
  /** Run in this existing sandbox (its kernels' state is where the model starts); it is never deleted by the run. */
  sandbox?: Sandbox | string;
  /** Otherwise the run's sandbox is made from this template (default `python`). */
  template?: string;
  /** Repl mode: the input put in the kernel as the variable `context`. */
  context?: string;
  /** Limits (each left out: the daemon's default). */
  budgets?: BudgetsInput;
  /** Keep the sandbox the run made when it ends (default: it is deleted then). */
  keepSandbox?: boolean;
  /**
   * Check the model's final answer with a command run in the run's sandbox (a command alone
   * takes the daemon's defaults: 60 s, 3 attempts); a failed check goes back to the model.
   */
  validate?: string | Validate;
  /** When it snapshots its sandbox at the end of a step (default: the daemon's `agent.step_snapshots`, `on_mutation`). */
  snapshots?: SnapshotPolicy;
  /**
   * Keep all its step snapshots when it ends (default: only the last one and those a sandbox
   * was made from stay), so that it can be forked from any step later.
   */
  keepSnapshots?: boolean;
  /**
   * Run on this thread (`th-…`, see `threads()`): the model sees the thread's earlier
   * conversation and works in the thread's sandbox.
   */
  threadId?: string;
}

/** Options of `Run.fork` (and `run.fork`). */
export interface ForkRunOptions {
  /** The original's committed step to go on from (1 for the first). */
  fromStep: number;
  /** A new instruction, given after the history (default: the model goes on with the original task). */
  task?: string;
  /** Another `provider/model` (default: the original's). */
  model?: string;
  /** The fork's limits (each left out: the daemon's default). */
  budgets?: BudgetsInput;
  /** Its check of the final answer (default: the original's). */
  validate?: string | Validate;
  /** Keep the fork's sandbox when it ends (default: it is deleted then). */
  keepSandbox?: boolean;
  /** Answer once the fork has ended (its `info` then says how) instead of at once. */
  wait?: boolean;
}

/** What `Run.stepSandbox` made: a new sandbox as the run's was at the end of a step. */
export interface StepSandbox {
  /** The new sandbox (running; yours to kill). */
  sandbox: Sandbox;
  /** Its id. */
  sandboxId: string;
  /** The step snapshot it was restored from. */
  snapshotId: string;
  /** The step that snapshot was taken at: the newest at or before the step asked for (the steps between changed nothing). */
  snapshotStep: number;
  /** What the snapshot did not carry (running processes, variables it could not save). */
  notCarried: string[];
}

/** Options of `run.wait()`. */
export interface WaitOptions {
  /** Seconds to wait before failing with `TimeoutError` (the run goes on); default: until it ends. */
  timeout?: number;
  /** Stops waiting (the run goes on). */
  signal?: AbortSignal;
}

/** Options of `run.events()`. */
export interface RunEventsOptions {
  /** Only events numbered after this one (default 0: all). */
  after?: number;
  /** Stops following (leaving the loop does too). */
  signal?: AbortSignal;
}

/** `Budgets` as sent. */
export interface WireBudgets {
  max_iterations: number;
  max_depth: number;
  max_sub_calls: number;
  token_budget?: number | null;
  cost_limit_usd: number;
  timeout_secs: number;
  cell_timeout_secs: number;
  max_output_tokens: number;
}

/** `RunUsage` as sent. */
export interface WireRunUsage {
  input_tokens: number;
  output_tokens: number;
  cost_usd?: number | null;
  steps: number;
  llm_calls: number;
  tool_calls: number;
  sub_calls: number;
  estimated?: boolean;
}

/** `ForkedFrom` as sent. */
export interface WireForkedFrom {
  run_id: string;
  step: number;
}

/** `StepSandbox` as sent. */
export interface WireStepSandbox {
  sandbox_id: string;
  snapshot_id: string;
  snapshot_step: number;
  not_carried: string[];
}

/** `RunInfo` as sent. */
export interface WireRun {
  id: string;
  status: string;
  reason?: string | null;
  answer?: string | null;
  task: string;
  model: string;
  mode: RunMode;
  sandbox_id?: string | null;
  parent_id?: string | null;
  root_id: string;
  depth: number;
  budgets: WireBudgets;
  forked_from?: WireForkedFrom | null;
  usage: WireRunUsage;
  created_at: string;
  ended_at?: string | null;
}

/** A broken event stream is followed again this many times in a row (no event in between) before its error is thrown. */
const RECONNECTS = 5;
/**
 * `wait` asks for the run's state every this many seconds at first, growing to `POLL_MAX`,
 * when the daemon has no live events of the run to give (it goes on in another process).
 */
const POLL_FIRST = 0.1;
const POLL_MAX = 1;
/** The longest delay `setTimeout` takes (a longer one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** Most events one `format=json` answer holds (the route's own cap). */
const EVENTS_PAGE = 1000;

function toBudgets(b: WireBudgets): Budgets {
  return {
    maxIterations: b.max_iterations,
    maxDepth: b.max_depth,
    maxSubCalls: b.max_sub_calls,
    tokenBudget: b.token_budget ?? null,
    costLimitUsd: b.cost_limit_usd,
    timeoutSecs: b.timeout_secs,
    cellTimeoutSecs: b.cell_timeout_secs,
    maxOutputTokens: b.max_output_tokens,
  };
}

/** Maps asked-for budgets to the wire; only the fields the server takes (it refuses any other key). */
function fromBudgets(b: BudgetsInput): Partial<WireBudgets> {
  return {
    max_iterations: b.maxIterations,
    max_depth: b.maxDepth,
    max_sub_calls: b.maxSubCalls,
    token_budget: b.tokenBudget ?? undefined,
    cost_limit_usd: b.costLimitUsd,
    timeout_secs: b.timeoutSecs,
    cell_timeout_secs: b.cellTimeoutSecs,
    max_output_tokens: b.maxOutputTokens,
  };
}

/** Maps a validation to the wire; only the fields the server takes (it refuses any other key). */
function fromValidate(v: string | Validate): { command: string; timeout_s?: number; max_attempts?: number } {
  if (typeof v === "string") return { command: v };
  return { command: v.command, timeout_s: v.timeoutS, max_attempts: v.maxAttempts };
}

function toUsage(u: WireRunUsage): RunUsage {
  return {
    inputTokens: u.input_tokens,
    outputTokens: u.output_tokens,
    costUsd: u.cost_usd ?? null,
    steps: u.steps,
    llmCalls: u.llm_calls,
    toolCalls: u.tool_calls,
    subCalls: u.sub_calls,
    estimated: u.estimated ?? false,
  };
}

/** Maps a run from the wire. */
export function toRunInfo(r: WireRun): RunInfo {
  const status = r.status as RunStatus;
  return {
    id: r.id,
    status,
    reason: r.reason ?? null,
    answer: r.answer ?? null,
    task: r.task,
    model: r.model,
    mode: r.mode,
    sandboxId: r.sandbox_id ?? null,
    parentId: r.parent_id ?? null,
    rootId: r.root_id,
    depth: r.depth,
    budgets: toBudgets(r.budgets),
    forkedFrom: r.forked_from === undefined || r.forked_from === null ? null : { runId: r.forked_from.run_id, step: r.forked_from.step },
    usage: toUsage(r.usage),
    createdAt: new Date(r.created_at),
    endedAt: toDate(r.ended_at),
    ok: status === "succeeded",
    done: status !== "running",
  };
}

function toRunEvent(e: Record<string, unknown>): RunEvent {
  return {
    seq: typeof e["seq"] === "number" ? e["seq"] : 0,
    type: String(e["type"] ?? ""),
    ts: String(e["ts"] ?? ""),
    runId: String(e["run_id"] ?? ""),
    step: typeof e["step"] === "number" ? e["step"] : null,
    depth: typeof e["depth"] === "number" ? e["depth"] : 0,
    data: e,
  };
}

/** Resolves after `secs`, or rejects with the signal's reason when it aborts first. */
export function sleep(secs: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, secs * 1000);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Whether a failure of an event stream is the connection's (worth following again), not the daemon's answer. */
export function isDropped(e: unknown): boolean {
  return e instanceof ConnectionError || (e instanceof TimeoutError && e.status === undefined);
}

/**
 * One agent run. Start one with `Run.start(task, { model })` (or `Run.run`, which also waits
 * for its end); reach one with `Run.get(id)`.
 */
export class Run {
  /** Its id (`run-…`). */
  readonly id: string;
  /** What the API last said about it (refreshed by `refresh`, `wait`, `cancel`). */
  info: RunInfo;
  /** The last event a `wait` saw: the next one follows on from there. */
  private seen = 0;

  /** Wraps a run the API described; use `Run.start` or `Run.get` instead. */
  constructor(private readonly http: HttpClient, info: RunInfo) {
    this.id = info.id;
    this.info = info;
  }

  /** Starts a run and returns at once: it goes on in the daemon (`info.status` is `running`). */
  static async start(task: string, options: StartRunOptions = {}): Promise<Run> {
    const http = clientFor(options);
    const sandbox = options.sandbox;
    const body = {
      task,
      model: options.model,
      mode: options.mode,
      sandbox_id: typeof sandbox === "string" ? sandbox : sandbox?.id,
      template: options.template,
      context: options.context,
      budgets: options.budgets === undefined ? undefined : fromBudgets(options.budgets),
      keep_sandbox: options.keepSandbox,
      validate: options.validate === undefined ? undefined : fromValidate(options.validate),
      snapshots: options.snapshots,
      keep_snapshots: options.keepSnapshots,
      thread_id: options.threadId,
    };
    const r = await http.json<WireRun>("POST", "/v1/runs", { body: { json: body } });
    return new Run(http, toRunInfo(r));
  }

  /**
   * Takes up a run a stopped process left unfinished (`running` with no process, or `failed`
   * with reason `interrupted`): it goes on from its last committed step. Answers at once
   * (follow it with `Run.get(id)` then `wait` or `events`); a run that is going on or has
   * ended is a `ConflictError` (fork one that has ended instead).
   */
  static async resume(runId: string, options: ClientOptions = {}): Promise<RunInfo> {
    return resumeRun(clientFor(options), runId);
  }

  /**
   * Starts a new run whose history is the original's steps 1..`fromStep` and whose sandbox is
   * restored from that step's snapshot (the original is never changed); its `info.forkedFrom`
   * says where it came from. A step whose snapshot was pruned is a `ConflictError`: start runs
   * you mean to fork later with `keepSnapshots`.
   */
  static async fork(runId: string, options: ForkRunOptions & ClientOptions): Promise<Run> {
    return forkRun(clientFor(options), runId, options);
  }

  /**
   * Makes a new sandbox as the run's sandbox was at the end of committed step `step` (from the
   * newest step snapshot at or before it), without starting a run.
   */
  static async stepSandbox(runId: string, step: number, options: ClientOptions = {}): Promise<StepSandbox> {
    return openStepSandbox(clientFor(options), runId, step);
  }

  /**
   * `Run.start`, then `wait`: the run as it ended. A run that fails or is cancelled is a
   * result (`ok: false`, `reason` says why), not an exception.
   */
  static async run(task: string, options: StartRunOptions & WaitOptions = {}): Promise<RunInfo> {
    const run = await Run.start(task, options);
    return run.wait({ timeout: options.timeout, signal: options.signal });
  }

  /** Reaches an existing run by id (`NotFoundError` if this key has none of that id). */
  static async get(id: string, options: ClientOptions = {}): Promise<Run> {
    const http = clientFor(options);
    return new Run(http, toRunInfo(await http.json<WireRun>("GET", `/v1/runs/${encodeURIComponent(id)}`)));
  }

  /** Your runs, newest first (at most `limit`, 1 to 1000; the daemon's default is 100). */
  static async list(options: ClientOptions & { limit?: number } = {}): Promise<RunInfo[]> {
    const http = clientFor(options);
    const list = await http.json<{ runs: WireRun[] }>("GET", "/v1/runs", { query: { limit: options.limit } });
    return list.runs.map(toRunInfo);
  }

  /** Reads its record again (status, answer, usage so far). */
  async refresh(): Promise<RunInfo> {
    return this.load();
  }

  /** `refresh`, which `signal` can stop. */
  private async load(signal?: AbortSignal): Promise<RunInfo> {
    const r = await this.http.json<WireRun>("GET", `/v1/runs/${encodeURIComponent(this.id)}`, { signal });
    this.info = toRunInfo(r);
    return this.info;
  }

  /**
   * Waits for it to end and returns its record. It follows the run's events, so it returns as
   * soon as `run_finished` comes (a run that has ended: at once); a later wait goes on from the
   * last event this one saw. Fails with `TimeoutError` when it still runs after `timeout`
   * seconds, and with the signal's reason when `signal` aborts: it goes on (wait again, or
   * `cancel()` it). Its own `budgets.timeoutSecs` bounds it in any case.
   */
  async wait(options: WaitOptions = {}): Promise<RunInfo> {
    if (this.info.done) return this.info;
    const { timeout, signal } = options;
    if (signal?.aborted) throw signal.reason;
    // One signal for the caller's and the deadline's: either stops the stream being read.
    const stop = new AbortController();
    const onAbort = (): void => stop.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    // Past what a timer can hold (about 24.8 days), no deadline: the run's own ends far sooner.
    const timer =
      timeout === undefined || timeout * 1000 > MAX_TIMER_MS
        ? undefined
        : setTimeout(() => {
            stop.abort(new TimeoutError(`run ${this.id} is still running after ${timeout} s`, { code: "timeout" }));
          }, timeout * 1000);
    try {
      return await this.followToEnd(stop.signal);
    } catch (e) {
      // Whichever stopped it first, as it was given (whatever the step it stopped failed with).
      throw stop.signal.aborted ? stop.signal.reason : e;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * `wait` without its deadline: the events from the last one a wait saw until `run_finished`,
   * then its record. A stream that ends before `run_finished` while the run goes on means the
   * daemon has no live events of it (the run goes on in another process): its state is asked
   * for instead, every 0.1 s growing to 1 s.
   */
  private async followToEnd(signal: AbortSignal): Promise<RunInfo> {
    for await (const event of this.follow(this.seen, signal, true)) this.seen = event.seq;
    let pause = POLL_FIRST;
    while (!(await this.load(signal)).done) {
      await sleep(pause, signal);
      pause = Math.min(pause * 1.5, POLL_MAX);
    }
    return this.info;
  }

  /**
   * Follows its trajectory: the events numbered after `after` (default: all), the stored ones
   * then the live ones as they happen, ending with `run_finished`. A connection that drops on
   * the way is followed again from the last event given (`Last-Event-ID`), so no event comes
   * twice or goes missing. Leaving the loop stops following (the run goes on).
   */
  events(options: RunEventsOptions = {}): AsyncGenerator<RunEvent, void, undefined> {
    return this.follow(options.after ?? 0, options.signal, false);
  }

  /**
   * `events`; with `settle`, a stream that ends (without breaking) before `run_finished` ends
   * the iteration, for `wait` to find out why, instead of being followed again.
   */
  private async *follow(after: number, signal: AbortSignal | undefined, settle: boolean): AsyncGenerator<RunEvent, void, undefined> {
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
      try {
        const stream = sseRequest(this.http, "GET", `/v1/runs/${encodeURIComponent(this.id)}/events`, {
          query,
          headers,
          signal,
        });
        for await (const message of stream) {
          const data = message.data;
          if (typeof data !== "object" || data === null || Array.isArray(data)) continue;
          if (message.event === "error" && isErrorBody(data)) throw errorFromBody(data);
          const event = toRunEvent(data as Record<string, unknown>);
          // Already given (a server that replayed from earlier).
          if (event.seq <= last) continue;
          last = event.seq;
          failures = 0;
          if (event.type === "run_finished") finished = true;
          yield event;
        }
      } catch (e) {
        // Stopped on purpose: not a connection to follow again.
        if (signal?.aborted || !isDropped(e) || failures >= RECONNECTS) throw e;
        failures++;
        await sleep(Math.min(0.2 * 2 ** (failures - 1), 5), signal);
        continue;
      }
      if (finished || settle) return;
      // Ended without `run_finished`: a run that ended without one (its process died) has no
      // more to give; one still going is followed again.
      if ((await this.load(signal)).done) return;
      if (failures >= RECONNECTS) {
        throw new ConnectionError(`the event stream of run ${this.id} keeps ending before the run does`, {
          code: "connection_failed",
        });
      }
      failures++;
      await sleep(Math.min(0.2 * 2 ** (failures - 1), 5), signal);
    }
  }

  /** Its stored events numbered after `after` (default: all), oldest first, read at once (page by page); a run going on has more later. */
  async listEvents(options: { after?: number } = {}): Promise<RunEvent[]> {
    const found: RunEvent[] = [];
    let after = options.after ?? 0;
    for (;;) {
      const page = await this.http.json<{ events: Record<string, unknown>[] }>(
        "GET",
        `/v1/runs/${encodeURIComponent(this.id)}/events`,
        { query: { format: "json", after, limit: EVENTS_PAGE } },
      );
      const events = page.events.map(toRunEvent);
      found.push(...events);
      if (events.length < EVENTS_PAGE) return found;
      after = events[events.length - 1]!.seq;
    }
  }

  /**
   * Cancels it: its model call stops and a running cell is interrupted (the kernel's state
   * stays). Answers once its end is recorded (`cancelled`); a run that had ended is answered
   * as it ended.
   */
  async cancel(): Promise<RunInfo> {
    this.info = toRunInfo(await this.http.json<WireRun>("POST", `/v1/runs/${encodeURIComponent(this.id)}/cancel`));
    return this.info;
  }

  /** `Run.resume(this.id)`, keeping what it says in `info`. */
  async resume(): Promise<RunInfo> {
    this.info = await resumeRun(this.http, this.id);
    return this.info;
  }

  /** `Run.fork(this.id, options)`: a new run from one of this one's steps. */
  fork(options: ForkRunOptions): Promise<Run> {
    return forkRun(this.http, this.id, options);
  }

  /** `Run.stepSandbox(this.id, step)`: a new sandbox as this run's was at the end of `step`. */
  stepSandbox(step: number): Promise<StepSandbox> {
    return openStepSandbox(this.http, this.id, step);
  }

  /** Its sandbox (one it made is deleted when it ends, unless started with `keepSandbox`). */
  async sandbox(): Promise<Sandbox> {
    if (this.info.sandboxId === null) await this.refresh();
    const id = this.info.sandboxId;
    if (id === null) throw new Error(`run ${this.id} has no sandbox yet`);
    return new Sandbox(this.http, toSandboxInfo(await this.http.json<WireSandbox>("GET", `/v1/sandboxes/${id}`)));
  }
}

/** `POST /v1/runs/{id}/resume`. */
async function resumeRun(http: HttpClient, runId: string): Promise<RunInfo> {
  // No client deadline: going on may restore the sandbox from a snapshot first.
  const r = await http.json<WireRun>("POST", `/v1/runs/${encodeURIComponent(runId)}/resume`, { timeout: null });
  return toRunInfo(r);
}

/** `POST /v1/runs/{id}/fork`. */
async function forkRun(http: HttpClient, runId: string, options: ForkRunOptions): Promise<Run> {
  // Only the fields the server takes: it refuses any other key, and `options` may carry the client's.
  const body = {
    from_step: options.fromStep,
    task: options.task,
    model: options.model,
    budgets: options.budgets === undefined ? undefined : fromBudgets(options.budgets),
    validate: options.validate === undefined ? undefined : fromValidate(options.validate),
    keep_sandbox: options.keepSandbox,
    wait: options.wait,
  };
  // No client deadline: the fork's sandbox is restored from a snapshot (and `wait` waits for its end).
  const r = await http.json<WireRun>("POST", `/v1/runs/${encodeURIComponent(runId)}/fork`, {
    body: { json: body },
    timeout: null,
  });
  return new Run(http, toRunInfo(r));
}

/** `POST /v1/runs/{id}/steps/{step}/sandbox`, then the new sandbox's description. */
async function openStepSandbox(http: HttpClient, runId: string, step: number): Promise<StepSandbox> {
  const made = await http.json<WireStepSandbox>(
    "POST",
    `/v1/runs/${encodeURIComponent(runId)}/steps/${encodeURIComponent(String(step))}/sandbox`,
    { timeout: null },
  );
  const info = await http.json<WireSandbox>("GET", `/v1/sandboxes/${made.sandbox_id}`);
  return {
    sandbox: new Sandbox(http, toSandboxInfo(info)),
    sandboxId: made.sandbox_id,
    snapshotId: made.snapshot_id,
    snapshotStep: made.snapshot_step,
    notCarried: made.not_carried,
  };
}
