/** Server-sent events: the daemon's streams (exec, code, background processes) as async iterators. */

import { type HttpClient, type RequestSpec } from "./http.js";

/** One event: its name and its JSON data, parsed. */
export interface SseMessage {
  /** The event's name (`stdout`, `exit`, …). */
  event: string;
  /** Its data, parsed as JSON. */
  data: unknown;
}

/**
 * Sends a request whose answer is an event stream and yields its events in order. Leaving
 * the loop early (break, return, a throw) cancels the request, so the daemon sees the client
 * go; a connection that breaks off mid-stream becomes a `ConnectionError`.
 */
export async function* sseRequest(
  http: HttpClient,
  method: string,
  path: string,
  spec: RequestSpec,
): AsyncGenerator<SseMessage, void, undefined> {
  const response = await http.stream(method, path, spec);
  if (response.body === null) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  const read = () =>
    reader.read().catch((e: unknown) => {
      throw http.transportError(e, spec);
    });
  try {
    for (;;) {
      const chunk = await read();
      if (chunk.done) break;
      yield* parser.push(decoder.decode(chunk.value, { stream: true }));
    }
    yield* parser.push(decoder.decode());
    yield* parser.end();
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

/** The text/event-stream format, fed in pieces of any size (a line may span two reads). */
export class SseParser {
  private buffer = "";
  private event = "";
  private data: string[] = [];

  /** Adds text and returns the events it completed. */
  *push(text: string): Generator<SseMessage> {
    this.buffer += text;
    const eol = /\r\n|\r|\n/g;
    let start = 0;
    for (let match = eol.exec(this.buffer); match !== null; match = eol.exec(this.buffer)) {
      // A lone "\r" at the end may be the first half of "\r\n": wait for the next piece.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const message = this.line(this.buffer.slice(start, match.index));
      start = match.index + match[0].length;
      if (message !== undefined) yield message;
    }
    this.buffer = this.buffer.slice(start);
  }

  /** Ends the text: an event the stream did not close with a blank line still counts. */
  *end(): Generator<SseMessage> {
    yield* this.push("\n\n");
  }

  private line(line: string): SseMessage | undefined {
    if (line === "") {
      if (this.data.length === 0) {
        this.event = "";
        return undefined;
      }
      const message = { event: this.event || "message", data: JSON.parse(this.data.join("\n")) as unknown };
      this.event = "";
      this.data = [];
      return message;
    }
    if (line.startsWith(":")) return undefined; // a comment: the daemon's keep-alive
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    return undefined;
  }
}
