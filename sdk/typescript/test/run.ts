/**
 * The test run: one real daemon for every test file (Node 20's runner has no global setup),
 * `node --test` on the compiled files with the daemon's address in the environment, then a
 * check that no test left a sandbox running, and the daemon stopped whatever happened.
 */

import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { Sandbox } from "sandcell";
import { startDaemon } from "./daemon.js";

const here = dirname(fileURLToPath(import.meta.url));
const files = process.argv.length > 2
  ? process.argv.slice(2)
  : readdirSync(here).filter((f) => f.endsWith(".test.js")).sort().map((f) => join(here, f));

const daemon = await startDaemon();
let status = 1;
try {
  const [major = 0, minor = 0] = process.versions.node.split(".").map(Number);
  // Files run side by side (most of a test's time is spent waiting on sandboxes); the flag
  // exists from Node 20.10 on, older runners use their own default.
  const concurrency = major > 20 || (major === 20 && minor >= 10) ? ["--test-concurrency=4"] : [];
  // --expose-gc: the large-file test measures what a transfer holds after collections.
  const child = spawn(process.execPath, ["--test", "--test-reporter=spec", "--expose-gc", ...concurrency, ...files], {
    stdio: "inherit",
    env: {
      ...process.env,
      SANDCELL_API_URL: daemon.url,
      SANDCELL_API_KEY: daemon.key,
      SANDCELL_TEST_IMPORT_DIR: daemon.importDir,
      SANDCELL_TEST_MOUNT_DIR: daemon.mountDir,
      SANDCELL_TEST_HOME: daemon.home,
    },
  });
  status = await new Promise<number>((resolve) => child.on("exit", (code) => resolve(code ?? 1)));
  const left = await Sandbox.list({ apiUrl: daemon.url, apiKey: daemon.key });
  if (left.length > 0) {
    console.error(`tests left ${left.length} sandbox(es) active: ${left.map((s) => s.id).join(", ")}`);
    status = status === 0 ? 1 : status;
  }
} finally {
  await daemon.stop();
}
process.exit(status);
