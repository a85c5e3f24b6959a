/**
 * Configuration as the CLI finds it: options, then SANDCELL_API_URL / SANDCELL_API_KEY, then
 * what the daemon left in Sandcell's home (daemon.json's URL, admin.key), then the defaults.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { promisify } from "node:util";

import { AuthenticationError, ConnectionError, Sandbox, system } from "sandcell";
import { daemonEnv, withEnv } from "./helpers.js";

/** The built package's entry point, for child programs that run outside this folder. */
const ENTRY = pathToFileURL(join(dirname(fileURLToPath(import.meta.url)), "../dist/index.js")).href;

let empty: string;
before(() => {
  empty = mkdtempSync(join(tmpdir(), "sandcell-ts-home-"));
});
after(() => {
  rmSync(empty, { recursive: true, force: true });
});

/** A port nothing listens on. */
async function freePort(): Promise<number> {
  return new Promise<number>((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0));
    });
  });
}

test("a program with only SANDCELL_HOME set finds the daemon (daemon.json) and its admin key", async () => {
  const { home } = daemonEnv();
  const dir = mkdtempSync(join(tmpdir(), "sandcell-ts-child-"));
  try {
    const script = join(dir, "child.mjs");
    writeFileSync(
      script,
      `import { Sandbox } from ${JSON.stringify(ENTRY)};
const sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
try {
  const r = await sb.exec("echo found the daemon");
  console.log(JSON.stringify({ stdout: r.stdout, ok: r.ok }));
} finally {
  await sb.kill();
}
`,
    );
    // Nothing else in the environment: no URL, no key, no HOME.
    const { stdout } = await promisify(execFile)(process.execPath, [script], {
      env: { SANDCELL_HOME: home },
      timeout: 30_000,
    });
    assert.deepEqual(JSON.parse(stdout), { stdout: "found the daemon\n", ok: true });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the home's daemon.json and admin.key are used in-process too; the environment wins over them, options over both", async () => {
  const { url, key, home } = daemonEnv();
  const elsewhere = `http://127.0.0.1:${await freePort()}`;
  await withEnv({ SANDCELL_HOME: home, SANDCELL_API_URL: undefined, SANDCELL_API_KEY: undefined }, async () => {
    assert.equal((await system()).caller.admin, true, "URL and key from the home");

    await withEnv({ SANDCELL_API_KEY: "sk-from-the-environment" }, async () => {
      const err = await system().catch((e: unknown) => e);
      assert.ok(err instanceof AuthenticationError);
      assert.match(err.message, /the key was taken from SANDCELL_API_KEY/);
      assert.equal((await system({ apiKey: key })).caller.admin, true, "the option wins");
    });

    await withEnv({ SANDCELL_API_URL: elsewhere }, async () => {
      const err = await system().catch((e: unknown) => e);
      assert.ok(err instanceof ConnectionError, String(err));
      assert.ok(err.message.includes(elsewhere), err.message);
      assert.equal((await system({ apiUrl: `${url}/` })).caller.admin, true, "the option wins");
    });
  });
});

test("no key anywhere: the 401 says how to give one and which file was looked for", async () => {
  const { url } = daemonEnv();
  await withEnv({ SANDCELL_HOME: empty, SANDCELL_API_URL: undefined, SANDCELL_API_KEY: undefined }, async () => {
    // No daemon.json in this home: the default URL, where no daemon of this test listens.
    // (A daemon of this host's own may listen there: then it refuses the missing key.)
    const refused = await Sandbox.list({ requestTimeout: 5 }).catch((e: unknown) => e);
    assert.ok(refused instanceof ConnectionError || refused instanceof AuthenticationError, String(refused));
    if (refused instanceof ConnectionError) assert.match(refused.message, /127\.0\.0\.1:7070/);

    const err = await Sandbox.list({ apiUrl: url }).catch((e: unknown) => e);
    assert.ok(err instanceof AuthenticationError, String(err));
    assert.equal(err.status, 401);
    assert.ok(err.message.includes(`looked for ${empty}/admin.key`), err.message);
    assert.match(err.message, /pass apiKey, set SANDCELL_API_KEY/);
  });
});

test("without SANDCELL_HOME the home is /var/lib/sandcell as root, else ~/.local/share/sandcell", async () => {
  const { url } = daemonEnv();
  const expected = process.getuid?.() === 0 ? "/var/lib/sandcell/admin.key" : `${homedir()}/.local/share/sandcell/admin.key`;
  await withEnv({ SANDCELL_HOME: undefined, SANDCELL_API_KEY: undefined }, async () => {
    // That home's key (if this process may read it) is not the test daemon's: refused either way.
    const err = await Sandbox.list({ apiUrl: url }).catch((e: unknown) => e);
    assert.ok(err instanceof AuthenticationError, String(err));
    assert.ok(err.message.includes(expected), err.message);
  });
});
