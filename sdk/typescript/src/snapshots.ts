/** Snapshots: durable, checksummed copies of a sandbox's state; restore one, or fork it into many sandboxes. */

import { clientFor, type HttpClient } from "./http.js";
import { type ClientOptions } from "./config.js";
import { Sandbox } from "./sandbox.js";
import {
  fromSecrets,
  toSandboxInfo,
  type Language,
  type Secret,
  type SkippedVariable,
  type StringMap,
  type WireSandbox,
} from "./types.js";

/** One kernel's state in a snapshot. */
export interface KernelState {
  /** Its context. */
  context: string;
  /** Its language. */
  language: Language;
  /** Its state file in the sandbox. */
  path: string;
  /** Variables carried. */
  saved: string[];
  /** Variables left out, and why. */
  skipped: SkippedVariable[];
}

/** What a snapshot holds. */
export interface SnapshotManifest {
  /** Manifest format version. */
  format: number;
  /** `files`, `language` or `process`. */
  fidelity: string;
  /** The archive's file name in the snapshot's folder. */
  archive: string;
  /** SHA-256 of the archive (hex). */
  sha256: string;
  /** Bytes of the archive. */
  archiveBytes: number;
  /** What the archive holds. */
  files: { files: number; bytes: number; skipped: string[] };
  /** The kernels whose state it carries. */
  kernels: KernelState[];
  /** What a snapshot of this fidelity never carries. */
  notCarried: string[];
}

/**
 * What a snapshot keeps of the named volumes its sandbox mounts: `"mount"` (the default:
 * nothing; a sandbox made from it mounts the same volumes again, as they are then) or `"copy"`
 * (a copy of each, taken with the rest while the sandbox is paused; each sandbox restored or
 * forked from it mounts a new volume of its own, `<volume>-<6 hex>`, filled from the copy).
 */
export type VolumeCarry = "mount" | "copy";

/** A named volume a snapshot keeps a copy of (taken with `volumes: "copy"`). */
export interface VolumeCopy {
  /** The volume it was taken of. */
  volume: string;
  /** Where the sandbox mounted it (and where sandboxes made from the snapshot mount their new volume). */
  path: string;
  /** The copy's size in bytes. */
  bytes: number;
}

/** `VolumeCopyInfo` as sent. */
export interface WireVolumeCopy {
  volume: string;
  path: string;
  bytes: number;
}

/** Options of `createSnapshot`. */
export interface CreateSnapshotOptions {
  /** A name (default: the sandbox id and the time). */
  name?: string;
  /** What it is for. */
  description?: string;
  /** Tags to find it by. */
  tags?: StringMap;
  /**
   * `"copy"`: also keep a copy of each named volume the sandbox mounts (host folders are never
   * kept); each sandbox restored or forked from the snapshot then gets a new volume of its own
   * (`<volume>-<6 hex>`, in its `info.restore.volumes`) filled from the copy, at the same path,
   * and the live volume is left alone. `"mount"` (the daemon's default): a restore mounts the
   * same volume again, as it is then.
   */
  volumes?: VolumeCarry;
}

/** Options of a fork: how many sandboxes, and what each gets besides the snapshot's settings. */
export interface ForkOptions {
  /** How many sandboxes (1 to 16; default 1). */
  count?: number;
  /** Labels of the new sandboxes. */
  labels?: StringMap;
  /** Metadata of the new sandboxes. */
  metadata?: StringMap;
  /** Lifetime in seconds. */
  timeoutSecs?: number;
  /** Idle timeout in seconds. */
  idleTimeoutSecs?: number;
  /** Forget each new sandbox's record once it stops or is killed (`Sandbox.get` then answers `NotFoundError`). */
  ephemeral?: boolean;
  /**
   * Values for the snapshot's secrets by name (`[{ name, value, hosts }]`), which keep their
   * placeholders: needed after the daemon restarted, as it keeps values in memory only
   * (otherwise the forks get the values it holds for those placeholders, and these replace
   * them). A name the snapshot lacks, or a bad value or host rule, is an
   * `InvalidArgumentError`; a malformed list a `TypeError` before anything is sent.
   */
  secrets?: readonly Secret[];
}

/** Automatic snapshots of one sandbox. */
export interface AutoSnapshotSettings {
  /** One snapshot every this many seconds while it runs (null: none). */
  intervalSecs: number | null;
  /** Interval snapshots kept (default 3, at most 100). */
  keep: number | null;
  /** One snapshot just before it is stopped for idleness or its lifetime. */
  beforeReclaim: boolean;
}

/** `AutoSnapshotSettings` as sent. */
export interface WireAutoSnapshot {
  interval_secs?: number | null;
  keep?: number | null;
  before_reclaim?: boolean;
}

interface WireSnapshot {
  id: string;
  sandbox_id: string;
  parent_id?: string | null;
  name: string;
  description: string;
  tags: StringMap;
  fidelity: string;
  created_at: string;
  size: number;
  files: number;
  manifest: {
    format: number;
    fidelity: string;
    archive: string;
    sha256: string;
    archive_bytes: number;
    files: { files: number; bytes: number; skipped: string[] };
    kernels?: KernelState[];
    not_carried: string[];
  };
  volumes?: WireVolumeCopy[];
  children?: string[] | null;
  sandboxes?: string[] | null;
}

/** Maps auto-snapshot settings to the wire. */
export function fromAutoSnapshot(a: Partial<AutoSnapshotSettings>): WireAutoSnapshot {
  return { interval_secs: a.intervalSecs, keep: a.keep, before_reclaim: a.beforeReclaim };
}

/** Maps auto-snapshot settings from the wire. */
export function toAutoSnapshot(a: WireAutoSnapshot): AutoSnapshotSettings {
  return { intervalSecs: a.interval_secs ?? null, keep: a.keep ?? null, beforeReclaim: a.before_reclaim ?? false };
}

/** A snapshot of a sandbox, with its lineage. */
export class Snapshot {
  /** Its id (`sn-…`). */
  readonly id: string;
  /** The sandbox it was taken of. */
  readonly sandboxId: string;
  /** The snapshot that sandbox came from (its parent in the lineage). */
  readonly parentId: string | null;
  /** Its name. */
  readonly name: string;
  /** Its description. */
  readonly description: string;
  /** Its tags. */
  readonly tags: StringMap;
  /** `files`, `language` or `process`: what a restore brings back. */
  readonly fidelity: string;
  /** When it was taken. */
  readonly createdAt: Date;
  /** Bytes on disk. */
  readonly size: number;
  /** Files carried. */
  readonly files: number;
  /** What it holds. */
  readonly manifest: SnapshotManifest;
  /** The named volumes it keeps copies of (taken with `volumes: "copy"`; else empty). */
  readonly volumes: VolumeCopy[];
  /** Snapshots taken of sandboxes made from it (only from `Snapshot.get`). */
  readonly children: string[] | null;
  /** Sandboxes restored or forked from it (only from `Snapshot.get`). */
  readonly sandboxes: string[] | null;

  constructor(private readonly http: HttpClient, s: WireSnapshot) {
    this.id = s.id;
    this.sandboxId = s.sandbox_id;
    this.parentId = s.parent_id ?? null;
    this.name = s.name;
    this.description = s.description;
    this.tags = s.tags;
    this.fidelity = s.fidelity;
    this.createdAt = new Date(s.created_at);
    this.size = s.size;
    this.files = s.files;
    const m = s.manifest;
    this.manifest = {
      format: m.format,
      fidelity: m.fidelity,
      archive: m.archive,
      sha256: m.sha256,
      archiveBytes: m.archive_bytes,
      files: m.files,
      kernels: m.kernels ?? [],
      notCarried: m.not_carried,
    };
    this.volumes = (s.volumes ?? []).map((v) => ({ volume: v.volume, path: v.path, bytes: v.bytes }));
    this.children = s.children ?? null;
    this.sandboxes = s.sandboxes ?? null;
  }

  /** Takes a snapshot of a sandbox. */
  static async take(http: HttpClient, sandboxId: string, options: CreateSnapshotOptions = {}): Promise<Snapshot> {
    // Only the fields the server takes: it refuses any other key, and `options` may carry more.
    const body = { name: options.name, description: options.description, tags: options.tags, volumes: options.volumes };
    const s = await http.json<WireSnapshot>("POST", `/v1/sandboxes/${sandboxId}/snapshots`, {
      body: { json: body },
      timeout: null,
    });
    return new Snapshot(http, s);
  }

  /** One snapshot, with its lineage (`children`, `sandboxes`). */
  static async get(snapshotId: string, options: ClientOptions = {}): Promise<Snapshot> {
    const http = clientFor(options);
    return new Snapshot(http, await http.json<WireSnapshot>("GET", `/v1/snapshots/${snapshotId}`));
  }

  /** Your snapshots, oldest first (`sandboxId`: only that sandbox's). */
  static async list(options: ClientOptions & { sandboxId?: string } = {}): Promise<Snapshot[]> {
    return listSnapshots(clientFor(options), options.sandboxId);
  }

  /** Makes `count` new independent sandboxes from it, all or none; each one's `info.restore` says what came back. */
  async fork(options: ForkOptions = {}): Promise<Sandbox[]> {
    return forkSnapshot(this.http, this.id, options);
  }

  /** Deletes it and its files (refused with `ConflictError` while it has children). */
  async delete(): Promise<void> {
    await this.http.json<void>("DELETE", `/v1/snapshots/${this.id}`);
  }
}

/** Lists snapshots (one sandbox's, or all of the owner's). */
export async function listSnapshots(http: HttpClient, sandboxId?: string): Promise<Snapshot[]> {
  const list = await http.json<{ snapshots: WireSnapshot[] }>("GET", "/v1/snapshots", { query: { sandbox: sandboxId } });
  return list.snapshots.map((s) => new Snapshot(http, s));
}

/** Makes new sandboxes from a snapshot. */
export async function forkSnapshot(http: HttpClient, snapshotId: string, options: ForkOptions = {}): Promise<Sandbox[]> {
  const r = await http.json<{ sandboxes: { sandbox: WireSandbox; restore: WireSandbox["restore"] }[] }>(
    "POST",
    `/v1/snapshots/${snapshotId}/fork`,
    {
      body: {
        json: {
          count: options.count,
          labels: options.labels,
          metadata: options.metadata,
          timeout_secs: options.timeoutSecs,
          idle_timeout_secs: options.idleTimeoutSecs,
          ephemeral: options.ephemeral,
          secrets: options.secrets === undefined ? undefined : fromSecrets(options.secrets),
        },
      },
      timeout: null,
    },
  );
  return r.sandboxes.map((f) => new Sandbox(http, toSandboxInfo({ ...f.sandbox, restore: f.restore })));
}
