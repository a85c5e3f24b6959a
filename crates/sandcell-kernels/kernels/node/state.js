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

