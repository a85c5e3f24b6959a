/**
 * Where the daemon is and how to talk to it, found the way the CLI finds it: options first,
 * then the environment, then what a running daemon left in Sandcell's home.
 */

/** How to reach the daemon; every static method and `Sandbox.create` accept these. */
export interface ClientOptions {
  /**
   * The daemon's base URL (default: `$SANDCELL_API_URL`, else the `url` in
   * `<home>/daemon.json` of a daemon running with this home, else `http://127.0.0.1:7070`).
   */
  apiUrl?: string;
  /**
   * The API key, sent as `X-API-Key` (default: `$SANDCELL_API_KEY`, else the admin key in
   * `<home>/admin.key` when this process may read it).
   */
  apiKey?: string;
  /**
   * Seconds an ordinary request may take before it fails with `TimeoutError` (default 60;
   * `null`: no deadline). Calls that wait for work in the sandbox (exec, code, process output,
   * transfers, snapshots, forks) have no client deadline unless given a `timeout` of their own:
   * the daemon's timeouts bound them.
   */
  requestTimeout?: number | null;
}

/** Options resolved to their final values. */
export interface ResolvedConfig {
  /** Base URL without a trailing slash. */
  apiUrl: string;
  /** The key, if one was found. */
  apiKey: string | undefined;
  /** Default deadline in seconds, or null. */
  requestTimeout: number | null;
  /**
   * Where the key came from (`the apiKey option`, `SANDCELL_API_KEY`, a file), or with no key
   * the admin key file that was looked for (undefined where there is no file system to look
   * in): said in authentication errors.
   */
  keyOrigin: string | undefined;
}

/** The daemon's own default address (`listen` in docs/daemon.md). */
export const DEFAULT_API_URL = "http://127.0.0.1:7070";

const DEFAULT_REQUEST_TIMEOUT_SECS = 60;

/** What this module needs of Node's `fs` and `os`, present in Node, Deno and Bun. */
interface NodeHost {
  readFileSync(path: string, encoding: "utf8"): string;
  homedir(): string;
}

/** The global `process`, where there is one (not in a browser). */
const proc: { env?: Record<string, string | undefined>; getuid?: () => number; versions?: { node?: string } } | undefined =
  typeof process === "undefined" ? undefined : process;

/**
 * Node's file system, loaded once when the module loads and only where Node's built-ins
 * exist; elsewhere the home is not read and nothing is said about it.
 */
const host: NodeHost | undefined = await (async () => {
  if (proc?.versions?.node === undefined) return undefined;
  try {
    const [fs, os] = await Promise.all([import("node:fs"), import("node:os")]);
    return { readFileSync: (path, encoding) => fs.readFileSync(path, encoding), homedir: () => os.homedir() };
  } catch {
    return undefined;
  }
})();

/** Reads an environment variable where there is an environment (Node, Deno, Bun; not a browser). */
function env(name: string): string | undefined {
  const value = proc?.env?.[name];
  return value === undefined || value === "" ? undefined : value;
}

/**
 * Sandcell's home, as the daemon and the CLI find it: `$SANDCELL_HOME`, else
 * `/var/lib/sandcell` when running as root, else `~/.local/share/sandcell`. Undefined where
 * there is no file system to read it from.
 */
export function defaultHome(): string | undefined {
  if (host === undefined) return undefined;
  const home = env("SANDCELL_HOME");
  if (home !== undefined) return home.replace(/\/+$/, "") || "/";
  if (proc?.getuid?.() === 0) return "/var/lib/sandcell";
  try {
    return `${host.homedir()}/.local/share/sandcell`;
  } catch {
    return ".sandcell"; // no HOME and no password entry: what the daemon uses then
  }
}

/** A small file of the home, or undefined when it is missing or unreadable. */
function readHomeFile(path: string): string | undefined {
  try {
    return host?.readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

/** The URL the daemon running with this home wrote in `daemon.json`, if any. */
function daemonUrl(home: string): string | undefined {
  const text = readHomeFile(`${home}/daemon.json`);
  if (text === undefined) return undefined;
  try {
    const url = (JSON.parse(text) as { url?: unknown }).url;
    return typeof url === "string" && url !== "" ? url : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Resolves options: the option, else `SANDCELL_API_URL` / `SANDCELL_API_KEY`, else what a
 * daemon left in its home (`daemon.json`'s URL, `admin.key`), as the CLI does, else the
 * default URL and no key.
 */
export function resolveConfig(options: ClientOptions = {}): ResolvedConfig {
  let apiUrl = options.apiUrl || env("SANDCELL_API_URL");
  let apiKey = options.apiKey || undefined;
  let keyOrigin: string | undefined = "the apiKey option";
  if (apiKey === undefined) {
    apiKey = env("SANDCELL_API_KEY");
    keyOrigin = "SANDCELL_API_KEY";
  }
  if (apiUrl === undefined || apiKey === undefined) {
    const home = defaultHome();
    if (apiUrl === undefined && home !== undefined) apiUrl = daemonUrl(home);
    if (apiKey === undefined) {
      keyOrigin = home === undefined ? undefined : `${home}/admin.key`;
      apiKey = keyOrigin === undefined ? undefined : readHomeFile(keyOrigin)?.trim() || undefined;
    }
  }
  return {
    apiUrl: (apiUrl ?? DEFAULT_API_URL).replace(/\/+$/, ""),
    apiKey,
    requestTimeout: options.requestTimeout === undefined ? DEFAULT_REQUEST_TIMEOUT_SECS : options.requestTimeout,
    keyOrigin,
  };
}

/** What to add to a 401's message: how to give a key, or where the refused one came from. */
export function authenticationHint(config: ResolvedConfig): string {
  if (config.apiKey !== undefined) return `the key was taken from ${config.keyOrigin}`;
  if (config.keyOrigin === undefined) return "this client has no API key: pass apiKey or set SANDCELL_API_KEY";
  return (
    "this client has no API key: pass apiKey, set SANDCELL_API_KEY, or run where the daemon's " +
    `admin key is readable (looked for ${config.keyOrigin}; the home is $SANDCELL_HOME, else ` +
    "/var/lib/sandcell as root, else ~/.local/share/sandcell)"
  );
}
