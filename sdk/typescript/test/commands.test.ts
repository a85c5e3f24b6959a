/** Commands: exec, streamed exec, background processes with reconnects, terminals, process lists and signals. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { ConflictError, Sandbox, type ExecEvent, type ProcessEvent } from "sandcell";
import { collect, withSandbox } from "./helpers.js";

/** Whether `e` is the documented answer to a stdin write racing its process's end. */
function endedBeforeConfirmed(e: unknown): boolean {
  return e instanceof ConflictError && e.code === "invalid_state" && e.status === 409;
}

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create({ labels: { suite: "sdk-ts" }, env: { FROM_SANDBOX: "yes" } });
});
after(async () => {
  await sb.kill();
});

test("exec returns output, exit code and cause", async () => {
  const r = await sb.exec("echo out; echo err >&2; exit 3");
  assert.equal(r.stdout, "out\n");
  assert.equal(r.stderr, "err\n");
  assert.equal(r.exitCode, 3);
  assert.equal(r.ok, false);
  assert.equal(r.cause, "exited");
  assert.equal(r.message, "exited with code 3");
  assert.ok(r.durationMs >= 0);
});

test("exec takes env, cwd, stdin and argv", async () => {
  await sb.mkdir("/workspace/sub");
  const r = await sb.exec("echo $FROM_SANDBOX $EXTRA; pwd; cat", { env: { EXTRA: "more" }, cwd: "/workspace/sub", stdin: "fed" });
  assert.equal(r.stdout, "yes more\n/workspace/sub\nfed");
  const argv = await sb.exec(["printf", "%s|", "a b", "$HOME"]);
  assert.equal(argv.stdout, "a b|$HOME|", "argv is not run through a shell");
});

test("exec timeout kills the command and says so", async () => {
  const r = await sb.exec("echo start; sleep 30", { timeout: 0.5 });
  assert.equal(r.cause, "timeout");
  assert.equal(r.timedOut, true);
  assert.equal(r.ok, false);
  assert.equal(r.stdout, "start\n");
  assert.ok(r.durationMs < 10_000);
});

test("execStream yields stdout and stderr in the order written, done last", async () => {
  const script = "for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done; exit 4";
  const events = await collect(sb.execStream(script));
  const last = events.at(-1);
  assert.equal(last?.type, "done");
  assert.ok(last?.type === "done" && last.result.exitCode === 4 && !last.result.ok);
  assert.equal(events.filter((e) => e.type === "done").length, 1);
  const output = events.filter((e): e is Extract<ExecEvent, { data: string }> => e.type !== "done");
  assert.deepEqual(
    output.map((e) => `${e.type}:${e.data}`),
    ["stdout:out1\n", "stderr:err1\n", "stdout:out2\n", "stderr:err2\n", "stdout:out3\n", "stderr:err3\n"],
  );
});

test("execStream delivers chunks before the command ends, and stops when the loop breaks", async () => {
  const started = Date.now();
  for await (const event of sb.execStream("echo first; sleep 20; echo never")) {
    assert.deepEqual(event, { type: "stdout", data: "first\n" });
    break;
  }
  assert.ok(Date.now() - started < 10_000, "the first chunk came long before the command's end");
});

test("a background process: list, stream, reconnect from the offset, output", async () => {
  const proc = await sb.startProcess("for i in $(seq 1 6); do echo line$i; sleep 0.1; done; echo bye >&2");
  assert.ok(proc.pid > 1);
  const listed = await sb.processes();
  assert.ok(listed.some((p) => p.pid === proc.pid && p.background && p.tracked));

  // Read two chunks, drop the connection, come back: nothing repeated, nothing skipped.
  let seen = "";
  for await (const e of proc.stream()) {
    if (e.type === "stdout") seen += e.data;
    if (seen.split("\n").length > 2) break;
  }
  const firstOffset = proc.stdoutOffset ?? 0;
  assert.equal(firstOffset, Buffer.byteLength(seen));
  const rest = await collect(proc.stream());
  for (const e of rest) if (e.type === "stdout") seen += e.data;
  assert.equal(seen, "line1\nline2\nline3\nline4\nline5\nline6\n");
  const done = rest.at(-1);
  assert.ok(done?.type === "done" && done.result.exitCode === 0);

  // A fresh handle (another client, later) reads from any offset, and the whole output.
  const again = sb.process(proc.pid);
  const tail = await collect(again.stream({ stdoutFrom: firstOffset }));
  assert.equal(tail.filter((e) => e.type === "stdout").map((e) => (e as { data: string }).data).join(""), seen.slice(firstOffset));
  const out = await again.output();
  assert.equal(out.stdout, seen);
  assert.equal(out.stderr, "bye\n");
  assert.equal(out.ok, true);
  const fromOffset = await again.output({ stdoutFrom: 6 });
  assert.equal(fromOffset.stdout, seen.slice(6));
});

test("a lost event tells which bytes left a small buffer", async () => {
  const proc = await sb.startProcess("head -c 20000 /dev/zero | tr '\\0' x; echo", { bufferBytes: 4096 });
  await proc.output();
  const events = await collect(proc.stream({ stdoutFrom: 0 }));
  const lost = events.find((e): e is Extract<ProcessEvent, { type: "lost" }> => e.type === "lost");
  assert.ok(lost !== undefined, JSON.stringify(events.map((e) => e.type)));
  assert.equal(lost.channel, "stdout");
  assert.equal(lost.offset, 0);
  assert.ok(lost.bytes > 0);
  const kept = events.filter((e) => e.type === "stdout").reduce((n, e) => n + (e as { bytes: number }).bytes, 0);
  assert.equal(lost.bytes + kept, 20001);
});

test("stdin of a background process, then close", { timeout: 30_000 }, async () => {
  const proc = await sb.startProcess("tr a-z A-Z", { stdin: true });
  await proc.write("hello ");
  await proc.write(new TextEncoder().encode("world\n"));
  await proc.closeStdin();
  const out = await proc.output();
  assert.equal(out.stdout, "HELLO WORLD\n");
  assert.equal(out.exitCode, 0);
});

test("kill a background process with a signal, and killProcess by pid", async () => {
  const proc = await sb.startProcess("sleep 60");
  await proc.kill({ signal: "TERM" });
  const out = await proc.output();
  assert.equal(out.cause, "signaled");
  assert.equal(out.signalName, "SIGTERM");

  const other = await sb.startProcess("sleep 60");
  await sb.killProcess(other.pid, { tree: true });
  assert.equal((await other.output()).signalName, "SIGKILL");
  const listed = await sb.processes();
  assert.ok(listed.some((p) => p.pid === other.pid && p.exited && p.state === "X"));
});

test("a background process on a terminal: size, resize, typed input", { timeout: 30_000 }, async () => {
  const proc = await sb.startProcess("stty size; read line; stty size; echo got:$line", {
    pty: { rows: 20, cols: 70 },
  });
  let screen = "";
  const until = async (text: string): Promise<void> => {
    for await (const e of proc.stream()) {
      if (e.type === "stdout") screen += e.data;
      if (screen.includes(text)) return;
    }
  };
  // Resize only once the first size is printed, so that it is the size the process started with.
  await until("20 70");
  await proc.resize(33, 99);
  // The line ends the process: the write may be refused as too late although it was read.
  await proc.write("typed\n").catch((e: unknown) => {
    if (!endedBeforeConfirmed(e)) throw e;
  });
  const out = await proc.output();
  assert.equal(out.exitCode, 0);
  assert.match(out.stdout, /20 70\r\n/);
  assert.match(out.stdout, /33 99\r\n/);
  assert.match(out.stdout, /got:typed\r\n$/);
});

test("a stdin write that the process answers by exiting is answered at once: done, or ConflictError", {
  timeout: 120_000,
}, async (t) => {
  // A handle whose requests fail after 5 s: a write left unanswered would be a TimeoutError.
  const quick = await Sandbox.get(sb.id, { requestTimeout: 5 });
  const answers = { written: 0, refused: 0 };
  for (let i = 0; i < 20; i++) {
    for (const pty of [undefined, { rows: 20, cols: 70 }]) {
      const proc = await quick.startProcess("read line; echo got:$line", { stdin: true, pty });
      // Writes land at different moments: before the process reads, while it waits in `read`.
      await new Promise((r) => setTimeout(r, (i % 5) * 25));
      const started = Date.now();
      try {
        await proc.write("typed\n");
        answers.written++;
      } catch (e) {
        assert.ok(endedBeforeConfirmed(e), `write ${i} to pid ${proc.pid}: ${String(e)}`);
        assert.match((e as Error).message, new RegExp(`stdin of pid ${proc.pid}`));
        answers.refused++;
      }
      assert.ok(Date.now() - started < 5_000);
      // Either way the process read the line.
      const out = await proc.output();
      assert.match(out.stdout, /got:typed/);
      assert.equal(out.exitCode, 0);
    }
  }
  t.diagnostic(`writes answered 204: ${answers.written}, 409 invalid_state: ${answers.refused}`);
});

test("a terminal over the WebSocket: output, input, resize, exit, and joining again", { timeout: 30_000 }, async () => {
  const term = await sb.openTerminal({ cmd: "bash --norc --noprofile -i", rows: 30, cols: 100 });
  assert.ok(term.pid > 1);
  let screen = "";
  const reading = (async () => {
    for await (const bytes of term) screen += new TextDecoder().decode(bytes);
  })();
  const waitFor = async (text: string): Promise<void> => {
    const deadline = Date.now() + 10_000;
    while (!screen.includes(text)) {
      assert.ok(Date.now() < deadline, `no ${JSON.stringify(text)} on the screen: ${JSON.stringify(screen)}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  term.write("stty size; echo A$((20+22))\n");
  await waitFor("A42");
  assert.match(screen, /30 100/);
  term.resize(40, 120);
  await new Promise((r) => setTimeout(r, 100));
  term.write("stty size\n");
  await waitFor("40 120");

  // Drop the connection: the shell lives on, and a new connection replays and continues.
  term.close();
  await reading;
  assert.equal(await term.wait(), null);
  let replay = "";
  const joined = await sb.attachTerminal(term.pid, { onData: (b) => (replay += new TextDecoder().decode(b)) });
  assert.equal(joined.pid, term.pid);
  joined.write("echo B$((40+2)); exit 7\n");
  const exit = await joined.wait();
  assert.equal(exit?.exitCode, 7);
  assert.equal(exit.ok, false);
  assert.equal(exit.cause, "exited");
  assert.match(replay, /A42/, "the recent output was replayed on joining");
  assert.match(replay, /B42/);

  const doomed = await sb.openTerminal({ cmd: "sleep 60" });
  const ended = doomed.wait();
  await doomed.kill();
  const result = await ended;
  assert.equal(result?.signalName, "SIGKILL");
  assert.equal(result.ok, false);
  assert.ok((await sb.processes()).some((p) => p.pid === doomed.pid && p.exited && p.pty));
});

test("typing `exit 3` as the last keystroke always brings the exit frame", { timeout: 120_000 }, async () => {
  for (let i = 0; i < 20; i++) {
    const term = await sb.openTerminal({ cmd: "bash --norc --noprofile -i", rows: 10, cols: 40 });
    let screen = "";
    const reading = (async () => {
      for await (const bytes of term) screen += new TextDecoder().decode(bytes);
    })();
    // Once the shell has answered, the keystrokes that end it.
    term.write("echo ready$((1+1))\n");
    const deadline = Date.now() + 10_000;
    while (!screen.includes("ready2")) {
      assert.ok(Date.now() < deadline, `terminal ${i}: no prompt: ${JSON.stringify(screen)}`);
      await new Promise((r) => setTimeout(r, 10));
    }
    term.write("exit 3\n");
    const exit = await term.wait();
    assert.ok(exit !== null, `terminal ${i} (pid ${term.pid}) closed without its exit frame`);
    assert.equal(exit.exitCode, 3);
    assert.equal(exit.ok, false);
    await reading;
  }
});

test("openTerminal with env starts the process first, then joins it", { timeout: 30_000 }, async () => {
  let screen = "";
  const term = await sb.openTerminal({
    cmd: "stty size; echo $GREETING from $(pwd); read line; echo got:$line; exit 5",
    env: { GREETING: "hi" },
    cwd: "/tmp",
    rows: 12,
    cols: 34,
    onData: (b) => (screen += new TextDecoder().decode(b)),
  });
  assert.ok(term.pid > 1);
  const deadline = Date.now() + 10_000;
  while (!screen.includes("hi from /tmp")) {
    assert.ok(Date.now() < deadline, `nothing on the screen: ${JSON.stringify(screen)}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  term.write("line\n");
  const exit = await term.wait();
  assert.equal(exit?.exitCode, 5);
  assert.match(screen, /12 34\r\nhi from \/tmp\r\n/);
  assert.match(screen, /got:line/);
});

test("an OOM kill during a shell line is reported", { timeout: 60_000 }, async () => {
  await withSandbox({ limits: { memoryMb: 64 } }, async (small) => {
    const hog = "python3 -c 'x = bytearray(300 * 2**20)'";
    const killed = await small.exec(hog);
    assert.equal(killed.exitCode, 137);
    assert.equal(killed.oomKilled, true);
    assert.equal(killed.cause, "oom_killed");
    assert.equal(killed.ok, false);

    const carriedOn = await small.exec(`${hog}; echo after`);
    assert.equal(carriedOn.exitCode, 0);
    assert.equal(carriedOn.stdout, "after\n");
    assert.equal(carriedOn.oomKilled, true, "the kill is reported although the shell line went on");
    assert.equal(carriedOn.ok, true);

    const fine = await small.exec("echo fine");
    assert.equal(fine.oomKilled, false);
    assert.equal(fine.cause, "exited");
  });
});
