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
