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

