/** The examples run to completion as a user would run them (a child process, the daemon in the environment). */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Sandbox } from "sandcell";
import { daemonEnv } from "./helpers.js";

const EXAMPLES = join(dirname(fileURLToPath(import.meta.url)), "../examples");

async function runExample(name: string, args: string[] = []): Promise<string> {
  const { url, key } = daemonEnv();
  const { stdout } = await promisify(execFile)(process.execPath, [join(EXAMPLES, name), ...args], {
    env: { ...process.env, SANDCELL_API_URL: url, SANDCELL_API_KEY: key },
    timeout: 60_000,
  });
  return stdout;
}

async function leftBehind(example: string): Promise<string[]> {
  return (await Sandbox.list({ label: { example } })).map((s) => s.id);
}

test("data-analysis.mjs saves a PNG of the plot", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sandcell-ts-example-"));
  try {
    const png = join(dir, "plot.png");
    const out = await runExample("data-analysis.mjs", [png]);
    assert.match(out, /growth over the year \(%\): \{'gadgets': -?\d+\.\d+, 'widgets': -?\d+\.\d+\}/);
    assert.match(out, /mean\s+\d+/);
    const bytes = readFileSync(png);
    assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    assert.ok(bytes.length > 5_000);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.deepEqual(await leftBehind("data-analysis"), []);
});

test("fork-and-compare.mjs forks a snapshot three ways and leaves the source untouched", async () => {
  const out = await runExample("fork-and-compare.mjs");
  assert.match(out, /2003 points, raw score/);
  assert.match(out, /carries: .*data.*score/);
  for (const strategy of ["keep everything", "trim 1% each side", "drop beyond 3 sigma"]) {
    assert.ok(out.includes(strategy), `no row for ${strategy}`);
  }
  assert.match(out, /source after the forks: \(False, 2003\)/);
  assert.match(out, /best strategy: /);
  assert.deepEqual(await leftBehind("fork-and-compare"), []);
});

test("stream-command.mjs streams in order and reconnects to a background process", async () => {
  const out = await runExample("stream-command.mjs");
  const streamed = out.slice(0, out.indexOf("-- background process"));
  const steps = [...streamed.matchAll(/stdout: step (\d): working/g)].map((m) => Number(m[1]));
  assert.deepEqual(steps, [1, 2, 3, 4, 5, 6]);
  assert.ok(streamed.indexOf("step 2: working") < streamed.indexOf("stderr: step 2: a warning"));
  assert.match(streamed, /done: exited with code 0 \(exit 0\)\n$/);
  // The two connections together saw every line once.
  const background = out.slice(out.indexOf("-- background process"));
  const seen = [...background.matchAll(/connection: (?:stdout: )?(step \d: working|all done)/g)].map((m) => m[1]);
  assert.deepEqual(seen, ["step 1: working", "step 2: working", "step 3: working", "step 4: working", "step 5: working", "step 6: working", "all done"]);
  assert.match(background, /second connection: done, exit 0/);
  assert.deepEqual(await leftBehind("stream-command"), []);
});
