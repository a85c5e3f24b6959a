/** Snapshots: take, list, lineage, restore, fork into several sandboxes, automatic snapshots, delete. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { ConflictError, NotFoundError, Sandbox, Snapshot } from "sandcell";
import { withSandbox } from "./helpers.js";

test("a snapshot carries files and Python variables into a restore and a fork of three", async () => {
  await withSandbox({ template: "python" }, async (sb) => {
    await sb.writeFile("data/seed.txt", "seeded");
    await sb.runCode("import random\nbase = [1, 2, 3]\ndef total(): return sum(base)\nfh = open('/workspace/data/seed.txt')");

    const snap = await sb.createSnapshot({ name: "seeded", description: "base list and a file", tags: { stage: "1" } });
    assert.match(snap.id, /^sn-/);
    assert.equal(snap.sandboxId, sb.id);
    assert.equal(snap.name, "seeded");
    assert.equal(snap.description, "base list and a file");
    assert.deepEqual(snap.tags, { stage: "1" });
    assert.equal(snap.fidelity, "language");
    assert.ok(snap.size > 0 && snap.files >= 1);
    assert.match(snap.manifest.sha256, /^[0-9a-f]{64}$/);
    const python = snap.manifest.kernels.find((k) => k.language === "python");
    assert.ok(python?.saved.includes("base") && python.saved.includes("total"));
    assert.ok(python?.skipped.some((s) => s.name === "fh"), "an open file is reported as not carried");
    assert.ok(snap.manifest.notCarried.length > 0);

    assert.deepEqual((await sb.listSnapshots()).map((s) => s.id), [snap.id]);
    assert.ok((await Snapshot.list()).some((s) => s.id === snap.id));

    // One restore, then a fork of three: each independent.
    const restored = await Sandbox.create({ snapshotId: snap.id, labels: { suite: "sdk-ts" } });
    const forks = await snap.fork({ count: 3, labels: { suite: "sdk-ts", role: "fork" } });
    try {
      assert.notEqual(restored.id, sb.id);
      assert.equal(restored.info.restore?.fidelity, "language");
      assert.ok(restored.info.restore?.kernels.some((k) => k.restored.includes("base")));
      assert.equal(await restored.readFile("data/seed.txt"), "seeded");
      assert.equal((await restored.runCode("total()")).text, "6");

      assert.equal(forks.length, 3);
      assert.equal(new Set(forks.map((f) => f.id)).size, 3);
      for (const fork of forks) assert.deepEqual(fork.info.labels, { suite: "sdk-ts", role: "fork" });
      await Promise.all(forks.map((f, i) => f.runCode(`base.append(${i * 10})`)));
      const totals = await Promise.all(forks.map(async (f) => (await f.runCode("total()")).text));
      assert.deepEqual(totals, ["6", "16", "26"]);
      assert.equal((await sb.runCode("total()")).text, "6", "the source is untouched by its forks");

      const lineage = await Snapshot.get(snap.id);
      assert.deepEqual(
        [...(lineage.sandboxes ?? [])].sort(),
        [restored.id, ...forks.map((f) => f.id)].sort(),
      );
      assert.deepEqual(lineage.children, []);

      // A snapshot of a fork is a child; the parent cannot go while it has one.
      const child = await forks[0]!.createSnapshot({ name: "child" });
      assert.equal(child.parentId, snap.id);
      await assert.rejects(snap.delete(), (e: unknown) => e instanceof ConflictError && e.code === "has_children");
      await child.delete();
    } finally {
      await Promise.all([restored, ...forks].map((s) => s.kill()));
    }
    await snap.delete();
    await assert.rejects(Snapshot.get(snap.id), NotFoundError);
  });
});

test("Sandbox.fork makes sandboxes from a snapshot id", async () => {
  await withSandbox({}, async (sb) => {
    await sb.writeFile("marker.txt", "from the source");
    const snap = await sb.createSnapshot();
    assert.equal(snap.fidelity, "files");
    const [one, two] = await Sandbox.fork(snap.id, { count: 2, metadata: { batch: "b1" }, timeoutSecs: 300 });
    try {
      assert.ok(one !== undefined && two !== undefined);
      assert.equal(await one.readFile("marker.txt"), "from the source");
      assert.equal(await two.readFile("marker.txt"), "from the source");
      assert.deepEqual(two.info.metadata, { batch: "b1" });
    } finally {
      await Promise.all([one?.kill(), two?.kill()]);
    }
    await snap.delete();
  });
});

test("an ephemeral fork is forgotten once killed; the others stay", async () => {
  await withSandbox({}, async (sb) => {
    await sb.writeFile("marker.txt", "source");
    const snap = await sb.createSnapshot();
    const [scratch] = await snap.fork({ ephemeral: true, labels: { suite: "sdk-ts" } });
    const [kept] = await Sandbox.fork(snap.id, { labels: { suite: "sdk-ts" } });
    try {
      assert.ok(scratch !== undefined && kept !== undefined);
      assert.equal(scratch.info.ephemeral, true);
      assert.equal(kept.info.ephemeral, false);
      assert.equal(await scratch.readFile("marker.txt"), "source");
    } finally {
      await Promise.all([scratch?.kill(), kept?.kill()]);
    }
    await assert.rejects(Sandbox.get(scratch.id), NotFoundError);
    assert.equal((await Sandbox.get(kept.id)).info.state, "stopped");
    await snap.delete();
  });
});

test("automatic snapshot settings of a sandbox that never had any: the defaults", async () => {
  await withSandbox({}, async (sb) => {
    assert.deepEqual(await sb.getAutoSnapshot(), { intervalSecs: null, keep: 3, beforeReclaim: false });
  });
});

test("automatic snapshot settings: at creation, read, replace", async () => {
  await withSandbox({ autoSnapshot: { beforeReclaim: true } }, async (sb) => {
    assert.deepEqual(await sb.getAutoSnapshot(), { intervalSecs: null, keep: 3, beforeReclaim: true });
    const set = await sb.setAutoSnapshot({ intervalSecs: 3600, keep: 2 });
    assert.deepEqual(set, { intervalSecs: 3600, keep: 2, beforeReclaim: false });
    assert.deepEqual(await sb.getAutoSnapshot(), set);
  });
});
