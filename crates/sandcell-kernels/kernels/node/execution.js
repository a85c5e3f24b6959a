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

