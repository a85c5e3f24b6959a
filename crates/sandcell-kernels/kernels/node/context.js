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

