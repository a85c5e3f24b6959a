/**
 * Threads: conversations that persist across runs (docs/agent.md, Durability). A run started
 * with `threadId` sees the thread's earlier conversation (its latest run's, with that run's
 * answer) and works in the thread's sandbox, which the thread keeps; threads outlive the
 * daemon's restarts.
 */

import { clientFor, type HttpClient } from "./http.js";
import { type ClientOptions } from "./config.js";

/** A thread as the API describes it. */
export interface ThreadInfo {
  /** Its id (`th-…`): what `Run.start(task, { threadId })` takes. */
  id: string;
  /** Its name, unique among your threads. */
  name: string;
  /** Runs started on it. */
  runs: number;
  /** The sandbox its runs share (none until its first run). */
  sandboxId: string | null;
  /** Its latest run. */
  lastRunId: string | null;
  /** When it was made. */
  createdAt: Date;
  /** When it last changed. */
  updatedAt: Date;
}

/** Options of `threads().create`. */
export interface CreateThreadOptions {
  /** Its name, unique among your threads (default: its id). */
  name?: string;
}

/** `ThreadInfo` as sent. */
export interface WireThread {
  id: string;
  name: string;
  runs: number;
  sandbox_id?: string | null;
  last_run_id?: string | null;
  created_at: string;
  updated_at: string;
}

/** Maps a thread from the wire. */
function toThreadInfo(t: WireThread): ThreadInfo {
  return {
    id: t.id,
    name: t.name,
    runs: t.runs,
    sandboxId: t.sandbox_id ?? null,
    lastRunId: t.last_run_id ?? null,
    createdAt: new Date(t.created_at),
    updatedAt: new Date(t.updated_at),
  };
}

/** Your threads: make, list, read, rename and delete them. Get one with `threads(options?)`. */
export class Threads {
  /** Wraps a client; use `threads(options)` instead. */
  constructor(private readonly http: HttpClient) {}

  /** Makes a thread (`ConflictError` when the name is taken). */
  async create(options: CreateThreadOptions = {}): Promise<ThreadInfo> {
    // Only the fields the server takes: it refuses any other key.
    const t = await this.http.json<WireThread>("POST", "/v1/threads", { body: { json: { name: options.name } } });
    return toThreadInfo(t);
  }

  /** Your threads, the most recently used first (at most `limit`, 1 to 1000; the daemon's default is 100). */
  async list(options: { limit?: number } = {}): Promise<ThreadInfo[]> {
    const list = await this.http.json<{ threads: WireThread[] }>("GET", "/v1/threads", { query: { limit: options.limit } });
    return list.threads.map(toThreadInfo);
  }

  /** One thread (`NotFoundError` if you have none of that id). */
  async get(id: string): Promise<ThreadInfo> {
    return toThreadInfo(await this.http.json<WireThread>("GET", `/v1/threads/${encodeURIComponent(id)}`));
  }

  /** Gives it a new name (`ConflictError` when the name is taken). */
  async rename(id: string, name: string): Promise<ThreadInfo> {
    const t = await this.http.json<WireThread>("PATCH", `/v1/threads/${encodeURIComponent(id)}`, { body: { json: { name } } });
    return toThreadInfo(t);
  }

  /**
   * Deletes it and its sandbox; its runs and their trajectories stay. A thread with a run
   * going on is a `ConflictError`.
   */
  async delete(id: string): Promise<void> {
    await this.http.json<void>("DELETE", `/v1/threads/${encodeURIComponent(id)}`);
  }
}

/** Your threads on the daemon these options (and the environment) point at. */
export function threads(options: ClientOptions = {}): Threads {
  return new Threads(clientFor(options));
}
