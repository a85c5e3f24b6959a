/**
 * A minimal WebSocket client (RFC 6455) on `node:http`, for the terminal route. Node 20 has
 * no stable global WebSocket and this package takes no runtime dependency; this client also
 * sends the API key as a header, where a browser-style WebSocket could only put it in the URL
 * (and so in logs). It speaks what the daemon needs: text and binary messages, fragmented
 * or not, ping/pong and the closing handshake; no extensions.
 */

import { createHash, randomBytes } from "node:crypto";
import { request as httpRequest, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { type Duplex } from "node:stream";

import { errorFromBody, isErrorBody, ConnectionError, SandcellError } from "./errors.js";
import { AsyncQueue } from "./queue.js";

/** A message from the server. */
export type WsMessage = { type: "text"; text: string } | { type: "binary"; data: Uint8Array };

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const OP_CONTINUATION = 0x0;
const OP_TEXT = 0x1;
const OP_BINARY = 0x2;
const OP_CLOSE = 0x8;
const OP_PING = 0x9;
const OP_PONG = 0xa;

/** One open connection; its messages are read with `for await`. */
export class WebSocketConnection implements AsyncIterable<WsMessage> {
  private readonly queue = new AsyncQueue<WsMessage>();
  private buffer: Buffer = Buffer.alloc(0);
  private fragments: Buffer[] = [];
  private fragmentOp = OP_BINARY;
  private closeSent = false;

  private constructor(
    private readonly socket: Duplex,
    head: Buffer,
    /** The headers of the server's `101` answer (lower-case names). */
    readonly headers: Record<string, string | string[] | undefined>,
  ) {
    socket.on("data", (chunk: Buffer) => this.receive(chunk));
    socket.on("close", () => this.queue.end());
    socket.on("error", (e) => this.queue.end(new ConnectionError(`terminal connection failed: ${e.message}`, { code: "connection_failed", cause: e })));
    if (head.length > 0) this.receive(head);
  }

  /** Opens a connection to a `ws://`/`wss://`-less http(s) URL, sending `headers` with the upgrade. */
  static connect(url: string, headers: Record<string, string>): Promise<WebSocketConnection> {
    const key = randomBytes(16).toString("base64");
    const target = new URL(url);
    const request = target.protocol === "https:" ? httpsRequest : httpRequest;
    return new Promise((resolve, reject) => {
      const req = request(target, {
        headers: {
          ...headers,
          connection: "Upgrade",
          upgrade: "websocket",
          "sec-websocket-key": key,
          "sec-websocket-version": "13",
        },
      });
      req.on("upgrade", (res: IncomingMessage, socket: Duplex, head: Buffer) => {
        const expected = createHash("sha1").update(key + GUID).digest("base64");
        if (res.headers["sec-websocket-accept"] !== expected) {
          socket.destroy();
          reject(new SandcellError("the daemon's WebSocket handshake answer is wrong", { code: "protocol_error" }));
          return;
        }
        resolve(new WebSocketConnection(socket, head, res.headers));
      });
      // Any answer but 101 is an ordinary API error (a bad pid, an unknown sandbox, no key).
      req.on("response", (res: IncomingMessage) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let body: unknown;
          try {
            body = JSON.parse(text);
          } catch {
            body = undefined;
          }
          const requestId = res.headers["x-request-id"];
          reject(
            errorFromBody(
              isErrorBody(body) ? body : { code: `http_${res.statusCode}`, message: text.slice(0, 200) },
              res.statusCode,
              typeof requestId === "string" ? requestId : undefined,
            ),
          );
        });
      });
      req.on("error", (e) =>
        reject(new ConnectionError(`cannot reach the Sandcell daemon at ${target.origin} (${e.message})`, { code: "connection_failed", cause: e })),
      );
      req.end();
    });
  }

  [Symbol.asyncIterator](): AsyncIterator<WsMessage> {
    return this.queue[Symbol.asyncIterator]();
  }

  /** Sends a text message. */
  sendText(text: string): void {
    this.send(OP_TEXT, Buffer.from(text, "utf8"));
  }

  /** Sends a binary message. */
  sendBinary(data: Uint8Array): void {
    this.send(OP_BINARY, Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }

  /** Starts the closing handshake; the server answers and the connection ends. */
  close(): void {
    if (this.closeSent) return;
    this.send(OP_CLOSE, Buffer.from([0x03, 0xe8])); // 1000: normal closure
    this.closeSent = true;
    // A server that never answers the close must not keep the socket (and the process) alive.
    setTimeout(() => this.socket.destroy(), 1000).unref();
  }

  private send(opcode: number, payload: Buffer): void {
    if (this.closeSent || this.socket.destroyed) return;
    const length = payload.length;
    const header =
      length < 126 ? Buffer.alloc(2) : length < 0x10000 ? Buffer.alloc(4) : Buffer.alloc(10);
    header[0] = 0x80 | opcode;
    if (length < 126) header[1] = 0x80 | length;
    else if (length < 0x10000) {
      header[1] = 0x80 | 126;
      header.writeUInt16BE(length, 2);
    } else {
      header[1] = 0x80 | 127;
      header.writeBigUInt64BE(BigInt(length), 2);
    }
    // Clients must mask every frame (RFC 6455 §5.3).
    const mask = randomBytes(4);
    const masked = Buffer.alloc(length);
    for (let i = 0; i < length; i++) masked[i] = payload[i]! ^ mask[i & 3]!;
    this.socket.write(Buffer.concat([header, mask, masked]));
  }

  private receive(chunk: Buffer): void {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    for (;;) {
      const frame = this.nextFrame();
      if (frame === undefined) return;
      this.handle(frame.fin, frame.opcode, frame.payload);
    }
  }

  /** Takes one whole frame off the buffer, if one is there. */
  private nextFrame(): { fin: boolean; opcode: number; payload: Buffer } | undefined {
    const b = this.buffer;
    if (b.length < 2) return undefined;
    let length = b[1]! & 0x7f;
    let at = 2;
    if (length === 126) {
      if (b.length < 4) return undefined;
      length = b.readUInt16BE(2);
      at = 4;
    } else if (length === 127) {
      if (b.length < 10) return undefined;
      length = Number(b.readBigUInt64BE(2));
      at = 10;
    }
    const masked = (b[1]! & 0x80) !== 0;
    const maskAt = at;
    if (masked) at += 4;
    if (b.length < at + length) return undefined;
    const payload = Buffer.from(b.subarray(at, at + length));
    if (masked) for (let i = 0; i < length; i++) payload[i] = payload[i]! ^ b[maskAt + (i & 3)]!;
    this.buffer = b.subarray(at + length);
    return { fin: (b[0]! & 0x80) !== 0, opcode: b[0]! & 0x0f, payload };
  }

  private handle(fin: boolean, opcode: number, payload: Buffer): void {
    switch (opcode) {
      case OP_PING:
        this.send(OP_PONG, payload);
        return;
      case OP_PONG:
        return;
      case OP_CLOSE:
        if (!this.closeSent) this.send(OP_CLOSE, payload.subarray(0, 2));
        this.closeSent = true;
        this.socket.end();
        this.queue.end();
        return;
      case OP_TEXT:
      case OP_BINARY:
        this.fragmentOp = opcode;
        this.fragments = [];
        break;
      case OP_CONTINUATION:
        break;
      default:
        return; // reserved opcodes: nothing the daemon sends
    }
    this.fragments.push(payload);
    if (!fin) return;
    const whole = Buffer.concat(this.fragments);
    this.fragments = [];
    this.queue.push(
      this.fragmentOp === OP_TEXT
        ? { type: "text", text: whole.toString("utf8") }
        : { type: "binary", data: new Uint8Array(whole.buffer, whole.byteOffset, whole.byteLength) },
    );
  }
}
