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

