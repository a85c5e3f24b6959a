/** What every test file shares: the daemon `run.ts` started, and sandboxes that clean up after themselves. */

import { createHash } from "node:crypto";
import { Sandbox, type ClientOptions, type CreateSandboxOptions } from "sandcell";
import { startDaemon, startScriptedModel, type ScriptedModel } from "./daemon.js";

/** The daemon's URL, admin key and home, as `run.ts` passed them. */
export function daemonEnv(): { url: string; key: string; home: string } {
  const url = process.env["SANDCELL_API_URL"];
  const key = process.env["SANDCELL_API_KEY"];
  const home = process.env["SANDCELL_TEST_HOME"];
  if (url === undefined || key === undefined || home === undefined) {
    throw new Error("SANDCELL_API_URL, SANDCELL_API_KEY or SANDCELL_TEST_HOME is unset: run the tests through test.sh (or build/run.js)");
  }
  return { url, key, home };
}

/**
 * Runs `fn` with these environment variables set (`undefined`: unset), then puts the
 * environment back. The tests of one file run one after the other, so no other test sees it.
 */
export async function withEnv<T>(vars: Record<string, string | undefined>, fn: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const apply = (values: Record<string, string | undefined>): void => {
    for (const [k, v] of Object.entries(values)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
  apply(vars);
  try {
    return await fn();
  } finally {
    apply(saved);
  }
}

/** Runs `fn` with a new sandbox and deletes the sandbox afterwards, whatever happened. */
export async function withSandbox<T>(options: CreateSandboxOptions, fn: (sb: Sandbox) => Promise<T>): Promise<T> {
  const sb = await Sandbox.create({ labels: { suite: "sdk-ts" }, ...options });
  try {
    return await fn(sb);
  } finally {
    await sb.kill();
  }
}

/** Collects an async iterable into an array. */
export async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

/** SHA-256 of bytes, in hex. */
export function sha256(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

/**
 * Runs `fn` with the test kit's scripted model serving `script` (its turns in order, across
 * every run `fn` starts) and a daemon of its own pointed at it; stops both after.
 */
export async function withAgent<T>(script: unknown[], fn: (client: ClientOptions, model: ScriptedModel) => Promise<T>): Promise<T> {
  const model = await startScriptedModel(script);
  try {
    const daemon = await startDaemon({ env: { OPENAI_BASE_URL: model.baseUrl, OPENAI_API_KEY: "sk-test" } });
    try {
      return await fn({ apiUrl: daemon.url, apiKey: daemon.key }, model);
    } finally {
      await daemon.stop();
    }
  } finally {
    await model.stop();
  }
}
