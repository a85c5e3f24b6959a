/** Starts and stops a real `sandcell serve` on a temporary home, for the tests. */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, mkdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** A running daemon. */
export interface Daemon {
  /** Its base URL. */
  url: string;
  /** Its admin key. */
  key: string;
  /** Its home folder. */
  home: string;
  /** A host folder the daemon may import from (`import.allowed_paths`). */
  importDir: string;
  /** A host folder whose folders the daemon may mount into sandboxes (`mounts.allowed_paths`). */
  mountDir: string;
  /** Stops it (SIGTERM: its sandboxes are stopped with it) and removes its home. */
  stop(): Promise<void>;
}

/** The repository's root, from this file compiled into `sdk/typescript/build/`. */
const REPO = resolve(fileURLToPath(import.meta.url), "../../../..");

/** The binary: `$SANDCELL_BIN`, else the release build of this repository. */
export function binaryPath(): string {
  return process.env["SANDCELL_BIN"] ?? join(REPO, "target/release/sandcell");
}

async function waitFor<T>(what: string, child: ChildProcess, log: () => string, probe: () => T | undefined): Promise<T> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const value = probe();
    if (value !== undefined) return value;
    if (child.exitCode !== null) throw new Error(`${child.spawnfile} exited (${child.exitCode}) before ${what}:\n${log()}`);
    if (Date.now() > deadline) throw new Error(`${child.spawnfile}: no ${what} after 20 s:\n${log()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** What a daemon is started with besides the tests' usual settings. */
export interface DaemonOptions {
  /** More `--set key=value` settings. */
  settings?: string[];
  /** More environment variables (`OPENAI_BASE_URL`, …). */
  env?: Record<string, string>;
}

/** Starts a daemon listening on a free port of 127.0.0.1. */
export async function startDaemon(options: DaemonOptions = {}): Promise<Daemon> {
  const bin = binaryPath();
  if (!existsSync(bin)) {
    throw new Error(`the sandcell binary is not at ${bin}: build it (cargo build --release) or set SANDCELL_BIN`);
  }
  const home = mkdtempSync(join(tmpdir(), "sandcell-ts-"));
  const importDir = join(home, "import");
  mkdirSync(importDir);
  const mountDir = join(home, "mounts");
  mkdirSync(mountDir);
  const child = spawn(
    bin,
    [
      "serve",
      "--home", home,
      "--listen", "127.0.0.1:0",
      "--set", "shutdown.sandboxes=stop",
      // The test files run side by side: room for all their sandboxes at once.
      "--set", "limits.max_per_owner=60",
      ...(options.settings ?? []).flatMap((s) => ["--set", s]),
    ],
    {
      env: { ...process.env, SANDCELL_IMPORT_ALLOWED_PATHS: importDir, SANDCELL_MOUNTS_ALLOWED_PATHS: mountDir, SANDCELL_LOG: "warn", ...options.env },
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  let stderr = "";
  child.stderr?.on("data", (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-20_000);
  });
  const log = (): string => stderr;
  const url = await waitFor("daemon.json", child, log, () => {
    try {
      return (JSON.parse(readFileSync(join(home, "daemon.json"), "utf8")) as { url: string }).url;
    } catch {
      return undefined;
    }
  });
  const key = readFileSync(join(home, "admin.key"), "utf8").trim();
  return {
    url,
    key,
    home,
    importDir,
    mountDir,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(home, { recursive: true, force: true });
    },
  };
}

/** The test kit's scripted model, serving one script. */
export interface ScriptedModel {
  /** Its OpenAI base URL (with `/v1`). */
  baseUrl: string;
  /** The requests it has answered, oldest first. */
  requests(): Record<string, unknown>[];
  /** Stops it and removes its folder. */
  stop(): Promise<void>;
}

/**
 * Starts the test kit's scripted OpenAI / Anthropic server (`scripted-llm`:
 * `$SANDCELL_SCRIPTED_LLM`, else this repository's debug build, which test.sh makes) on a
 * free port of 127.0.0.1, answering the turns of `script` in order (a list of turns, or an
 * object with `turns` and `embeddings`), then its small deterministic agent.
 */
export async function startScriptedModel(script: unknown): Promise<ScriptedModel> {
  const bin = process.env["SANDCELL_SCRIPTED_LLM"] ?? join(REPO, "target/debug/scripted-llm");
  if (!existsSync(bin)) {
    throw new Error(`no scripted-llm at ${bin}: build it (cargo build -p sandcell-testkit --features llm --bin scripted-llm) or set SANDCELL_SCRIPTED_LLM`);
  }
  const dir = mkdtempSync(join(tmpdir(), "sandcell-ts-llm-"));
  writeFileSync(join(dir, "script.json"), JSON.stringify(script));
  const log = join(dir, "requests.jsonl");
  const child = spawn(bin, ["--port", "0", "--script", join(dir, "script.json"), "--log", log], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout?.on("data", (c: Buffer) => {
    out += c.toString();
  });
  child.stderr?.on("data", (c: Buffer) => {
    out += c.toString();
  });
  const baseUrl = await waitFor("the scripted model's address", child, () => out, () => {
    const m = /^listening on (http:\/\/\S+)\n/.exec(out);
    return m === null ? undefined : `${m[1]}/v1`;
  });
  return {
    baseUrl,
    requests() {
      if (!existsSync(log)) return [];
      return readFileSync(log, "utf8").split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l) as Record<string, unknown>);
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGKILL");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The test kit's fake package registries, serving. */
export interface FakeRegistries {
  /** Their HTTPS address (`127.0.0.1:P`). */
  https: string;
  /** Their plain-HTTP address. */
  http: string;
  /** The test CA their certificate is signed by (a PEM file they remove as they exit). */
  ca: string;
  /** The HTTPS port. */
  httpsPort: number;
  /** Stops them (SIGTERM, so they remove their files). */
  stop(): Promise<void>;
}

/**
 * Starts the test kit's fake package registries (`fake-registries`:
 * `$SANDCELL_FAKE_REGISTRIES`, else this repository's debug build, which test.sh makes) on
 * 127.0.0.1: a PEP 503 index and an npm registry, each with `sandcell-fake`, their
 * certificate covering `names`.
 */
export async function startFakeRegistries(names: string[]): Promise<FakeRegistries> {
  const bin = process.env["SANDCELL_FAKE_REGISTRIES"] ?? join(REPO, "target/debug/fake-registries");
  if (!existsSync(bin)) {
    throw new Error(`no fake-registries at ${bin}: build it (cargo build -p sandcell-testkit --features registries --bin fake-registries) or set SANDCELL_FAKE_REGISTRIES`);
  }
  const child = spawn(bin, names.flatMap((n) => ["--name", n]), { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout?.on("data", (c: Buffer) => {
    out += c.toString();
  });
  child.stderr?.on("data", (c: Buffer) => {
    err = (err + c.toString()).slice(-20_000);
  });
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    }
  };
  try {
    // One JSON line once both ports accept connections.
    const ready = await waitFor("the registries' addresses", child, () => err, () => {
      const end = out.indexOf("\n");
      return end < 0 ? undefined : (JSON.parse(out.slice(0, end)) as { https: string; http: string; ca: string });
    });
    return { ...ready, httpsPort: Number(ready.https.split(":").pop()), stop };
  } catch (e) {
    await stop();
    throw e;
  }
}
