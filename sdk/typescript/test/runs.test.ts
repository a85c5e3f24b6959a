/**
 * Agent runs through the SDK against real daemons whose runs ask the test kit's scripted model
 * (a model and a daemon per test, each with the script the test needs): a run answers, with
 * its usage; its trajectory streams, resumes, reads whole, and is followed again across a
 * connection cut in the middle; a run stuck in a slow model call is cancelled; a wait follows
 * the run's events (it sees an end it was not told of at once, with one stream and no polling,
 * and keeps its deadline and signal; a run that has ended returns at once; a daemon without the
 * run's live events is asked instead); a kept sandbox holds the run's state and takes another
 * run; a run with a validation command is sent back to work by a failed check and ends
 * `validated` once it passes, or `validation_failed` when its attempts are spent; errors map as
 * everywhere else.
 */

import assert from "node:assert/strict";
import { createServer as createHttpServer } from "node:http";
import { createServer, connect, type Socket } from "node:net";
import { test } from "node:test";

import { InvalidArgumentError, NotFoundError, Run, TimeoutError, type ClientOptions, type RunEvent, type Validate } from "sandcell";
import { collect, withAgent } from "./helpers.js";

const MODEL = "openai/test-model";
const TASK = "Set x to 21 in Python, then print x * 2.";

/** A model turn that calls the `execute_code` tool. */
function code(source: string): unknown {
  return { tool_calls: [{ name: "execute_code", arguments: { code: source } }] };
}

/** Set x, double it (the kernel keeps x), answer. */
const DOUBLING = [code("x = 21"), code("print(x * 2)"), { text: "the answer is 42" }];

/** The events are numbered from `first` without a gap, and the last is `run_finished`. */
function contiguous(events: RunEvent[], first = 1): void {
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => first + i));
  for (const e of events) assert.equal(e.data["type"], e.type);
  assert.equal(events[events.length - 1]?.type, "run_finished");
}

function toolTexts(events: RunEvent[]): string[] {
  return events.filter((e) => e.type === "tool_result").map((e) => String(e.data["text"]));
}

test("a run answers with its usage; its trajectory streams, resumes and reads whole", { timeout: 180_000 }, async () => {
  await withAgent(DOUBLING, async (client, model) => {
    const run = await Run.start(TASK, { ...client, model: MODEL, budgets: { maxIterations: 5, timeoutSecs: 120 } });
    assert.match(run.id, /^run-/);
    assert.equal(run.info.status, "running");
    assert.equal(run.info.done, false);
    assert.deepEqual([run.info.task, run.info.model, run.info.mode], [TASK, MODEL, "tools"]);

    const info = await run.wait({ timeout: 120 });
    assert.equal(info, run.info);
    assert.deepEqual([info.status, info.reason, info.answer], ["succeeded", "text", "the answer is 42"]);
    assert.ok(info.ok && info.done && info.endedAt instanceof Date && info.sandboxId !== null);
    // Every scripted answer counts 100 input and 10 output tokens.
    const u = info.usage;
    assert.deepEqual([u.inputTokens, u.outputTokens, u.llmCalls, u.toolCalls, u.steps, u.subCalls], [300, 30, 3, 2, 2, 0]);
    assert.equal(u.estimated, false);
    // The limits asked for, and the daemon's defaults for the others.
    assert.deepEqual([info.budgets.maxIterations, info.budgets.timeoutSecs, info.budgets.maxDepth, info.budgets.tokenBudget], [5, 120, 4, null]);
    assert.equal(model.requests().length, 3);

    // The trajectory: every event once, in order, run_finished last; the kernel kept x.
    const events = await collect(run.events());
    contiguous(events);
    assert.equal(events[0]!.type, "run_started");
    assert.equal(events[0]!.data["task"], TASK);
    const finished = events[events.length - 1]!.data;
    assert.deepEqual([finished["status"], finished["answer"]], ["succeeded", "the answer is 42"]);
    assert.equal((finished["usage"] as { input_tokens: number }).input_tokens, 300);
    assert.match(toolTexts(events).at(-1)!, /42/);
    // Resumed after event 3: the same events from 4; and read whole, at once.
    const resumed = await collect(run.events({ after: 3 }));
    contiguous(resumed, 4);
    assert.deepEqual(resumed, events.slice(3));
    assert.deepEqual(await run.listEvents(), events);
    assert.deepEqual(await run.listEvents({ after: 3 }), events.slice(3));

    // Found again, and listed.
    const again = await Run.get(run.id, client);
    assert.deepEqual(again.info, info);
    const listed = await Run.list({ ...client, limit: 10 });
    assert.ok(listed.some((r) => r.id === run.id));
    // The sandbox it made is deleted with its end (nobody asked to keep it).
    const sb = await again.sandbox();
    assert.ok(["stopped", "deleted"].includes(sb.info.state), sb.info.state);
  });
});

/**
 * A TCP proxy on 127.0.0.1 in front of the daemon that cuts the first answer to an events
 * request after `cut` bytes (in the middle of the stream), and records what the client sent
 * on each connection.
 */
async function cuttingProxy(upstream: string, cut: number): Promise<{ url: string; sent: Buffer[][]; close(): Promise<void> }> {
  const target = new URL(upstream);
  const sent: Buffer[][] = [];
  const sockets: Socket[] = [];
  let cutDone = false;
  const server = createServer((client) => {
    const record: Buffer[] = [];
    sent.push(record);
    const up = connect(Number(target.port), target.hostname);
    sockets.push(client, up);
    // Armed once this connection carries the first events request: what the daemon sends
    // after it is that request's answer (HTTP/1.1 answers in order).
    let budget = Infinity;
    client.on("data", (c: Buffer) => {
      record.push(c);
      if (!cutDone && budget === Infinity && c.toString("latin1").includes("/events")) budget = cut;
      up.write(c);
    });
    up.on("data", (c: Buffer) => {
      if (budget <= 0) return;
      const piece = c.subarray(0, budget);
      budget -= piece.length;
      if (budget > 0) {
        client.write(piece);
        return;
      }
      // The cut: what was let through is delivered, then the connection ends.
      cutDone = true;
      client.end(piece);
      up.destroy();
    });
    up.on("end", () => client.end());
    client.on("end", () => up.end());
    up.on("error", () => client.destroy());
    client.on("error", () => up.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  return {
    url: `http://127.0.0.1:${address.port}`,
    sent,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

test("a dropped event stream is followed again from the last event", { timeout: 180_000 }, async () => {
  await withAgent(DOUBLING, async (client) => {
    const info = await Run.run(TASK, { ...client, model: MODEL, timeout: 120 });
    assert.equal(info.status, "succeeded");
    const expected = await (await Run.get(info.id, client)).listEvents();
    contiguous(expected);
    // The whole answer's size, to cut it in the middle.
    const whole = await fetch(`${client.apiUrl}/v1/runs/${info.id}/events`, { headers: { "x-api-key": client.apiKey! } });
    const size = (await whole.arrayBuffer()).byteLength;

    const proxy = await cuttingProxy(client.apiUrl!, Math.floor(size / 2));
    try {
      const through = await Run.get(info.id, { ...client, apiUrl: proxy.url });
      assert.deepEqual(await collect(through.events()), expected); // nothing twice, nothing lost
    } finally {
      await proxy.close();
    }
    const streams = proxy.sent
      .map((chunks) => Buffer.concat(chunks).toString("latin1").toLowerCase())
      .flatMap((text) => text.split(/(?=get \/v1\/runs\/)/))
      .filter((request) => request.startsWith("get ") && request.includes("/events"));
    // Two requests (connections may be opened in any order): the first from the start, the
    // second for what came after the last whole event of the first.
    assert.equal(streams.length, 2, streams.join("\n---\n"));
    const resumes = streams.filter((r) => r.includes("last-event-id"));
    assert.equal(resumes.length, 1, streams.join("\n---\n"));
    const resumedAfter = Number(/last-event-id: (\d+)\r\n/.exec(resumes[0]!)?.[1]);
    assert.ok(resumedAfter >= 1 && resumedAfter < expected.length, String(resumedAfter));
  });
});

test("a run stuck in a slow model call is cancelled at once", { timeout: 180_000 }, async () => {
  await withAgent([{ slow: { delay_ms: 30_000, then: { text: "too late" } } }], async (client) => {
    const run = await Run.start("Wait for it.", { ...client, model: MODEL, budgets: { timeoutSecs: 120 } });
    const deadline = Date.now() + 60_000;
    while (!(await run.listEvents()).some((e) => e.type === "llm_request")) {
      assert.ok(Date.now() < deadline, "no llm_request within 60 s");
      await new Promise((r) => setTimeout(r, 50));
    }
    // Still running: a wait with a deadline gives up, and the run goes on.
    await assert.rejects(run.wait({ timeout: 0.3 }), TimeoutError);
    assert.equal((await run.refresh()).status, "running");

    const asked = Date.now();
    const ended = await run.cancel();
    assert.ok(Date.now() - asked < 5_000, `${Date.now() - asked} ms`);
    assert.deepEqual([ended.status, ended.reason, ended.ok], ["cancelled", "cancelled", false]);
    assert.equal(run.info, ended);
    assert.equal((await run.wait()).status, "cancelled");
    const events = await collect(run.events());
    contiguous(events);
    assert.equal(events[events.length - 1]!.data["status"], "cancelled");
    // Cancelling a run that has ended answers it as it is.
    assert.equal((await run.cancel()).status, "cancelled");
  });
});

/** A model call that takes longer than any test: the run stays in it, sending no event, until it is cancelled. */
const STUCK = [{ slow: { delay_ms: 60_000, then: { text: "too late" } } }];

/** A run started and waited for until it is in its (slow) model call. */
async function stuckInModelCall(client: ClientOptions): Promise<Run> {
  const run = await Run.start("Wait for it.", { ...client, model: MODEL, budgets: { timeoutSecs: 120 } });
  const deadline = Date.now() + 60_000;
  while (!(await run.listEvents()).some((e) => e.type === "llm_request")) {
    assert.ok(Date.now() < deadline, "no llm_request within 60 s");
    await new Promise((r) => setTimeout(r, 50));
  }
  return run;
}

/** The requests of run `id` that went through a proxy, as `METHOD path?query`. */
function runRequests(sent: Buffer[][], id: string): string[] {
  const pattern = new RegExp(`(GET|POST) (/v1/runs/${id}[^ ]*) HTTP/1.1`, "g");
  return sent.flatMap((chunks) => [...Buffer.concat(chunks).toString("latin1").matchAll(pattern)].map((m) => `${m[1]} ${m[2]}`));
}

test("a wait follows the events: it sees an end it was not told of at once, and keeps its deadline", { timeout: 180_000 }, async () => {
  await withAgent(STUCK, async (client) => {
    const run = await stuckInModelCall(client);
    // The waiting handle's requests go through a proxy that records them (and never cuts).
    const proxy = await cuttingProxy(client.apiUrl!, Infinity);
    try {
      const waiting = await Run.get(run.id, { ...client, apiUrl: proxy.url });
      // No event comes while the model thinks: the deadline is kept all the same, and so is a signal.
      let asked = Date.now();
      await assert.rejects(waiting.wait({ timeout: 0.3 }), (e: unknown) => e instanceof TimeoutError && e.code === "timeout");
      assert.ok(Date.now() - asked >= 290 && Date.now() - asked < 1_500, `${Date.now() - asked} ms`);
      const stop = new AbortController();
      setTimeout(() => stop.abort(new Error("enough")), 200);
      asked = Date.now();
      await assert.rejects(waiting.wait({ signal: stop.signal }), /enough/);
      assert.ok(Date.now() - asked < 1_500, `${Date.now() - asked} ms`);
      assert.equal(waiting.info.status, "running");
      const seen = (await run.listEvents()).length;

      let returned = 0;
      const done = waiting.wait({ timeout: 60 }).then((info) => {
        returned = Date.now();
        return info;
      });
      // Long enough for a poller to be asking once a second by now.
      await new Promise((r) => setTimeout(r, 2_500));
      assert.equal(returned, 0);
      // Ended through another handle: the waiting one is not told, it must see it.
      const ended = await (await Run.get(run.id, client)).cancel();
      const cancelled = Date.now();
      const info = await done;
      assert.ok(returned - cancelled < 250, `${returned - cancelled} ms after the end`);
      assert.equal(info, waiting.info);
      assert.deepEqual([info.status, info.reason, info.endedAt], [ended.status, ended.reason, ended.endedAt]);

      // One stream a wait, the last from the last event seen; the record read at the start and
      // once at the end: a poller would have read it every second.
      const requests = runRequests(proxy.sent, run.id);
      const path = `/v1/runs/${run.id}`;
      const streams = requests.filter((r) => r.startsWith(`GET ${path}/events`));
      assert.equal(streams.length, 3, requests.join("\n"));
      assert.ok(streams.includes(`GET ${path}/events`) && streams.includes(`GET ${path}/events?after=${seen}`), requests.join("\n"));
      assert.deepEqual(requests.filter((r) => !streams.includes(r)), [`GET ${path}`, `GET ${path}`], requests.join("\n"));
    } finally {
      await proxy.close();
    }
  });
});

test("a wait on a run that has ended returns at once", { timeout: 180_000 }, async () => {
  await withAgent(DOUBLING, async (client) => {
    const run = await Run.start(TASK, { ...client, model: MODEL });
    assert.equal((await (await Run.get(run.id, client)).wait({ timeout: 120 })).status, "succeeded");
    // A handle that knows it has ended answers without asking, whatever the timeout.
    const ended = await Run.get(run.id, client);
    let asked = Date.now();
    assert.equal(await ended.wait({ timeout: 0 }), ended.info);
    assert.ok(Date.now() - asked < 100, `${Date.now() - asked} ms`);
    // A handle that still says `running` finds the end in the stored events at once.
    assert.equal(run.info.status, "running");
    asked = Date.now();
    const info = await run.wait({ timeout: 10 });
    assert.ok(Date.now() - asked < 1_000, `${Date.now() - asked} ms`);
    assert.deepEqual([info.status, info.answer], ["succeeded", "the answer is 42"]);
  });
});

/**
 * An HTTP proxy on 127.0.0.1 in front of the daemon that answers every events stream with one
 * that ends at once, as a daemon does for a run that goes on in another process (it has none
 * of its live events), and passes every other request on; it records the requests.
 */
async function emptyEventsProxy(upstream: string): Promise<{ url: string; requests: string[]; close(): Promise<void> }> {
  const requests: string[] = [];
  const server = createHttpServer((req, res) => {
    const url = req.url ?? "/";
    requests.push(`${req.method} ${url}`);
    if (req.method === "GET" && url.includes("/events") && !url.includes("format=json")) {
      res.writeHead(200, { "content-type": "text/event-stream", "content-length": "0" });
      res.end();
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const headers: Record<string, string> = {};
      for (const name of ["x-api-key", "content-type", "accept"]) {
        const value = req.headers[name];
        if (typeof value === "string") headers[name] = value;
      }
      const body = chunks.length > 0 ? Buffer.concat(chunks) : undefined;
      fetch(upstream + url, { method: req.method, headers, body })
        .then(async (answer) => {
          const bytes = Buffer.from(await answer.arrayBuffer());
          res.writeHead(answer.status, { "content-type": answer.headers.get("content-type") ?? "application/json" });
          res.end(bytes);
        })
        .catch(() => res.destroy());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  assert.ok(address !== null && typeof address === "object");
  return {
    url: `http://127.0.0.1:${address.port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

test("a wait asks for the run when the daemon has none of its live events", { timeout: 180_000 }, async () => {
  await withAgent(STUCK, async (client) => {
    const run = await stuckInModelCall(client);
    const proxy = await emptyEventsProxy(client.apiUrl!);
    try {
      const waiting = await Run.get(run.id, { ...client, apiUrl: proxy.url });
      let settled = false;
      const done = waiting.wait({ timeout: 60 }).finally(() => {
        settled = true;
      });
      // Longer than a stream followed again and again would take to give up (0.2 s doubling, five times).
      await new Promise((r) => setTimeout(r, 7_000));
      assert.equal(settled, false);
      await (await Run.get(run.id, client)).cancel();
      const cancelled = Date.now();
      const info = await done;
      // Asked for every second at most.
      assert.ok(Date.now() - cancelled < 1_500, `${Date.now() - cancelled} ms`);
      assert.equal(info.status, "cancelled");
    } finally {
      await proxy.close();
    }
    const path = `/v1/runs/${run.id}`;
    // One stream, which ended at once, then the record asked for about once a second.
    assert.equal(proxy.requests.filter((r) => r.startsWith(`GET ${path}/events`)).length, 1, proxy.requests.join("\n"));
    const gets = proxy.requests.filter((r) => r === `GET ${path}`).length;
    assert.ok(gets >= 6 && gets <= 20, proxy.requests.join("\n"));
  });
});

test("a kept sandbox holds the run's state and takes another run", { timeout: 180_000 }, async () => {
  await withAgent([...DOUBLING, code("print(x + 1)"), { text: "x + 1 is 22" }], async (client) => {
    const info = await Run.run(TASK, { ...client, model: MODEL, keepSandbox: true, template: "python", timeout: 120 });
    assert.deepEqual([info.status, info.answer], ["succeeded", "the answer is 42"]);
    const sb = await (await Run.get(info.id, client)).sandbox();
    try {
      assert.equal(sb.id, info.sandboxId);
      assert.equal((await sb.runCode("x")).text, "21");
      // A run in an existing sandbox starts from its kernels' state.
      const second = await Run.start("Add one to x.", { ...client, model: MODEL, sandbox: sb });
      const done = await second.wait({ timeout: 120 });
      assert.deepEqual([done.status, done.answer, done.sandboxId], ["succeeded", "x + 1 is 22", sb.id]);
      assert.match(toolTexts(await collect(second.events())).at(-1) ?? "", /22/);
      // A sandbox given to a run is never deleted by it.
      assert.equal((await sb.refresh()).state, "running");
    } finally {
      await sb.kill();
    }
  });
});

/** A model turn that answers with the `final_answer` tool. */
function final(answer: string): unknown {
  return { tool_calls: [{ name: "final_answer", arguments: { answer } }] };
}

/** Answers before doing the work (the check fails), does it, answers again (the check passes). */
const HASTY = [final("done"), code("open('done.txt', 'w').write('x')"), final("done.txt is written")];

function checks(events: RunEvent[]): Record<string, unknown>[] {
  return events.filter((e) => e.type === "validation").map((e) => e.data);
}

test("a failed check sends the run back to work until it passes", { timeout: 180_000 }, async () => {
  await withAgent(HASTY, async (client, model) => {
    // A command alone: the daemon's defaults for the rest (60 s, 3 attempts).
    const run = await Run.start(TASK, { ...client, model: MODEL, validate: "test -f done.txt" });
    const info = await run.wait({ timeout: 120 });
    assert.deepEqual([info.status, info.reason, info.answer, info.ok], ["succeeded", "validated", "done.txt is written", true]);
    assert.equal(info.usage.llmCalls, 3);

    const events = await run.listEvents();
    contiguous(events);
    assert.equal((events[0]!.data["validate"] as { command: string }).command, "test -f done.txt");
    const [first, second, ...more] = checks(events);
    assert.equal(more.length, 0);
    assert.deepEqual(
      [first!["attempt"], first!["max_attempts"], first!["passed"], first!["exit_code"], first!["command"]],
      [1, 3, false, 1, "test -f done.txt"],
    );
    assert.deepEqual([second!["attempt"], second!["max_attempts"], second!["passed"], second!["exit_code"]], [2, 3, true, 0]);
    assert.equal(typeof first!["duration_ms"], "number");
    assert.ok("output_tail" in first! && "cause" in first!);
    // The failed check came back to the model as its final_answer call's result.
    const told = JSON.stringify(model.requests()[1]);
    assert.ok(told.includes("the check failed (attempt 1 of 3)") && told.includes("exited with code 1"), told);
    // The second check came after the code that made the file.
    const kinds = events.map((e) => e.type);
    assert.ok(kinds.indexOf("tool_result") < kinds.lastIndexOf("validation"));
    assert.equal(events.at(-1)!.data["reason"], "validated");
  });
});

test("an answer that never passes ends the run validation_failed", { timeout: 180_000 }, async () => {
  await withAgent([final("first try"), final("second try")], async (client, model) => {
    const info = await Run.run(TASK, {
      ...client,
      model: MODEL,
      validate: { command: "test -f never.txt", timeoutS: 10, maxAttempts: 2 },
      timeout: 120,
    });
    // Failed, its last answer kept.
    assert.deepEqual([info.status, info.reason, info.answer, info.ok], ["failed", "validation_failed", "second try", false]);
    const events = await (await Run.get(info.id, client)).listEvents();
    contiguous(events);
    // Sent in snake_case: the run took both fields.
    assert.deepEqual(events[0]!.data["validate"], { command: "test -f never.txt", timeout_s: 10, max_attempts: 2 });
    assert.deepEqual(
      checks(events).map((c) => [c["attempt"], c["max_attempts"], c["passed"]]),
      [
        [1, 2, false],
        [2, 2, false],
      ],
    );
    assert.equal(model.requests().length, 2);
  });
});

test("bad runs fail with the SDK's errors", async () => {
  // The suite's daemon (from the environment): these are refused before any model is asked.
  for (const model of ["nope", "bogus/model"]) {
    await assert.rejects(Run.start(TASK, { model }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.deepEqual([e.code, e.status], ["invalid_argument", 400]);
      assert.ok(e.message.includes(model), e.message);
      return true;
    });
  }
  await assert.rejects(Run.run("   ", { model: MODEL }), (e: unknown) => e instanceof InvalidArgumentError && /task/.test(e.message));
  await assert.rejects(Run.get("run-0000000000000000"), NotFoundError);
  // Validation values are the daemon's to judge: each bad one is its 400, naming the field.
  const bad: [string | Validate, string][] = [
    [{ command: "true", maxAttempts: 0 }, "validate.max_attempts"],
    [{ command: "true", maxAttempts: 11 }, "validate.max_attempts"],
    [{ command: "true", timeoutS: 601 }, "validate.timeout_s"],
    [{ command: "true", timeoutS: 0 }, "validate.timeout_s"],
    ["   ", "validate.command"],
  ];
  for (const [validate, field] of bad) {
    await assert.rejects(Run.start(TASK, { model: MODEL, validate }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.deepEqual([e.code, e.status], ["invalid_argument", 400]);
      assert.ok(e.message.includes(field), `${JSON.stringify(validate)}: ${e.message}`);
      return true;
    });
  }
  await assert.rejects(
    Run.run(TASK, { model: MODEL, validate: { command: "true", maxAttempts: 0 } }),
    (e: unknown) => e instanceof InvalidArgumentError && e.message.includes("validate.max_attempts"),
  );
});
