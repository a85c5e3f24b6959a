// Streaming a long command: print its stdout and stderr as they are written, then how it
// ended; then the same work as a background process, followed, dropped and picked up again
// from the byte offset where the first connection stopped.
//
//   SANDCELL_API_URL=http://127.0.0.1:7070 SANDCELL_API_KEY=... node examples/stream-command.mjs

import { Sandbox } from "sandcell";

const WORK = `
for step in 1 2 3 4 5 6; do
  echo "step $step: working"
  [ $((step % 2)) -eq 0 ] && echo "step $step: a warning" >&2
  sleep 0.3
done
echo "all done"
`;

const sandbox = await Sandbox.create({ labels: { example: "stream-command" } });
try {
  const started = Date.now();
  const stamp = () => `${((Date.now() - started) / 1000).toFixed(1).padStart(4)}s`;

  console.log("-- streamed exec");
  for await (const event of sandbox.execStream(WORK)) {
    if (event.type === "done") {
      console.log(`${stamp()} done: ${event.result.message} (exit ${event.result.exitCode})`);
    } else {
      process.stdout.write(`${stamp()} ${event.type}: ${event.data}`);
    }
  }

  console.log("-- background process, with a reconnect");
  const proc = await sandbox.startProcess(WORK);
  let lines = 0;
  for await (const event of proc.stream()) {
    if (event.type === "stdout") process.stdout.write(`first connection: ${event.data}`);
    if (event.type === "stdout" && ++lines === 2) break; // drop the connection; the process runs on
  }
  console.log(`(disconnected at stdout offset ${proc.stdoutOffset}; reconnecting)`);
  // Another client could do the same with sandbox.process(pid): the pid is the handle.
  for await (const event of sandbox.process(proc.pid).stream({ stdoutFrom: proc.stdoutOffset })) {
    if (event.type === "done") console.log(`second connection: done, exit ${event.result.exitCode}`);
    else process.stdout.write(`second connection: ${event.type}: ${event.data}`);
  }
} finally {
  await sandbox.kill();
}
