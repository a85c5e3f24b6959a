/** The service itself: version, backends and what each offers on this host, and who is asking. */

import { clientFor } from "./http.js";
import { type ClientOptions } from "./config.js";

/** One isolation backend and what it offers on this host. */
export interface BackendInfo {
  /** `process` or `gvisor`. */
  kind: string;
  /** Whether it can be used here. */
  available: boolean;
  /** How it isolates (`container`, `user-space kernel`). */
  isolationLevel: string | null;
  /** Whether pause/resume works. */
  supportsPause: boolean;
  /** The fidelity of its snapshots (`language`, `process`). */
  checkpointFidelity: string | null;
  /** Host features it relies on, each `active` or `unavailable` with a sentence. */
  features: { name: string; state: string; detail: string }[];
}

/** What `GET /v1/system` says. */
export interface SystemInfo {
  /** Sandcell's version. */
  version: string;
  /** Seconds since the daemon started. */
  uptimeSecs: number;
  /** Sandboxes running now (all owners). */
  running: number;
  /** The backends. */
  backends: BackendInfo[];
  /** The caller's identity. */
  caller: { owner: string; keyId: string; admin: boolean };
}

interface WireBackend {
  kind: string;
  available: boolean;
  isolation_level?: string | null;
  supports_pause?: boolean;
  checkpoint_fidelity?: string | null;
  host?: { features?: { name: string; state: string; detail: string }[] };
}

/** Asks the daemon about itself (also a cheap check that the URL and key work). */
export async function system(options: ClientOptions = {}): Promise<SystemInfo> {
  const s = await clientFor(options).json<{
    version: string;
    uptime_secs: number;
    running: number;
    backends: WireBackend[];
    caller: { owner: string; key_id: string; admin: boolean };
  }>("GET", "/v1/system");
  return {
    version: s.version,
    uptimeSecs: s.uptime_secs,
    running: s.running,
    backends: s.backends.map((b) => ({
      kind: b.kind,
      available: b.available,
      isolationLevel: b.isolation_level ?? null,
      supportsPause: b.supports_pause ?? false,
      checkpointFidelity: b.checkpoint_fidelity ?? null,
      features: b.host?.features ?? [],
    })),
    caller: { owner: s.caller.owner, keyId: s.caller.key_id, admin: s.caller.admin },
  };
}
