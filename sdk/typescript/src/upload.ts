/**
 * Streamed uploads over `node:http`. Node's `fetch` keeps every chunk of a streamed request
 * body in memory until the request is over (undici issue #4058), so a large upload through
 * it would cost its whole size; here each chunk is written to the socket and dropped, with
 * backpressure from the connection.
 */

import { request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

import { type HttpClient, type Query } from "./http.js";
import { errorFromBody, isErrorBody } from "./errors.js";

/** Sends `source` as the body of a request and returns the JSON answer. */
export async function sendStream<T>(
  http: HttpClient,
  method: string,
  path: string,
  query: Query,
  source: AsyncIterable<Uint8Array>,
): Promise<T> {
  const url = new URL(http.url(path, query));
  const headers: Record<string, string> = { "content-type": "application/octet-stream", accept: "application/json" };
  if (http.config.apiKey !== undefined) headers["x-api-key"] = http.config.apiKey;
  const request = (url.protocol === "https:" ? httpsRequest : httpRequest)(url, { method, headers });
  const answered = new Promise<IncomingMessage>((resolve, reject) => {
    request.once("response", resolve);
    request.once("error", reject);
  });
  let response: IncomingMessage;
  try {
    // The daemon may answer early (an error before the body is read): then the answer counts,
    // not the broken pipe that follows it.
    const [sent, answer] = await Promise.allSettled([pipeline(Readable.from(source), request), answered]);
    if (answer.status === "rejected") throw answer.reason;
    if (sent.status === "rejected" && answer.value.statusCode !== undefined && answer.value.statusCode < 400) {
      throw sent.reason;
    }
    response = answer.value;
  } catch (e) {
    request.destroy();
    throw http.transportError(e, {});
  }
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString("utf8");
  const status = response.statusCode ?? 0;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (status >= 200 && status < 300) return body as T;
  const requestId = response.headers["x-request-id"];
  throw errorFromBody(
    isErrorBody(body) ? body : { code: `http_${status}`, message: `HTTP ${status}: ${text.slice(0, 200)}` },
    status,
    typeof requestId === "string" ? requestId : undefined,
  );
}
