/**
 * Template builds through the SDK against the shared daemon, on a base of its own: a busybox
 * root filesystem imported into the daemon's home as `tiny:v1` (`sandcell image import`).
 * A build whose context folder the SDK packs (its Dockerfile read from the folder) succeeds,
 * its log streams `output` and ends with `finished`, its info has step reports, and an
 * identical build is all cached; a sandbox on the template sees the copied file and the
 * `ENV`, and the template cannot be deleted while it runs; a failing `RUN` is a
 * `BuildError` with its exit code; a bad Dockerfile an `InvalidArgumentError` naming
 * the line; a build cancelled in a long `RUN` ends `cancelled`. Builds run steps in a private
 * id range: the tests are skipped (visibly) unless they run as root with /bin/busybox.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  BuildError,
  ConflictError,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  SandcellError,
  Template,
  type BuildEvent,
} from "sandcell";
import { binaryPath } from "./daemon.js";
import { collect, daemonEnv } from "./helpers.js";

const BUSYBOX = "/bin/busybox";
const SKIP =
  process.getuid?.() !== 0
    ? "template builds map a private id range: they need root"
    : !existsSync(BUSYBOX)
      ? `${BUSYBOX} is missing (scripts/setup.sh installs busybox-static)`
      : false;

const BASE = "tiny:v1";
const APP = "sdk-ts-app:v1";
const TOOLS = ["sh", "echo", "cat", "ls", "id", "rm", "mkdir", "sleep"];
const DOCKERFILE = `FROM ${BASE}
COPY hello.txt /app/hello.txt
RUN echo building step output && mkdir -p /app/made && echo made in a step > /app/made/file
ENV GREETING=hi-from-env
`;

let dir = "";
/** The build context: a folder with a file to copy and the Dockerfile. */
let context = "";

before(() => {
  if (SKIP !== false) return;
  dir = mkdtempSync(join(tmpdir(), "sandcell-ts-templates-"));
  // A root filesystem with busybox as its whole system.
  const root = join(dir, "rootfs");
  mkdirSync(join(root, "usr/bin"), { recursive: true });
  mkdirSync(join(root, "etc"));
  copyFileSync(BUSYBOX, join(root, "usr/bin/busybox"));
  for (const tool of TOOLS) symlinkSync("busybox", join(root, "usr/bin", tool));
  symlinkSync("usr/bin", join(root, "bin"));
  writeFileSync(join(root, "etc/os-release"), "ID=tiny\n");
  const tarball = join(dir, "tiny.tar");
  execFileSync("tar", ["-C", root, "-cf", tarball, "."]);
  const { home } = daemonEnv();
  // Into the running daemon's store (the CLI and the daemon share it under a file lock).
  execFileSync(binaryPath(), ["image", "import", tarball, "--as", BASE, "--home", home], { stdio: "pipe" });
  // A build step runs as root of a private id range, which cannot pass through a home only
  // the real root may enter (mkdtemp makes it 0700): every step would fail with "bind the
  // step's root failed: Permission denied". Homes the daemon uses in earnest are 0755.
  chmodSync(home, 0o755);

  context = join(dir, "ctx");
  mkdirSync(context);
  writeFileSync(join(context, "hello.txt"), "hello from the context\n");
  writeFileSync(join(context, "Dockerfile"), DOCKERFILE);
});

after(async () => {
  if (SKIP !== false) return;
  for (const name of [APP, "sdk-ts-fails", "sdk-ts-slow"]) await Template.delete(name).catch(() => undefined);
  rmSync(dir, { recursive: true, force: true });
});

/** The events are numbered from 1 without a gap, and the last is `finished`. */
function contiguous(events: BuildEvent[]): void {
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1));
  for (const e of events) assert.equal(e.data["event"], e.type);
  assert.equal(events[events.length - 1]?.type, "finished");
}

test("a build from a context folder succeeds; its log streams; an identical build is all cached", { skip: SKIP, timeout: 180_000 }, async () => {
  // No dockerfile given: the context's own Dockerfile.
  const build = await Template.build(APP, { context });
  assert.match(build.id, /^bld-[0-9a-f]{12}$/);
  assert.equal(build.name, APP);
  assert.ok(["queued", "running"].includes(build.lastInfo.state), build.lastInfo.state);
  assert.equal(build.lastInfo.done, false);

  // Followed live to its end.
  const events = await collect(build.logs());
  contiguous(events);
  const kinds = events.map((e) => e.type);
  assert.equal(kinds[0], "base", kinds.join(" "));
  assert.ok(kinds.includes("step_started") && kinds.includes("step_finished"), kinds.join(" "));
  const base = events[0]!;
  assert.ok(base.type === "base" && base.name === BASE && base.digest.startsWith("sha256:"), JSON.stringify(base.data));
  const output = events.flatMap((e) => (e.type === "output" ? [e.text] : [])).join("");
  assert.match(output, /building step output/);
  const finished = events[events.length - 1]!;
  assert.ok(finished.type === "finished" && finished.state === "succeeded" && finished.error === null, JSON.stringify(finished.data));

  const info = await build.wait({ timeout: 60 });
  assert.equal(info, build.lastInfo);
  assert.deepEqual([info.state, info.ok, info.done, info.exitCode, info.error], ["succeeded", true, true, null, null]);
  assert.ok(info.finishedAt instanceof Date && info.createdAt instanceof Date);
  // Two steps (COPY, RUN; ENV changes only the configuration), each reported.
  assert.equal(info.steps, 2);
  assert.equal(info.stepReports.length, 2);
  const [copy, run] = info.stepReports;
  assert.deepEqual([copy!.index, copy!.line, copy!.cached], [1, 2, false]);
  assert.match(copy!.text, /^COPY hello\.txt/);
  assert.deepEqual([run!.index, run!.line, run!.exitCode, run!.cached], [2, 3, 0, false]);
  assert.match(run!.layer ?? "", /^sha256:/);
  assert.ok(run!.durationMs >= 0 && run!.size > 0);
  const image = info.image;
  assert.ok(image !== null);
  assert.equal(image.reference, APP);
  assert.match(image.digest, /^sha256:/);
  assert.equal(image.layers, 3); // the base's and the two steps'
  // The step_finished events carry the same reports.
  assert.deepEqual(events.flatMap((e) => (e.type === "step_finished" ? [e.step] : [])), info.stepReports);

  // The stored log, whole and from an event on; the build found again and listed.
  assert.deepEqual(await build.listLogs(), events);
  assert.deepEqual(await build.listLogs({ after: 2 }), events.slice(2));
  assert.deepEqual(await collect(Template.logs(build.id, { after: 2 })), events.slice(2));
  const again = await Template.getBuild(build.id);
  assert.deepEqual(again.lastInfo, info);
  assert.deepEqual(await Template.waitForBuild(build.id), info);
  assert.deepEqual(await again.info(), info);
  assert.ok((await Template.listBuilds()).some((b) => b.id === build.id));

  // The same build again: every step from the cache, the same image.
  const cached = await Template.build(APP, { context, wait: true });
  assert.notEqual(cached.id, build.id);
  assert.equal(cached.lastInfo.state, "succeeded");
  assert.deepEqual(cached.lastInfo.stepReports.map((s) => s.cached), [true, true]);
  assert.equal(cached.lastInfo.image?.digest, image.digest);
  assert.deepEqual(await cached.wait(), cached.lastInfo);
  // Newest first.
  assert.deepEqual((await Template.listBuilds()).slice(0, 2).map((b) => b.id), [cached.id, build.id]);
});

test("a sandbox on the template sees its files and ENV; the template is not deleted while it runs", { skip: SKIP, timeout: 120_000 }, async () => {
  const listed = await Template.list();
  assert.ok(listed.some((t) => t.name === BASE), listed.map((t) => t.name).join(" "));
  const template = listed.find((t) => t.name === APP);
  assert.ok(template !== undefined, `${APP} is not listed (did the first test build it?)`);
  assert.deepEqual(await Template.get(APP), template);
  assert.equal(template.env["GREETING"], "hi-from-env");
  assert.equal(template.layers, 3);
  assert.equal(template.sandboxes, 0);
  assert.match(template.digest, /^sha256:/);

  const sb = await Sandbox.create({ template: APP, labels: { suite: "sdk-ts" } });
  try {
    assert.equal(sb.info.template, APP);
    const out = await sb.exec("cat /app/hello.txt /app/made/file; echo $GREETING; cat /etc/os-release");
    assert.equal(out.exitCode, 0, out.stderr);
    assert.equal(out.stdout, "hello from the context\nmade in a step\nhi-from-env\nID=tiny\n");
    assert.equal((await Template.get(APP)).sandboxes, 1);
    const refused = await Template.delete(APP).catch((e: unknown) => e);
    assert.ok(refused instanceof ConflictError, String(refused));
    assert.deepEqual([refused.status, refused.code], [409, "invalid_state"]);
    assert.match(refused.message, /running sandbox/);
  } finally {
    await sb.kill();
  }
  await Template.delete(APP);
  await assert.rejects(Template.get(APP), NotFoundError);
  await assert.rejects(Template.delete(APP), NotFoundError);
});

test("a failing RUN step is a BuildError with its exit code", { skip: SKIP, timeout: 120_000 }, async () => {
  const build = await Template.build("sdk-ts-fails", { dockerfile: `FROM ${BASE}\nRUN echo about to fail && exit 3\n` });
  const err = await build.wait().catch((e: unknown) => e);
  assert.ok(err instanceof BuildError, String(err));
  assert.ok(err instanceof SandcellError);
  assert.equal(err.name, "BuildError");
  assert.deepEqual([err.code, err.state, err.exitCode, err.buildId, err.status], ["build_failed", "failed", 3, build.id, undefined]);
  assert.match(err.message, new RegExp(`${build.id} of sdk-ts-fails failed at step 1/1 \\(line 2: RUN echo about to fail && exit 3\\) with exit code 3: `));
  assert.equal(err.info, build.lastInfo);
  assert.deepEqual([err.step?.index, err.step?.line, err.step?.exitCode], [1, 2, 3]);
  assert.equal(err.error, build.lastInfo.error);
  assert.match(err.error ?? "", /exit code 3/);
  assert.deepEqual([build.lastInfo.state, build.lastInfo.ok, build.lastInfo.image], ["failed", false, null]);
  assert.equal(build.lastInfo.stepReports.at(-1)?.exitCode, 3);
  // Its log has the step's output, and ends `failed`.
  const events = await build.listLogs();
  contiguous(events);
  assert.ok(events.some((e) => e.type === "output" && e.text.includes("about to fail")));
  const last = events[events.length - 1]!;
  assert.ok(last.type === "finished" && last.state === "failed", JSON.stringify(last.data));
  // By id as well; and a build that waited in the request is thrown by wait() at once.
  await assert.rejects(Template.waitForBuild(build.id), (e: unknown) => e instanceof BuildError && e.exitCode === 3);
  const waited = await Template.build("sdk-ts-fails", { dockerfile: `FROM ${BASE}\nRUN exit 3\n`, wait: true });
  assert.deepEqual([waited.lastInfo.state, waited.lastInfo.exitCode], ["failed", 3]);
  await assert.rejects(waited.wait(), (e: unknown) => e instanceof BuildError && e.exitCode === 3);
  await assert.rejects(Template.get("sdk-ts-fails"), NotFoundError);
});

test("a bad Dockerfile is an InvalidArgumentError naming its line; no Dockerfile at all, a TypeError", { skip: SKIP }, async () => {
  const err = await Template.build("sdk-ts-bad", { dockerfile: `FROM ${BASE}\nONBUILD RUN echo x\n` }).catch((e: unknown) => e);
  assert.ok(err instanceof InvalidArgumentError, String(err));
  assert.deepEqual([err.status, err.code], [400, "invalid_argument"]);
  assert.match(err.message, /line 2/);
  await assert.rejects(Template.build("Bad Name", { dockerfile: `FROM ${BASE}\n` }), InvalidArgumentError);
  // Caught before anything is sent.
  await assert.rejects(Template.build("sdk-ts-bad"), TypeError);
  await assert.rejects(Template.build("sdk-ts-bad", { context: join(dir, "rootfs") }), /Dockerfile/);
  await assert.rejects(Template.build("sdk-ts-bad", { dockerfile: `FROM ${BASE}\n`, context: join(dir, "missing") }), /ENOENT/);
});

test("a build cancelled in a long RUN step ends cancelled", { skip: SKIP, timeout: 120_000 }, async () => {
  const build = await Template.build("sdk-ts-slow", { dockerfile: `FROM ${BASE}\nRUN echo sleeping && sleep 60\n` });
  // Followed until its step has started and printed (leaving the loop leaves the build running).
  for await (const e of build.logs()) if (e.type === "output") break;
  assert.equal((await build.info()).state, "running");
  const started = Date.now();
  const info = await build.cancel();
  assert.ok(Date.now() - started < 20_000, `the cancel took ${Date.now() - started} ms`);
  assert.deepEqual([info.state, info.ok, info.done, info.image], ["cancelled", false, true, null]);
  assert.equal(build.lastInfo, info);
  const err = await build.wait().catch((e: unknown) => e);
  assert.ok(err instanceof BuildError, String(err));
  assert.deepEqual([err.code, err.state, err.step], ["build_cancelled", "cancelled", null]);
  assert.match(err.message, /was cancelled/);
  const events = await collect(build.logs());
  contiguous(events);
  const last = events[events.length - 1]!;
  assert.ok(last.type === "finished" && last.state === "cancelled", JSON.stringify(last.data));
  // Cancelling again answers the build as it ended.
  assert.equal((await Template.cancelBuild(build.id)).state, "cancelled");
  await assert.rejects(Template.get("sdk-ts-slow"), NotFoundError);
});
