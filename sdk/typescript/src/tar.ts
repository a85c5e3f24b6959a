/**
 * A folder as a gzip-compressed tar archive, made in memory: a template build's context
 * (`Template.build(name, { context: "./app" })`). The package takes no dependency, so this is
 * a small POSIX (ustar) writer with PAX records for what ustar cannot hold (paths and link
 * targets over 100 bytes, files of 8 GiB or more). Node only: loaded when a build is given a
 * folder.
 */

import { lstat, readdir, readFile, readlink } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { gzip } from "node:zlib";

const BLOCK = 512;
/** The largest size a ustar header's 11 octal digits hold. */
const MAX_USTAR_SIZE = 0o77777777777;
const encoder = new TextEncoder();

/** One entry of the archive. */
interface Entry {
  /** Its path inside the archive (`a/b`, a folder's with a trailing `/`). */
  path: string;
  /** `0` a file, `2` a symbolic link, `5` a folder. */
  type: "0" | "2" | "5";
  /** Permission bits (and setuid, setgid, sticky). */
  mode: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** A symbolic link's target. */
  link?: string;
  /** A file's contents. */
  data?: Uint8Array;
}

/**
 * Packs the folder `dir` (its contents, not the folder itself) as a gzip-compressed tar:
 * files, folders and symbolic links (kept as links, not followed) with their permission bits
 * and modification times, owned by 0:0, in name order, so the same folder gives the same
 * archive. Sockets, FIFOs and devices are left out.
 */
export async function packFolder(dir: string): Promise<Uint8Array> {
  const top = await lstat(dir);
  if (!top.isDirectory()) throw new TypeError(`the build context ${dir} is not a folder`);
  const entries: Entry[] = [];
  await walk(dir, "", entries);
  const blocks: Uint8Array[] = [];
  for (const entry of entries) writeEntry(entry, blocks);
  blocks.push(new Uint8Array(2 * BLOCK)); // the end: two empty blocks
  const tar = concat(blocks);
  return new Uint8Array(await promisify(gzip)(tar));
}

async function walk(root: string, rel: string, out: Entry[]): Promise<void> {
  const names = (await readdir(rel === "" ? root : join(root, rel))).sort();
  for (const name of names) {
    const path = rel === "" ? name : `${rel}/${name}`;
    const full = join(root, path);
    const st = await lstat(full);
    const common = { mode: st.mode & 0o7777, mtime: Math.max(0, Math.floor(st.mtimeMs / 1000)) };
    if (st.isDirectory()) {
      out.push({ path: `${path}/`, type: "5", ...common });
      await walk(root, path, out);
    } else if (st.isSymbolicLink()) {
      out.push({ path, type: "2", link: await readlink(full), ...common });
    } else if (st.isFile()) {
      out.push({ path, type: "0", data: await readFile(full), ...common });
    }
  }
}

/** The entry's header block(s) and its data, padded to whole blocks. */
function writeEntry(entry: Entry, blocks: Uint8Array[]): void {
  const size = entry.data?.length ?? 0;
  const pax: [string, string][] = [];
  if (encoder.encode(entry.path).length > 100) pax.push(["path", entry.path]);
  if (entry.link !== undefined && encoder.encode(entry.link).length > 100) pax.push(["linkpath", entry.link]);
  if (size > MAX_USTAR_SIZE) pax.push(["size", String(size)]);
  if (pax.length > 0) {
    const records = encoder.encode(pax.map(([k, v]) => paxRecord(k, v)).join(""));
    blocks.push(header({ path: "PaxHeader", type: "x", mode: 0o644, mtime: entry.mtime }, records.length));
    pushData(records, blocks);
  }
  blocks.push(header(entry, size));
  if (entry.data !== undefined) pushData(entry.data, blocks);
}

/** `"<length> <key>=<value>\n"`, the length counting its own digits. */
function paxRecord(key: string, value: string): string {
  const rest = encoder.encode(` ${key}=${value}\n`).length;
  let length = rest + String(rest).length;
  if (String(length).length !== String(rest).length) length = rest + String(length).length;
  return `${length} ${key}=${value}\n`;
}

function pushData(data: Uint8Array, blocks: Uint8Array[]): void {
  blocks.push(data);
  const pad = (BLOCK - (data.length % BLOCK)) % BLOCK;
  if (pad > 0) blocks.push(new Uint8Array(pad));
}

/** A ustar header block (a field too long for it is cut: a PAX record carries it whole). */
function header(entry: Pick<Entry, "path" | "mode" | "mtime" | "link"> & { type: string }, size: number): Uint8Array {
  const h = new Uint8Array(BLOCK);
  text(h, 0, 100, entry.path);
  octal(h, 100, 8, entry.mode);
  octal(h, 108, 8, 0); // uid
  octal(h, 116, 8, 0); // gid
  octal(h, 124, 12, Math.min(size, MAX_USTAR_SIZE));
  octal(h, 136, 12, entry.mtime);
  h.fill(0x20, 148, 156); // the checksum counts its own field as spaces
  text(h, 156, 1, entry.type);
  text(h, 157, 100, entry.link ?? "");
  text(h, 257, 6, "ustar"); // and a NUL
  text(h, 263, 2, "00");
  text(h, 265, 32, "root");
  text(h, 297, 32, "root");
  let sum = 0;
  for (const byte of h) sum += byte;
  text(h, 148, 8, `${sum.toString(8).padStart(6, "0")}\0 `);
  return h;
}

/** UTF-8 text at `offset`, at most `length` bytes (a multi-byte character is not split). */
function text(h: Uint8Array, offset: number, length: number, value: string): void {
  let bytes = encoder.encode(value);
  if (bytes.length > length) {
    let end = length;
    while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
    bytes = bytes.subarray(0, end);
  }
  h.set(bytes, offset);
}

/** A number in octal, zero-padded, ending with a NUL. */
function octal(h: Uint8Array, offset: number, length: number, value: number): void {
  text(h, offset, length - 1, value.toString(8).padStart(length - 1, "0"));
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
