// Sandcell Node.js kernel: speaks PROTOCOL.md (JSON lines) over two inherited pipes.
//
// Started as `node -e <this file>`. User code runs in one `vm` context that lives as long as
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

  // ---------------------------------------------------------------- the user's context

  const sandbox = {};
  const ctx = vm.createContext(sandbox, { name: 'sandcell' });
  const ctxGlobal = vm.runInContext('globalThis', ctx);
  const ctxJSONParse = vm.runInContext('JSON.parse', ctx);
  const ctxObjectProto = vm.runInContext('Object.prototype', ctx);
  const ctxArrayProto = vm.runInContext('Array.prototype', ctx);
  const baseline = new Map(); // injected name -> its descriptor (to tell user changes apart)

  function defineBase(name, desc) {
    Object.defineProperty(sandbox, name, desc);
    baseline.set(name, Object.getOwnPropertyDescriptor(sandbox, name));
  }
  function defineValue(name, value, enumerable = false) {
    defineBase(name, { value, writable: true, configurable: true, enumerable });
  }

  // Node's globals that a fresh context lacks (timers, URL, Buffer, fetch, ...). Lazy ones stay
  // lazy: they are read from the main realm on first use.
  {
    const own = new Set(Object.getOwnPropertyNames(ctxGlobal));
    const skip = new Set(['global', 'globalThis', 'require', 'module', 'exports', '__filename', '__dirname', 'console']);
    // `node -e` also makes every built-in module a global (as the REPL does); scripts don't see
    // those, except `process` and `crypto` (the Web Crypto object), which are real globals.
    for (const m of Module.builtinModules) if (m !== 'process' && m !== 'crypto') skip.add(m);
    for (const name of Object.getOwnPropertyNames(globalThis)) {
      if (own.has(name) || skip.has(name)) continue;
      const d = Object.getOwnPropertyDescriptor(globalThis, name);
      if (!d) continue;
      if (!d.get) {
        defineValue(name, d.value, d.enumerable);
        continue;
      }
      const enumerable = d.enumerable;
      const settle = (value) => {
        Object.defineProperty(sandbox, name, { value, writable: true, configurable: true, enumerable });
        return value;
      };
      defineBase(name, {
        configurable: true,
        enumerable,
        get() {
          const value = settle(globalThis[name]);
          baseline.set(name, Object.getOwnPropertyDescriptor(sandbox, name));
          return value;
        },
        set(value) {
          settle(value);
        },
      });
    }
  }
  defineValue('global', ctxGlobal);

  // console: log/info/debug/dir/table -> stdout, warn/error/trace -> stderr.
  const userConsole = new console.Console({
    stdout: { write: (s) => (capture('stdout', s), true) },
    stderr: { write: (s) => (capture('stderr', s), true) },
    ignoreErrors: false,
    colorMode: false,
  });
  userConsole.trace = function trace(...args) {
    const holder = { name: 'Trace', message: util.format(...args) };
    Error.captureStackTrace(holder, trace);
    capture('stderr', cleanStack(String(holder.stack)).join('\n') + '\n');
  };
  defineValue('console', userConsole);

  // require resolves from the working directory (./node_modules, then the global paths).
  const moduleValues = new WeakSet();
  // What each module value was required as (state capture requires it again).
  const moduleIds = new WeakMap();
  let reqCwd = null;
  let baseRequire = null;
  function currentRequire() {
    let cwd;
    try {
      cwd = process.cwd();
    } catch (_) {
      cwd = reqCwd || '/';
    }
    if (cwd !== reqCwd || !baseRequire) {
      reqCwd = cwd;
      baseRequire = Module.createRequire(path.join(cwd, '<repl>'));
    }
    return baseRequire;
  }
  const userRequire = function require(id) {
    const value = currentRequire()(id);
    if (value !== null && (typeof value === 'object' || typeof value === 'function')) {
      moduleValues.add(value);
      if (!moduleIds.has(value)) moduleIds.set(value, moduleId(id));
    }
    return value;
  };
  // A relative id is kept as the file it resolved to: a restore may run from another cwd.
  function moduleId(id) {
    if (typeof id !== 'string' || !(id.startsWith('./') || id.startsWith('../') || id === '.' || id === '..')) return id;
    try {
      return currentRequire().resolve(id);
    } catch (_) {
      return id;
    }
  }
  userRequire.resolve = function resolve(request, options) {
    return currentRequire().resolve(request, options);
  };
  userRequire.resolve.paths = function paths(request) {
    return currentRequire().resolve.paths(request);
  };
  userRequire.cache = Module._cache;
  userRequire.extensions = Module._extensions;
  userRequire.main = undefined;
  const startCwd = process.cwd();
  const replFile = path.join(startCwd, '<repl>');
  const userModule = new Module(replFile, null);
  userModule.filename = replFile;
  userModule.paths = Module._nodeModulePaths(startCwd);
  userModule.loaded = true;
  userModule.require = userRequire;
  defineValue('require', userRequire);
  defineValue('module', userModule);
  defineValue('exports', userModule.exports);
  defineValue('__filename', replFile);
  defineValue('__dirname', startCwd);

  // Dynamic import() from cells uses the main context's loader (Node >= 20.12).
  const importOpts = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER
    ? { importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER }
    : {};
  // ... which warns that it is experimental, on the user's stderr, at the first import().
  const emitWarning = process.emitWarning;
  process.emitWarning = function (warning, ...rest) {
    const text = warning && typeof warning === 'object' ? warning.message : warning;
    if (typeof text === 'string' && text.includes('USE_MAIN_CONTEXT_DEFAULT_LOADER')) return;
    return emitWarning.call(this, warning, ...rest);
  };

  // ---------------------------------------------------------------- tokenizer

  const RE_IDENT = /(?:[$_\p{ID_Start}]|\\u[0-9a-fA-F]{4}|\\u\{[0-9a-fA-F]+\})(?:[$\u200c\u200d\p{ID_Continue}]|\\u[0-9a-fA-F]{4}|\\u\{[0-9a-fA-F]+\})*/uy;
  const RE_NUM = /(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?[\d_]+)?)n?/y;
  const RE_WS = /[\t\v\f \u00a0\ufeff\u1680\u2000-\u200a\u202f\u205f\u3000]+/y;
  const RE_FLAGS = /[$\p{ID_Continue}]*/uy;
  const PUNCTS = [
    '>>>=', '...', '===', '!==', '**=', '<<=', '>>=', '>>>', '&&=', '||=', '??=',
    '=>', '==', '!=', '<=', '>=', '&&', '||', '??', '?.', '++', '--', '+=', '-=', '*=', '%=',
    '&=', '|=', '^=', '**', '<<', '>>',
  ];
  const PUNCT_BY_CHAR = new Map();
  for (const p of PUNCTS) {
    if (!PUNCT_BY_CHAR.has(p[0])) PUNCT_BY_CHAR.set(p[0], []);
    PUNCT_BY_CHAR.get(p[0]).push(p);
  }
  const REGEX_AFTER = new Set([
    'return', 'typeof', 'instanceof', 'in', 'of', 'new', 'delete', 'void', 'throw', 'case', 'do',
    'else', 'yield', 'await', 'extends',
  ]);
  const isLineTerm = (c) => c === '\n' || c === '\r' || c === '\u2028' || c === '\u2029';

  // Splits `src` into tokens {t, v, s, e, nl}: t is 'name', 'num', 'str', 'tpl' (a whole
  // template literal), 're' or 'p' (punctuator); nl says a line break precedes the token.
  // Returns {tokens, hasAwait} or {error: 'incomplete' | 'invalid'}.
  function tokenize(src) {
    const r = scan(src, 0, false);
    return r.error ? { error: r.error } : r;
  }

  function scan(src, pos, nested) {
    const n = src.length;
    const tokens = nested ? null : [];
    let prev = null;
    let nl = false;
    let depth = 0;
    let hasAwait = false;
    if (!nested && src.startsWith('#!')) {
      while (pos < n && !isLineTerm(src[pos])) pos++;
    }
    const push = (t, v, s, e) => {
      const tok = { t, v, s, e, nl };
      nl = false;
      prev = tok;
      if (tokens) tokens.push(tok);
      return tok;
    };
    while (pos < n) {
      const c = src[pos];
      if (isLineTerm(c)) {
        nl = true;
        pos++;
        continue;
      }
      RE_WS.lastIndex = pos;
      if (RE_WS.test(src)) {
        pos = RE_WS.lastIndex;
        continue;
      }
      if (c === '/' && src[pos + 1] === '/') {
        while (pos < n && !isLineTerm(src[pos])) pos++;
        continue;
      }
      if (c === '/' && src[pos + 1] === '*') {
        const end = src.indexOf('*/', pos + 2);
        if (end < 0) return { error: 'incomplete' };
        if (/[\n\r\u2028\u2029]/.test(src.slice(pos, end))) nl = true;
        pos = end + 2;
        continue;
      }
      if (c === '"' || c === "'") {
        let j = pos + 1;
        for (;;) {
          if (j >= n) return { error: 'invalid' };
          const d = src[j];
          if (d === '\\') {
            j += src[j + 1] === '\r' && src[j + 2] === '\n' ? 3 : 2;
            continue;
          }
          if (d === c) break;
          if (d === '\n' || d === '\r') return { error: 'invalid' };
          j++;
        }
        push('str', null, pos, j + 1);
        pos = j + 1;
        continue;
      }
      if (c === '`') {
        let j = pos + 1;
        for (;;) {
          if (j >= n) return { error: 'incomplete' };
          const d = src[j];
          if (d === '\\') {
            j += 2;
            continue;
          }
          if (d === '`') break;
          if (d === '$' && src[j + 1] === '{') {
            const r = scan(src, j + 2, true);
            if (r.error) return r;
            j = r.end;
            continue;
          }
          j++;
        }
        push('tpl', null, pos, j + 1);
        pos = j + 1;
        continue;
      }
      RE_IDENT.lastIndex = pos;
      if (RE_IDENT.test(src)) {
        const end = RE_IDENT.lastIndex;
        const v = src.slice(pos, end);
        if (v === 'await' && !(prev && prev.t === 'p' && (prev.v === '.' || prev.v === '?.'))) hasAwait = true;
        push('name', v, pos, end);
        pos = end;
        continue;
      }
      if ((c >= '0' && c <= '9') || (c === '.' && src[pos + 1] >= '0' && src[pos + 1] <= '9')) {
        RE_NUM.lastIndex = pos;
        RE_NUM.test(src);
        const end = Math.max(RE_NUM.lastIndex, pos + 1);
        push('num', null, pos, end);
        pos = end;
        continue;
      }
      if (c === '/') {
        let regex = true;
        if (prev) {
          if (prev.t === 'p') regex = !(prev.v === ')' || prev.v === ']' || prev.v === '++' || prev.v === '--');
          else if (prev.t === 'name') regex = REGEX_AFTER.has(prev.v);
          else regex = false;
        }
        if (regex) {
          let j = pos + 1;
          let inClass = false;
          for (;;) {
            if (j >= n || isLineTerm(src[j])) return { error: 'invalid' };
            const d = src[j];
            if (d === '\\') {
              j += 2;
              continue;
            }
            if (d === '[') inClass = true;
            else if (d === ']') inClass = false;
            else if (d === '/' && !inClass) break;
            j++;
          }
          RE_FLAGS.lastIndex = j + 1;
          RE_FLAGS.test(src);
          push('re', null, pos, RE_FLAGS.lastIndex);
          pos = RE_FLAGS.lastIndex;
          continue;
        }
        const v = src[pos + 1] === '=' ? '/=' : '/';
        push('p', v, pos, pos + v.length);
        pos += v.length;
        continue;
      }
      let v = c;
      const cands = PUNCT_BY_CHAR.get(c);
      if (cands) {
        for (const p of cands) {
          if (src.startsWith(p, pos)) {
            if (p === '?.' && src[pos + 2] >= '0' && src[pos + 2] <= '9') continue;
            v = p;
            break;
          }
        }
      }
      if (nested) {
        if (v === '{') depth++;
        else if (v === '}') {
          if (depth === 0) return { end: pos + 1 };
          depth--;
        }
      }
      push('p', v, pos, pos + v.length);
      pos += v.length;
    }
    if (nested) return { error: 'incomplete' };
    return { tokens, hasAwait };
  }

  // ---------------------------------------------------------------- the cell rewriter

  const OPEN = new Set(['(', '[', '{']);
  const CLOSE_OF = { '(': ')', '[': ']', '{': '}' };
  const LET_NOT_DECL = new Set(['in', 'instanceof', 'of']);
  const NOT_END = new Set([
    'in', 'instanceof', 'typeof', 'void', 'delete', 'new', 'await', 'yield', 'return', 'throw',
    'case', 'do', 'else', 'extends', 'var', 'let', 'const', 'class', 'function', 'if', 'for',
    'while', 'switch', 'try', 'catch', 'finally', 'with', 'export', 'import',
  ]);
  const NOT_SIMPLE = new Set(['new', 'for', 'while', 'do', 'await', 'yield', 'class', 'import']);
  const KEYWORDS = new Set([
    'break', 'case', 'catch', 'class', 'const', 'continue', 'debugger', 'default', 'delete', 'do',
    'else', 'enum', 'export', 'extends', 'false', 'finally', 'for', 'function', 'if', 'import', 'in',
    'instanceof', 'new', 'null', 'return', 'super', 'switch', 'this', 'throw', 'true', 'try',
    'typeof', 'var', 'void', 'while', 'with',
  ]);

  // Returns {body, edits, hoisted, hasAwait} (body: the rewritten cell) or {error, depth}.
  function analyze(src) {
    const tk = tokenize(src);
    if (tk.error) return { error: tk.error, depth: 0 };
    const T = tk.tokens;
    const N = T.length;
    const match = new Int32Array(N).fill(-1);
    const stack = [];
    for (let i = 0; i < N; i++) {
      const t = T[i];
      if (t.t !== 'p') continue;
      if (OPEN.has(t.v)) stack.push(i);
      else if (t.v === ')' || t.v === ']' || t.v === '}') {
        if (!stack.length) return { error: 'invalid', depth: 0 };
        const o = stack.pop();
        if (CLOSE_OF[T[o].v] !== t.v) return { error: 'invalid', depth: 0 };
        match[o] = i;
        match[i] = o;
      }
    }
    if (stack.length) return { error: 'incomplete', depth: stack.length };

    const edits = [];
    const hoisted = new Set();
    const funcs = [];
    const top = [];
    let seq = 0;
    const ins = (pos, text, order) => edits.push({ pos, del: 0, text, seq: order === undefined ? seq++ : order });
    const rep = (tok, text) => edits.push({ pos: tok.s, del: tok.e - tok.s, text, seq: seq++ });
    const isP = (i, v) => i < N && T[i].t === 'p' && T[i].v === v;
    const isN = (i, v) => i < N && T[i].t === 'name' && T[i].v === v;
    const isOpen = (t) => t.t === 'p' && OPEN.has(t.v);
    const rec = (isTop, kind, start, last) => {
      if (isTop) top.push({ kind, start, last });
    };
    const endsExpr = (p) => {
      if (p.t === 'name') return !NOT_END.has(p.v);
      if (p.t === 'p') return p.v === ')' || p.v === ']' || p.v === '}' || p.v === '++' || p.v === '--';
      return true;
    };
    const continues = (t) => {
      if (t.t === 'p') return !(t.v === '{' || t.v === '!' || t.v === '~' || t.v === '++' || t.v === '--');
      if (t.t === 'tpl') return true;
      if (t.t === 'name') return t.v === 'in' || t.v === 'instanceof';
      return false;
    };

    // `function ...(...) {...}` or `class ... {...}` starting at j: the index after it.
    function skipFnClass(j, end) {
      if (T[j].v === 'function') {
        let k = j + 1;
        if (isP(k, '*')) k++;
        if (k < end && T[k].t === 'name') k++;
        if (isP(k, '(')) {
          k = match[k] + 1;
          if (isP(k, '{')) return match[k] + 1;
        }
        return j + 1;
      }
      let k = j + 1;
      while (k < end) {
        const u = T[k];
        if (u.t === 'p') {
          if (u.v === '{') return match[k] + 1;
          if (u.v === '(' || u.v === '[') {
            k = match[k] + 1;
            continue;
          }
          if (u.v === ';' || u.v === ')' || u.v === ']' || u.v === '}') return j + 1;
        }
        k++;
      }
      return j + 1;
    }

    // An expression (or declarator list) from i to the end of its statement (`;`, or a line
    // break where automatic semicolon insertion applies). {next, last}: the index after the
    // statement, the index of its last token before any `;`.
    function scanExpr(i, end) {
      let j = i;
      let prev = null;
      while (j < end) {
        const t = T[j];
        if (t.t === 'p' && t.v === ';') return { next: j + 1, last: j - 1 };
        if (prev && t.nl && endsExpr(prev) && !continues(t)) return { next: j, last: j - 1 };
        if (t.t === 'name' && (t.v === 'function' || t.v === 'class')
          && !(prev && prev.t === 'p' && (prev.v === '.' || prev.v === '?.'))) {
          j = skipFnClass(j, end);
          prev = T[j - 1];
          continue;
        }
        if (isOpen(t)) {
          j = match[j] + 1;
          prev = T[j - 1];
          continue;
        }
        prev = t;
        j++;
      }
      return { next: end, last: end - 1 };
    }

    function splitTop(a, b, sep) {
      const out = [];
      let s = a;
      let k = a;
      while (k < b) {
        const t = T[k];
        if (t.t === 'p' && t.v === sep) {
          out.push([s, k]);
          s = k + 1;
          k++;
          continue;
        }
        k = isOpen(t) ? match[k] + 1 : k + 1;
      }
      if (s < b) out.push([s, b]);
      return out;
    }

    function findTop(a, b, v) {
      let k = a;
      while (k < b) {
        const t = T[k];
        if (t.t === 'p' && t.v === v) return k;
        k = isOpen(t) ? match[k] + 1 : k + 1;
      }
      return -1;
    }

    function patternNames(a, b, out) {
      if (a >= b) return;
      const t = T[a];
      if (t.t === 'name') {
        out.push(t.v);
        return;
      }
      if (isP(a, '[')) {
        for (const [x, y] of splitTop(a + 1, match[a], ',')) {
          const s = isP(x, '...') ? x + 1 : x;
          const eq = findTop(s, y, '=');
          patternNames(s, eq < 0 ? y : eq, out);
        }
      } else if (isP(a, '{')) {
        for (const [x, y] of splitTop(a + 1, match[a], ',')) {
          if (isP(x, '...')) {
            patternNames(x + 1, y, out);
            continue;
          }
          const colon = findTop(x, y, ':');
          if (colon >= 0) {
            const eq = findTop(colon + 1, y, '=');
            patternNames(colon + 1, eq < 0 ? y : eq, out);
          } else if (x < y && T[x].t === 'name') {
            out.push(T[x].v);
          }
        }
      }
    }

    // Declarators [a, b): their bound names are hoisted; `let x;` gets `= void 0`.
    function declarators(a, b, kind) {
      for (const [x, y] of splitTop(a, b, ',')) {
        const eq = findTop(x, y, '=');
        const names = [];
        patternNames(x, eq < 0 ? y : eq, names);
        for (const nm of names) hoisted.add(nm);
        if (eq < 0 && kind !== 'var') ins(T[y - 1].e, ' = void 0');
      }
    }

    function declaration(i, end, isTop, inList, kind) {
      const r = scanExpr(i + 1, end);
      if (isTop || kind === 'var') {
        declarators(i + 1, r.last + 1, kind);
        // `let a = 1, b` -> `;(  a = 1, b = void 0)`: same columns, an expression statement.
        rep(T[i], (inList ? ';(' : '(').padEnd(T[i].v.length, ' '));
        ins(T[r.last].e, ')');
      }
      rec(isTop, 'decl', i, r.last);
      return r.next;
    }

    function block(j) {
      if (!isP(j, '{')) return j;
      statements(j + 1, match[j], false);
      return match[j] + 1;
    }

    function statements(i, end, isTop) {
      while (i < end) {
        const j = statement(i, end, isTop, true);
        i = j > i ? j : i + 1;
      }
    }

    function statement(i, end, isTop, inList) {
      if (i >= end) return end;
      const t = T[i];
      if (t.t === 'p') {
        if (t.v === ';') {
          rec(isTop, 'empty', i, i);
          return i + 1;
        }
        if (t.v === '{') {
          const j = block(i);
          rec(isTop, 'other', i, j - 1);
          return j;
        }
      } else if (t.t === 'name') {
        const nx = i + 1 < end ? T[i + 1] : null;
        const nxName = nx && nx.t === 'name';
        const nxPattern = nx && nx.t === 'p' && (nx.v === '[' || nx.v === '{');
        switch (t.v) {
          case 'var':
          case 'const':
            if (nxName || nxPattern) return declaration(i, end, isTop, inList, t.v);
            break;
          case 'let':
            if ((nxName && !LET_NOT_DECL.has(nx.v)) || nxPattern) return declaration(i, end, isTop, inList, 'let');
            break;
          case 'class':
            if (nxName && nx.v !== 'extends') {
              const k = skipFnClass(i, end);
              if (isTop && k > i + 1 && inList) {
                ins(T[i].s, nx.v + ' = ');
                ins(T[k - 1].e, ';');
                hoisted.add(nx.v);
              }
              rec(isTop, 'decl', i, k - 1);
              return k;
            }
            break;
          case 'async':
          case 'function': {
            const f = t.v === 'async' ? i + 1 : i;
            if (f !== i && !(nx && nx.t === 'name' && nx.v === 'function' && !nx.nl)) break;
            let k = f + 1;
            if (isP(k, '*')) k++;
            const nameTok = k < end && T[k].t === 'name' ? T[k] : null;
            const j = skipFnClass(f, end);
            if (isTop && inList && nameTok && j > f + 1) funcs.push(nameTok.v);
            rec(isTop, 'decl', i, j - 1);
            return j;
          }
          case 'if': {
            if (!isP(i + 1, '(')) break;
            let j = statement(match[i + 1] + 1, end, false, false);
            if (isN(j, 'else')) j = statement(j + 1, end, false, false);
            rec(isTop, 'other', i, j - 1);
            return j;
          }
          case 'for': {
            let j = i + 1;
            if (isN(j, 'await')) j++;
            if (!isP(j, '(')) break;
            const close = match[j];
            if (isN(j + 1, 'var')) {
              const k = j + 1;
              let e = k + 1;
              while (e < close) {
                const u = T[e];
                if (u.t === 'p' && u.v === ';') break;
                if (u.t === 'name' && (u.v === 'in' || u.v === 'of') && e > k + 1) break;
                e = isOpen(u) ? match[e] + 1 : e + 1;
              }
              declarators(k + 1, e, 'var');
              rep(T[k], '   ');
            }
            j = statement(close + 1, end, false, false);
            rec(isTop, 'other', i, j - 1);
            return j;
          }
          case 'while':
          case 'with': {
            if (!isP(i + 1, '(')) break;
            const j = statement(match[i + 1] + 1, end, false, false);
            rec(isTop, 'other', i, j - 1);
            return j;
          }
          case 'do': {
            let j = statement(i + 1, end, false, false);
            if (isN(j, 'while') && isP(j + 1, '(')) {
              j = match[j + 1] + 1;
              if (isP(j, ';')) j++;
            }
            rec(isTop, 'other', i, j - 1);
            return j;
          }
          case 'try': {
            let j = block(i + 1);
            if (isN(j, 'catch')) {
              j++;
              if (isP(j, '(')) j = match[j] + 1;
              j = block(j);
            }
            if (isN(j, 'finally')) j = block(j + 1);
            rec(isTop, 'other', i, j - 1);
            return j;
          }
          case 'switch': {
            if (!isP(i + 1, '(')) break;
            const b = match[i + 1] + 1;
            if (!isP(b, '{')) break;
            const close = match[b];
            let k = b + 1;
            while (k < close) {
              if (isN(k, 'case')) {
                let q = 0;
                k++;
                while (k < close) {
                  const u = T[k];
                  if (u.t === 'p' && u.v === '?') q++;
                  else if (u.t === 'p' && u.v === ':') {
                    if (q === 0) {
                      k++;
                      break;
                    }
                    q--;
                  }
                  k = isOpen(u) ? match[k] + 1 : k + 1;
                }
                continue;
              }
              if (isN(k, 'default') && isP(k + 1, ':')) {
                k += 2;
                continue;
              }
              const nk = statement(k, close, false, true);
              k = nk > k ? nk : k + 1;
            }
            rec(isTop, 'other', i, close);
            return close + 1;
          }
          case 'return':
          case 'throw':
          case 'break':
          case 'continue': {
            if (!nx || nx.nl || (nx.t === 'p' && nx.v === ';')) {
              rec(isTop, 'other', i, i);
              return isP(i + 1, ';') ? i + 2 : i + 1;
            }
            const r = scanExpr(i + 1, end);
            rec(isTop, 'other', i, r.last);
            return r.next;
          }
          case 'debugger':
          case 'export': {
            const r = scanExpr(i, end);
            rec(isTop, 'other', i, r.last);
            return r.next;
          }
          case 'import':
            if (!(nx && nx.t === 'p' && (nx.v === '(' || nx.v === '.'))) {
              const r = scanExpr(i, end);
              rec(isTop, 'other', i, r.last);
              return r.next;
            }
            break;
          default:
            if (nx && nx.t === 'p' && nx.v === ':' && !KEYWORDS.has(t.v)) {
              const j = statement(i + 2, end, false, false);
              rec(isTop, 'other', i, j - 1);
              return j;
            }
        }
      }
      const r = scanExpr(i, end);
      rec(isTop, 'expr', i, r.last);
      return r.next;
    }

    statements(0, N, true);

    let first = 0;
    while (first < top.length && top[first].kind === 'expr' && top[first].start === top[first].last
      && T[top[first].start].t === 'str') first++;
    if (funcs.length && first < top.length) {
      ins(T[top[first].start].s, funcs.map((f) => `this.${f} = ${f}; `).join(''), -1);
    }
    let last = top.length - 1;
    while (last >= 0 && top[last].kind === 'empty') last--;
    if (last >= 0 && top[last].kind === 'expr') ins(T[top[last].start].s, 'return ', 1e9);

    edits.sort((a, b) => a.pos - b.pos || a.seq - b.seq);
    let body = '';
    let cur = 0;
    for (const e of edits) {
      body += src.slice(cur, e.pos) + e.text;
      cur = e.pos + e.del;
    }
    body += src.slice(cur);
    // A cell that calls nothing, loops nowhere and defines no class cannot run for long
    // (short of a pathological getter or coercion): it skips the SIGINT watchdog, which costs
    // a thread start and join per run (0.2-0.8 ms).
    let simple = true;
    for (const t of T) {
      if (t.t === 'tpl' || (t.t === 'p' && (t.v === '(' || t.v === '...')) || (t.t === 'name' && NOT_SIMPLE.has(t.v))) {
        simple = false;
        break;
      }
    }
    return { body, edits, hoisted: [...hoisted], hasAwait: tk.hasAwait, simple };
  }

  // ---------------------------------------------------------------- tracebacks

  const RE_LINE_BREAKS = /\r\n|[\n\r\u2028\u2029]/g;
  function lineStarts(s) {
    const out = [0];
    RE_LINE_BREAKS.lastIndex = 0;
    let m;
    while ((m = RE_LINE_BREAKS.exec(s))) out.push(m.index + m[0].length);
    return out;
  }
  function lineOf(starts, off) {
    let lo = 0;
    let hi = starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (starts[mid] <= off) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  // Per cell: how to map `<cell N>:L:C` of the compiled script back to the user's code.
  const cells = new Map();

  function mapLocation(info, line, col) {
    if (!info.wrapped) return [line, col];
    if (line < 1 || line > info.lines) return null; // the wrapper's own lines
    if (!info.edits.length) return [line, col];
    let off = info.tStarts[line - 1] + col - 1;
    let delta = 0;
    let orig = null;
    for (const e of info.edits) {
      const tStart = e.pos + delta;
      if (off < tStart) break;
      if (off < tStart + e.text.length) {
        orig = e.pos;
        break;
      }
      delta += e.text.length - e.del;
    }
    if (orig === null) orig = off - delta;
    const l = lineOf(info.oStarts, orig);
    return [l + 1, orig - info.oStarts[l] + 1];
  }

  const RE_CELL_LOC = /<cell (\d+)>:(\d+):(\d+)/g;
  const RE_KERNEL_FRAME = /\[eval\]|\(node:vm:|at node:vm:|node:internal\/vm[:/]|node:internal\/process\/execution/;

  // err.stack -> traceback lines: the user's frames (columns mapped back), never the kernel's.
  function cleanStack(stack) {
    const lines = String(stack).split(/\r?\n/);
    const head = [];
    let frames = [];
    let i = 0;
    while (i < lines.length && !/^\s+at /.test(lines[i])) head.push(lines[i++]);
    for (; i < lines.length; i++) {
      let line = lines[i];
      if (!/^\s+at /.test(line)) {
        frames.push(line);
        continue;
      }
      if (RE_KERNEL_FRAME.test(line)) continue;
      let wrapper = false;
      line = line.replace(RE_CELL_LOC, (all, n, l, c) => {
        const info = cells.get(Number(n));
        if (!info) return all;
        const m = mapLocation(info, Number(l), Number(c));
        if (!m) {
          wrapper = true;
          return all;
        }
        return `<cell ${n}>:${m[0]}:${m[1]}`;
      });
      if (!wrapper) frames.push(line);
    }
    let lastCell = -1;
    for (let k = 0; k < frames.length; k++) if (frames[k].includes('<cell ')) lastCell = k;
    if (lastCell >= 0) frames = frames.slice(0, lastCell + 1);
    else while (frames.length && /\(node:|at node:/.test(frames[frames.length - 1])) frames.pop();
    while (head.length && head[head.length - 1] === '' && !frames.length) head.pop();
    return head.concat(frames);
  }

  function ctorName(v) {
    try {
      const p = Object.getPrototypeOf(v);
      if (p === null) return 'Object';
      const c = p.constructor;
      return typeof c === 'function' && typeof c.name === 'string' && c.name ? c.name : 'Object';
    } catch (_) {
      return 'Object';
    }
  }

  function inspectShort(v, max) {
    let s;
    try {
      s = util.inspect(v, { depth: 2, colors: false, maxArrayLength: 50, maxStringLength: max, breakLength: 80 });
    } catch (e) {
      s = `[uninspectable ${typeof v}]`;
    }
    return s.length > max ? s.slice(0, max - 3) + '...' : s;
  }

  function errorFields(err) {
    if (err !== null && (typeof err === 'object' || typeof err === 'function')) {
      let name;
      let message;
      let stack;
      try {
        name = err.name;
        message = err.message;
        stack = err.stack;
      } catch (_) {
        /* a throwing getter */
      }
      const ename = typeof name === 'string' && name ? name : ctorName(err) || 'Error';
      let evalue;
      if (typeof message === 'string') evalue = message;
      else if (message === undefined) evalue = util.types.isNativeError(err) ? '' : inspectShort(err, 1000);
      else evalue = inspectShort(message, 1000);
      let traceback;
      if (typeof stack === 'string' && stack) traceback = cleanStack(stack);
      else traceback = [evalue ? `${ename}: ${evalue}` : ename];
      return { ename, evalue, traceback };
    }
    const evalue = typeof err === 'symbol' ? err.toString() : String(err);
    return { ename: 'Error', evalue, traceback: [`Uncaught ${inspectShort(err, 1000)}`] };
  }

  // ---------------------------------------------------------------- execution

  let executionCount = 0;
  const RUN_OPTS = { breakOnSigint: true, displayErrors: false };
  const RUN_OPTS_SIMPLE = { displayErrors: false };
  const isAwaitError = (e) => e && typeof e.message === 'string' && e.message.includes('await');
  const wrap = (body, isAsync) => `${isAsync ? '(async () => {' : '(() => {'}\n${body}\n})()`;

  // -> {script, hoisted} or {error}
  function prepare(code, count) {
    const filename = `<cell ${count}>`;
    const oStarts = lineStarts(code);
    const a = analyze(code);
    if (!a.error) {
      for (const isAsync of a.hasAwait ? [true, false] : [false, true]) {
        try {
          const script = new vm.Script(wrap(a.body, isAsync), { filename, lineOffset: -1, ...importOpts });
          cells.set(count, { wrapped: true, edits: a.edits, lines: oStarts.length, oStarts, tStarts: lineStarts(a.body) });
          return { script, hoisted: a.hoisted, simple: a.simple && !isAsync };
        } catch (_) {
          /* try the next form */
        }
      }
    }
    // The rewriter could not handle the cell: plain script semantics, or just an async body.
    try {
      const script = new vm.Script(code, { filename, ...importOpts });
      cells.set(count, { wrapped: false });
      return { script, hoisted: [] };
    } catch (e) {
      if (!isAwaitError(e)) return { error: e };
    }
    try {
      const script = new vm.Script(wrap(code, true), { filename, lineOffset: -1, ...importOpts });
      cells.set(count, { wrapped: true, edits: [], lines: oStarts.length, oStarts, tStarts: oStarts });
      return { script, hoisted: [] };
    } catch (e) {
      // A syntax error at the wrapper's closing line is the end of the user's input.
      if (typeof e.stack === 'string') {
        const m = /^<cell \d+>:(\d+)\n/.exec(e.stack);
        if (m && Number(m[1]) > oStarts.length) {
          const rest = e.stack.split('\n').slice(3).join('\n').replace(/^\n/, '');
          try {
            Object.defineProperty(e, 'stack', { value: rest, configurable: true, writable: true });
          } catch (_) {
            /* keep */
          }
        }
      }
      return { error: e };
    }
  }

  function isThenable(v) {
    if (v === null || (typeof v !== 'object' && typeof v !== 'function')) return false;
    try {
      return typeof v.then === 'function';
    } catch (_) {
      return false;
    }
  }

  function execute(req) {
    const count = ++executionCount;
    const ex = {
      id: req.id,
      count,
      phase: 'sync',
      settled: false,
      used: { stdout: 0, stderr: 0 },
      dropped: { stdout: 0, stderr: 0 },
      pend: [],
      pendName: null,
      pendBytes: 0,
      lastFlush: 0,
      flushTimer: null,
    };
    current = ex;
    if (background.items.length || background.dropped.stdout || background.dropped.stderr) {
      const items = background.items;
      ex.dropped.stdout += background.dropped.stdout;
      ex.dropped.stderr += background.dropped.stderr;
      background.items = [];
      background.bytes = { stdout: 0, stderr: 0 };
      background.dropped = { stdout: 0, stderr: 0 };
      for (const [name, text] of items) capture(name, text);
    }
    const code = typeof req.code === 'string' ? req.code : '';
    let prepared;
    try {
      prepared = prepare(code, count);
    } catch (e) {
      prepared = { error: e };
    }
    if (prepared.error) {
      finish(ex, { kind: 'error', err: prepared.error });
      return;
    }
    for (const name of prepared.hoisted) {
      if (!(name in ctxGlobal)) sandbox[name] = undefined;
    }
    let value;
    try {
      value = prepared.script.runInContext(ctx, prepared.simple ? RUN_OPTS_SIMPLE : RUN_OPTS);
    } catch (e) {
      ex.phase = 'async';
      if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') finish(ex, { kind: 'interrupted' });
      else finish(ex, { kind: 'error', err: e });
      return;
    }
    ex.phase = 'async';
    if (isThenable(value)) {
      Promise.resolve(value).then(
        (v) => finish(ex, { kind: 'ok', value: v }),
        (e) => finish(ex, { kind: 'error', err: e }),
      );
    } else {
      // Let promise jobs the cell queued run (and unhandled rejections surface) first.
      setImmediate(() => finish(ex, { kind: 'ok', value }));
    }
  }

  function finish(ex, outcome) {
    if (ex.settled) return;
    let status = 'ok';
    if (outcome.kind === 'ok' && outcome.value !== undefined) {
      let text;
      try {
        text = util.inspect(outcome.value, { depth: 4, colors: false });
      } catch (e) {
        outcome = { kind: 'error', err: e };
      }
      if (text !== undefined) {
        emitFor(ex, { type: 'result', id: ex.id, data: { 'text/plain': text }, metadata: {} });
      }
    }
    if (outcome.kind === 'error') {
      status = 'error';
      let f;
      try {
        f = errorFields(outcome.err);
      } catch (_) {
        f = { ename: 'Error', evalue: 'unprintable error', traceback: ['Error: unprintable error'] };
      }
      emitFor(ex, { type: 'error', id: ex.id, ename: f.ename, evalue: f.evalue, traceback: f.traceback });
    } else if (outcome.kind === 'interrupted') {
      status = 'interrupted';
      emitFor(ex, {
        type: 'error',
        id: ex.id,
        ename: 'Interrupted',
        evalue: 'execution interrupted',
        traceback: ['Interrupted: execution interrupted'],
      });
    }
    ex.settled = true;
    if (ex.flushTimer) clearTimeout(ex.flushTimer);
    emitFor(ex, {
      type: 'done',
      id: ex.id,
      status,
      execution_count: ex.count,
      dropped: { stdout: ex.dropped.stdout, stderr: ex.dropped.stderr },
    });
    if (current === ex) current = null;
    busy = false;
    pump();
  }

  process.on('SIGINT', () => {
    // While user code runs synchronously, vm's breakOnSigint handles the signal instead.
    if (current && current.phase !== 'sync') finish(current, { kind: 'interrupted' });
  });
  process.on('uncaughtException', (err) => {
    if (current && current.phase !== 'sync') finish(current, { kind: 'error', err });
    else backgroundError('Uncaught', err);
  });
  process.on('unhandledRejection', (reason) => {
    if (current && current.phase !== 'sync') finish(current, { kind: 'error', err: reason });
    else backgroundError('Uncaught (in promise)', reason);
  });
  function backgroundError(prefix, err) {
    try {
      const f = errorFields(err);
      capture('stderr', `${prefix} ${f.traceback.join('\n')}\n`);
    } catch (_) {
      /* nothing sensible to report */
    }
  }

  // ---------------------------------------------------------------- is_complete

  function isComplete(code) {
    const a = analyze(code);
    if (a.error === 'incomplete') return { status: 'incomplete', indent: '  '.repeat(a.depth || 0) };
    if (a.error) return { status: 'invalid' };
    const endOfInput = (e) => /Unexpected end of input|Unterminated template/.test(String(e && e.message));
    if (a.hasAwait) {
      // Top-level await: the cell as an async body, else the rest as a script with `await`
      // blanked out (to tell a missing operand from a real error).
      try {
        new vm.Script(wrap(code, true));
        return { status: 'complete' };
      } catch (_) {
        /* see below */
      }
      const tk = tokenize(code);
      const parts = [];
      let cur = 0;
      for (const t of tk.tokens) {
        if (t.t === 'name' && t.v === 'await') {
          parts.push(code.slice(cur, t.s), '     ');
          cur = t.e;
        }
      }
      parts.push(code.slice(cur));
      try {
        new vm.Script(parts.join(''));
      } catch (e) {
        if (endOfInput(e)) return { status: 'incomplete' };
      }
    }
    try {
      new vm.Script(code);
      return { status: 'complete' };
    } catch (e) {
      return { status: endOfInput(e) ? 'incomplete' : 'invalid' };
    }
  }

  // ---------------------------------------------------------------- variables

  const RE_IDENTIFIER = /^[$_\p{ID_Start}][$\u200c\u200d\p{ID_Continue}]*$/u;
  const RESERVED = new Set([
    ...KEYWORDS, 'let', 'static', 'yield', 'await', 'implements', 'interface', 'package', 'private',
    'protected', 'public', 'arguments', 'eval', 'undefined', 'NaN', 'Infinity', 'globalThis',
  ]);
  const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

  function sameDesc(a, b) {
    return a && b && a.value === b.value && a.get === b.get && a.set === b.set;
  }
  // Names the user made or changed (injected globals the user left alone are not theirs).
  function isUserName(name) {
    if (!baseline.has(name)) return true;
    return !sameDesc(Object.getOwnPropertyDescriptor(sandbox, name), baseline.get(name));
  }
  function readVar(name) {
    try {
      return { ok: true, value: sandbox[name] };
    } catch (e) {
      return { ok: false, error: e };
    }
  }
  function isModuleValue(v) {
    if (v === null || (typeof v !== 'object' && typeof v !== 'function')) return false;
    return moduleValues.has(v) || util.types.isModuleNamespaceObject(v);
  }
  // The variables list_vars shows: user-made, not modules, not starting with `_`.
  function userVarNames() {
    const out = [];
    for (const name of Object.getOwnPropertyNames(sandbox)) {
      if (name.startsWith('_') || !isUserName(name)) continue;
      const d = Object.getOwnPropertyDescriptor(sandbox, name);
      if (d && !d.get && isModuleValue(d.value)) continue;
      out.push(name);
    }
    return out.sort();
  }

  function isPlainProto(p) {
    return p === null || p === Object.prototype || p === ctxObjectProto;
  }
  // True if JSON.stringify(v) represents v exactly.
  function jsonExact(v, ancestors, depth) {
    switch (typeof v) {
      case 'string':
      case 'boolean':
        return true;
      case 'number':
        return Number.isFinite(v);
      case 'object':
        break;
      default:
        return false;
    }
    if (v === null) return true;
    if (depth > 200 || ancestors.has(v) || util.types.isProxy(v)) return false;
    ancestors.add(v);
    try {
      if (Array.isArray(v)) {
        const p = Object.getPrototypeOf(v);
        if (p !== Array.prototype && p !== ctxArrayProto) return false;
        const keys = Reflect.ownKeys(v);
        if (keys.length !== v.length + 1) return false;
        for (let i = 0; i < v.length; i++) {
          const d = Object.getOwnPropertyDescriptor(v, i);
          if (!d || d.get || d.set || !jsonExact(d.value, ancestors, depth + 1)) return false;
        }
        return true;
      }
      if (!isPlainProto(Object.getPrototypeOf(v))) return false;
      for (const k of Reflect.ownKeys(v)) {
        if (typeof k !== 'string') return false;
        const d = Object.getOwnPropertyDescriptor(v, k);
        if (!d.enumerable || d.get || d.set || !jsonExact(d.value, ancestors, depth + 1)) return false;
      }
      return true;
    } finally {
      ancestors.delete(v);
    }
  }
  function isJson(v) {
    try {
      return jsonExact(v, new Set(), 0);
    } catch (_) {
      return false;
    }
  }

  function typeName(v) {
    if (v === null) return 'null';
    const t = typeof v;
    if (t === 'function') {
      if (moduleValues.has(v)) return 'module';
      try {
        return /^class\b/.test(Function.prototype.toString.call(v)) ? 'class' : 'function';
      } catch (_) {
        return 'function';
      }
    }
    if (t !== 'object') return t;
    if (util.types.isModuleNamespaceObject(v) || moduleValues.has(v)) return 'module';
    if (Array.isArray(v)) return 'Array';
    return ctorName(v);
  }

  function getVars(names) {
    const values = {};
    const unrepresentable = {};
    const missing = [];
    for (const name of names == null ? userVarNames() : names) {
      if (typeof name !== 'string') continue;
      let r;
      if (hasOwn(sandbox, name)) r = readVar(name);
      else if (Object.getOwnPropertyDescriptor(ctxGlobal, name)) {
        try {
          r = { ok: true, value: ctxGlobal[name] };
        } catch (e) {
          r = { ok: false, error: e };
        }
      } else {
        missing.push(name);
        continue;
      }
      if (!r.ok) {
        unrepresentable[name] = { type: 'error', repr: inspectShort(r.error, 1000) };
      } else if (isJson(r.value)) {
        values[name] = r.value;
      } else {
        unrepresentable[name] = { type: typeName(r.value), repr: inspectShort(r.value, 1000) };
      }
    }
    return { values, unrepresentable, missing };
  }

  function setVars(values) {
    if (values === null || typeof values !== 'object' || Array.isArray(values)) {
      return { error: 'values must be an object' };
    }
    const names = Object.keys(values);
    for (const name of names) {
      if (!RE_IDENTIFIER.test(name) || RESERVED.has(name)) return { error: `invalid variable name: ${JSON.stringify(name)}` };
    }
    for (const name of names) {
      const v = values[name];
      sandbox[name] = v !== null && typeof v === 'object' ? ctxJSONParse(JSON.stringify(v)) : v;
    }
    return { set: names.sort() };
  }

  function clearVars(names) {
    const cleared = [];
    for (const name of names == null ? userVarNames() : names) {
      if (typeof name !== 'string' || !hasOwn(sandbox, name) || !isUserName(name)) continue;
      if (baseline.has(name)) Object.defineProperty(sandbox, name, baseline.get(name));
      else if (!Reflect.deleteProperty(sandbox, name)) continue;
      cleared.push(name);
    }
    return { cleared: cleared.sort() };
  }

  function listVars() {
    return {
      variables: userVarNames().map((name) => {
        const r = readVar(name);
        return r.ok
          ? { name, type: typeName(r.value), json: isJson(r.value) }
          : { name, type: 'error', json: false };
      }),
    };
  }

  // ---------------------------------------------------------------- state capture (snapshots)
  //
  // dump_state writes the user's variables to a file; load_state brings them back (in a fresh
  // kernel). The file is one v8.serialize'd object {format, version, entries}, an entry being
  //   {name, kind: 'module', id}          a value `require(id)` returned: required again;
  //   {name, kind: 'source', source}      a function or class: its source text evaluated again;
  //   {name, kind: 'alias', of}           the same function as an earlier entry;
  //   {name, kind: 'value', data, fixes}  v8.serialize(value) (structured clone). Each variable
  //                                       is serialized on its own, so one that cannot be is
  //                                       skipped alone; `fixes` give objects their prototypes
  //                                       back (instances of the session's classes, null).
  // A clone comes back with the main realm's built-in prototypes; they are swapped for the
  // context's own, so `x instanceof Map` in a cell holds after a restore.
  const STATE_FORMAT = 'sandcell-node-state';
  const STATE_VERSION = 1;
  const INTRINSICS = [
    'Object', 'Array', 'Map', 'Set', 'Date', 'RegExp', 'Error', 'EvalError', 'RangeError',
    'ReferenceError', 'SyntaxError', 'TypeError', 'URIError', 'ArrayBuffer', 'SharedArrayBuffer',
    'DataView', 'Int8Array', 'Uint8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array',
    'Int32Array', 'Uint32Array', 'Float32Array', 'Float64Array', 'BigInt64Array', 'BigUint64Array',
    'Boolean', 'Number', 'String',
  ];
  // Taken now: user code may replace the context's globals later.
  const ctxIntrinsicProtos = INTRINSICS.map((n) => {
    const c = ctxGlobal[n];
    return typeof c === 'function' ? c.prototype : undefined;
  });
  let realmMaps = null;
  function realms() {
    if (!realmMaps) {
      const mainToCtx = new Map();
      const natural = new Set([Buffer.prototype]);
      INTRINSICS.forEach((n, i) => {
        const main = globalThis[n] && globalThis[n].prototype;
        const own = ctxIntrinsicProtos[i];
        if (main) natural.add(main);
        if (own) natural.add(own);
        if (main && own) mainToCtx.set(main, own);
      });
      realmMaps = { mainToCtx, natural };
    }
    return realmMaps;
  }

  class NotCarried extends Error {}

  function isCloneLeaf(v) {
    const t = util.types;
    return t.isDate(v) || t.isRegExp(v) || t.isNativeError(v) || t.isBoxedPrimitive(v) ||
      t.isArrayBufferView(v) || t.isAnyArrayBuffer(v);
  }

  // Calls fn(object, index) for the objects a structured clone of `root` holds, in an order
  // the clone shares: array elements, other objects' own enumerable keys, Map entries, Set
  // values; leaves (dates, buffers, errors, ...) are not entered.
  function eachObject(root, fn) {
    const seen = new Set();
    const stack = [root];
    let index = 0;
    const push = (children) => {
      for (let i = children.length - 1; i >= 0; i--) stack.push(children[i]);
    };
    while (stack.length) {
      const v = stack.pop();
      if (v === null || (typeof v !== 'object' && typeof v !== 'function') || seen.has(v)) continue;
      seen.add(v);
      fn(v, index++);
      const children = [];
      const add = (x) => {
        if (x !== null && typeof x === 'object') children.push(x);
      };
      if (util.types.isMap(v)) {
        for (const [k, x] of Map.prototype.entries.call(v)) add(k), add(x);
      } else if (util.types.isSet(v)) {
        for (const x of Set.prototype.values.call(v)) add(x);
      } else if (Array.isArray(v)) {
        for (let i = 0; i < v.length; i++) if (hasOwn(v, i)) add(v[i]);
      } else if (!isCloneLeaf(v)) {
        for (const k of Object.keys(v)) add(v[k]);
      }
      push(children);
    }
  }

  // prototype -> name of the session's class (or constructor function) that owns it.
  function sessionClasses() {
    const out = new Map();
    for (const name of Object.getOwnPropertyNames(sandbox)) {
      if (!isUserName(name)) continue;
      const d = Object.getOwnPropertyDescriptor(sandbox, name);
      if (!d || d.get || typeof d.value !== 'function' || moduleValues.has(d.value)) continue;
      const p = d.value.prototype;
      if (p !== null && typeof p === 'object' && !out.has(p)) out.set(p, name);
    }
    return out;
  }

  function prototypeFixes(value, classes) {
    const { natural } = realms();
    const fixes = [];
    eachObject(value, (o, i) => {
      const p = Object.getPrototypeOf(o);
      if (natural.has(p)) return;
      if (p === null) fixes.push([i, 'null']);
      else if (classes.has(p)) fixes.push([i, 'class', classes.get(p)]);
      else throw new NotCarried(`an instance of ${ctorName(o)}, whose class is not defined in the session`);
    });
    return fixes;
  }

  function reviveValue(value, fixes) {
    const { mainToCtx } = realms();
    const byIndex = new Map(fixes.map((f) => [f[0], f]));
    eachObject(value, (o, i) => {
      const f = byIndex.get(i);
      let p;
      if (!f) p = mainToCtx.get(Object.getPrototypeOf(o));
      else if (f[1] === 'null') p = null;
      else {
        const cls = hasOwn(sandbox, f[2]) ? sandbox[f[2]] : undefined;
        if (typeof cls !== 'function' || cls.prototype === null || typeof cls.prototype !== 'object') {
          throw new Error(`its class ${f[2]} was not restored`);
        }
        p = cls.prototype;
      }
      if (p !== undefined) Object.setPrototypeOf(o, p);
    });
    return value;
  }

  const cut = (s) => (s.length > 300 ? s.slice(0, 297) + '...' : s);
  const why = (e) => {
    if (e instanceof NotCarried || (e && e.name === 'Error')) return cut(String(e.message));
    return cut(`${(e && e.name) || 'Error'}: ${e && e.message}`);
  };

  function statePath(req) {
    const p = req.path;
    if (typeof p !== 'string' || !p.startsWith('/')) throw new NotCarried('path must be an absolute path');
    return p;
  }

  // The source of a function that evaluates back to it, or a NotCarried.
  function functionSource(fn) {
    const src = Function.prototype.toString.call(fn);
    if (/\{\s*\[native code\]\s*\}\s*$/.test(src)) {
      throw new NotCarried('a built-in or bound function: it has no source to evaluate again');
    }
    try {
      new vm.Script(`(${src}\n)`);
    } catch (_) {
      throw new NotCarried('its source is not a function expression (a method?)');
    }
    return src;
  }

  function dumpState(req) {
    let file;
    try {
      file = statePath(req);
    } catch (e) {
      return { error: e.message };
    }
    const v8 = require('v8');
    const classes = sessionClasses();
    const entries = [];
    const saved = [];
    const skipped = [];
    const sources = new Map(); // function -> the first name saved for it
    for (const name of Object.getOwnPropertyNames(sandbox)) {
      if (!isUserName(name)) continue;
      const d = Object.getOwnPropertyDescriptor(sandbox, name);
      if (!d) continue;
      if (d.get || d.set) {
        skipped.push({ name, type: 'accessor', reason: 'an accessor property (getter or setter)' });
        continue;
      }
      const v = d.value;
      try {
        if (moduleValues.has(v) && moduleIds.has(v)) {
          entries.push({ name, kind: 'module', id: moduleIds.get(v) });
        } else if (util.types.isModuleNamespaceObject(v)) {
          throw new NotCarried('an ES module namespace: import() it again');
        } else if (typeof v === 'function') {
          if (sources.has(v)) entries.push({ name, kind: 'alias', of: sources.get(v) });
          else {
            entries.push({ name, kind: 'source', source: functionSource(v) });
            sources.set(v, name);
          }
        } else {
          const data = v8.serialize(v);
          entries.push({ name, kind: 'value', data, fixes: prototypeFixes(v, classes) });
        }
        saved.push(name);
      } catch (e) {
        skipped.push({ name, type: typeName(v), reason: why(e) });
      }
    }
    fs.mkdirSync(path.dirname(file), { recursive: true });
    const tmp = `${file}.tmp-${process.pid}`;
    try {
      fs.writeFileSync(tmp, v8.serialize({ format: STATE_FORMAT, version: STATE_VERSION, entries }));
      fs.renameSync(tmp, file);
    } catch (e) {
      try {
        fs.unlinkSync(tmp);
      } catch (_) {
        /* not there */
      }
      return { error: `cannot write ${file}: ${e.message}` };
    }
    return { saved, skipped, bytes: fs.statSync(file).size };
  }

  function loadState(req) {
    let file;
    try {
      file = statePath(req);
    } catch (e) {
      return { error: e.message };
    }
    const v8 = require('v8');
    let state;
    try {
      state = v8.deserialize(fs.readFileSync(file));
    } catch (e) {
      return { error: `cannot read ${file}: ${e.message}` };
    }
    if (!state || state.format !== STATE_FORMAT || !Array.isArray(state.entries)) {
      return { error: `${file} is not a node state file` };
    }
    const restored = new Set();
    const failed = new Map();
    const put = (name, value) => {
      sandbox[name] = value;
      restored.add(name);
      failed.delete(name);
    };
    const attempt = (entry, fn) => {
      try {
        put(entry.name, fn());
        return true;
      } catch (e) {
        failed.set(entry.name, why(e));
        return false;
      }
    };
    const byKind = (k) => state.entries.filter((e) => e && e.kind === k && typeof e.name === 'string');
    for (const e of byKind('module')) attempt(e, () => userRequire(e.id));
    // Functions and classes in definition order; one that needs a later one (a class
    // extending it) is tried again after the others, while that makes progress.
    let pending = byKind('source');
    while (pending.length) {
      const next = pending.filter((e) => !attempt(e, () => vm.runInContext(`(${e.source}\n)`, ctx, { filename: `<state ${e.name}>` })));
      if (next.length === pending.length) break;
      pending = next;
    }
    for (const e of byKind('alias')) {
      attempt(e, () => {
        if (!restored.has(e.of)) throw new NotCarried(`${e.of} was not restored`);
        return sandbox[e.of];
      });
    }
    for (const e of byKind('value')) attempt(e, () => reviveValue(v8.deserialize(e.data), e.fixes || []));
    for (const e of state.entries) {
      if (e && typeof e.name === 'string' && !restored.has(e.name) && !failed.has(e.name)) {
        failed.set(e.name, `unknown entry kind ${String(e.kind)}`);
      }
    }
    const order = state.entries.map((e) => e && e.name);
    return {
      restored: order.filter((n) => restored.has(n)),
      failed: [...failed].map(([name, reason]) => ({ name, reason })),
    };
  }

  // ---------------------------------------------------------------- requests

  const queue = [];
  let busy = false;

  function reply(id, body) {
    emitRaw({ type: 'reply', id, ...body });
  }

  function handle(req) {
    const id = req.id;
    try {
      switch (req.op) {
        case 'execute':
          if (typeof req.code !== 'string') {
            reply(id, { error: 'execute needs a string code' });
            return;
          }
          busy = true;
          execute(req);
          return;
        case 'is_complete':
          reply(id, isComplete(typeof req.code === 'string' ? req.code : ''));
          return;
        case 'get_vars':
          reply(id, getVars(Array.isArray(req.names) ? req.names : null));
          return;
        case 'set_vars':
          reply(id, setVars(req.values));
          return;
        case 'clear_vars':
          reply(id, clearVars(Array.isArray(req.names) ? req.names : null));
          return;
        case 'list_vars':
          reply(id, listVars());
          return;
        case 'dump_state':
          reply(id, dumpState(req));
          return;
        case 'load_state':
          reply(id, loadState(req));
          return;
        default:
          reply(id, { error: `unknown op: ${String(req.op)}` });
      }
    } catch (e) {
      if (req.op === 'execute' && current && !current.settled) {
        finish(current, { kind: 'error', err: e });
        return;
      }
      busy = false;
      reply(id, { error: `internal error: ${String(e && e.message).toLowerCase()}` });
    }
  }

  function pump() {
    while (!busy && queue.length) handle(queue.shift());
  }

  function onLine(line) {
    if (!line.trim()) return;
    let req;
    try {
      req = JSON.parse(line);
    } catch (_) {
      reply(null, { error: 'request is not json' });
      return;
    }
    if (req === null || typeof req !== 'object') {
      reply(null, { error: 'request is not an object' });
      return;
    }
    queue.push(req);
    pump();
  }

  let chunks = [];
  function onData(chunk) {
    let start = 0;
    let nlAt = chunk.indexOf('\n');
    while (nlAt >= 0) {
      chunks.push(chunk.slice(start, nlAt));
      const line = chunks.length === 1 ? chunks[0] : chunks.join('');
      chunks = [];
      onLine(line);
      start = nlAt + 1;
      nlAt = chunk.indexOf('\n', start);
    }
    if (start < chunk.length) chunks.push(chunk.slice(start));
  }
  const onEnd = () => process.exit(0);

  let input;
  try {
    const net = require('net');
    input = new net.Socket({ fd: ctlFd, readable: true, writable: false });
  } catch (_) {
    input = fs.createReadStream(null, { fd: ctlFd, highWaterMark: 65536 });
  }
  input.setEncoding('utf8');
  input.on('data', onData);
  input.on('end', onEnd);
  input.on('close', onEnd);
  input.on('error', onEnd);

  emitRaw({ type: 'ready', language: 'node', version: process.versions.node, pid: process.pid });
})();
