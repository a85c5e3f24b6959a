/**
 * Mounts and named volumes against the shared daemon (whose `mounts.allowed_paths` is the
 * folder `run.ts` passes as SANDCELL_TEST_MOUNT_DIR): a host folder mounted read-only is read
 * and not written, in both forms of a mount; an overlay takes writes without reaching the
 * host; a host folder outside the allow-list is a `PermissionDeniedError`, a bad mount path an
 * `InvalidArgumentError`; a volume written by one sandbox is read by the next once the first is
 * gone; volumes are made, listed, shown, refused deletion while a sandbox mounts them, deleted
 * and not found after; a snapshot taken with `volumes: "copy"` keeps the volume as it was, each
 * sandbox made from it getting a new volume of its own while the live one goes on (without it,
 * a restore mounts the live volume); a malformed `mounts` is refused before anything is sent.
 * Names are unique: the test files run side by side on one daemon.
 */

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  ConflictError,
  InvalidArgumentError,
  Mount,
  NotFoundError,
  PermissionDeniedError,
  Sandbox,
  Snapshot,
  Volume,
  type CreateSnapshotOptions,
} from "sandcell";
import { withSandbox } from "./helpers.js";

/** A name no other test (nor file running beside this one) uses. */
function unique(prefix: string): string {
  return `${prefix}-${randomUUID().slice(0, 12)}`;
}

/** A new folder inside the daemon's `mounts.allowed_paths`, holding `in.txt`. */
function hostFolder(): string {
  const root = process.env["SANDCELL_TEST_MOUNT_DIR"];
  assert.ok(root !== undefined, "SANDCELL_TEST_MOUNT_DIR is unset: run the tests through test.sh");
  const folder = mkdtempSync(join(root, "mount-"));
  writeFileSync(join(folder, "in.txt"), "from the host\n");
  return folder;
}

test("a host folder is mounted read-only: read, not written", async () => {
  const folder = hostFolder();
  const mounts = [Mount.fromHost(folder, "/workspace/data"), { hostPath: folder, path: "/home/sandbox/also", mode: "ro" as const }];
  await withSandbox({ mounts }, async (sb) => {
    assert.equal(await sb.readFile("data/in.txt"), "from the host\n");
    assert.equal((await sb.exec("cat /home/sandbox/also/in.txt")).stdout, "from the host\n");
    assert.deepEqual((await sb.ls("/workspace/data")).map((e) => e.name), ["in.txt"]);
    const written = await sb.exec("echo new > /workspace/data/new.txt");
    assert.equal(written.ok, false);
    assert.match(written.stderr, /Read-only file system/);
    await assert.rejects(sb.writeFile("/home/sandbox/also/new.txt", "x"), (e: unknown) => e instanceof PermissionDeniedError && /read-only/.test(e.message));
    // The rest of /workspace is the sandbox's own, as ever.
    assert.equal((await sb.writeFile("mine.txt", "mine")).size, 4);
  });
  assert.deepEqual(readdirSync(folder), ["in.txt"]);
});

test("an overlay takes writes without reaching the host", async () => {
  const folder = hostFolder();
  await withSandbox({ mounts: [Mount.fromHost(folder, "/tmp/layer", "overlay")] }, async (sb) => {
    assert.ok((await sb.exec("echo changed > /tmp/layer/in.txt && echo new > /tmp/layer/new.txt")).ok);
    assert.equal(await sb.readFile("/tmp/layer/in.txt"), "changed\n");
    assert.deepEqual((await sb.ls("/tmp/layer")).map((e) => e.name).sort(), ["in.txt", "new.txt"]);
  });
  assert.equal(readFileSync(join(folder, "in.txt"), "utf8"), "from the host\n");
  assert.deepEqual(readdirSync(folder), ["in.txt"]);
});

test("a host folder outside the allow-list is a PermissionDeniedError; a bad path an InvalidArgumentError", async () => {
  const outside = mkdtempSync(join(tmpdir(), "sandcell-ts-outside-"));
  const denied = await Sandbox.create({ mounts: [Mount.fromHost(outside, "/workspace/data")] }).catch((e: unknown) => e);
  assert.ok(denied instanceof PermissionDeniedError, String(denied));
  assert.equal(denied.status, 403);
  assert.equal(denied.code, "permission_denied");
  assert.match(denied.message, /mounts\.allowed_paths/);
  const bad = await Sandbox.create({ mounts: [{ hostPath: hostFolder(), path: "/etc/data" }] }).catch((e: unknown) => e);
  assert.ok(bad instanceof InvalidArgumentError, String(bad));
  assert.equal(bad.code, "invalid_argument");
  await assert.rejects(Sandbox.create({ mounts: [{ volume: "x", path: "/tmp/v", mode: "sideways" as "ro" }] }), InvalidArgumentError);
});

test("a volume outlives the sandbox that wrote it, and is not deleted while mounted", async () => {
  const name = unique("cache");
  await withSandbox({ mounts: [Mount.fromVolume(name, "/home/sandbox/cache")] }, async (first) => {
    await first.writeFile("/home/sandbox/cache/note.txt", "kept");
    assert.ok((await first.exec("echo more >> /home/sandbox/cache/log.txt")).ok);
    // Made on first use, mounted by the sandbox while it runs: not deleted meanwhile.
    const shown = await Volume.get(name);
    assert.equal(shown.name, name);
    assert.deepEqual(shown.sandboxes, [first.id]);
    const refused = await Volume.delete(name).catch((e: unknown) => e);
    assert.ok(refused instanceof ConflictError, String(refused));
    assert.equal(refused.status, 409);
    assert.equal(refused.code, "invalid_state");
    assert.ok(refused.message.includes(first.id));
  });
  // The first sandbox is gone; the next one reads what it left.
  assert.deepEqual((await Volume.get(name)).sandboxes, []);
  await withSandbox({ mounts: [{ volume: name, path: "/workspace/cache", mode: "ro" }] }, async (second) => {
    assert.equal(await second.readFile("cache/note.txt"), "kept");
    assert.equal(await second.readFile("cache/log.txt"), "more\n");
    assert.equal((await second.exec("touch /workspace/cache/x")).ok, false, "mounted read-only this time");
    assert.deepEqual((await Volume.get(name)).sandboxes, [second.id]);
  });
  const info = await Volume.get(name);
  assert.deepEqual(info.sandboxes, []);
  assert.equal(info.sizeBytes, "kept".length + "more\n".length);
  await Volume.delete(name);
  await assert.rejects(Volume.get(name), NotFoundError);
});

test("volumes are made, listed, shown and deleted; then not found", async () => {
  const name = unique("data");
  const made = await Volume.create(name);
  assert.equal(made.name, name);
  assert.equal(made.sizeBytes, 0);
  assert.deepEqual(made.sandboxes, []);
  assert.ok(made.createdAt instanceof Date && !Number.isNaN(made.createdAt.getTime()));
  assert.ok(Math.abs(made.createdAt.getTime() - Date.now()) < 60_000);
  const listed = await Volume.list();
  const names = listed.map((v) => v.name);
  assert.deepEqual(names, [...names].sort(), "by name");
  assert.deepEqual(listed.find((v) => v.name === name), made);
  assert.deepEqual(await Volume.get(name), made);
  const taken = await Volume.create(name).catch((e: unknown) => e);
  assert.ok(taken instanceof ConflictError && taken.code === "already_exists", String(taken));
  for (const bad of ["Upper", "-dash-first", "x".repeat(65), "a/b"]) {
    await assert.rejects(Volume.create(bad), InvalidArgumentError, bad);
  }
  await Volume.delete(name);
  const gone = await Volume.get(name).catch((e: unknown) => e);
  assert.ok(gone instanceof NotFoundError && gone.status === 404 && gone.code === "not_found", String(gone));
  await assert.rejects(Volume.delete(name), NotFoundError);
  assert.ok(!(await Volume.list()).some((v) => v.name === name));
});

test("a snapshot with volumes: \"copy\" keeps the volume as it was; each restore gets a volume of its own", async () => {
  const name = unique("data");
  const copies: string[] = [];
  await withSandbox({ mounts: [Mount.fromVolume(name, "/workspace/data")] }, async (live) => {
    await live.writeFile("data/note.txt", "then");
    const snap = await live.createSnapshot({ volumes: "copy" });
    try {
      assert.deepEqual(snap.volumes.map((v) => [v.volume, v.path]), [[name, "/workspace/data"]]);
      assert.ok(snap.volumes[0]!.bytes > 0);
      assert.deepEqual((await Snapshot.get(snap.id)).volumes, snap.volumes);
      // The live volume goes on changing; the copy does not.
      await live.writeFile("data/note.txt", "now");
      await withSandbox({ snapshotId: snap.id }, async (restored) => {
        assert.equal(await restored.readFile("data/note.txt"), "then");
        const made = restored.info.restore?.volumes ?? [];
        assert.deepEqual(made.map((m) => [m.from, m.path]), [[name, "/workspace/data"]]);
        const copy = made[0]!.volume;
        copies.push(copy);
        assert.ok(copy.startsWith(`${name}-`) && copy.length === name.length + 7, copy);
        assert.deepEqual((await Volume.get(copy)).sandboxes, [restored.id]);
        // Its own: a write reaches neither the live volume nor the next fork's.
        await restored.writeFile("data/note.txt", "restored");
      });
      assert.equal(await live.readFile("data/note.txt"), "now");
      const [forked] = await snap.fork({ labels: { suite: "sdk-ts" } });
      try {
        assert.equal(await forked!.readFile("data/note.txt"), "then");
        const again = forked!.info.restore?.volumes[0]?.volume ?? "";
        copies.push(again);
        assert.ok(again.startsWith(`${name}-`) && again !== copies[0], again);
      } finally {
        await forked!.kill();
      }
      // Without the copy (the default), a restore mounts the live volume, as it is now.
      const plain = await live.createSnapshot({ volumes: "mount" });
      try {
        assert.deepEqual(plain.volumes, []);
        await withSandbox({ snapshotId: plain.id }, async (shared) => {
          assert.equal(await shared.readFile("data/note.txt"), "now");
          assert.deepEqual(shared.info.restore?.volumes, []);
        });
      } finally {
        await plain.delete();
      }
      const bad = await live.createSnapshot({ volumes: "all" } as unknown as CreateSnapshotOptions).catch((e: unknown) => e);
      assert.ok(bad instanceof InvalidArgumentError && bad.status === 400 && bad.code === "invalid_argument", String(bad));
    } finally {
      await snap.delete();
    }
  });
  for (const made of [name, ...copies]) await Volume.delete(made);
});

test("a malformed mounts option is a TypeError before anything is sent", async () => {
  const cases: [unknown, RegExp][] = [
    [Mount.fromVolume("v", "/tmp/v"), /mounts is a list/],
    ["/srv/data", /mounts is a list/],
    [[["v", "/tmp/v"]], /mounts\[0\] is an object/],
    [[{ volume: "v", path: "/tmp/v", readonly: true }], /unknown: readonly/],
    [[{ host_path: "/srv", path: "/tmp/v" }], /unknown: host_path/],
    [[{ volume: "v" }], /missing: path/],
    [[{ path: "/tmp/v" }], /mounts\[0\] \(\/tmp\/v\): give hostPath or volume/],
    [[{ hostPath: "/srv", volume: "v", path: "/tmp/v" }], /exactly one/],
    [[{ volume: 7, path: "/tmp/v" }], /volume is a string, not number/],
  ];
  for (const [mounts, message] of cases) {
    // An unreachable daemon: anything sent would fail otherwise.
    await assert.rejects(
      Sandbox.create({ apiUrl: "http://127.0.0.1:9", mounts: mounts as readonly Mount[] }),
      (e: unknown) => e instanceof TypeError && message.test(e.message),
      JSON.stringify(mounts),
    );
  }
  assert.deepEqual(Mount.fromHost("/srv/d", "/workspace/d"), { hostPath: "/srv/d", path: "/workspace/d" });
  assert.deepEqual(Mount.fromVolume("v", "/tmp/v", "ro"), { volume: "v", path: "/tmp/v", mode: "ro" });
});
