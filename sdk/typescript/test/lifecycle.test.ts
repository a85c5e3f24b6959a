/** Sandboxes: create, get, list with filters, timeouts, pause/resume, metrics, `await using`, concurrency. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Sandbox, system, NotFoundError } from "sandcell";
import { withSandbox } from "./helpers.js";

test("system() answers with the version, the backends and the caller", async () => {
  const info = await system();
  assert.match(info.version, /^\d+\.\d+\.\d+/);
  assert.ok(info.backends.some((b) => b.kind === "process" && b.available));
  assert.equal(info.caller.admin, true);
});

test("create, get, list by label and metadata, kill", async () => {
  const tag = `t${Date.now()}`;
  const sb = await Sandbox.create({
    template: "python",
    size: "nano",
    labels: { suite: "sdk-ts", run: tag },
    metadata: { purpose: "lifecycle" },
    env: { GREETING: "hello" },
    timeoutSecs: 600,
    idleTimeoutSecs: 300,
    network: "off",
  });
  try {
    assert.match(sb.id, /^sb-[0-9a-f]{12}$/);
    assert.equal(sb.info.state, "running");
    assert.equal(sb.info.template, "python");
    assert.equal(sb.info.network, "off");
    assert.equal(sb.info.idleTimeoutSecs, 300);
    assert.ok(sb.info.createdAt instanceof Date);
    assert.ok(sb.info.expiresAt !== null && sb.info.expiresAt.getTime() > Date.now() + 500_000);
    assert.equal(typeof sb.info.limits.diskMb, "number");

    const again = await Sandbox.get(sb.id);
    assert.equal(again.id, sb.id);
    assert.deepEqual(again.info.labels, { suite: "sdk-ts", run: tag });
    assert.equal((await again.exec("echo $GREETING")).stdout, "hello\n");

    const byLabel = await Sandbox.list({ label: { run: tag } });
    assert.deepEqual(byLabel.map((s) => s.id), [sb.id]);
    const byBoth = await Sandbox.list({ label: { run: tag }, metadata: { purpose: "lifecycle" } });
    assert.deepEqual(byBoth.map((s) => s.id), [sb.id]);
    assert.deepEqual(await Sandbox.list({ label: { run: tag }, metadata: { purpose: "other" } }), []);
  } finally {
    await sb.kill();
  }
  const stopped = await Sandbox.list({ label: { run: tag }, state: "stopped" });
  assert.deepEqual(stopped.map((s) => [s.id, s.state]), [[sb.id, "stopped"]]);
  assert.equal((await sb.refresh()).state, "stopped");
  await sb.kill(); // a second kill is not an error
});

test("limits override the size's; the backend is chosen at creation", async (t) => {
  await withSandbox({ size: "small", limits: { memoryMb: 256, execTimeoutSecs: 7 } }, async (sb) => {
    assert.equal(sb.info.limits.memoryMb, 256);
    assert.equal(sb.info.limits.execTimeoutSecs, 7);
    assert.equal(sb.info.backend, "process");
  });
  const gvisor = (await system()).backends.find((b) => b.kind === "gvisor");
  if (gvisor?.available !== true) {
    t.diagnostic("gvisor is not available on this host: its half of the test is skipped");
    return;
  }
  await withSandbox({ backend: "gvisor" }, async (sb) => {
    assert.equal(sb.info.backend, "gvisor");
    assert.equal((await sb.exec("echo in gvisor")).stdout, "in gvisor\n");
  });
});

test("an ephemeral sandbox is forgotten once killed", async () => {
  const sb = await Sandbox.create({ ephemeral: true, labels: { suite: "sdk-ts" } });
  assert.equal(sb.info.ephemeral, true);
  await sb.kill();
  await assert.rejects(Sandbox.get(sb.id), NotFoundError);
});

test("setTimeout gives a new lifetime", async () => {
  await withSandbox({}, async (sb) => {
    const info = await sb.setTimeout(42);
    const left = (info.expiresAt?.getTime() ?? 0) - Date.now();
    assert.ok(left > 30_000 && left <= 43_000, `lifetime left: ${left} ms`);
    assert.equal(sb.info.expiresAt?.getTime(), info.expiresAt?.getTime());
  });
});

test("pause freezes and resume goes on; a request wakes a paused sandbox", async () => {
  await withSandbox({ template: "python" }, async (sb) => {
    await sb.runPython("counter = 41");
    assert.equal((await sb.pause()).state, "paused");
    assert.equal((await sb.refresh()).state, "paused");
    assert.equal((await sb.resume()).state, "running");
    await sb.pause();
    const run = await sb.runPython("counter + 1");
    assert.equal(run.text, "42");
    assert.equal((await sb.refresh()).state, "running");
  });
});

test("metrics report memory and processes", async () => {
  await withSandbox({ template: "python" }, async (sb) => {
    const m = await sb.metrics();
    assert.ok((m.memoryBytes ?? 0) > 0);
    assert.ok((m.memoryLimitBytes ?? 0) >= (m.memoryBytes ?? 0));
    assert.ok((m.pids ?? 0) >= 1);
    assert.equal(typeof m.cpuSeconds, "number");
  });
});

test("await using kills the sandbox at the end of the block", async () => {
  let id = "";
  {
    await using sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
    id = sb.id;
    assert.equal((await sb.exec("true")).ok, true);
  }
  assert.equal((await Sandbox.get(id)).info.state, "stopped");
});

test("several sandboxes at once with Promise.all", async () => {
  const sandboxes = await Promise.all(
    Array.from({ length: 5 }, (_, i) => Sandbox.create({ labels: { suite: "sdk-ts", n: String(i) } })),
  );
  try {
    assert.equal(new Set(sandboxes.map((s) => s.id)).size, 5);
    const outs = await Promise.all(sandboxes.map((sb, i) => sb.exec(`echo ${i}; hostname`)));
    outs.forEach((out, i) => {
      assert.equal(out.stdout.split("\n")[0], String(i));
      assert.equal(out.stdout.split("\n")[1], sandboxes[i]!.id, "each command ran in its own sandbox");
    });
  } finally {
    await Promise.all(sandboxes.map((sb) => sb.kill()));
  }
});
