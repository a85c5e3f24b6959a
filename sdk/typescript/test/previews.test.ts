/**
 * Previews against the shared daemon: a `python3 -m http.server` inside a sandbox (default
 * network) serves a page; `previewUrl` gives URLs a plain HTTP client opens without the API
 * key, on the path route and on the host route (sent to the daemon's address with the URL's
 * `Host`, since `*.localhost` may not resolve here), the latter setting the token's cookie;
 * without a token the port is refused, `public: true` opens it and `public: false` closes it
 * again; a port nothing listens on is a 502 `port_closed`; `getHost` is made from the
 * sandbox's info and the client's URL; a sandbox with network `off` is a 409.
 */

import assert from "node:assert/strict";
import { request, type IncomingHttpHeaders } from "node:http";
import { test } from "node:test";

import { InvalidArgumentError, type PreviewInfo, type Sandbox } from "sandcell";
import { daemonEnv, withSandbox } from "./helpers.js";

const PAGE = "hello from a server inside\n";
const SERVE = "cd /workspace/www && exec python3 -m http.server 8000 --bind 127.0.0.1";
const UP = `python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000), 1).close()' 2>&1 && echo up`;

/** Serves PAGE at / on 127.0.0.1:8000 inside `sb`; resolves once it answers there. */
async function startServer(sb: Sandbox): Promise<void> {
  await sb.mkdir("/workspace/www");
  await sb.writeFile("/workspace/www/index.html", PAGE);
  await sb.startProcess(SERVE);
  const deadline = Date.now() + 20_000;
  for (;;) {
    const out = await sb.exec(UP);
    if (out.stdout.endsWith("up\n")) return;
    assert.ok(Date.now() < deadline, `the server inside did not start: ${out.stdout}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/**
 * GET `url` with no API key. With `viaDaemon`, the connection goes to the daemon's own address
 * and the URL's host and port are the `Host` header (as a browser resolving `*.localhost` to
 * loopback would send it).
 */
function get(url: string, options: { viaDaemon?: boolean; headers?: Record<string, string> } = {}): Promise<Answer> {
  const u = new URL(url);
  const to = options.viaDaemon ? new URL(daemonEnv().url) : u;
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: to.hostname,
        port: to.port,
        path: u.pathname + u.search,
        headers: { host: u.host, ...options.headers },
      },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end();
  });
}

const code = (a: Answer): string => (JSON.parse(a.body) as { code: string }).code;

test("previews reach a server inside: path and host routes, tokens, cookie, public, closed port", async () => {
  const daemonPort = new URL(daemonEnv().url).port;
  await withSandbox({ ephemeral: true }, async (sb) => {
    await startServer(sb);
    const host = `8000-${sb.id}.localhost`;
    // No request: made from the sandbox's info and the client's URL.
    assert.equal(sb.info.previewHost, `{port}-${sb.id}.localhost`);
    assert.equal(sb.info.previewPath, `/v1/sandboxes/${sb.id}/ports/{port}/`);
    assert.equal(sb.getHost(8000), `${host}:${daemonPort}`);

    // A token for the port, typed.
    const info: PreviewInfo = await sb.preview(8000, { ttlSecs: 60 });
    assert.deepEqual(Object.keys(info).sort(), ["expiresAt", "host", "path", "port", "public", "token"]);
    assert.deepEqual([info.port, info.path, info.host, info.public], [8000, `/v1/sandboxes/${sb.id}/ports/8000/`, host, false]);
    assert.ok(info.expiresAt instanceof Date);
    const left = (info.expiresAt.getTime() - Date.now()) / 1000;
    assert.ok(left > 30 && left <= 61, String(info.expiresAt));

    // The path route, with no API key: the token in the URL is enough.
    const page = `${daemonEnv().url}/v1/sandboxes/${sb.id}/ports/8000/`;
    const url = await sb.previewUrl(8000, { route: "path" });
    assert.ok(url.startsWith(`${page}?sandcell_token=`), url);
    const opened = await get(url);
    assert.deepEqual([opened.status, opened.body], [200, PAGE]);
    // The token works as a header too.
    const byHeader = await get(page, { headers: { "x-sandcell-token": info.token } });
    assert.deepEqual([byHeader.status, byHeader.body], [200, PAGE]);
    // The same path without the token is refused, as is a wrong token.
    const refused = await get(page);
    assert.deepEqual([refused.status, code(refused)], [401, "unauthenticated"]);
    assert.equal((await get(`${url}x`)).status, 401);

    // The host route: the token in the URL, then kept in a cookie for the page's assets.
    const hostUrl = await sb.previewUrl(8000);
    const token = new URL(hostUrl).searchParams.get("sandcell_token");
    assert.equal(hostUrl, `http://${host}:${daemonPort}/?sandcell_token=${encodeURIComponent(token ?? "")}`);
    const first = await get(hostUrl, { viaDaemon: true });
    assert.deepEqual([first.status, first.body], [200, PAGE]);
    const cookie = first.headers["set-cookie"]?.[0] ?? "";
    assert.ok(cookie.startsWith(`sandcell_token=${token};`), cookie);
    const again = await get(`http://${host}:${daemonPort}/index.html`, { viaDaemon: true, headers: { cookie: cookie.split(";")[0]! } });
    assert.deepEqual([again.status, again.body], [200, PAGE]);
    assert.equal((await get(`http://${host}:${daemonPort}/`, { viaDaemon: true })).status, 401);

    // Public: no token needed on either route; private again: refused again.
    assert.equal((await sb.preview(8000, { public: true })).public, true);
    assert.equal((await get(page)).body, PAGE);
    assert.equal((await get(`http://${host}:${daemonPort}/`, { viaDaemon: true })).status, 200);
    assert.equal((await sb.preview(8000, { public: false })).public, false);
    const closed = await get(page);
    assert.deepEqual([closed.status, code(closed)], [401, "unauthenticated"]);
    assert.equal((await get(`http://${host}:${daemonPort}/`, { viaDaemon: true })).status, 401);

    // Nothing listens on port 9: said plainly, with a valid token.
    const nothing = await get(await sb.previewUrl(9, { route: "path" }));
    assert.deepEqual([nothing.status, code(nothing)], [502, "port_closed"]);

    // Bad input: checked here (no request) or by the daemon.
    await assert.rejects(sb.previewUrl(8000, { route: "nowhere" as "host" }), TypeError);
    for (const bad of [0, 65536, 80.5]) assert.throws(() => sb.getHost(bad), RangeError);
    await assert.rejects(sb.preview(0), InvalidArgumentError);
    await assert.rejects(sb.preview(8000, { ttlSecs: 8 * 24 * 3600 }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.match(e.message, /ttl_secs/);
      return true;
    });
  });
});

test("a sandbox with network off: nothing inside can listen, and the route says so", async () => {
  await withSandbox({ ephemeral: true, network: "off" }, async (sb) => {
    const r = await get(await sb.previewUrl(8000, { route: "path", ttlSecs: 30 }));
    assert.deepEqual([r.status, code(r)], [409, "invalid_state"]);
  });
});
