/**
 * Files: small reads and writes, directory operations, streamed uploads and downloads of any
 * size, imports, exports kept by the service, and the artifacts folder. Paths are absolute
 * inside `/workspace`, `/tmp` and `/home/sandbox`, or relative to `/workspace`.
 */

import { clientFor, type HttpClient } from "./http.js";
import { type ClientOptions } from "./config.js";

/** One file or directory. */
export interface FileInfo {
  /** Last path component. */
  name: string;
  /** Absolute path inside the sandbox. */
  path: string;
  /** Size in bytes. */
  size: number;
  /** `file`, `dir`, `symlink` or `other`. */
  kind: "file" | "dir" | "symlink" | "other";
  /** Whether it is a directory. */
  isDir: boolean;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  /** Modification time. */
  mtime: Date;
  /** Where a symlink points. */
  linkTarget: string | null;
}

/** Options of `writeFile` and `upload`. */
export interface WriteOptions {
  /** Permission bits, e.g. `0o755` or `"755"`. */
  mode?: number | string;
  /** Append instead of replacing. */
  append?: boolean;
}

/** Bytes to upload: a local file path (Node), bytes, or a stream of bytes (web or Node stream, any async iterable). */
export type UploadSource = string | Uint8Array | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** Where an import takes its content from: exactly one source. */
export type ImportSource =
  | { hostPath: string }
  | { text: string }
  | { base64: string }
  | { exportId: string };

/** What an import wrote. */
export interface ImportResult {
  /** Where it went. */
  path: string;
  /** Files written. */
  files: number;
  /** Bytes written. */
  bytes: number;
}

/** A file in the artifacts folder (`/workspace/outputs`). */
export interface Artifact {
  /** Its path in the sandbox. */
  path: string;
  /** Bytes. */
  size: number;
  /** Its MIME type, from its name. */
  mime: string;
  /** Modification time. */
  mtime: Date;
}

interface WireFile {
  name: string;
  path: string;
  size: number;
  kind: FileInfo["kind"];
  is_dir: boolean;
  mode: number;
  mtime: number;
  link_target?: string | null;
}

interface WireExport {
  id: string;
  sandbox_id: string;
  path: string;
  kind: "file" | "dir";
  size?: number | null;
  sha256?: string | null;
  created_at: string;
  download_url: string;
  signed_url?: string | null;
  signed_url_expires_at?: string | null;
}

function toFile(f: WireFile): FileInfo {
  return {
    name: f.name,
    path: f.path,
    size: f.size,
    kind: f.kind,
    isDir: f.is_dir,
    mode: f.mode,
    mtime: new Date(f.mtime * 1000),
    linkTarget: f.link_target ?? null,
  };
}

function modeParam(mode: number | string | undefined): string | undefined {
  return typeof mode === "number" ? mode.toString(8) : mode;
}

function filesPath(id: string, rest = ""): string {
  return `/v1/sandboxes/${id}/files${rest}`;
}

/** Writes a file (parents are created) from text or bytes. */
export async function writeFile(
  http: HttpClient,
  id: string,
  path: string,
  data: string | Uint8Array,
  options: WriteOptions = {},
): Promise<FileInfo> {
  return upload(http, id, typeof data === "string" ? new TextEncoder().encode(data) : data, path, options);
}

/**
 * Uploads to a path in the sandbox: bytes in memory go in one request; a local file or a
 * stream is sent chunk by chunk (through `node:http`, see upload.ts), never held whole.
 */
export async function upload(
  http: HttpClient,
  id: string,
  source: UploadSource,
  path: string,
  options: WriteOptions = {},
): Promise<FileInfo> {
  const query = { path, mode: modeParam(options.mode), append: options.append };
  if (source instanceof Uint8Array) {
    return toFile(await http.json<WireFile>("PUT", filesPath(id, "/content"), { query, body: { bytes: source }, timeout: null }));
  }
  // Loaded when first used: the rest of the SDK needs nothing but fetch.
  const { sendStream } = await import("./upload.js");
  const { createReadStream } = await import("node:fs");
  const stream = typeof source === "string" ? (createReadStream(source) as AsyncIterable<Uint8Array>) : source;
  return toFile(await sendStream<WireFile>(http, "PUT", filesPath(id, "/content"), query, stream));
}

/** Opens a file for reading as a web byte stream (the daemon paces it to the reader). */
export async function downloadStream(http: HttpClient, id: string, path: string, signal?: AbortSignal): Promise<ReadableStream<Uint8Array>> {
  const response = await http.stream("GET", filesPath(id, "/content"), { query: { path }, signal });
  return response.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
}

/** Reads a whole file as bytes. */
export async function readBytes(http: HttpClient, id: string, path: string): Promise<Uint8Array> {
  const spec = { query: { path } };
  const response = await http.stream("GET", filesPath(id, "/content"), spec);
  try {
    return new Uint8Array(await response.arrayBuffer());
  } catch (e) {
    throw http.transportError(e, spec);
  }
}

/** Writes a web byte stream to a local file, piece by piece; returns the bytes written. */
export async function saveStream(stream: ReadableStream<Uint8Array>, localPath: string): Promise<number> {
  const { createWriteStream } = await import("node:fs");
  const { pipeline } = await import("node:stream/promises");
  const { Readable, Transform } = await import("node:stream");
  let bytes = 0;
  const count = new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      bytes += chunk.length;
      callback(null, chunk);
    },
  });
  // The Node and DOM typings of ReadableStream differ only in name; the object is the same.
  await pipeline(Readable.fromWeb(stream as Parameters<typeof Readable.fromWeb>[0]), count, createWriteStream(localPath));
  return bytes;
}

/** Lists a directory (default `/workspace`). */
export async function ls(http: HttpClient, id: string, path?: string): Promise<FileInfo[]> {
  const list = await http.json<{ entries: WireFile[] }>("GET", filesPath(id), { query: { path } });
  return list.entries.map(toFile);
}

/** Describes one path (a final symlink is not followed). */
export async function stat(http: HttpClient, id: string, path: string): Promise<FileInfo> {
  return toFile(await http.json<WireFile>("GET", filesPath(id, "/stat"), { query: { path } }));
}

/** Creates a directory and its parents. */
export async function mkdir(http: HttpClient, id: string, path: string): Promise<FileInfo> {
  return toFile(await http.json<WireFile>("POST", filesPath(id, "/mkdir"), { body: { json: { path } } }));
}

/** Removes a file, or a directory (`recursive` for a non-empty one). */
export async function remove(http: HttpClient, id: string, path: string, options: { recursive?: boolean } = {}): Promise<void> {
  await http.json<void>("DELETE", filesPath(id), { query: { path, recursive: options.recursive } });
}

/** Moves a file or directory (the target must not exist). */
export async function rename(http: HttpClient, id: string, from: string, to: string): Promise<FileInfo> {
  return toFile(await http.json<WireFile>("POST", filesPath(id, "/rename"), { body: { json: { from, to } } }));
}

/** Puts files into the sandbox from an allowed host path, inline text or base64, or an export. */
export async function importFiles(
  http: HttpClient,
  id: string,
  path: string,
  source: ImportSource,
  options: { mode?: number } = {},
): Promise<ImportResult> {
  const body = {
    path,
    mode: options.mode,
    host_path: "hostPath" in source ? source.hostPath : undefined,
    text: "text" in source ? source.text : undefined,
    base64: "base64" in source ? source.base64 : undefined,
    export_id: "exportId" in source ? source.exportId : undefined,
  };
  return http.json<ImportResult>("POST", `/v1/sandboxes/${id}/import`, { body: { json: body }, timeout: null });
}

/** Copies a file or folder out of the sandbox into the service's keeping. */
export async function exportFiles(http: HttpClient, id: string, path: string): Promise<FileExport> {
  const e = await http.json<WireExport>("POST", `/v1/sandboxes/${id}/exports`, { body: { json: { path } }, timeout: null });
  return new FileExport(http, e);
}

/** Lists the files code left in `/workspace/outputs`. */
export async function artifacts(http: HttpClient, id: string): Promise<Artifact[]> {
  const list = await http.json<{ artifacts: (Omit<Artifact, "mtime"> & { mtime: number })[] }>(
    "GET",
    `/v1/sandboxes/${id}/artifacts`,
  );
  return list.artifacts.map((a) => ({ ...a, mtime: new Date(a.mtime * 1000) }));
}

/**
 * A file or folder copied out of a sandbox and kept by the service after the sandbox is
 * gone: download it, import it into another sandbox (`{exportId}`), or hand out its signed link.
 */
export class FileExport {
  /** Its id (`ex-…`). */
  readonly id: string;
  /** The sandbox it came from. */
  readonly sandboxId: string;
  /** The path it had there. */
  readonly path: string;
  /** `file` or `dir` (a folder downloads as a tar archive). */
  readonly kind: "file" | "dir";
  /** Bytes (of all files, for a folder). */
  readonly size: number | null;
  /** SHA-256 of a file's bytes (hex). */
  readonly sha256: string | null;
  /** When it was made. */
  readonly createdAt: Date;
  /** Absolute download URL; needs the owner's key. */
  readonly downloadUrl: string;
  /** Absolute download URL that needs no key, until `signedUrlExpiresAt` (null when the service gives none). */
  readonly signedUrl: string | null;
  /** When `signedUrl` stops working. */
  readonly signedUrlExpiresAt: Date | null;

  constructor(private readonly http: HttpClient, e: WireExport) {
    this.id = e.id;
    this.sandboxId = e.sandbox_id;
    this.path = e.path;
    this.kind = e.kind;
    this.size = e.size ?? null;
    this.sha256 = e.sha256 ?? null;
    this.createdAt = new Date(e.created_at);
    this.downloadUrl = http.config.apiUrl + e.download_url;
    this.signedUrl = e.signed_url === null || e.signed_url === undefined ? null : http.config.apiUrl + e.signed_url;
    this.signedUrlExpiresAt = e.signed_url_expires_at === null || e.signed_url_expires_at === undefined ? null : new Date(e.signed_url_expires_at);
  }

  /** One export by id. */
  static async get(exportId: string, options: ClientOptions = {}): Promise<FileExport> {
    const http = clientFor(options);
    return new FileExport(http, await http.json<WireExport>("GET", `/v1/exports/${exportId}`));
  }

  /** Your exports, oldest first (`sandboxId` narrows to one sandbox's). */
  static async list(options: ClientOptions & { sandboxId?: string } = {}): Promise<FileExport[]> {
    const http = clientFor(options);
    const list = await http.json<{ exports: WireExport[] }>("GET", "/v1/exports", {
      query: { sandbox_id: options.sandboxId },
    });
    return list.exports.map((e) => new FileExport(http, e));
  }

  /** Its bytes (a folder as a tar archive), as a web byte stream. */
  async stream(): Promise<ReadableStream<Uint8Array>> {
    const response = await this.http.stream("GET", `/v1/exports/${this.id}/content`);
    return response.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
  }

  /** Downloads it to a local file, streamed; returns the bytes written. */
  async download(localPath: string): Promise<number> {
    return saveStream(await this.stream(), localPath);
  }

  /** Deletes it and its stored copy. */
  async delete(): Promise<void> {
    await this.http.json<void>("DELETE", `/v1/exports/${this.id}`);
  }
}
