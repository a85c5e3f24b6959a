/** `git clone` into a sandbox, done by the daemon on its host (credentials never enter the sandbox). */

import { type HttpClient } from "./http.js";

/** Options of `gitClone`. */
export interface GitCloneOptions {
  /**
   * Where in the sandbox (default `/workspace/<repository name>`; relative paths are under
   * `/workspace`); it must not exist or be an empty folder.
   */
  path?: string;
  /** The branch or tag to check out (default: the remote's default branch). */
  branch?: string;
  /** Only this many commits of history (a shallow clone; smart HTTP servers only). */
  depth?: number;
  /** The user name for HTTP authentication (with `password`); not with credentials in the URL. */
  username?: string;
  /** The password or token for HTTP authentication: used on the host only, never written into the sandbox. */
  password?: string;
}

/** What a clone brought into the sandbox. */
export interface GitCloneResult {
  /** Where it is in the sandbox (absolute). */
  path: string;
  /** The checked-out commit (40 hex digits). */
  commit: string;
  /** The checked-out branch; null for a detached tag. */
  branch: string | null;
  /** Files copied in (its `.git` folder's included). */
  files: number;
  /** Their bytes. */
  bytes: number;
  /** How long the clone and the copy took, in milliseconds. */
  durationMs: number;
}

/** `GitCloneResult` as sent. */
export interface WireGitCloneResult {
  path: string;
  commit: string;
  branch?: string | null;
  files: number;
  bytes: number;
  duration_ms: number;
}

/**
 * `POST /v1/sandboxes/{id}/git/clone`. No client timeout: the daemon bounds a clone itself,
 * and a large repository takes a while.
 */
export async function gitClone(http: HttpClient, id: string, url: string, options: GitCloneOptions = {}): Promise<GitCloneResult> {
  // Only the fields the server takes: it refuses any other key, and `options` may carry more.
  const body = {
    url,
    path: options.path,
    branch: options.branch,
    depth: options.depth,
    username: options.username,
    password: options.password,
  };
  const r = await http.json<WireGitCloneResult>("POST", `/v1/sandboxes/${id}/git/clone`, {
    body: { json: body },
    timeout: null,
  });
  return {
    path: r.path,
    commit: r.commit,
    branch: r.branch ?? null,
    files: r.files,
    bytes: r.bytes,
    durationMs: r.duration_ms,
  };
}
