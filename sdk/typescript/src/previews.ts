/**
 * Previews: a server listening inside a sandbox (on its loopback) reached through the daemon,
 * at the path route `/v1/sandboxes/{id}/ports/{port}/…` or at the host `{port}-{id}.localhost`
 * on the daemon's port, with the API key, a token for that port, or nothing once public.
 */

import { type HttpClient } from "./http.js";

/**
 * How a preview URL reaches the port: `host` at `{port}-{id}.localhost` on the daemon's port
 * (a page's absolute links work as on its own server; browsers resolve `*.localhost` to this
 * machine's loopback), `path` under `/v1/sandboxes/{id}/ports/{port}/` on the daemon's own URL
 * (works wherever the daemon's URL does).
 */
export type PreviewRoute = "host" | "path";

/** Options of `preview`. */
export interface PreviewOptions {
  /** How long the token is valid, in seconds (default 3600, at most 7 days). */
  ttlSecs?: number;
  /** `true`: anyone may reach the port, with no key or token; `false`: private again; unset: unchanged. */
  public?: boolean;
}

/** Options of `previewUrl`. */
export interface PreviewUrlOptions {
  /** The route of the URL (default `host`). */
  route?: PreviewRoute;
  /** How long its token is valid, in seconds (default 3600, at most 7 days). */
  ttlSecs?: number;
}

/** How to reach a port of a sandbox through the daemon. */
export interface PreviewInfo {
  /** The port inside the sandbox. */
  port: number;
  /** The path route on the daemon (`/v1/sandboxes/{id}/ports/{port}/`). */
  path: string;
  /** The host route's name (`{port}-{id}.localhost`), reached on the daemon's port. */
  host: string;
  /** Opens this port until `expiresAt`: `?sandcell_token=…` on a URL (the host route then keeps it in a cookie), or the `X-Sandcell-Token` header. */
  token: string;
  /** When the token expires. */
  expiresAt: Date;
  /** Reachable with no key or token. */
  public: boolean;
}

/** `PreviewInfo` as sent. */
export interface WirePreviewInfo {
  port: number;
  path: string;
  host: string;
  token: string;
  expires_at: string;
  public: boolean;
}

/** The query parameter a preview token travels in. */
export const PREVIEW_TOKEN_PARAM = "sandcell_token";

/** `POST /v1/sandboxes/{id}/previews/{port}`: a token for the port (and, with `public`, the port opened or closed to anyone). */
export async function createPreview(http: HttpClient, id: string, port: number, options: PreviewOptions = {}): Promise<PreviewInfo> {
  // Only the fields the server takes: it refuses any other key, and `options` may carry more.
  const body = { ttl_secs: options.ttlSecs, public: options.public };
  const r = await http.json<WirePreviewInfo>("POST", `/v1/sandboxes/${id}/previews/${port}`, { body: { json: body } });
  return { port: r.port, path: r.path, host: r.host, token: r.token, expiresAt: new Date(r.expires_at), public: r.public };
}

/** `port` if it is a port number (1 to 65535), else a `RangeError`: a host name is made of it with no request the daemon would refuse. */
export function checkPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`port ${String(port)} must be an integer from 1 to 65535`);
  return port;
}

/** `route` if it is `host` or `path`, else a `TypeError` (before a token is made). */
export function checkRoute(route: string): PreviewRoute {
  if (route !== "host" && route !== "path") throw new TypeError(`route "${route}" must be "host" or "path"`);
  return route;
}

/** `:port` of the daemon's URL; empty when it names none (its scheme's own then). */
function daemonPort(apiUrl: string): string {
  const port = new URL(apiUrl).port;
  return port === "" ? "" : `:${port}`;
}

/**
 * The host route's `host[:port]` for `port`: the sandbox's `previewHost` (`{port}-<id>.localhost`,
 * made from the id if the daemon sent none) with the port put in, and the daemon's port.
 */
export function previewHost(hostTemplate: string | undefined, id: string, port: number, apiUrl: string): string {
  const template = hostTemplate || `{port}-${id}.localhost`;
  return template.replaceAll("{port}", String(checkPort(port))) + daemonPort(apiUrl);
}

/** A URL of the port with the preview's token in its query, on the route asked for. */
export function previewUrl(preview: PreviewInfo, apiUrl: string, route: PreviewRoute): string {
  const token = `?${PREVIEW_TOKEN_PARAM}=${encodeURIComponent(preview.token)}`;
  if (checkRoute(route) === "path") return `${apiUrl.replace(/\/+$/, "")}${preview.path}${token}`;
  return `${new URL(apiUrl).protocol}//${preview.host}${daemonPort(apiUrl)}/${token}`;
}
