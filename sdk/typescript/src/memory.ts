/**
 * Memories: short texts kept by the daemon and found again by ranked search: full-text, and
 * by meaning too when the daemon has an embedding model (docs/agent.md, Memory). They belong
 * to one sandbox (`sb.memory`, reached only through it; a sandbox made from a snapshot of it
 * starts with copies of what it had then) or to their owner (`memory(options?)`, whatever the
 * sandbox). `add(text, { infer: true })` has the daemon's model extract the facts of a text
 * in the background instead: an `InferJob` says how far it got.
 */

import { clientFor, type HttpClient } from "./http.js";
import { type ClientOptions } from "./config.js";
import type { StringMap } from "./types.js";

/** Whose a memory is: a sandbox's, or its owner's. */
export type MemoryScope = "sandbox" | "owner";

/** How a search ranked: words and embeddings fused (`hybrid`), or words only (`fts`). */
export type MemoryRanking = "hybrid" | "fts";

/** How one search result was found: its words, its embedding only, or both. */
export type MatchedBy = "fts" | "semantic" | "both";

/** Where an infer job is. */
export type InferStatus = "queued" | "running" | "succeeded" | "failed";

/** A memory. */
export interface Memory {
  /** Its id (`mem-…`). */
  id: string;
  /** A sandbox's, or its owner's. */
  scope: MemoryScope;
  /** What is remembered. */
  text: string;
  /** Its category (`general` unless one was given). */
  category: string;
  /** Its metadata. */
  metadata: StringMap;
  /** The sandbox, for a sandbox's memory. */
  sandboxId: string | null;
  /**
   * In search results: how well it matched (bm25 negated: higher is better, comparable only
   * within one search); null in listings.
   */
  score: number | null;
  /** In search results: whether its words, its embedding, or both found it; null in listings. */
  matchedBy: MatchedBy | null;
  /** In hybrid search results found by their embedding: the cosine similarity; else null. */
  similarity: number | null;
  /** On an add whose embedding failed: why (the memory is kept; a later hybrid search embeds it). */
  warning: string | null;
  /** When it was remembered (a fork's copy keeps its original's time). */
  createdAt: Date;
}

/**
 * Search results, best first, and how they were ranked (`ranking`, and `warning` when the
 * search could not rank as configured, e.g. the embeddings endpoint failed: `fts`).
 */
export type MemorySearchResults = Memory[] & {
  readonly ranking: MemoryRanking | null;
  readonly warning: string | null;
};

/** A job extracting facts from a text with the daemon's model. */
export interface InferJob {
  /** Its id (`inf-…`). */
  id: string;
  /** `queued`, `running`, `succeeded` (see `memories`) or `failed` (see `error`). */
  status: InferStatus;
  /** Whose memories it adds. */
  scope: MemoryScope;
  /** The sandbox, for a sandbox's memories. */
  sandboxId: string | null;
  /** The model asked (`provider/model`). */
  model: string;
  /** The category of the memories it adds. */
  category: string;
  /** The ids of the memories it added. */
  memories: string[];
  /** Why it failed (`interrupted: …` when the daemon stopped first); null unless failed. */
  error: string | null;
  /** When it was accepted. */
  createdAt: Date;
  /** When its status last changed. */
  updatedAt: Date;
}

/** Options of `add`. */
export interface AddMemoryOptions {
  /** A category to filter by later (default `general`): lowercase letters, digits, `-`, `_`, `.`. */
  category?: string;
  /** Metadata (at most 64 entries), kept and shown with it. */
  metadata?: StringMap;
  /**
   * Have the daemon's model (`memory.infer_model`, else `agent.model`) extract the facts of
   * `text`, each added as a memory (with this category and metadata, plus `source: infer`),
   * in the background: `add` then answers the `InferJob`.
   */
  infer?: boolean;
}

/** Options of `waitInfer`. */
export interface WaitInferOptions {
  /** Give up after this many milliseconds (default 120 000): a `TimeoutError`-like `Error`. */
  timeoutMs?: number;
  /** Ask again after this many milliseconds (default 100). */
  pollMs?: number;
}

/** Options of `search`. */
export interface SearchMemoriesOptions {
  /** At most this many (1 to 100; the daemon's default is 10). */
  limit?: number;
  /** Only this category. */
  category?: string;
}

/** Options of `list`. */
export interface ListMemoriesOptions {
  /** Only this category. */
  category?: string;
  /** At most this many in all (default: every one, read a page at a time). */
  limit?: number;
}

/** `Memory` as sent. */
export interface WireMemory {
  id: string;
  scope: MemoryScope;
  text: string;
  category: string;
  metadata: StringMap;
  sandbox_id?: string | null;
  score?: number | null;
  matched_by?: MatchedBy | null;
  similarity?: number | null;
  warning?: string | null;
  created_at: string;
}

/** `MemoryList` as sent. */
export interface WireMemoryList {
  memories: WireMemory[];
  next_cursor?: string | null;
  ranking?: MemoryRanking | null;
  warning?: string | null;
}

/** `InferJob` as sent. */
export interface WireInferJob {
  id: string;
  status: InferStatus;
  scope: MemoryScope;
  sandbox_id?: string | null;
  model: string;
  category: string;
  memories: string[];
  error?: string | null;
  created_at: string;
  updated_at: string;
}

/** Maps an infer job from the wire. */
function toInferJob(j: WireInferJob): InferJob {
  return {
    id: j.id,
    status: j.status,
    scope: j.scope,
    sandboxId: j.sandbox_id ?? null,
    model: j.model,
    category: j.category,
    memories: j.memories,
    error: j.error ?? null,
    createdAt: new Date(j.created_at),
    updatedAt: new Date(j.updated_at),
  };
}

/** Whether an infer job has ended. */
export function inferDone(job: InferJob): boolean {
  return job.status === "succeeded" || job.status === "failed";
}

/** The most one listing page holds (the route's own cap). */
const LIST_PAGE = 1000;

/** Maps a memory from the wire. */
function toMemory(m: WireMemory): Memory {
  return {
    id: m.id,
    scope: m.scope,
    text: m.text,
    category: m.category,
    metadata: m.metadata,
    sandboxId: m.sandbox_id ?? null,
    score: m.score ?? null,
    matchedBy: m.matched_by ?? null,
    similarity: m.similarity ?? null,
    warning: m.warning ?? null,
    createdAt: new Date(m.created_at),
  };
}

/** The memories route of a scope: a sandbox's, or the caller's own. */
function memoriesPath(sandboxId: string | undefined, rest = ""): string {
  return sandboxId === undefined ? `/v1/memories${rest}` : `/v1/sandboxes/${sandboxId}/memories${rest}`;
}

/**
 * The memories of one scope: `sb.memory` (a sandbox's) or `memory(options?)` (your own). The
 * daemon checks every value: a blank text or query, a bad category, a limit out of range is an
 * `InvalidArgumentError`.
 */
export class Memories {
  /**
   * Wraps a client and a scope (a sandbox's id, or none for the owner's); use `sb.memory` or
   * `memory(options)` instead.
   */
  constructor(
    private readonly http: HttpClient,
    private readonly sandboxId?: string,
  ) {}

  /**
   * Remembers `text` (not blank, at most 64 KiB); a scope holds at most 10 000 (then
   * `LimitExceededError`). The memory's `warning` says when its embedding failed (it is kept).
   * With `{ infer: true }`: the daemon's model extracts the facts of `text` in the
   * background, and the answer is the `InferJob` (no model on the daemon: `InvalidArgumentError`).
   */
  async add(text: string, options: AddMemoryOptions & { infer: true }): Promise<InferJob>;
  async add(text: string, options?: AddMemoryOptions & { infer?: false }): Promise<Memory>;
  async add(text: string, options: AddMemoryOptions = {}): Promise<Memory | InferJob> {
    // Only the fields the server takes: it refuses any other key.
    const body = { text, category: options.category, metadata: options.metadata };
    if (options.infer === true) {
      return toInferJob(
        await this.http.json<WireInferJob>("POST", memoriesPath(this.sandboxId, "/infer"), { body: { json: body } }),
      );
    }
    return toMemory(await this.http.json<WireMemory>("POST", memoriesPath(this.sandboxId), { body: { json: body } }));
  }

  /** An infer job as it is now (your own scope reaches a sandbox's jobs too). */
  async inferStatus(job: string | InferJob): Promise<InferJob> {
    const id = typeof job === "string" ? job : job.id;
    return toInferJob(await this.http.json<WireInferJob>("GET", memoriesPath(this.sandboxId, `/infer/${encodeURIComponent(id)}`)));
  }

  /** The scope's infer jobs, newest first (at most `limit`, 1 to 1000; default 100). */
  async inferJobs(options: { limit?: number } = {}): Promise<InferJob[]> {
    const found = await this.http.json<{ jobs: WireInferJob[] }>("GET", memoriesPath(this.sandboxId, "/infer"), {
      query: { limit: options.limit },
    });
    return found.jobs.map(toInferJob);
  }

  /** Waits until an infer job has ended (`succeeded` or `failed`) and returns it. */
  async waitInfer(job: string | InferJob, options: WaitInferOptions = {}): Promise<InferJob> {
    const deadline = Date.now() + (options.timeoutMs ?? 120_000);
    for (;;) {
      const current = await this.inferStatus(job);
      if (inferDone(current)) return current;
      if (Date.now() >= deadline) {
        throw new Error(`infer job ${current.id} is still ${current.status} after ${options.timeoutMs ?? 120_000} ms`);
      }
      await new Promise((r) => setTimeout(r, options.pollMs ?? 100));
    }
  }

  /**
   * The memories matching `query`, most relevant first: by its words (those matching more of
   * the words, and rarer ones, first; stemmed: "deploying" finds "deploys"), and by meaning
   * too when the daemon has an embedding model (each result's `matchedBy` says how). The
   * array's `ranking` (`hybrid` or `fts`) and `warning` say how it ranked: `fts` with a
   * warning when the embeddings endpoint failed. `query` is only words, never search syntax.
   */
  async search(query: string, options: SearchMemoriesOptions = {}): Promise<MemorySearchResults> {
    const found = await this.http.json<WireMemoryList>("GET", memoriesPath(this.sandboxId, "/search"), {
      query: { q: query, limit: options.limit, category: options.category },
    });
    // Not enumerable: the results compare as the plain array of memories they are.
    return Object.defineProperties(found.memories.map(toMemory), {
      ranking: { value: found.ranking ?? null, enumerable: false },
      warning: { value: found.warning ?? null, enumerable: false },
    }) as MemorySearchResults;
  }

  /** The scope's memories, newest first: every one (page by page), or at most `limit`. */
  async list(options: ListMemoriesOptions = {}): Promise<Memory[]> {
    const found: Memory[] = [];
    let cursor: string | undefined;
    for (;;) {
      const left = options.limit === undefined ? undefined : options.limit - found.length;
      const page = await this.http.json<WireMemoryList>("GET", memoriesPath(this.sandboxId), {
        query: { category: options.category, limit: left === undefined ? undefined : Math.min(left, LIST_PAGE), cursor },
      });
      found.push(...page.memories.map(toMemory));
      cursor = page.next_cursor ?? undefined;
      if (cursor === undefined || (options.limit !== undefined && found.length >= options.limit)) return found;
    }
  }

  /** One memory (`NotFoundError` when there is none of that id here; your own scope finds a sandbox's too). */
  async get(id: string): Promise<Memory> {
    return toMemory(await this.http.json<WireMemory>("GET", memoriesPath(this.sandboxId, `/${encodeURIComponent(id)}`)));
  }

  /** Forgets one (your own scope reaches a sandbox's too); a snapshot taken before still hands it on. */
  async delete(id: string): Promise<void> {
    await this.http.json<void>("DELETE", memoriesPath(this.sandboxId, `/${encodeURIComponent(id)}`));
  }
}

/**
 * Your own memories (whatever the sandbox) on the daemon these options (and the environment)
 * point at. By id (`get`, `delete`) it reaches any of your memories, a sandbox's too;
 * `list` and `search` cover your own only.
 */
export function memory(options: ClientOptions = {}): Memories {
  return new Memories(clientFor(options));
}
