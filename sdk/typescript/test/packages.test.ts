/**
 * `packages` at create against a daemon of its own pointed at the test kit's fake package
 * registries: the daemon maps the test-only names `pypi.test` and `npm.test` to 127.0.0.1 and
 * installs from `https://pypi.test:P/simple/` and `https://npm.test:P/` (trusting the
 * registries' test CA). The first create installs `sandcell-fake` (pip, and npm when the host
 * has npm) inside the sandbox; the next with the same lists gets it from the cache; both can
 * use it. A package the index lacks and packages with network `off` are refused, naming the
 * package, and leave no sandbox.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, test } from "node:test";

import { InvalidArgumentError, Sandbox, type ClientOptions, type Packages, type PackagesReport } from "sandcell";
import { startDaemon, startFakeRegistries, type Daemon, type FakeRegistries } from "./daemon.js";

const PYTHON_CHECK = "python3 -c 'import sandcell_fake; print(sandcell_fake.VALUE)'";
const NODE_CHECK = `cd /workspace && node -e 'console.log(require("sandcell-fake"))'`;

/** Whether the host has npm (the sandbox runs the host's; Debian's nodejs has none). */
function hasNpm(): boolean {
  try {
    execFileSync("npm", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}
const NPM = hasNpm();

let registries: FakeRegistries | undefined;
let daemon: Daemon | undefined;
let client: ClientOptions = {};

before(async () => {
  const r = await startFakeRegistries(["pypi.test", "npm.test"]);
  registries = r;
  // A daemon of its own: the name mapping is test-only (it takes SANDCELL_TEST=1), and the
  // shared daemon is left as users run it.
  daemon = await startDaemon({
    settings: [
      `packages.pip_index_url=https://pypi.test:${r.httpsPort}/simple/`,
      `packages.npm_registry=https://npm.test:${r.httpsPort}/`,
      `packages.ca_file=${r.ca}`,
      // Python sandboxes with the package installed while they wait (the other tests use the
      // default template, which this pool never serves).
      "pools.warm=python/small=1 pip:sandcell-fake",
    ],
    env: { SANDCELL_TEST: "1", SANDCELL_TEST_RESOLVE: "pypi.test=127.0.0.1;npm.test=127.0.0.1" },
  });
  client = { apiUrl: daemon.url, apiKey: daemon.key };
});

after(async () => {
  await daemon?.stop();
  await registries?.stop();
});

/** The installed packages work inside the sandbox. */
async function check(sb: Sandbox): Promise<void> {
  const py = await sb.exec(PYTHON_CHECK);
  assert.equal(py.stdout, "42\n", py.stderr);
  if (NPM) {
    const node = await sb.exec(NODE_CHECK);
    assert.equal(node.stdout, "42\n", node.stderr);
  }
}

/** Creates a sandbox, runs `fn` with it, and deletes it whatever happened. */
async function withCreated<T>(packages: Packages | undefined, fn: (sb: Sandbox) => Promise<T>): Promise<T> {
  const sb = await Sandbox.create({ ...client, ephemeral: true, packages });
  try {
    return await fn(sb);
  } finally {
    await sb.kill();
  }
}

test("packages are installed at create, then come from the cache", async () => {
  if (!NPM) console.log("skipped: npm is not installed here (the npm half of the packages test)");
  const packages: Packages = NPM ? { pip: ["sandcell-fake"], npm: ["sandcell-fake"] } : { pip: ["sandcell-fake"] };
  await withCreated(packages, async (sb) => {
    const first: PackagesReport | null = sb.info.packages;
    assert.ok(first !== null, JSON.stringify(sb.info));
    assert.equal(first.cached, false);
    assert.ok(first.files > 0 && first.bytes > 0 && first.durationMs >= 0, JSON.stringify(first));
    assert.deepEqual(Object.keys(first).sort(), ["bytes", "cached", "durationMs", "files", "fromPool"]);
    assert.equal(first.fromPool, false);
    await check(sb);
    // The install's access is gone: the sandbox's own policy (loopback) is back.
    assert.equal(sb.info.network, "loopback");
    // The report belongs to the create answer: the record read again has none.
    assert.equal((await sb.refresh()).packages, null);
  });

  // The same lists again (keys in another order): from the cache.
  const again: Packages = NPM ? { npm: ["sandcell-fake"], pip: ["sandcell-fake"] } : { pip: ["sandcell-fake"] };
  await withCreated(again, async (sb) => {
    const cached = sb.info.packages;
    assert.ok(cached !== null && cached.cached, JSON.stringify(cached));
    assert.ok(cached.files > 0 && cached.bytes > 0, JSON.stringify(cached));
    await check(sb);
  });

  // Without packages, no report.
  await withCreated(undefined, async (sb) => {
    assert.equal(sb.info.packages, null);
  });
});

test("a warm pool serves the same packages, installed ahead", async () => {
  const ready = 'sandcell_pool_ready{pool="python/small+pip:sandcell-fake"} 1';
  const deadline = Date.now() + 120_000;
  for (;;) {
    const r = await fetch(`${client.apiUrl}/metrics`, { headers: { authorization: `Bearer ${client.apiKey}` } });
    if ((await r.text()).includes(ready)) break;
    assert.ok(Date.now() < deadline, "the warm pool never filled");
    await new Promise((done) => setTimeout(done, 200));
  }
  const sb = await Sandbox.create({ ...client, ephemeral: true, template: "python", packages: { pip: ["sandcell-fake"] } });
  try {
    const report = sb.info.packages;
    assert.ok(report !== null && report.fromPool && report.files > 0, JSON.stringify(report));
    const py = await sb.exec(PYTHON_CHECK);
    assert.equal(py.stdout, "42\n", py.stderr);
  } finally {
    await sb.kill();
  }
});

test("refusals name the package and leave no sandbox", async () => {
  const active = async (): Promise<number> => (await Sandbox.list(client)).length;
  const before = await active();
  await assert.rejects(Sandbox.create({ ...client, ephemeral: true, packages: { pip: ["no-such-package"] } }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.equal(e.code, "invalid_argument");
    assert.equal(e.status, 400);
    assert.ok(e.message.includes("packages.pip (no-such-package)"), e.message);
    return true;
  });
  assert.equal(await active(), before);

  // Installed through the egress proxy, which `off` has none of.
  await assert.rejects(Sandbox.create({ ...client, ephemeral: true, network: "off", packages: { pip: ["x"] } }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.match(e.message, /off/);
    return true;
  });

  // Only the daemon's installers: another key is sent, and refused, not dropped.
  const apt = { apt: ["jq"] } as Packages;
  await assert.rejects(Sandbox.create({ ...client, ephemeral: true, packages: apt }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.match(e.message, /apt/);
    return true;
  });

  // A name where a list belongs is caught before anything is sent.
  const name = { pip: "sandcell-fake" } as unknown as Packages;
  await assert.rejects(Sandbox.create({ ...client, ephemeral: true, packages: name }), /packages\.pip is a list of package names/);
  assert.equal(await active(), before);
});
