/** `sb.commands` and `sb.files`: E2B's names over the SDK's own methods; and `exec` with output callbacks, which `commands.run` uses. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { BackgroundProcess, ConflictError, NotFoundError, Sandbox } from "sandcell";

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create({ labels: { suite: "sdk-ts" } });
});
after(async () => {
  await sb.kill();
});

const INTERLEAVED = "for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done; exit 4";

test("exec with onStdout / onStderr gets the output as it comes, and the same result", async () => {
  const seen: string[] = [];
  const r = await sb.exec(INTERLEAVED, {
    onStdout: (t) => seen.push(`out:${t}`),
    onStderr: (t) => seen.push(`err:${t}`),
  });
  assert.deepEqual(seen, ["out:out1\n", "err:err1\n", "out:out2\n", "err:err2\n", "out:out3\n", "err:err3\n"]);
  assert.equal(r.stdout, "out1\nout2\nout3\n");
  assert.equal(r.stderr, "err1\nerr2\nerr3\n");
  assert.equal(r.exitCode, 4);
  assert.equal(r.ok, false);
  assert.equal(r.cause, "exited");
  assert.equal(r.message, "exited with code 4");
  const plain = await sb.exec(INTERLEAVED);
  assert.deepEqual([plain.stdout, plain.stderr, plain.exitCode, plain.cause], [r.stdout, r.stderr, 4, r.cause]);
});

test("commands.run: foreground with envs, cwd, timeout and callbacks; a failure is a result", async () => {
  const out: string[] = [];
  const r = await sb.commands.run("echo $A in $(pwd)", { envs: { A: "a" }, cwd: "/tmp", timeout: 30, onStdout: (t) => out.push(t) });
  assert.equal(r.ok, true);
  assert.equal(r.stdout, "a in /tmp\n");
  assert.deepEqual(out, [r.stdout]);

  const failed = await sb.commands.run(["sh", "-c", "echo bad >&2; exit 5"], { onStderr: (t) => out.push(t) });
  assert.equal(failed.exitCode, 5);
  assert.equal(failed.ok, false);
  assert.equal(out.at(-1), "bad\n");
  assert.equal((await sb.commands.run("sleep 5", { timeout: 0.3 })).cause, "timeout");
  assert.equal((await sb.commands.run("echo plain")).stdout, "plain\n");
});

test("commands.run in the background, list, connect, sendStdin, kill", async () => {
  const job = await sb.commands.run("echo $B; sleep 60", { background: true, envs: { B: "bg" }, cwd: "/tmp" });
  assert.ok(job instanceof BackgroundProcess);
  assert.ok(job.pid > 1);
  const listed = await sb.commands.list();
  const mine = listed.find((p) => p.pid === job.pid);
  assert.ok(mine !== undefined && !mine.exited && mine.cmdline.includes("sleep 60"), JSON.stringify(mine));

  for await (const event of sb.commands.connect(job.pid).stream()) {
    assert.deepEqual(event.type === "stdout" && event.data, "bg\n");
    break;
  }
  assert.equal(await sb.commands.kill(job.pid), true);
  assert.equal((await job.output()).signalName, "SIGKILL");
  assert.equal(await sb.commands.kill(job.pid), false, "ended: nothing to kill");
  assert.equal(await sb.commands.kill(99999, { signal: "TERM" }), false);

  const fed = await sb.commands.run("tr a-z A-Z", { background: true, stdin: true });
  await sb.commands.sendStdin(fed.pid, "shout\n");
  await fed.closeStdin();
  assert.equal((await sb.commands.connect(fed.pid).output()).stdout, "SHOUT\n");

  await assert.rejects(
    sb.commands.run("true", { background: true as boolean, onStdout: () => undefined }),
    (e: unknown) => e instanceof TypeError && /process\.stream/.test(e.message),
  );
});

test("files: write, read (text and bytes), list, getInfo, makeDir, rename, exists, remove", async () => {
  const info = await sb.files.write("ns/a.txt", "héllo");
  assert.equal(info.path, "/workspace/ns/a.txt");
  assert.equal(info.size, Buffer.byteLength("héllo"));
  assert.equal((await sb.files.write("ns/a.txt", "!", { append: true })).size, info.size + 1);
  assert.equal(await sb.files.read("ns/a.txt"), "héllo!");
  assert.equal(await sb.files.read("ns/a.txt", { format: "text" }), "héllo!");
  await sb.files.write("/tmp/b.bin", new Uint8Array([0, 255]), { mode: 0o600 });
  assert.deepEqual(await sb.files.read("/tmp/b.bin", { format: "bytes" }), new Uint8Array([0, 255]));
  assert.equal((await sb.files.getInfo("/tmp/b.bin")).mode & 0o777, 0o600);

  assert.equal((await sb.files.makeDir("ns/sub/deeper")).isDir, true);
  assert.equal((await sb.files.makeDir("ns/sub")).isDir, true, "already there: fine");
  assert.deepEqual((await sb.files.list("ns")).map((e) => e.name).sort(), ["a.txt", "sub"]);
  assert.ok((await sb.files.list()).some((e) => e.name === "ns"), "list() lists /workspace");

  assert.equal((await sb.files.rename("ns/a.txt", "ns/sub/c.txt")).path, "/workspace/ns/sub/c.txt");
  assert.equal(await sb.files.exists("ns/a.txt"), false);
  assert.equal(await sb.files.exists("ns/sub/c.txt"), true);
  await assert.rejects(sb.files.remove("ns"), ConflictError);
  await sb.files.remove("ns/sub/c.txt");
  await sb.files.remove("ns", { recursive: true });
  assert.equal(await sb.files.exists("ns"), false);
  await assert.rejects(sb.files.read("ns/sub/c.txt"), NotFoundError);
  await assert.rejects(sb.files.getInfo("ns"), NotFoundError);

  // The namespace only hands over: what one writes, the other reads.
  await sb.writeFile("same.txt", "x");
  assert.equal(await sb.files.read("same.txt"), await sb.readFile("same.txt"));
});
