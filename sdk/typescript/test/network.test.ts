/** A sandbox's network policy: allow rules at creation, the egress proxy inside, live changes, egress events, refusals. */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { type AddressInfo } from "node:net";
import { test } from "node:test";

import { InvalidArgumentError, Sandbox, type EgressEvent, type NetworkPolicyInput } from "sandcell";
import { collect, withSandbox } from "./helpers.js";

const GREETING = "hello from the host";
const PROXY = "http://127.0.0.1:3128";

/** Runs `fn` with a tiny HTTP server on the host's 127.0.0.1 answering GREETING; its port. */
async function withHostServer<T>(fn: (port: number) => Promise<T>): Promise<T> {
  const server: Server = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(GREETING);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    return await fn((server.address() as AddressInfo).port);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
}

/** A port of 127.0.0.1 nothing listens on (and no rule names). */
async function otherPort(taken: number): Promise<number> {
  for (;;) {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const port = (probe.address() as AddressInfo).port;
    await new Promise((resolve) => probe.close(resolve));
    if (port !== taken) return port;
  }
}

/**
 * GET http://127.0.0.1:port/ from inside the sandbox through its HTTP proxy (NO_PROXY names
 * 127.0.0.1, hence `--noproxy ''`): the body and the status.
 */
async function throughProxy(sb: Sandbox, port: number): Promise<[string, string]> {
  const out = await sb.exec(`curl -sS --noproxy '' -x ${PROXY} -w '\\n%{http_code}' http://127.0.0.1:${port}/`);
  const cut = out.stdout.lastIndexOf("\n");
  return [out.stdout.slice(0, cut), out.stdout.slice(cut + 1)];
}

/** The sandbox's egress events once there are `count` (an allowed one is recorded when its connection ends). */
async function eventsUntil(sb: Sandbox, count: number): Promise<EgressEvent[]> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const { events } = await sb.egressEvents();
    if (events.length >= count || Date.now() > deadline) return events;
    await new Promise((r) => setTimeout(r, 100));
  }
}

test("an allow rule reaches the host through the proxy; the policy changes live; egress events page", async () => {
  await withHostServer(async (port) => {
    const rule = `127.0.0.1:${port}`;
    const other = await otherPort(port);
    await withSandbox({ network: { allow: [rule] }, ephemeral: true }, async (sb) => {
      assert.deepEqual(sb.info.network, { allow: [rule] });
      assert.equal((await sb.exec("echo $HTTP_PROXY $HTTPS_PROXY")).stdout, `${PROXY} ${PROXY}\n`);

      assert.deepEqual(await throughProxy(sb, port), [GREETING, "200"]);
      assert.equal((await throughProxy(sb, other))[1], "403");

      const info = await sb.network();
      assert.deepEqual(info.network, { allow: [rule] });
      assert.equal(info.httpProxy, PROXY);
      assert.equal(info.socksProxy, "socks5h://127.0.0.1:1080");
      assert.ok(info.bytes > GREETING.length, `bytes: ${info.bytes}`);
      assert.equal(info.openConnections, 0);

      const events = await eventsUntil(sb, 2);
      assert.deepEqual(
        events.map((e) => [e.decision, e.host, e.port]),
        [
          ["denied", "127.0.0.1", other],
          ["allowed", "127.0.0.1", port],
        ],
      );
      const [denied, allowed] = events as [EgressEvent, EgressEvent];
      assert.ok(denied.id > allowed.id);
      assert.equal(denied.protocol, "http");
      assert.match(denied.reason ?? "", /not allowed/);
      assert.equal(allowed.reason, null);
      assert.equal(allowed.address, rule);
      assert.ok(allowed.bytesDown > GREETING.length && allowed.bytesUp > 0);
      assert.ok(allowed.at instanceof Date && Math.abs(allowed.at.getTime() - Date.now()) < 60_000);

      // From the next connection on, loopback refuses what the rule let through.
      const changed = await sb.setNetwork("loopback");
      assert.equal(changed.network, "loopback");
      assert.equal(changed.httpProxy, PROXY);
      assert.equal(sb.info.network, "loopback");
      assert.equal((await sb.refresh()).network, "loopback");
      assert.equal((await throughProxy(sb, port))[1], "403");
      const refused = (await eventsUntil(sb, 3))[0]!;
      assert.deepEqual([refused.decision, refused.port], ["denied", port]);
      assert.match(refused.reason ?? "", /loopback/);

      // A list of rules is an allow policy.
      assert.deepEqual((await sb.setNetwork([rule])).network, { allow: [rule] });
      assert.deepEqual(await throughProxy(sb, port), [GREETING, "200"]);

      // `off` is chosen when a sandbox is made, never on a running one.
      const off = await sb.setNetwork("off").catch((e: unknown) => e);
      assert.ok(off instanceof InvalidArgumentError, String(off));
      assert.equal(off.code, "invalid_argument");
      assert.equal(off.status, 400);
      assert.deepEqual((await sb.network()).network, { allow: [rule] });

      // Pages, newest first, linked by nextBefore; the iterator reads them all.
      const every = await eventsUntil(sb, 4);
      const ids = every.map((e) => e.id);
      assert.equal(ids.length, 4);
      assert.deepEqual(ids, [...ids].sort((a, b) => b - a));
      const first = await sb.egressEvents({ limit: 1 });
      assert.deepEqual(first.events.map((e) => e.id), [ids[0]]);
      assert.equal(first.nextBefore, ids[0]);
      const second = await sb.egressEvents({ limit: 2, before: first.nextBefore! });
      assert.deepEqual(second.events.map((e) => e.id), [ids[1], ids[2]]);
      assert.deepEqual((await collect(sb.iterEgressEvents({ pageSize: 1 }))).map((e) => e.id), ids);
      assert.deepEqual(await sb.egressEvents({ before: ids[3]! }), { events: [], nextBefore: null });
    });
  });
});

test("the daemon refuses bad policies at creation with invalid_argument", async () => {
  const cases: [NetworkPolicyInput, RegExp][] = [
    [{ allow: ["http://x"] }, /URL/],
    [[], /at least one rule/],
    ["wide" as NetworkPolicyInput, /not a network policy/],
  ];
  for (const [network, says] of cases) {
    const err = await Sandbox.create({ network, ephemeral: true, labels: { suite: "sdk-ts" } }).catch((e: unknown) => e);
    assert.ok(err instanceof InvalidArgumentError, `${JSON.stringify(network)}: ${String(err)}`);
    assert.equal(err.code, "invalid_argument");
    assert.match(err.message, says);
  }
});

test("off has no proxy and cannot be left", async () => {
  await withSandbox({ network: "off", ephemeral: true }, async (sb) => {
    const info = await sb.network();
    assert.equal(info.network, "off");
    assert.equal(info.httpProxy, null);
    assert.equal(info.socksProxy, null);
    await assert.rejects(sb.setNetwork("loopback"), InvalidArgumentError);
  });
});

test("a name no rule allows is denied by name", async () => {
  await withSandbox({ ephemeral: true }, async (sb) => {
    assert.equal(sb.info.network, "loopback");
    assert.deepEqual((await sb.setNetwork(["*.example.org:443"])).network, { allow: ["*.example.org:443"] });
    assert.deepEqual(sb.info.network, { allow: ["*.example.org:443"] });
    const out = await sb.exec(`curl -sS -o /dev/null -w '%{http_code}' -x ${PROXY} http://example.net/`);
    assert.equal(out.stdout, "403");
    const page = await sb.egressEvents({ limit: 10 });
    assert.deepEqual(page.events.map((e) => [e.decision, e.host, e.port]), [["denied", "example.net", 80]]);
    assert.equal(page.nextBefore, null);
  });
});
