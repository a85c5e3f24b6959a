/**
 * Durable runs through the SDK: threads are made, listed, read, renamed and deleted, and a
 * second run on a thread sees the first (its `thread_history` carries the first task, and it
 * works in the same kernel); a run kept with `keepSnapshots` is forked from its first step
 * (the fork's sandbox has that step's state, its record says where it came from, the original
 * is unchanged) and opened as a sandbox at a step without a run; an ended run cannot be
 * resumed (`ConflictError`). The agent tests ask the test kit's scripted model, with a daemon
 * of their own; the thread CRUD test uses the suite's daemon.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { ConflictError, InvalidArgumentError, NotFoundError, Run, Sandbox, threads, type RunEvent } from "sandcell";
import { withAgent } from "./helpers.js";

const MODEL = "openai/test-model";

/** A model turn that calls the `execute_code` tool. */
function code(source: string): unknown {
  return { tool_calls: [{ name: "execute_code", arguments: { code: source } }] };
}

function toolTexts(events: RunEvent[]): string[] {
  return events.filter((e) => e.type === "tool_result").map((e) => String(e.data["text"]));
}

/** The one event of `type` (fails when there is not exactly one). */
function only(events: RunEvent[], type: string): Record<string, unknown> {
  const found = events.filter((e) => e.type === type);
  assert.equal(found.length, 1, `${found.length} ${type} events: ${events.map((e) => e.type).join(", ")}`);
  return found[0]!.data;
}

test("threads are made, listed, read, renamed and deleted", async () => {
  const th = threads();
  const name = `notes-${Date.now().toString(36)}`;
  const made = await th.create({ name });
  assert.match(made.id, /^th-/);
  assert.deepEqual([made.name, made.runs, made.sandboxId, made.lastRunId], [name, 0, null, null]);
  assert.ok(made.createdAt instanceof Date && made.updatedAt instanceof Date);
  // Without a name, its id is its name.
  const unnamed = await th.create();
  assert.equal(unnamed.name, unnamed.id);
  try {
    assert.deepEqual(await th.get(made.id), made);
    const listed = await th.list();
    assert.ok(listed.some((t) => t.id === made.id) && listed.some((t) => t.id === unnamed.id));
    assert.equal((await th.list({ limit: 1 })).length, 1);
    // Names are unique among the owner's threads.
    await assert.rejects(th.create({ name }), ConflictError);
    await assert.rejects(th.rename(unnamed.id, name), ConflictError);

    const renamed = await th.rename(made.id, `${name}-2`);
    assert.deepEqual([renamed.id, renamed.name], [made.id, `${name}-2`]);
    assert.equal((await th.get(made.id)).name, `${name}-2`);
  } finally {
    await th.delete(made.id);
    await th.delete(unnamed.id);
  }
  await assert.rejects(th.get(made.id), NotFoundError);
  await assert.rejects(th.delete(made.id), NotFoundError);
  await assert.rejects(th.create({ name: "   " }), InvalidArgumentError);
});

test("a second run on a thread sees the first, in the same sandbox", { timeout: 180_000 }, async () => {
  const script = [code("y = 7"), { text: "y is set" }, code("print(y * 6)"), { text: "y * 6 is 42" }];
  await withAgent(script, async (client) => {
    const th = threads(client);
    const thread = await th.create({ name: "work" });
    const FIRST = "Set y to 7 in Python.";
    const first = await Run.run(FIRST, { ...client, model: MODEL, threadId: thread.id, timeout: 120 });
    assert.deepEqual([first.status, first.answer], ["succeeded", "y is set"]);
    const second = await Run.start("Now print y * 6.", { ...client, model: MODEL, threadId: thread.id });
    const done = await second.wait({ timeout: 120 });
    assert.deepEqual([done.status, done.answer, done.sandboxId], ["succeeded", "y * 6 is 42", first.sandboxId]);

    const events = await second.listEvents();
    // The first run's conversation came with it: its task is in the history.
    const history = only(events, "thread_history");
    assert.deepEqual([history["thread_id"], history["from_run_id"]], [thread.id, first.id]);
    assert.ok(JSON.stringify(history["messages"]).includes(FIRST), JSON.stringify(history["messages"]));
    // Its kernel still had y.
    assert.match(toolTexts(events).at(-1) ?? "", /42/);

    // The thread keeps the sandbox its runs shared; deleting the thread deletes it.
    const now = await th.get(thread.id);
    assert.deepEqual([now.runs, now.lastRunId, now.sandboxId], [2, second.id, first.sandboxId]);
    const sb = await Sandbox.get(first.sandboxId!, client);
    assert.equal(sb.info.state, "running");
    await th.delete(thread.id);
    const gone = await sb.refresh().then(
      (info) => info.state,
      (e: unknown) => (e instanceof NotFoundError ? "not found" : Promise.reject(e)),
    );
    assert.ok(["stopped", "not found"].includes(gone), gone);
  });
});

test("a run is forked from a step, opened as a sandbox at a step, and not resumed once ended", { timeout: 300_000 }, async () => {
  // The original sets x twice and answers; the fork (from step 1) prints x and answers.
  const script = [code("x = 1"), code("x = 2"), { text: "x is 2" }, code("print(x)"), { text: "x was 1" }];
  await withAgent(script, async (client, model) => {
    const original = await Run.run("Set x to 1, then to 2.", { ...client, model: MODEL, keepSnapshots: true, snapshots: "on_mutation", timeout: 120 });
    assert.deepEqual([original.status, original.answer, original.forkedFrom], ["succeeded", "x is 2", null]);
    const run = await Run.get(original.id, client);
    // Both steps ran code: each has its snapshot, and keepSnapshots kept both.
    const committed = (await run.listEvents()).filter((e) => e.type === "step_committed");
    assert.deepEqual(committed.map((e) => e.step), [1, 2]);
    assert.ok(committed.every((e) => typeof (e.data["snapshot"] as { snapshot_id?: unknown })?.snapshot_id === "string"));

    const fork = await Run.fork(original.id, { ...client, fromStep: 1, task: "Print x." });
    assert.notEqual(fork.id, original.id);
    const forked = await fork.wait({ timeout: 120 });
    assert.deepEqual([forked.status, forked.answer, forked.forkedFrom], ["succeeded", "x was 1", { runId: original.id, step: 1 }]);
    assert.equal(model.requests().length, 5);
    const events = await fork.listEvents();
    const from = only(events, "forked");
    assert.deepEqual([from["from_run_id"], from["from_step"]], [original.id, 1]);
    // Its sandbox was restored from step 1's snapshot: x was 1 there, not 2.
    assert.equal(toolTexts(events).at(-1)?.trim(), "1");
    // The original is as it was.
    assert.deepEqual([(await run.refresh()).answer, run.info.forkedFrom], ["x is 2", null]);

    // A sandbox at step 1 without a run, and one at step 2 through the handle.
    const at1 = await Run.stepSandbox(original.id, 1, client);
    try {
      assert.deepEqual([at1.sandboxId, at1.snapshotStep], [at1.sandbox.id, 1]);
      assert.equal(at1.snapshotId, (committed[0]!.data["snapshot"] as { snapshot_id: string }).snapshot_id);
      assert.ok(Array.isArray(at1.notCarried));
      assert.equal(at1.sandbox.info.state, "running");
      assert.equal((await at1.sandbox.runCode("x")).text, "1");
    } finally {
      await at1.sandbox.kill();
    }
    const at2 = await run.stepSandbox(2);
    try {
      assert.equal(at2.snapshotStep, 2);
      assert.equal((await at2.sandbox.runCode("x")).text, "2");
    } finally {
      await at2.sandbox.kill();
    }

    // An ended run is not resumed (it is forked instead); a step it never had is refused.
    await assert.rejects(Run.resume(original.id, client), (e: unknown) => {
      assert.ok(e instanceof ConflictError, String(e));
      assert.equal(e.status, 409);
      assert.match(e.message, /ended/);
      return true;
    });
    await assert.rejects(run.resume(), ConflictError);
    await assert.rejects(run.fork({ fromStep: 9 }), InvalidArgumentError);
    await assert.rejects(Run.stepSandbox(original.id, 9, client), InvalidArgumentError);
  });
});
