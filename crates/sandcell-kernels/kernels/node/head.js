// Sandcell Node.js kernel: speaks PROTOCOL.md (JSON lines) over two inherited pipes.
//
// The program is this file and the others of this folder joined in the order `src/lib.rs`
// lists them: one function body, a file per concern (this one opens it, requests.js closes it).
//
// Started as `node -e <program>`. User code runs in one `vm` context that lives as long as
// the kernel. Each cell is rewritten (see `analyze`) into the body of an arrow function,
// `(() => {BODY})()` or, when it uses top-level `await`, `(async () => {BODY})()`, so that:
//   - top-level `let`/`const`/`var` declarations become assignments to globals of the context
//     (re-running a cell that declares the same `let`/`const` works, as in the Node REPL; a
//     `const` can be reassigned by a later cell);
//   - top-level `class X {}` becomes `X = class X {};`, top-level function declarations are
//     copied onto the global object at the start of the cell (they stay hoisted);
//   - `var` anywhere outside nested functions (blocks, loop heads) is global too;
//   - the last statement, when it is an expression, is returned: its value is the `result`
//     (a thenable is awaited);
//   - line numbers are unchanged and columns in tracebacks are mapped back to the user's code.
// A cell the rewriter cannot handle runs as a plain `vm.Script` (script semantics: its
// `let`/`const` are lexical and are not seen by the variable operations).
//
// Interrupts: SIGINT stops synchronous code (vm's `breakOnSigint`) and abandons a pending
// `await` (the abandoned work may go on in the background). Code that never yields inside a
// callback (a timer, or the part of a cell after an `await`) cannot be stopped from JavaScript;
// the agent's grace period ends the kernel then. So can a cell without calls, loops or
// classes (it runs without the watchdog, see `simple`) whose getter or coercion never returns. Output produced while no execution runs is
// kept (up to the stream limit) and sent at the start of the next execution.
'use strict';
(() => {
  const fs = require('fs');
  const vm = require('vm');
  const util = require('util');
  const path = require('path');
  const Module = require('module');

  // ---------------------------------------------------------------- pipes and events

  const env = process.env;
  const ctlFdIn = parseInt(env.SANDCELL_KERNEL_CTL_FD, 10);
  const evFdIn = parseInt(env.SANDCELL_KERNEL_EVENT_FD, 10);
  if (!(ctlFdIn >= 0) || !(evFdIn >= 0)) {
    process.stderr.write('sandcell node kernel: SANDCELL_KERNEL_CTL_FD / SANDCELL_KERNEL_EVENT_FD not set\n');
    process.exit(2);
  }
  delete env.SANDCELL_KERNEL_CTL_FD;
  delete env.SANDCELL_KERNEL_EVENT_FD;
  // `node -e SRC` puts the kernel into execArgv; child_process.fork() would pass it on.
  try {
    process.execArgv = [];
  } catch (_) {
    /* keep */
  }

  // The inherited descriptors must not leak into processes the user starts. Node 20 happens to
  // mark inherited descriptors close-on-exec at start-up, but offers no fcntl to make sure:
  // re-open both pipes through /proc (libuv opens with O_CLOEXEC) and close the inherited
  // numbers, which also moves the pipes away from the numbers the agent chose.
  function reopen(fd, flags) {
    try {
      const nfd = fs.openSync(`/proc/self/fd/${fd}`, flags);
      fs.closeSync(fd);
      return nfd;
    } catch (_) {
      return fd;
    }
  }
  const ctlFd = reopen(ctlFdIn, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const evFd = reopen(evFdIn, fs.constants.O_WRONLY);

  const sleepCell = new Int32Array(new SharedArrayBuffer(4));
  function writeAll(str) {
    const buf = Buffer.from(str, 'utf8');
    let off = 0;
    while (off < buf.length) {
      try {
        off += fs.writeSync(evFd, buf, off, buf.length - off);
      } catch (e) {
        if (e && (e.code === 'EAGAIN' || e.code === 'EINTR')) {
          Atomics.wait(sleepCell, 0, 0, 1);
          continue;
        }
        // The agent is gone: nobody is left to serve.
        process.exit(0);
      }
    }
  }
  const wellFormed = (k, v) => (typeof v === 'string' ? v.toWellFormed() : v);
  function emitRaw(obj) {
    let line = JSON.stringify(obj);
    // Lone surrogates would be escaped as \udXXX, which strict JSON readers reject.
    if (line.includes('\\ud')) line = JSON.stringify(obj, wellFormed);
    writeAll(line + '\n');
  }

  // ---------------------------------------------------------------- streams

  let LIMIT = parseInt(env.SANDCELL_STREAM_LIMIT || '', 10);
  if (!(LIMIT >= 0)) LIMIT = 1048576;
  const BATCH_BYTES = 65536;
  const BATCH_MS = 20;

  let current = null; // the execution that owns output right now
  // Output produced while no execution runs (timers, abandoned cells): kept (bounded) and
  // sent at the start of the next execution.
  const background = { items: [], bytes: { stdout: 0, stderr: 0 }, dropped: { stdout: 0, stderr: 0 } };

  function utf8Prefix(text, maxBytes) {
    let s = text.length > maxBytes ? text.slice(0, maxBytes) : text;
    const last = s.charCodeAt(s.length - 1);
    if (last >= 0xd800 && last <= 0xdbff) s = s.slice(0, -1);
    const buf = Buffer.from(s, 'utf8');
    if (buf.length <= maxBytes) return s;
    let end = maxBytes;
    while (end > 0 && (buf[end] & 0xc0) === 0x80) end--;
    return buf.toString('utf8', 0, end);
  }

  function capture(name, text) {
    if (typeof text !== 'string') text = String(text);
    if (text.length === 0) return;
    const ex = current;
    if (!ex) {
      const bytes = Buffer.byteLength(text, 'utf8');
      if (background.bytes[name] + bytes > LIMIT) {
        background.dropped[name] += bytes;
        return;
      }
      background.bytes[name] += bytes;
      background.items.push([name, text]);
      return;
    }
    const used = ex.used[name];
    if (used >= LIMIT) {
      ex.dropped[name] += Buffer.byteLength(text, 'utf8');
      return;
    }
    // Cheap bound first: a string of n UTF-16 units has at most 3n UTF-8 bytes.
    const bytes = text.length * 3 <= LIMIT - used ? -1 : Buffer.byteLength(text, 'utf8');
    if (bytes >= 0 && used + bytes > LIMIT) {
      const part = utf8Prefix(text, LIMIT - used);
      const partBytes = Buffer.byteLength(part, 'utf8');
      ex.dropped[name] += bytes - partBytes;
      ex.used[name] = LIMIT;
      if (part) append(ex, name, part, partBytes);
      flush(ex);
      emitRaw({ type: 'stream', id: ex.id, name, text: `\n[sandcell: output truncated after ${LIMIT} bytes]\n` });
      return;
    }
    const n = bytes >= 0 ? bytes : Buffer.byteLength(text, 'utf8');
    ex.used[name] = used + n;
    append(ex, name, text, n);
  }

  function append(ex, name, text, bytes) {
    if (ex.pendName !== null && ex.pendName !== name) flush(ex);
    ex.pendName = name;
    ex.pend.push(text);
    ex.pendBytes += bytes;
    const now = Date.now();
    if (ex.pendBytes >= BATCH_BYTES || now - ex.lastFlush >= BATCH_MS) {
      flush(ex);
    } else if (!ex.flushTimer) {
      ex.flushTimer = setTimeout(() => {
        ex.flushTimer = null;
        if (!ex.settled) flush(ex);
      }, BATCH_MS);
      ex.flushTimer.unref();
    }
  }

  function flush(ex) {
    if (ex.pendName === null) return;
    const text = ex.pend.length === 1 ? ex.pend[0] : ex.pend.join('');
    const name = ex.pendName;
    ex.pend = [];
    ex.pendName = null;
    ex.pendBytes = 0;
    ex.lastFlush = Date.now();
    emitRaw({ type: 'stream', id: ex.id, name, text });
  }

  // Every non-stream event of an execution goes through here: pending text first.
  function emitFor(ex, obj) {
    flush(ex);
    emitRaw(obj);
  }

  // process.stdout / process.stderr (used by libraries and the main realm's console) are
  // captured as well, so their text is ordered with everything else.
  function patchStdio(stream, name) {
    const { StringDecoder } = require('string_decoder');
    const dec = new StringDecoder('utf8');
    stream.write = function write(chunk, encoding, cb) {
      if (typeof encoding === 'function') {
        cb = encoding;
        encoding = undefined;
      }
      let text;
      if (typeof chunk === 'string') {
        text = encoding && encoding !== 'utf8' && encoding !== 'utf-8' && Buffer.isEncoding(encoding)
          ? Buffer.from(chunk, encoding).toString('utf8')
          : chunk;
      } else if (ArrayBuffer.isView(chunk)) {
        text = dec.write(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
      } else {
        text = String(chunk);
      }
      capture(name, text);
      if (typeof cb === 'function') process.nextTick(cb);
      return true;
    };
  }
  for (const name of ['stdout', 'stderr']) {
    const d = Object.getOwnPropertyDescriptor(process, name);
    if (d && d.get && d.configurable) {
      Object.defineProperty(process, name, {
        configurable: true,
        enumerable: d.enumerable,
        get() {
          const s = d.get.call(process);
          patchStdio(s, name);
          Object.defineProperty(process, name, { configurable: true, enumerable: d.enumerable, writable: true, value: s });
          return s;
        },
      });
    } else {
      patchStdio(process[name], name);
    }
  }

