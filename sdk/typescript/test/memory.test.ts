/**
 * Memories through the SDK on the suite's daemon: a sandbox's (`sb.memory`) are added, found by
 * ranked search (the relevant first, stemmed, by category, bounded), listed newest first, read
 * and deleted; the owner's (`memory()`) are apart from any sandbox's, though by id they reach
 * a sandbox's too; bad values are the daemon's 400 as `InvalidArgumentError`. Against daemons
 * of their own pointed at the test kit's scripted model: hybrid search finds a memory by
 * meaning, and says it ranked by words only when the embeddings endpoint fails; infer jobs
 * add the model's facts, or fail saying why; without a model infer is refused at once.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidArgumentError, NotFoundError, memory, type Memory } from "sandcell";
import { startDaemon, startScriptedModel, type ScriptedModel } from "./daemon.js";
import { withSandbox } from "./helpers.js";

const ids = (ms: Memory[]): string[] => ms.map((m) => m.id);

test("a sandbox's memories: added, searched (the relevant first), listed, read, deleted", async () => {
  await withSandbox({ template: "default" }, async (sb) => {
    const deploy = await sb.memory.add("The deploy script lives in ops/deploy.sh and needs the staging key", {
      category: "ops",
      metadata: { source: "wiki" },
    });
    const lunch = await sb.memory.add("Lunch is served at noon on the third floor");
    const style = await sb.memory.add("Every shell script in the repository is formatted with shfmt", { category: "style" });

    assert.match(deploy.id, /^mem-[0-9a-f]{16}$/);
    assert.deepEqual(
      [deploy.scope, deploy.sandboxId, deploy.category, deploy.metadata, deploy.score],
      ["sandbox", sb.id, "ops", { source: "wiki" }, null],
    );
    assert.ok(deploy.createdAt instanceof Date && !Number.isNaN(deploy.createdAt.getTime()));
    // No category given: the daemon's default.
    assert.deepEqual([lunch.category, lunch.metadata], ["general", {}]);

    // Both words first, one word after, the unrelated one not at all; scores best first.
    const found = await sb.memory.search("deploy script");
    assert.deepEqual(ids(found), [deploy.id, style.id]);
    const scores = found.map((m) => m.score);
    assert.ok(scores.every((s) => typeof s === "number"), String(scores));
    assert.ok(scores[0]! > scores[1]!, String(scores));
    // Stemmed words; a category; a limit.
    assert.deepEqual(ids(await sb.memory.search("deploying")), [deploy.id]);
    assert.deepEqual(ids(await sb.memory.search("script", { category: "style" })), [style.id]);
    assert.equal((await sb.memory.search("script", { limit: 1 })).length, 1);
    assert.deepEqual(await sb.memory.search("basketball"), []);

    // Newest first; bounded; by category; one by id as it was made.
    assert.deepEqual(ids(await sb.memory.list()), [style.id, lunch.id, deploy.id]);
    assert.deepEqual(ids(await sb.memory.list({ limit: 2 })), [style.id, lunch.id]);
    assert.deepEqual(ids(await sb.memory.list({ category: "ops" })), [deploy.id]);
    assert.deepEqual(await sb.memory.get(deploy.id), deploy);

    await sb.memory.delete(lunch.id);
    await assert.rejects(sb.memory.get(lunch.id), NotFoundError);
    await assert.rejects(sb.memory.delete(lunch.id), NotFoundError);
    assert.deepEqual(ids(await sb.memory.list()), [style.id, deploy.id]);
    assert.deepEqual(await sb.memory.search("lunch noon"), []);
  });
});

test("the owner's memories are apart from a sandbox's; by id the owner's scope reaches both", async () => {
  const mine = memory();
  // A word of its own: the suite's other tests share the owner.
  const word = `zq${Date.now().toString(36)}`;
  await withSandbox({ template: "default" }, async (sb) => {
    const owned = await mine.add(`The owner prefers tabs ${word}`, { category: "prefs" });
    const boxed = await sb.memory.add(`This sandbox prefers spaces ${word}`);
    assert.deepEqual([owned.scope, owned.sandboxId, owned.category], ["owner", null, "prefs"]);

    // Each scope searches and lists its own.
    assert.deepEqual(ids(await mine.search(word)), [owned.id]);
    assert.deepEqual(ids(await sb.memory.search(word)), [boxed.id]);
    const listed = ids(await mine.list());
    assert.ok(listed.includes(owned.id) && !listed.includes(boxed.id), listed.join(", "));
    assert.deepEqual(ids(await mine.list({ category: "prefs" })), [owned.id]);

    // By id the owner's scope finds a sandbox's memory (saying whose); a sandbox never finds the owner's.
    const reached = await mine.get(boxed.id);
    assert.deepEqual([reached.id, reached.scope, reached.sandboxId], [boxed.id, "sandbox", sb.id]);
    await assert.rejects(sb.memory.get(owned.id), NotFoundError);
    // Another sandbox has none of this one's.
    await withSandbox({ template: "default" }, async (other) => {
      await assert.rejects(other.memory.get(boxed.id), NotFoundError);
      assert.deepEqual(await other.memory.search(word), []);
    });

    // The owner's scope deletes a sandbox's memory too.
    await mine.delete(boxed.id);
    await assert.rejects(sb.memory.get(boxed.id), NotFoundError);
    await mine.delete(owned.id);
    await assert.rejects(mine.get(owned.id), NotFoundError);
    assert.deepEqual(await mine.search(word), []);
  });
});

test("bad memory values are InvalidArgumentError", async () => {
  await withSandbox({ template: "default" }, async (sb) => {
    const tooMuchMetadata = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"]));
    const bad: [string, () => Promise<unknown>][] = [
      ["a blank text", () => sb.memory.add("   ")],
      ["a category with capitals and a space", () => sb.memory.add("x", { category: "Not Valid" })],
      ["65 metadata entries", () => memory().add("x", { metadata: tooMuchMetadata })],
      ["a blank query", () => sb.memory.search("  ")],
      ["a search limit of 0", () => sb.memory.search("x", { limit: 0 })],
      ["a search limit of 101", () => memory().search("x", { limit: 101 })],
      ["a listing limit of 0", () => sb.memory.list({ limit: 0 })],
      ["a bad category to list", () => memory().list({ category: "Bad!" })],
    ];
    for (const [what, call] of bad) {
      await assert.rejects(call(), (e: unknown) => {
        assert.ok(e instanceof InvalidArgumentError, `${what}: ${String(e)}`);
        assert.deepEqual([e.code, e.status], ["invalid_argument", 400], what);
        return true;
      });
    }
    // Nothing was added by the refused calls.
    assert.deepEqual(await sb.memory.list(), []);
  });
});

/** A scripted model serving `script` and a daemon pointed at it with `settings`; both stop after. */
async function withModel<T>(
  script: unknown,
  settings: string[],
  fn: (mine: ReturnType<typeof memory>, model: ScriptedModel) => Promise<T>,
): Promise<T> {
  const model = await startScriptedModel(script);
  try {
    const daemon = await startDaemon({ settings: [`agent.openai.base_url=${model.baseUrl}`, ...settings] });
    try {
      return await fn(memory({ apiUrl: daemon.url, apiKey: daemon.key }), model);
    } finally {
      await daemon.stop();
    }
  } finally {
    await model.stop();
  }
}

const EMBEDDINGS = { synonyms: [["automobile", "car", "vehicle"]] };

test("the suite's daemon ranks by words, and has no model to infer with", async () => {
  const word = `zr${Date.now().toString(36)}`;
  const m = await memory().add(`plain ${word}`);
  const found = await memory().search(word);
  assert.deepEqual([found.ranking, found.warning, found[0]?.matchedBy], ["fts", null, "fts"]);
  await assert.rejects(memory().add("I moved to Lisbon", { infer: true }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError && e.message.includes("infer_model"), String(e));
    return true;
  });
  await memory().delete(m.id);
});

test("hybrid search finds by meaning, and says when it ranked by words only", async () => {
  await withModel({ turns: [], embeddings: EMBEDDINGS }, ["memory.embedding_model=openai/test-embed"], async (mine) => {
    const car = await mine.add("The automobile needs new tyres");
    assert.equal(car.warning, null);
    await mine.add("Lunch is at noon on Fridays");
    const found = await mine.search("vehicle");
    assert.deepEqual([found.ranking, found.warning], ["hybrid", null]);
    assert.deepEqual(ids(found), [car.id]);
    assert.equal(found[0]!.matchedBy, "semantic");
    assert.ok((found[0]!.similarity ?? 0) > 0.3, String(found[0]!.similarity));
  });
  const down = { turns: [], embeddings: { ...EMBEDDINGS, fault: { status: 500, message: "embedder down" } } };
  await withModel(down, ["memory.embedding_model=openai/test-embed"], async (mine) => {
    const kept = await mine.add("The car is parked in the garage");
    assert.ok(kept.warning?.includes("embedder down"), String(kept.warning));
    const found = await mine.search("vehicle garage");
    assert.equal(found.ranking, "fts");
    assert.ok(found.warning?.includes("embeddings endpoint failed"), String(found.warning));
    assert.deepEqual(ids(found), [kept.id]);
    assert.deepEqual(await mine.search("vehicle"), []);
  });
});

test("infer jobs add the model's facts, or fail saying why", async () => {
  const script = [
    { text: '["The user lives in Lisbon", "The user drinks green tea"]' },
    { text: "Sure! The user lives in Lisbon." },
  ];
  await withModel(script, ["agent.model=openai/test-model"], async (mine, model) => {
    const job = await mine.add("I moved to Lisbon. I drink green tea.", { category: "profile", infer: true });
    assert.match(job.id, /^inf-[0-9a-f]{16}$/);
    assert.equal(job.model, "openai/test-model");
    const done = await mine.waitInfer(job, { timeoutMs: 30_000 });
    assert.deepEqual([done.status, done.error, done.memories.length], ["succeeded", null, 2]);
    const first = await mine.get(done.memories[0]!);
    assert.deepEqual([first.text, first.category, first.metadata], ["The user lives in Lisbon", "profile", { source: "infer" }]);
    assert.equal((await mine.search("green tea"))[0]!.id, done.memories[1]);
    assert.ok(model.requests().some((r) => JSON.stringify(r["body"]).includes("I drink green tea")));

    const bad = await mine.waitInfer(await mine.add("More.", { infer: true }), { timeoutMs: 30_000 });
    assert.equal(bad.status, "failed");
    assert.ok(bad.error?.includes("not a JSON list of strings"), String(bad.error));
    assert.deepEqual((await mine.inferJobs()).map((j) => j.id), [bad.id, job.id]);
    assert.deepEqual((await mine.inferStatus(job.id)).memories, done.memories);
  });
});
