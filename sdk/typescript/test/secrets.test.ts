/**
 * `secrets` at create against a daemon of its own that maps the test-only names `api.test`
 * and `other.test` to 127.0.0.1, where the test kit's fake registries serve `/echo` (the
 * request as it arrived, as JSON) over TLS, and that trusts their test CA upstream. Inside the
 * sandbox the secret's variable holds a placeholder; curl sends it (trusting
 * `/run/sandcell/ca.pem`, the CA of the proxy that terminates the sandbox's TLS) and the
 * server sees the value, in a Bearer header, the query and Basic auth; to a host the secret
 * does not name it is refused. Bad secrets are refused by the daemon (400) or before anything
 * is sent, and no message shows a value. A live sandbox's secrets are listed (never their
 * values) and replaced, a name keeping its placeholder; a snapshot's forks and restores take
 * values for its secrets.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";

import { inspect } from "node:util";
import {
  InvalidArgumentError,
  Sandbox,
  secret as hiddenSecret,
  type ClientOptions,
  type Secret,
  type SecretState,
} from "sandcell";
import { startDaemon, startFakeRegistries, type Daemon, type FakeRegistries } from "./daemon.js";

let registries: FakeRegistries | undefined;
let daemon: Daemon | undefined;
let client: ClientOptions = {};
let port = 0;

before(async () => {
  const r = await startFakeRegistries(["api.test", "other.test"]);
  registries = r;
  port = r.httpsPort;
  // A daemon of its own: the name mapping is test-only (it takes SANDCELL_TEST=1), and its
  // proxy must trust the registries' test CA to verify them upstream.
  daemon = await startDaemon({
    settings: [`network.upstream_ca_file=${r.ca}`],
    env: { SANDCELL_TEST: "1", SANDCELL_TEST_RESOLVE: "api.test=127.0.0.1;other.test=127.0.0.1" },
  });
  client = { apiUrl: daemon.url, apiKey: daemon.key };
});

after(async () => {
  await daemon?.stop();
  await registries?.stop();
});

/** A value no test run repeats, so that finding it proves where it came from. */
function freshValue(): string {
  return `s3cr3t-${randomBytes(12).toString("hex")}`;
}

interface Echo {
  method: string;
  path: string;
  headers: Record<string, string>;
}

test("a secret's placeholder is in the sandbox, and the value reaches only its host", async () => {
  const value = freshValue();
  // Made with secret(): logging it (or the create's options) shows no value.
  const secret: Secret = hiddenSecret("TOKEN", value, ["api.test"]);
  for (const shown of [inspect(secret), JSON.stringify(secret), inspect({ secrets: [secret] }), JSON.stringify({ ...secret })]) {
    assert.ok(!shown.includes(value), shown);
  }
  assert.equal(secret.value, value);
  const sb = await Sandbox.create({ ...client, ephemeral: true, network: { allow: ["api.test", "other.test"] }, secrets: [secret] });
  try {
    assert.ok(!JSON.stringify(sb.info).includes(value), JSON.stringify(sb.info));
    const env = await sb.exec("printenv TOKEN");
    assert.equal(env.exitCode, 0, env.stderr);
    const placeholder = env.stdout.trim();
    assert.notEqual(placeholder, value);
    assert.match(placeholder, /^SANDCELL_SECRET_[0-9a-f]+$/);

    // To its host: the server sees the value where the placeholder was.
    const out = await sb.exec(
      `curl -sS --fail --cacert /run/sandcell/ca.pem -H "Authorization: Bearer $TOKEN" "https://api.test:${port}/echo?key=$TOKEN"`,
    );
    assert.equal(out.exitCode, 0, out.stderr);
    const seen = JSON.parse(out.stdout) as Echo;
    assert.equal(seen.headers["authorization"], `Bearer ${value}`);
    assert.equal(seen.path, `/echo?key=${value}`);
    // Basic auth: decoded, replaced, encoded again.
    const basic = await sb.exec(`curl -sS --fail --cacert /run/sandcell/ca.pem -u "me:$TOKEN" "https://api.test:${port}/echo"`);
    assert.equal(basic.exitCode, 0, basic.stderr);
    const auth = (JSON.parse(basic.stdout) as Echo).headers["authorization"];
    assert.equal(auth, `Basic ${Buffer.from(`me:${value}`).toString("base64")}`);

    // To a host the secret does not name: refused (403, naming the secret, never its value).
    const other = await sb.exec(
      `curl -sS --cacert /run/sandcell/ca.pem -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOKEN" "https://other.test:${port}/echo" 2>&1`,
    );
    assert.ok(!other.stdout.includes(value), other.stdout);
    assert.ok(other.stdout.includes("403") || other.stdout.includes("TOKEN"), other.stdout);
    // Without the placeholder that host is reachable (so the refusal was the secret's).
    const plain = await sb.exec(`curl -sS --cacert /run/sandcell/ca.pem -o /dev/null -w '%{http_code}' "https://other.test:${port}/echo"`);
    assert.equal(plain.stdout, "200", plain.stderr);
  } finally {
    await sb.kill();
  }
});

test("bad secrets are refused by the daemon or before sending, naming no value, leaving no sandbox", async () => {
  const value = freshValue();
  const active = async (): Promise<number> => (await Sandbox.list(client)).length;
  const before = await active();
  const refused: [string, Partial<Secret> & Record<string, unknown>, string | undefined][] = [
    ["a lowercase name", { name: "lower", value, hosts: ["api.test"] }, undefined],
    ["no hosts", { name: "A", value, hosts: [] }, undefined],
    ["a URL for a host", { name: "A", value, hosts: ["http://api.test/"] }, undefined],
    ["the network off", { name: "A", value, hosts: ["api.test"] }, "off"],
  ];
  for (const [what, secret, network] of refused) {
    await assert.rejects(
      Sandbox.create({ ...client, ephemeral: true, network: network === "off" ? "off" : ["api.test"], secrets: [secret as Secret] }),
      (e: unknown) => {
        assert.ok(e instanceof InvalidArgumentError, `${what}: ${String(e)}`);
        assert.equal(e.status, 400);
        assert.ok(!e.message.includes(value), e.message);
        return true;
      },
    );
  }

  // Malformed ones, before anything is sent (for JavaScript callers, whom no compiler checks).
  const malformed: [unknown, RegExp][] = [
    [{ name: "A", value, hosts: ["h"] }, /secrets is a list of \{ name, value, hosts \}, not object/],
    [[["A", value, ["h"]]], /secrets\[0\] is an object \{ name, value, hosts \}, not an array/],
    [[{ name: "A", value, host: ["h"] }], /secrets\[0\] has the keys name, value and hosts; unknown: host; missing: hosts/],
    [[{ name: "A", value, hosts: "api.test" }], /secrets\[0\] \(A\): hosts is a list of host rules/],
    [[{ name: "A", value, hosts: [443] }], /each host is a string, not number/],
    [[{ name: "A", value: 7, hosts: ["h"] }], /value is a string, not number/],
    [[{ name: 1, value, hosts: ["h"] }], /name is a string, not number/],
  ];
  for (const [secrets, message] of malformed) {
    await assert.rejects(Sandbox.create({ ...client, ephemeral: true, secrets: secrets as Secret[] }), (e: unknown) => {
      assert.ok(e instanceof TypeError, String(e));
      assert.match(e.message, message);
      assert.ok(!e.message.includes(value), e.message);
      return true;
    });
  }
  assert.equal(await active(), before);
});

/** The value the fake server saw where `sb` sent `$TOKEN` (a Bearer header and the query, which must agree). */
async function sentToken(sb: Sandbox): Promise<string> {
  const out = await sb.exec(
    `curl -sS --fail --cacert /run/sandcell/ca.pem -H "Authorization: Bearer $TOKEN" "https://api.test:${port}/echo?key=$TOKEN"`,
  );
  assert.equal(out.exitCode, 0, out.stderr);
  const seen = JSON.parse(out.stdout) as Echo;
  const bearer = seen.headers["authorization"]?.replace(/^Bearer /, "");
  assert.equal(seen.path, `/echo?key=${bearer}`);
  return bearer ?? "";
}

test("setSecrets rotates a value under the same placeholder; forks and restores take values of their own", async () => {
  const [first, rotated, forked, restoredValue] = [freshValue(), freshValue(), freshValue(), freshValue()];
  const token = (value: string): Secret[] => [hiddenSecret("TOKEN", value, ["api.test"])];
  const sb = await Sandbox.create({ ...client, network: ["api.test"], secrets: token(first) });
  const made: Sandbox[] = [];
  let snapshot: { delete(): Promise<void> } | undefined;
  try {
    const placeholder = (await sb.exec("printenv TOKEN")).stdout.trim();
    const expected: SecretState[] = [{ name: "TOKEN", placeholder, hosts: ["api.test"], held: true }];
    const listed = await sb.secrets();
    assert.deepEqual(listed, expected);
    assert.ok(!JSON.stringify(listed).includes(first));
    assert.equal(await sentToken(sb), first);

    // Rotated live: the same placeholder (nothing inside changes), the new value sent.
    const states = await sb.setSecrets(token(rotated));
    assert.deepEqual(states, expected);
    assert.deepEqual(await sb.secrets(), expected);
    assert.equal(await sentToken(sb), rotated);

    // A fork given a value of its own: the snapshot's placeholder, that value; the source keeps its own.
    const snap = await sb.createSnapshot({ name: "with-secret" });
    snapshot = snap;
    const [fork] = await snap.fork({ ephemeral: true, secrets: token(forked) });
    made.push(fork!);
    assert.equal((await fork!.exec("printenv TOKEN")).stdout.trim(), placeholder);
    assert.deepEqual(await fork!.secrets(), expected);
    assert.equal(await sentToken(fork!), forked);
    assert.equal(await sentToken(sb), rotated);
    // A restore takes them the same way (`snapshotId` with `secrets`).
    const restored = await Sandbox.create({ ...client, snapshotId: snap.id, ephemeral: true, secrets: token(restoredValue) });
    made.push(restored);
    assert.equal(await sentToken(restored), restoredValue);
    // A name the snapshot has no secret of is refused, naming the ones it has.
    await assert.rejects(snap.fork({ ephemeral: true, secrets: [hiddenSecret("NOPE", forked, ["api.test"])] }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.ok(e.message.includes("TOKEN"), e.message);
      assert.ok(!e.message.includes(forked), e.message);
      return true;
    });

    // A bad value (a newline) is refused by the daemon, naming no value, and changes nothing.
    const bad = `${freshValue()}\nX-Injected: 1`;
    await assert.rejects(sb.setSecrets(token(bad)), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.equal(e.status, 400);
      assert.ok(!e.message.includes(bad.split("\n")[0]!), e.message);
      return true;
    });
    assert.deepEqual(await sb.secrets(), expected);
    assert.equal(await sentToken(sb), rotated);

    // Left out: forgotten.
    assert.deepEqual(await sb.setSecrets([]), []);
    assert.deepEqual(await sb.secrets(), []);
  } finally {
    for (const s of [...made, sb]) await s.kill();
    await snapshot?.delete();
  }
});

test("setSecrets checks the list's shape before sending anything", async () => {
  const value = freshValue();
  const sb = await Sandbox.create({ ...client, ephemeral: true, network: ["api.test"], secrets: [hiddenSecret("TOKEN", value, ["api.test"])] });
  const real = globalThis.fetch;
  let requests = 0;
  try {
    globalThis.fetch = ((...args: Parameters<typeof fetch>) => {
      requests++;
      return real(...args);
    }) as typeof fetch;
    const malformed: [unknown, RegExp][] = [
      [{ name: "TOKEN", value, hosts: ["api.test"] }, /secrets is a list of \{ name, value, hosts \}, not object/],
      [[{ name: "TOKEN", value, host: ["api.test"] }], /secrets\[0\] has the keys name, value and hosts; unknown: host; missing: hosts/],
      [[{ name: "TOKEN", value, hosts: "api.test" }], /secrets\[0\] \(TOKEN\): hosts is a list of host rules/],
      [[{ name: "TOKEN", value: 7, hosts: ["api.test"] }], /value is a string, not number/],
    ];
    for (const [secrets, message] of malformed) {
      await assert.rejects(sb.setSecrets(secrets as Secret[]), (e: unknown) => {
        assert.ok(e instanceof TypeError, String(e));
        assert.match(e.message, message);
        assert.ok(!e.message.includes(value), e.message);
        return true;
      });
    }
    assert.equal(requests, 0);
  } finally {
    globalThis.fetch = real;
  }
  try {
    assert.equal((await sb.secrets())[0]?.held, true);
  } finally {
    await sb.kill();
  }
});
