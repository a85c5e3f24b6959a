/**
 * `gitClone` against a daemon of its own: the daemon maps the test-only name `git.test` to
 * 127.0.0.1 (its clone proxy refuses loopback addresses by address), and a small static HTTP
 * server on 127.0.0.1 serves a bare repository over git's dumb HTTP protocol, recording the
 * headers of each request. The clone lands at the default path on `main`; the server saw the
 * URL's credentials; the sandbox holds none of them; a second clone to the same path and a
 * transport other than http(s) are refused.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join, normalize } from "node:path";
import { after, before, test } from "node:test";

import { ConflictError, InvalidArgumentError, Sandbox, type ClientOptions, type GitCloneResult } from "sandcell";
import { startDaemon, type Daemon } from "./daemon.js";

const README = "a repository served over dumb HTTP\n";
// Distinct enough that no file git writes holds it by chance (its sample hooks say "token").
const TOKEN = "t0k-3a9f1c";

/** Runs the git CLI with no user or system configuration and a fixed author. */
function git(cwd: string, ...args: string[]): void {
  execFileSync("git", ["-C", cwd, ...args], {
    stdio: "pipe",
    env: {
      ...process.env,
      GIT_CONFIG_GLOBAL: "/dev/null",
      GIT_CONFIG_NOSYSTEM: "1",
      GIT_AUTHOR_NAME: "t",
      GIT_AUTHOR_EMAIL: "t@t",
      GIT_COMMITTER_NAME: "t",
      GIT_COMMITTER_EMAIL: "t@t",
    },
  });
}

/** A bare repository `repo.git` (one commit of README.md on `main`), ready for dumb HTTP; its parent folder. */
function makeRepository(): string {
  const root = mkdtempSync(join(tmpdir(), "sandcell-ts-git-"));
  const src = join(root, "src");
  mkdirSync(src);
  git(src, "init", "-q", "-b", "main");
  writeFileSync(join(src, "README.md"), README);
  git(src, "add", "README.md");
  git(src, "commit", "-q", "-m", "first");
  git(root, "clone", "-q", "--bare", "src", "repo.git");
  // Dumb HTTP reads info/refs and objects/info/packs as plain files.
  git(join(root, "repo.git"), "update-server-info");
  return root;
}

/** A static file server for `root` on 127.0.0.1, recording the headers of every request. */
async function serveStatic(root: string, seen: IncomingHttpHeaders[]): Promise<Server> {
  const server = createServer((req, res) => {
    seen.push(req.headers);
    const path = normalize(decodeURIComponent((req.url ?? "/").split("?")[0]!));
    const file = join(root, path);
    try {
      if (path.includes("..") || !statSync(file).isFile()) throw new Error("not a file");
      const body = readFileSync(file);
      res.writeHead(200, { "content-length": body.length });
      res.end(body);
    } catch {
      res.writeHead(404, { "content-length": 0 });
      res.end();
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

let root: string | undefined;
let server: Server | undefined;
let port = 0;
const seen: IncomingHttpHeaders[] = [];
let daemon: Daemon | undefined;
let client: ClientOptions = {};

before(async () => {
  root = makeRepository();
  const s = await serveStatic(root, seen);
  server = s;
  port = (s.address() as AddressInfo).port;
  // A daemon of its own: the mapping is test-only (it takes SANDCELL_TEST=1), and the shared
  // daemon is left as users run it.
  daemon = await startDaemon({ env: { SANDCELL_TEST: "1", SANDCELL_TEST_RESOLVE: "git.test=127.0.0.1" } });
  client = { apiUrl: daemon.url, apiKey: daemon.key };
});

after(async () => {
  await daemon?.stop();
  const s = server;
  if (s !== undefined) {
    s.closeAllConnections();
    await new Promise((resolve) => s.close(resolve));
  }
  if (root !== undefined) rmSync(root, { recursive: true, force: true });
});

const basic = (user: string): string => `Basic ${Buffer.from(`${user}:${TOKEN}`).toString("base64")}`;

test("a clone brings the repository in and keeps the credentials out", async () => {
  seen.length = 0;
  const url = `http://me:${TOKEN}@git.test:${port}/repo.git`;
  // The sandbox's own network stays at its default (loopback): the clone is the host's.
  const sb = await Sandbox.create({ ...client, ephemeral: true });
  try {
    const r: GitCloneResult = await sb.gitClone(url);
    assert.equal(r.path, "/workspace/repo");
    assert.match(r.commit, /^[0-9a-f]{40}$/);
    assert.equal(r.branch, "main");
    assert.ok(r.files > 3 && r.bytes > README.length && r.durationMs >= 0, JSON.stringify(r));
    assert.deepEqual(Object.keys(r).sort(), ["branch", "bytes", "commit", "durationMs", "files", "path"]);

    const out = await sb.exec("cat /workspace/repo/README.md; git -C /workspace/repo rev-parse HEAD");
    assert.equal(out.stdout, `${README}${r.commit}\n`, out.stderr);

    // The credentials went to the server, preemptively, as Basic authentication ...
    assert.ok(seen.length > 0);
    assert.deepEqual(seen.map((h) => h.authorization), seen.map(() => basic("me")));
    // ... and nowhere into the sandbox (its origin is the URL without them).
    const found = await sb.exec(`grep -r ${TOKEN} /workspace`);
    assert.deepEqual([found.exitCode, found.stdout], [1, ""]);
    const remote = await sb.exec("git -C /workspace/repo remote get-url origin");
    assert.equal(remote.stdout, `http://git.test:${port}/repo.git\n`);

    // The path is taken now.
    await assert.rejects(sb.gitClone(url), (e: unknown) => {
      assert.ok(e instanceof ConflictError, String(e));
      assert.equal(e.code, "already_exists");
      assert.equal(e.status, 409);
      return true;
    });

    // Only http(s): refused before anything is fetched.
    const fetched = seen.length;
    await assert.rejects(sb.gitClone("ssh://git.test/x"), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.equal(e.code, "invalid_argument");
      assert.equal(e.status, 400);
      assert.match(e.message, /ssh/);
      return true;
    });
    assert.equal(seen.length, fetched);
  } finally {
    await sb.kill();
  }
});

test("username and password, a path and a branch; a failed clone quotes git and leaves nothing", async () => {
  seen.length = 0;
  const sb = await Sandbox.create({ ...client, ephemeral: true });
  try {
    const r = await sb.gitClone(`http://git.test:${port}/repo.git`, { path: "src/here", branch: "main", username: "you", password: TOKEN });
    assert.deepEqual([r.path, r.branch], ["/workspace/src/here", "main"]);
    assert.equal(await sb.readFile("/workspace/src/here/README.md"), README);
    assert.ok(seen.length > 0);
    assert.deepEqual(seen.map((h) => h.authorization), seen.map(() => basic("you")));
    const found = await sb.exec(`grep -r ${TOKEN} /workspace`);
    assert.deepEqual([found.exitCode, found.stdout], [1, ""]);

    await assert.rejects(sb.gitClone(`http://git.test:${port}/missing.git`), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.equal(e.code, "invalid_argument");
      return true;
    });
    assert.equal(await sb.exists("/workspace/missing"), false);
  } finally {
    await sb.kill();
  }
});
