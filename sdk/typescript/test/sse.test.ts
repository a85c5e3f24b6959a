/**
 * The event-stream parser on its own (no daemon): a line or an event split anywhere across
 * reads, CRLF and CR line ends, comments, multi-line data. The real streams are covered
 * against the daemon in commands.test.ts and code.test.ts.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { SseParser, type SseMessage } from "../dist/sse.js";

function parse(pieces: string[]): SseMessage[] {
  const parser = new SseParser();
  return [...pieces.flatMap((p) => [...parser.push(p)]), ...parser.end()];
}

const STREAM = 'event: stdout\ndata: {"data":"a"}\n\n: keep-alive\n\nevent: exit\ndata: {"exit_code":0}\n\n';
const EXPECTED = [
  { event: "stdout", data: { data: "a" } },
  { event: "exit", data: { exit_code: 0 } },
];

test("events come out whole however the text is split", () => {
  assert.deepEqual(parse([STREAM]), EXPECTED);
  for (let cut = 1; cut < STREAM.length; cut++) {
    assert.deepEqual(parse([STREAM.slice(0, cut), STREAM.slice(cut)]), EXPECTED, `cut at ${cut}`);
  }
  assert.deepEqual(parse([...STREAM]), EXPECTED, "one character at a time");
});

test("CRLF and CR line ends, a CRLF split between reads, multi-line data", () => {
  const crlf = STREAM.replace(/\n/g, "\r\n");
  for (let cut = 1; cut < crlf.length; cut++) {
    assert.deepEqual(parse([crlf.slice(0, cut), crlf.slice(cut)]), EXPECTED, `cut at ${cut}`);
  }
  assert.deepEqual(parse([STREAM.replace(/\n/g, "\r")]), EXPECTED);
  assert.deepEqual(parse(["data: [1,\ndata: 2]\n\n"]), [{ event: "message", data: [1, 2] }]);
});
