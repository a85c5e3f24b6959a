/** Errors: API error codes become error classes; transport failures become ConnectionError and TimeoutError. */

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { test } from "node:test";

import {
  AuthenticationError,
  ConflictError,
  ConnectionError,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  SandboxGoneError,
  SandcellError,
  TimeoutError,
  system,
} from "sandcell";
import { daemonEnv } from "./helpers.js";

test("404: an unknown sandbox is NotFoundError with the API's code and message", async () => {
  const err = await Sandbox.get("sb-000000000000").catch((e: unknown) => e);
  assert.ok(err instanceof NotFoundError);
  assert.ok(err instanceof SandcellError);
  assert.equal(err.name, "NotFoundError");
  assert.equal(err.status, 404);
  assert.equal(err.code, "not_found");
  assert.match(err.message, /sb-000000000000/);
  assert.match(err.requestId ?? "", /\S/);
});

test("400: a malformed request is InvalidArgumentError", async () => {
  const badSize = await Sandbox.create({ size: "huge" as "nano" }).catch((e: unknown) => e);
  assert.ok(badSize instanceof InvalidArgumentError);
  assert.equal(badSize.status, 400);
  assert.equal(badSize.code, "invalid_argument");
  assert.match(badSize.message, /huge/);
  await assert.rejects(Sandbox.get("not-an-id"), InvalidArgumentError);
  await assert.rejects(Sandbox.create({ snapshotId: "sn-0000000000000000", template: "python" }), InvalidArgumentError);
});

test("401: a bad key is AuthenticationError, and says where the key came from", async () => {
  const { url } = daemonEnv();
  const err = await system({ apiUrl: url, apiKey: "sk-not-a-real-key" }).catch((e: unknown) => e);
  assert.ok(err instanceof AuthenticationError);
  assert.equal(err.status, 401);
  assert.equal(err.code, "unauthenticated");
  assert.match(err.message, /the key was taken from the apiKey option$/);
});

test("409: a stopped sandbox is SandboxGoneError; a conflict is ConflictError", async () => {
  const sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
  await sb.writeFile("a.txt", "a");
  await sb.writeFile("b.txt", "b");
  const conflict = await sb.rename("a.txt", "b.txt").catch((e: unknown) => e);
  assert.ok(conflict instanceof ConflictError);
  assert.equal(conflict.code, "already_exists");
  await sb.kill();
  const gone = await sb.exec("true").catch((e: unknown) => e);
  assert.ok(gone instanceof SandboxGoneError);
  assert.equal(gone.status, 409);
  assert.match(gone.message, /stopped/);
});

test("connection refused is ConnectionError", async () => {
  // A port that was free a moment ago: nothing listens there.
  const port = await new Promise<number>((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0));
    });
  });
  const err = await Sandbox.create({ apiUrl: `http://127.0.0.1:${port}`, apiKey: "k" }).catch((e: unknown) => e);
  assert.ok(err instanceof ConnectionError);
  assert.equal(err.code, "connection_failed");
  assert.match(err.message, new RegExp(`127\\.0\\.0\\.1:${port}.*ECONNREFUSED`));
  assert.equal(err.status, undefined);
});

test("a request past its deadline is TimeoutError", async () => {
  await assert.rejects(system({ requestTimeout: 0.000001 }), (e: unknown) => e instanceof TimeoutError && e.code === "timeout");
});

test("a caller's abort signal cancels a stream as an abort, not a connection error", async () => {
  const sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
  try {
    const controller = new AbortController();
    const seen: string[] = [];
    const reading = (async () => {
      for await (const event of sb.execStream("echo one; sleep 20", { signal: controller.signal })) {
        if (event.type === "stdout") seen.push(event.data);
        controller.abort();
      }
    })();
    await assert.rejects(reading, (e: unknown) => (e as Error).name === "AbortError");
    assert.deepEqual(seen, ["one\n"]);
  } finally {
    await sb.kill();
  }
});
