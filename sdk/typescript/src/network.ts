/**
 * A sandbox's network: its policy (read and changed live), its secrets (which its egress
 * proxy puts in), and its egress proxy's events.
 */

import { type HttpClient } from "./http.js";
import {
  fromNetworkPolicy,
  fromSecrets,
  toNetworkPolicy,
  type NetworkPolicy,
  type NetworkPolicyInput,
  type Secret,
} from "./types.js";

/** A sandbox's network now. */
export interface NetworkInfo {
  /** What it reaches. */
  network: NetworkPolicy;
  /** The HTTP proxy its programs reach the outside through (their `HTTP_PROXY` and `HTTPS_PROXY`); null when its network is `off`. */
  httpProxy: string | null;
  /** The SOCKS5 proxy inside it (its programs' `ALL_PROXY`); null when its network is `off`. */
  socksProxy: string | null;
  /** Bytes its egress proxy carried, both ways. */
  bytes: number;
  /** Connections open through the proxy now. */
  openConnections: number;
}

/**
 * One of a sandbox's secrets as the daemon shows it: never its value. The daemon keeps values
 * in memory only, so after it restarted `held` is false, and a request carrying the
 * placeholder is refused until the value is given again (`setSecrets`, or a fork's or
 * restore's `secrets`).
 */
export interface SecretState {
  /** The environment variable holding its placeholder. */
  name: string;
  /** The placeholder (`SANDCELL_SECRET_…`) its egress proxy replaces with the value. */
  placeholder: string;
  /** The hosts the value may be sent to. */
  hosts: string[];
  /** Whether the daemon holds the value now. */
  held: boolean;
}

/** How a connection went through the egress proxy: `http` (a plain request), `connect` (an HTTPS tunnel) or `socks5`. */
export type EgressProtocol = "http" | "connect" | "socks5";

/** What the egress proxy decided. */
export type EgressDecision = "allowed" | "denied";

/** One connection (or plain-HTTP request) through a sandbox's egress proxy. */
export interface EgressEvent {
  /** Its place in the audit log: orders events (pass it as `before` for older ones). */
  id: number;
  /** When it ended or was refused. */
  at: Date;
  /** How it came. */
  protocol: EgressProtocol;
  /** The host it asked for. */
  host: string;
  /** The port. */
  port: number;
  /** Let through or refused. */
  decision: EgressDecision;
  /** Why it was denied (or cut). */
  reason: string | null;
  /** The address it connected to. */
  address: string | null;
  /** The name its TLS ClientHello asked for. */
  sni: string | null;
  /** Bytes from the sandbox. */
  bytesUp: number;
  /** Bytes to the sandbox. */
  bytesDown: number;
  /** How long it lasted, in milliseconds. */
  durationMs: number;
}

/** One page of egress events, newest first. */
export interface EgressEventPage {
  /** The events. */
  events: EgressEvent[];
  /** The `before` of the next (older) page; null on the last. */
  nextBefore: number | null;
}

/** Options of `egressEvents`. */
export interface EgressEventsOptions {
  /** At most this many (1 to 1000; default 100). */
  limit?: number;
  /** Only events older than this one (the previous page's `nextBefore`). */
  before?: number;
}

/** Options of `iterEgressEvents`. */
export interface IterEgressEventsOptions {
  /** Events read per request (1 to 1000; default 100). */
  pageSize?: number;
}

/** `NetworkInfo` as sent. */
export interface WireNetworkInfo {
  network: NetworkPolicy;
  http_proxy?: string | null;
  socks_proxy?: string | null;
  bytes: number;
  open_connections: number;
}

/** `EgressEventInfo` as sent. */
export interface WireEgressEvent {
  id: number;
  at: string;
  protocol: EgressProtocol;
  host: string;
  port: number;
  decision: EgressDecision;
  reason?: string | null;
  address?: string | null;
  sni?: string | null;
  bytes_up: number;
  bytes_down: number;
  duration_ms: number;
}

/** `EgressEventList` as sent. */
export interface WireEgressEventList {
  events: WireEgressEvent[];
  next_before?: number | null;
}

/** `SecretState` as sent. */
export interface WireSecretState {
  name: string;
  placeholder: string;
  hosts: string[];
  held: boolean;
}

/** `SecretList` as sent. */
export interface WireSecretList {
  secrets: WireSecretState[];
}

function toSecretStates(list: WireSecretList): SecretState[] {
  return list.secrets.map((s) => ({ name: s.name, placeholder: s.placeholder, hosts: [...s.hosts], held: s.held }));
}

function toNetworkInfo(n: WireNetworkInfo): NetworkInfo {
  return {
    network: toNetworkPolicy(n.network),
    httpProxy: n.http_proxy ?? null,
    socksProxy: n.socks_proxy ?? null,
    bytes: n.bytes,
    openConnections: n.open_connections,
  };
}

function toEgressEvent(e: WireEgressEvent): EgressEvent {
  return {
    id: e.id,
    at: new Date(e.at),
    protocol: e.protocol,
    host: e.host,
    port: e.port,
    decision: e.decision,
    reason: e.reason ?? null,
    address: e.address ?? null,
    sni: e.sni ?? null,
    bytesUp: e.bytes_up,
    bytesDown: e.bytes_down,
    durationMs: e.duration_ms,
  };
}

/** `GET /v1/sandboxes/{id}/network`. */
export async function getNetwork(http: HttpClient, id: string): Promise<NetworkInfo> {
  return toNetworkInfo(await http.json<WireNetworkInfo>("GET", `/v1/sandboxes/${id}/network`));
}

/** `PUT /v1/sandboxes/{id}/network`. */
export async function setNetwork(http: HttpClient, id: string, policy: NetworkPolicyInput): Promise<NetworkInfo> {
  const n = await http.json<WireNetworkInfo>("PUT", `/v1/sandboxes/${id}/network`, {
    body: { json: { network: fromNetworkPolicy(policy) } },
  });
  return toNetworkInfo(n);
}

/** `GET /v1/sandboxes/{id}/secrets`. */
export async function getSecrets(http: HttpClient, id: string): Promise<SecretState[]> {
  return toSecretStates(await http.json<WireSecretList>("GET", `/v1/sandboxes/${id}/secrets`));
}

/** `PUT /v1/sandboxes/{id}/secrets`. */
export async function setSecrets(http: HttpClient, id: string, secrets: readonly Secret[]): Promise<SecretState[]> {
  // Checked as at create, before anything is sent (a malformed list is a TypeError).
  const body = { secrets: fromSecrets(secrets) };
  return toSecretStates(await http.json<WireSecretList>("PUT", `/v1/sandboxes/${id}/secrets`, { body: { json: body } }));
}

/** `GET /v1/sandboxes/{id}/network/events`: one page, newest first. */
export async function egressEvents(http: HttpClient, id: string, options: EgressEventsOptions = {}): Promise<EgressEventPage> {
  const page = await http.json<WireEgressEventList>("GET", `/v1/sandboxes/${id}/network/events`, {
    query: { limit: options.limit, before: options.before },
  });
  return { events: page.events.map(toEgressEvent), nextBefore: page.next_before ?? null };
}

/** Every egress event, newest first, a page at a time as the iteration gets to it. */
export async function* iterEgressEvents(
  http: HttpClient,
  id: string,
  options: IterEgressEventsOptions = {},
): AsyncGenerator<EgressEvent, void, undefined> {
  let before: number | undefined;
  for (;;) {
    const page = await egressEvents(http, id, { limit: options.pageSize, before });
    yield* page.events;
    if (page.nextBefore === null) return;
    before = page.nextBefore;
  }
}
