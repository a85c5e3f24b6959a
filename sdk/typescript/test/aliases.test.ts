/** The names users of other sandbox SDKs already write, over this SDK's own methods: each check fails if its alias stops reaching the method it stands for. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Sandbox, NotFoundError } from "sandcell";
import { withSandbox } from "./helpers.js";

test("enableAutoSnapshot takes minutes; disableAutoSnapshot turns it off", async () => {
  await withSandbox({}, async (sb) => {
    const on = await sb.enableAutoSnapshot({ intervalMins: 10 });
    assert.deepEqual(on, { intervalSecs: 600, keep: 3, beforeReclaim: false });
    assert.deepEqual(await sb.getAutoSnapshot(), on);
    const more = await sb.enableAutoSnapshot({ intervalMins: 0.5, keep: 2, beforeReclaim: true });
    assert.deepEqual(more, { intervalSecs: 30, keep: 2, beforeReclaim: true });
    const off = await sb.disableAutoSnapshot();
    assert.equal(off.intervalSecs, null);
    assert.equal(off.beforeReclaim, false);
    assert.deepEqual(await sb.getAutoSnapshot(), off);
  });
});

test("getProcesses lists what processes() lists; killProcess ends one", async () => {
  await withSandbox({}, async (sb) => {
    const job = await sb.startProcess("sleep 60");
    const listed = await sb.getProcesses();
    const mine = listed.find((p) => p.pid === job.pid);
    assert.ok(mine !== undefined && !mine.exited && mine.cmdline.includes("sleep 60"), JSON.stringify(listed));
    assert.deepEqual(new Set(listed.map((p) => p.pid)), new Set((await sb.processes()).map((p) => p.pid)));
    await sb.killProcess(job.pid);
    const out = await job.output();
    assert.equal(out.signalName, "SIGKILL");
    assert.equal((await sb.getProcesses()).find((p) => p.pid === job.pid)?.exited, true);
  });
});

test("delete() and close() end the sandbox", async () => {
  const a = await Sandbox.create({ labels: { suite: "sdk-ts" } });
  await a.delete();
  assert.equal((await Sandbox.get(a.id)).info.state, "stopped");
  await a.delete(); // as kill(): a sandbox already gone is not an error
  const b = await Sandbox.create({ ephemeral: true, labels: { suite: "sdk-ts" } });
  await b.close();
  await assert.rejects(Sandbox.get(b.id), NotFoundError);
});

test("runOnce gives output and metrics", async () => {
  const once = await Sandbox.runOnce("print('once')\n6 * 7");
  assert.equal(once.output, "once\n");
  assert.equal(once.output, once.execution.stdout);
  assert.equal(once.execution.text, "42");
  const m = once.metrics;
  assert.ok(m.startupMs > 0 && m.runMs > 0 && m.totalMs >= m.startupMs + m.runMs, JSON.stringify(m));
  assert.ok(m.executionMs > 0 && m.executionMs <= m.runMs, JSON.stringify(m));
  await assert.rejects(Sandbox.get(once.sandboxId), NotFoundError);
});
