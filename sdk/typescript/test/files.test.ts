/** Files: reads and writes, directory operations, a large streamed round trip, imports, exports, artifacts. */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { ConflictError, FileExport, InvalidArgumentError, NotFoundError, Sandbox } from "sandcell";
import { daemonEnv, sha256 } from "./helpers.js";

let sb: Sandbox;
let dir: string;
before(async () => {
  sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
  dir = mkdtempSync(join(tmpdir(), "sandcell-ts-files-"));
});
after(async () => {
  await sb.kill();
  rmSync(dir, { recursive: true, force: true });
});

test("write and read text and bytes", async () => {
  const info = await sb.writeFile("notes/hello.txt", "héllo\n");
  assert.equal(info.path, "/workspace/notes/hello.txt");
  assert.equal(info.size, 7);
  assert.equal(info.isDir, false);
  assert.equal(await sb.readFile("/workspace/notes/hello.txt"), "héllo\n");
  const bytes = new Uint8Array([0, 255, 1, 254, 10]);
  await sb.writeFile("/tmp/bin.dat", bytes);
  assert.deepEqual(await sb.readFile("/tmp/bin.dat", { format: "bytes" }), bytes);
  await sb.writeFile("notes/hello.txt", "more\n", { append: true });
  assert.equal(await sb.readFile("notes/hello.txt"), "héllo\nmore\n");
  const script = await sb.writeFile("run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
  assert.equal(script.mode & 0o777, 0o755);
  assert.equal((await sb.exec("./run.sh")).stdout, "ran\n");
});

test("ls, stat, exists, mkdir, rename, remove", async () => {
  const made = await sb.mkdir("tree/a/b");
  assert.equal(made.isDir, true);
  assert.equal(made.kind, "dir");
  await sb.writeFile("tree/a/one.txt", "1");
  await sb.writeFile("tree/a/two.txt", "22");
  const entries = await sb.ls("tree/a");
  assert.deepEqual(entries.map((e) => [e.name, e.isDir, e.size]).filter(([, d]) => !d), [["one.txt", false, 1], ["two.txt", false, 2]]);
  assert.deepEqual(entries.map((e) => e.name), ["b", "one.txt", "two.txt"]);
  const st = await sb.stat("tree/a/two.txt");
  assert.equal(st.kind, "file");
  assert.ok(st.mtime.getTime() > Date.now() - 600_000);
  assert.ok((await sb.ls()).some((e) => e.name === "tree"), "ls() lists /workspace");

  const moved = await sb.rename("tree/a/two.txt", "tree/a/b/2.txt");
  assert.equal(moved.path, "/workspace/tree/a/b/2.txt");
  assert.equal(await sb.exists("tree/a/two.txt"), false);
  assert.equal(await sb.exists("tree/a/b/2.txt"), true);

  await assert.rejects(sb.rename("tree/a/one.txt", "tree/a/b/2.txt"), ConflictError);
  await assert.rejects(sb.remove("tree"), (e: unknown) => e instanceof ConflictError && e.code === "directory_not_empty");
  await sb.remove("tree/a/one.txt");
  await sb.remove("tree", { recursive: true });
  await assert.rejects(sb.stat("tree"), NotFoundError);
  await assert.rejects(sb.readFile("/etc/passwd"), (e: unknown) => e instanceof InvalidArgumentError && e.code === "path_outside_sandbox");
});

/** Writes `size` random bytes to a local file and returns their SHA-256, outside this process (so its memory stays as it was). */
function writeRandomFile(path: string, size: number): string {
  const made = spawnSync("sh", ["-c", `head -c ${size} /dev/urandom > "$1" && sha256sum "$1"`, "sh", path], { encoding: "utf8" });
  assert.equal(made.status, 0, made.stderr);
  return made.stdout.split(" ")[0]!;
}

test("a 100 MiB file round trip is streamed both ways and arrives intact", async (t) => {
  const size = 100 << 20;
  const local = join(dir, "big.bin");
  const expected = writeRandomFile(local, size);

  // Memory is sampled during the transfers, after a collection each time (run.ts passes
  // --expose-gc): what is still held then is what the transfer keeps, not garbage.
  const gc = (globalThis as { gc?: () => void }).gc;
  assert.ok(gc !== undefined, "run with --expose-gc (build/test/run.js does)");
  let peak = 0;
  const sampler = setInterval(() => {
    gc();
    peak = Math.max(peak, process.memoryUsage().arrayBuffers);
  }, 100);
  try {
    const up = await sb.upload(local, "/workspace/big.bin");
    assert.equal(up.size, size);
    const inside = await sb.exec("sha256sum /workspace/big.bin | cut -d' ' -f1");
    assert.equal(inside.stdout.trim(), expected);

    const back = join(dir, "back.bin");
    assert.equal(await sb.download("/workspace/big.bin", back), size);
    const digest = createHash("sha256");
    for await (const chunk of createReadStream(back)) digest.update(chunk as Buffer);
    assert.equal(digest.digest("hex"), expected);
  } finally {
    clearInterval(sampler);
  }
  t.diagnostic(`buffers held at most: ${(peak / 2 ** 20).toFixed(1)} MiB`);
  assert.ok(peak < size / 2, `${(peak / 2 ** 20).toFixed(1)} MiB of buffers held during a ${size / 2 ** 20} MiB transfer`);
});

test("upload from a web stream and from an async iterable; read with downloadStream", async () => {
  const parts = ["alpha ", "beta ", "gamma"].map((s) => new TextEncoder().encode(s));
  const web = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const p of parts) controller.enqueue(p);
      controller.close();
    },
  });
  assert.equal((await sb.upload(web, "streams/web.txt")).size, 16);
  async function* generate(): AsyncGenerator<Uint8Array> {
    for (const p of parts) yield p;
  }
  await sb.upload(generate(), "streams/gen.txt");
  const stream = await sb.downloadStream("streams/gen.txt");
  let text = "";
  for await (const chunk of stream) text += new TextDecoder().decode(chunk, { stream: true });
  assert.equal(text, "alpha beta gamma");
  assert.equal(await sb.readFile("streams/web.txt"), "alpha beta gamma");
});

test("import from text, base64 and an allowed host folder", async () => {
  const text = await sb.importFiles("imported/a.txt", { text: "from text" });
  assert.deepEqual(text, { path: "/workspace/imported/a.txt", files: 1, bytes: 9 }, "the path comes back resolved");
  await sb.importFiles("imported/b.bin", { base64: Buffer.from([1, 2, 3]).toString("base64") }, { mode: 0o600 });
  assert.deepEqual(await sb.readFile("imported/b.bin", { format: "bytes" }), new Uint8Array([1, 2, 3]));
  assert.equal((await sb.stat("imported/b.bin")).mode & 0o777, 0o600);

  const allowed = process.env["SANDCELL_TEST_IMPORT_DIR"];
  assert.ok(allowed !== undefined);
  const folder = join(allowed, `data-${process.pid}`);
  mkdirSync(join(folder, "nested"), { recursive: true });
  writeFileSync(join(folder, "x.csv"), "a,b\n");
  writeFileSync(join(folder, "nested", "y.txt"), "why");
  const host = await sb.importFiles("imported/data", { hostPath: folder });
  assert.equal(host.files, 2);
  assert.equal(host.path, "/workspace/imported/data");
  assert.equal(await sb.readFile("imported/data/nested/y.txt"), "why");
});

test("exports outlive their sandbox: download, signed link, import elsewhere, delete", async () => {
  const source = await Sandbox.create({ labels: { suite: "sdk-ts" } });
  let fileExport: FileExport;
  let dirExport: FileExport;
  try {
    await source.writeFile("out/result.txt", "the result");
    await source.writeFile("out/more/other.txt", "other");
    fileExport = await source.exportFiles("out/result.txt");
    dirExport = await source.exportFiles("out");
  } finally {
    await source.kill();
  }
  assert.equal(fileExport.kind, "file");
  assert.equal(fileExport.size, 10);
  assert.equal(fileExport.sha256, sha256("the result"));
  assert.equal(fileExport.sandboxId, source.id);
  assert.ok(fileExport.downloadUrl.startsWith(daemonEnv().url));

  const local = join(dir, "result.txt");
  assert.equal(await fileExport.download(local), 10);
  // The signed link needs no key: plain fetch.
  assert.ok(fileExport.signedUrl !== null);
  assert.equal(await (await fetch(fileExport.signedUrl)).text(), "the result");

  const again = await FileExport.get(fileExport.id);
  assert.equal(again.path, "/workspace/out/result.txt");
  const listed = await FileExport.list({ sandboxId: source.id });
  assert.deepEqual(listed.map((e) => e.id).sort(), [fileExport.id, dirExport.id].sort());

  // A folder comes as a tar archive.
  assert.equal(dirExport.kind, "dir");
  const tar = join(dir, "out.tar");
  await dirExport.download(tar);
  assert.equal(readFileSync(tar).subarray(257, 262).toString(), "ustar");

  await sb.importFiles("from-export/result.txt", { exportId: fileExport.id });
  assert.equal(await sb.readFile("from-export/result.txt"), "the result");
  await sb.importFiles("from-export/dir", { exportId: dirExport.id });
  assert.equal(await sb.readFile("from-export/dir/more/other.txt"), "other");

  await fileExport.delete();
  await dirExport.delete();
  await assert.rejects(FileExport.get(fileExport.id), NotFoundError);
});
