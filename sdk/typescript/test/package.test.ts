/**
 * The package as a user gets it: `npm pack` makes the tarball, `npm install` puts it in a
 * new project (offline: it has no runtime dependency), and a program there imports
 * `sandcell` by name, type-checks against its declarations and runs a command.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { daemonEnv } from "./helpers.js";

const SDK = join(dirname(fileURLToPath(import.meta.url)), "..");
const run = promisify(execFile);

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), "sandcell-ts-package-"));
});
after(() => {
  rmSync(dir, { recursive: true, force: true });
});

/** Runs npm (next to this node) quietly, never asking a registry for anything. */
async function npm(args: string[], cwd: string): Promise<string> {
  const { stdout } = await run("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], {
    cwd,
    timeout: 120_000,
    env: { ...process.env, npm_config_update_notifier: "false" },
  });
  return stdout;
}

test("npm pack, npm install into a new project, import { Sandbox } from 'sandcell', run a command", { timeout: 180_000 }, async () => {
  // --ignore-scripts: test.sh has just built dist/, and other test files are using it.
  const packed = JSON.parse(await npm(["pack", "--json", "--ignore-scripts", "--pack-destination", dir], SDK)) as {
    filename: string;
    files: { path: string }[];
  }[];
  const tarball = join(dir, packed[0]!.filename);
  assert.ok(existsSync(tarball), tarball);
  const shipped = packed[0]!.files.map((f) => f.path);
  for (const needed of ["package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/ws.js", "src/index.ts"]) {
    assert.ok(shipped.includes(needed), `${needed} is not in the package: ${shipped.join(", ")}`);
  }
  assert.deepEqual(
    shipped.filter((p) => /^(test|build|node_modules|examples)\/|^API-GAPS|^test\.sh$|^tsconfig/.test(p)),
    [],
    "only the package's own files are shipped",
  );

  const project = join(dir, "project");
  mkdirSync(project);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
  await npm(["install", "--offline", "--no-package-lock", tarball], project);

  const manifest = JSON.parse(readFileSync(join(project, "node_modules/sandcell/package.json"), "utf8")) as Record<string, unknown>;
  assert.equal(manifest["name"], "sandcell");
  assert.equal(manifest["type"], "module");
  assert.equal(manifest["types"], "./dist/index.d.ts");
  assert.deepEqual(manifest["exports"], {
    ".": { types: "./dist/index.d.ts", import: "./dist/index.js" },
    "./package.json": "./package.json",
  });
  assert.deepEqual(manifest["files"], ["dist", "src", "README.md"]);
  assert.deepEqual(manifest["engines"], { node: ">=18" });
  assert.equal(manifest["dependencies"], undefined, "no runtime dependency");

  // A user's program: by name, from its own folder.
  const { url, key } = daemonEnv();
  writeFileSync(
    join(project, "app.mjs"),
    `import { Sandbox } from "sandcell";
const sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
try {
  console.log((await sb.exec("echo installed and running")).stdout.trim());
} finally {
  await sb.kill();
}
`,
  );
  const app = run(process.execPath, ["app.mjs"], {
    cwd: project,
    env: { ...process.env, SANDCELL_API_URL: url, SANDCELL_API_KEY: key },
    timeout: 30_000,
  });

  // And, meanwhile, TypeScript finds the declarations through `exports` (strict, the library's .d.ts checked too).
  writeFileSync(
    join(project, "check.ts"),
    `import { Sandbox, type ExecResult } from "sandcell";
export async function main(): Promise<string> {
  await using sb = await Sandbox.create({ template: "python", timeoutSecs: 60 });
  const r: ExecResult = await sb.commands.run("echo hi", { envs: { A: "b" } });
  const text: string = await sb.files.read("a.txt");
  const bytes: Uint8Array = await sb.files.read("a.txt", { format: "bytes" });
  return r.stdout + text + bytes.length;
}
`,
  );
  const typecheck = run(
    join(SDK, "node_modules/.bin/tsc"),
    [
      "--noEmit", "--strict", "--target", "ES2022", "--lib", "ES2022,ESNext.Disposable",
      "--module", "NodeNext", "--moduleResolution", "NodeNext",
      "--typeRoots", join(SDK, "node_modules/@types"), "--types", "node", "check.ts",
    ],
    { cwd: project, timeout: 60_000 },
  ).catch((e: { stdout?: string }) => assert.fail(`tsc: ${e.stdout ?? String(e)}`));

  assert.equal((await app).stdout, "installed and running\n");
  await typecheck;
});
