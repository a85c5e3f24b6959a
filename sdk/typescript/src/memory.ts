/**
 * Memories: short texts kept by the daemon and found again by ranked full-text search
 * (docs/agent.md, Memory). They belong to one sandbox (`sb.memory`, reached only through it;
 * a sandbox made from a snapshot of it starts with copies of what it had then) or to their
 * owner (`memory(options?)`, whatever the sandbox).
 */

import { clientFor, type HttpClient } from "./http.js";
import { type ClientOptions } from "./config.js";
import type { StringMap } from "./types.js";

/** Whose a memory is: a sandbox's, or its owner's. */
export type MemoryScope = "sandbox" | "owner";

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
  /** When it was remembered (a fork's copy keeps its original's time). */
  createdAt: Date;
}

/** Options of `add`. */
export interface AddMemoryOptions {
  /** A category to filter by later (default `general`): lowercase letters, digits, `-`, `_`, `.`. */
  category?: string;
  /** Metadata (at most 64 entries), kept and shown with it. */
  metadata?: StringMap;
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
  created_at: string;
}

/** `MemoryList` as sent. */
export interface WireMemoryList {
  memories: WireMemory[];
  next_cursor?: string | null;
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

  /** Remembers `text` (not blank, at most 64 KiB); a scope holds at most 10 000 (then `LimitExceededError`). */
  async add(text: string, options: AddMemoryOptions = {}): Promise<Memory> {
    // Only the fields the server takes: it refuses any other key.
    const body = { text, category: options.category, metadata: options.metadata };
    return toMemory(await this.http.json<WireMemory>("POST", memoriesPath(this.sandboxId), { body: { json: body } }));
  }

  /**
   * The memories matching the words of `query`, most relevant first (those matching more of
   * the words, and rarer ones, first; stemmed: "deploying" finds "deploys"). `query` is only
   * words, never search syntax; one without a letter or digit finds nothing.
   */
  async search(query: string, options: SearchMemoriesOptions = {}): Promise<Memory[]> {
    const found = await this.http.json<WireMemoryList>("GET", memoriesPath(this.sandboxId, "/search"), {
      query: { q: query, limit: options.limit, category: options.category },
    });
    return found.memories.map(toMemory);
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
