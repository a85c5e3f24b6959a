/** Code: collected and streamed runs, rich results, errors, contexts, variables, interrupt, restart, one-shot runs. */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Result, Sandbox } from "sandcell";

const PNG_MAGIC = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create({ template: "python", kernels: ["node"], labels: { suite: "sdk-ts" } });
});
after(async () => {
  await sb.kill();
});

test("state persists between runs; the last expression is the result", async () => {
  await sb.runCode("x = 41");
  const run = await sb.runCode("print('side'); x + 1");
  assert.equal(run.ok, true);
  assert.equal(run.status, "ok");
  assert.equal(run.stdout, "side\n");
  assert.equal(run.text, "42");
  assert.equal(run.result?.kind, "result");
  assert.equal(run.done.language, "python");
  assert.equal(run.done.context, "python");
  assert.ok(run.done.executionCount >= 2);
});

test("runPython and runNode use their languages' kernels", async () => {
  assert.equal((await sb.runPython("import sys; sys.version_info[0]")).text, "3");
  await sb.runNode("const base = 40");
  const node = await sb.runNode("await Promise.resolve(base + 2)");
  assert.equal(node.text, "42");
  assert.equal(node.done.language, "node");
});

test("an error comes back with its name, value and traceback", async () => {
  const run = await sb.runCode("def f():\n    return 1/0\nf()");
  assert.equal(run.ok, false);
  assert.equal(run.status, "error");
  assert.equal(run.error?.name, "ZeroDivisionError");
  assert.equal(run.error?.value, "division by zero");
  assert.ok(run.error?.traceback.some((l) => l.includes("<cell")));
});

test("a streamed run calls back in order and gives the same execution", async () => {
  const seen: string[] = [];
  const run = await sb.runCode(
    "import sys, time\nprint('a', flush=True)\ntime.sleep(0.05)\nprint('b', file=sys.stderr, flush=True)\ndisplay('shown')\n7 * 6",
    {
      onStdout: (t) => seen.push(`stdout:${t}`),
      onStderr: (t) => seen.push(`stderr:${t}`),
      onResult: (r) => seen.push(`${r.kind}:${r.text ?? ""}`),
    },
  );
  assert.deepEqual(seen, ["stdout:a\n", "stderr:b\n", "display:'shown'", "result:42"]);
  assert.equal(run.stdout, "a\n");
  assert.equal(run.stderr, "b\n");
  assert.equal(run.text, "42");
  assert.equal(run.results.length, 2);
});

test("a streamed run reports the code's error to onError", async () => {
  const errors: string[] = [];
  const run = await sb.runCode("raise ValueError('nope')", { onError: (e) => errors.push(`${e.name}: ${e.value}`) });
  assert.deepEqual(errors, ["ValueError: nope"]);
  assert.equal(run.error?.name, "ValueError");
  assert.equal(run.status, "error");
});

test("a matplotlib figure comes back as PNG bytes and saves to a file", async () => {
  const run = await sb.runCode("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')");
  const image = run.results.find((r) => r.png !== undefined);
  assert.ok(image instanceof Result, `no image in ${JSON.stringify(run.results.map((r) => r.formats))}`);
  assert.deepEqual([...(image.png ?? []).slice(0, 8)], PNG_MAGIC);
  const dir = mkdtempSync(join(tmpdir(), "sandcell-ts-img-"));
  try {
    const path = join(dir, "plot.png");
    assert.equal(await image.saveImage(path), "image/png");
    assert.deepEqual([...readFileSync(path).subarray(0, 8)], PNG_MAGIC);
    await assert.rejects(new Result("result", { "text/plain": "1" }).saveImage(join(dir, "x")), /no image/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("rich results: HTML of a pandas frame, JSON, markdown", async () => {
  const frame = await sb.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})");
  assert.match(frame.result?.html ?? "", /<table/);
  assert.match(frame.text ?? "", /a/);
  // The kernel's own `display` and `_repr_*_` protocol, no IPython needed.
  const reprs = await sb.runCode(
    "class J:\n    def _repr_json_(self): return {'k': [1, 2]}\n" +
      "class M:\n    def _repr_markdown_(self): return '# title'\n" +
      "display(J()); display(M())",
  );
  assert.deepEqual(reprs.results.find((r) => r.json !== undefined)?.json, { k: [1, 2] });
  assert.equal(reprs.results.find((r) => r.markdown !== undefined)?.markdown, "# title");
});

test("files written to /workspace/outputs are listed as artifacts", async () => {
  const run = await sb.runCode("open('/workspace/outputs/report.csv', 'w').write('a,b\\n1,2\\n')");
  assert.ok(run.done.artifacts.some((a) => a.path === "/workspace/outputs/report.csv" && a.mime === "text/csv"));
  const listed = await sb.artifacts();
  const report = listed.find((a) => a.path === "/workspace/outputs/report.csv");
  assert.equal(report?.size, 8);
  assert.ok(report?.mtime instanceof Date);
});

test("contexts: create, run in, list, delete; two contexts never share state", async () => {
  const ctx = await sb.createContext({ language: "python", env: { CTX_VAR: "mine" } });
  assert.equal(ctx.language, "python");
  await sb.runCode("x = 'in the context'", { context: ctx });
  assert.equal((await sb.runCode("x", { context: ctx.id })).text, "'in the context'");
  assert.equal((await sb.runCode("import os; os.environ['CTX_VAR']", { context: ctx })).text, "'mine'");
  assert.equal((await sb.runCode("x")).text, "41", "the default context keeps its own x");
  const listed = await sb.listContexts();
  assert.ok(listed.some((c) => c.id === ctx.id && c.language === "python" && c.pid !== null));
  assert.ok(listed.some((c) => c.id === "python"));
  await sb.deleteContext(ctx);
  assert.ok(!(await sb.listContexts()).some((c) => c.id === ctx.id));
});

test("variables: set, get (with the unrepresentable ones described), clear", async () => {
  const ctx = await sb.createContext();
  const names = await sb.setVariables({ cfg: { n: 3, tags: ["a"] }, label: "x" }, { context: ctx });
  assert.deepEqual(names.sort(), ["cfg", "label"]);
  assert.equal((await sb.runCode("cfg['n'] * 2", { context: ctx })).text, "6");
  await sb.runCode("import threading\nlock = threading.Lock()", { context: ctx });
  const vars = await sb.getVariables({ context: ctx });
  assert.deepEqual(vars.values["cfg"], { n: 3, tags: ["a"] });
  assert.equal(vars.unrepresentable["lock"]?.type.includes("lock"), true);
  const some = await sb.getVariables({ context: ctx, names: ["label", "absent"] });
  assert.deepEqual(some.values, { label: "x" });
  assert.deepEqual(some.missing, ["absent"]);
  assert.deepEqual(await sb.clearVariables({ context: ctx, names: ["label"] }), ["label"]);
  assert.deepEqual((await sb.getVariables({ context: ctx, names: ["label"] })).missing, ["label"]);
  await sb.clearVariables({ context: ctx });
  assert.deepEqual((await sb.getVariables({ context: ctx })).values, {});
  await sb.deleteContext(ctx);
});

test("interrupt stops a running execution and keeps the state; restart clears it", async () => {
  const ctx = await sb.createContext();
  await sb.runCode("kept = 'yes'", { context: ctx });
  const running = sb.runCode("import time\nwhile True: time.sleep(0.01)", { context: ctx });
  await new Promise((r) => setTimeout(r, 300));
  await sb.interrupt(ctx);
  const run = await running;
  assert.equal(run.status, "interrupted");
  assert.equal((await sb.runCode("kept", { context: ctx })).text, "'yes'");

  const fresh = await sb.restartContext(ctx);
  assert.equal(fresh.id, ctx.id);
  const after = await sb.runCode("kept", { context: ctx });
  assert.equal(after.error?.name, "NameError");
  await sb.deleteContext(ctx);
});

test("a timeout ends the execution with status timeout", async () => {
  const ctx = await sb.createContext();
  const run = await sb.runCode("import time\ntime.sleep(30)", { context: ctx, timeout: 0.5 });
  assert.equal(run.status, "timeout");
  await sb.deleteContext(ctx);
});

test("runOnce runs in a fresh sandbox, reports timings, and deletes it", async () => {
  const once = await Sandbox.runOnce("import platform\nprint('hi')\n6 * 7", { template: "python" });
  assert.equal(once.execution.stdout, "hi\n");
  assert.equal(once.execution.text, "42");
  for (const value of Object.values(once.metrics)) assert.ok(value >= 0);
  assert.ok(once.metrics.totalMs >= once.metrics.startupMs + once.metrics.runMs);
  const left = await Sandbox.list({ state: "all" });
  assert.ok(!left.some((s) => s.id === once.sandboxId), "the ephemeral sandbox's record is gone");

  const node = await Sandbox.runOnce("[1, 2, 3].map((x) => x * 2).join(',')", { template: "node" });
  assert.equal(node.execution.text, "'2,4,6'");
});
