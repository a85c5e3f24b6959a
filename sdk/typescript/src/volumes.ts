/**
 * Named volumes: folders the daemon keeps for your key's owner (each owner has its own), which
 * outlive the sandboxes that mount them (`Sandbox.create({ mounts: [Mount.fromVolume(name,
 * path)] })`, read-write by default). One is made by `Volume.create`, or by the first sandbox
 * that mounts it.
 */

import { clientFor } from "./http.js";
import { type ClientOptions } from "./config.js";

/** A named volume as the API describes it. */
export interface VolumeInfo {
  /** Its name. */
  name: string;
  /** When it was made. */
  createdAt: Date;
  /** The bytes of its files. */
  sizeBytes: number;
  /** The running sandboxes that mount it now, by id (it cannot be deleted while there are any). */
  sandboxes: string[];
}

/** `VolumeInfo` as sent. */
export interface WireVolumeInfo {
  name: string;
  created_at: string;
  size_bytes: number;
  sandboxes: string[];
}

/** Maps a volume from the wire. */
function toVolumeInfo(v: WireVolumeInfo): VolumeInfo {
  return { name: v.name, createdAt: new Date(v.created_at), sizeBytes: v.size_bytes, sandboxes: [...v.sandboxes] };
}

/**
 * Your named volumes: make, list, show and delete them. Every method is static and takes the
 * client options last.
 */
export class Volume {
  private constructor() {}

  /**
   * Makes an empty volume. `name` is 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a
   * letter or digit (else an `InvalidArgumentError`); a name you have is a `ConflictError`
   * (409 `already_exists`).
   */
  static async create(name: string, options: ClientOptions = {}): Promise<VolumeInfo> {
    // Only the fields the server takes: it refuses any other key.
    const v = await clientFor(options).json<WireVolumeInfo>("POST", "/v1/volumes", { body: { json: { name } } });
    return toVolumeInfo(v);
  }

  /** Your volumes, by name, with their sizes and the running sandboxes that mount them. */
  static async list(options: ClientOptions = {}): Promise<VolumeInfo[]> {
    const list = await clientFor(options).json<{ volumes: WireVolumeInfo[] }>("GET", "/v1/volumes");
    return list.volumes.map(toVolumeInfo);
  }

  /** One volume (`NotFoundError` if you have none of that name). */
  static async get(name: string, options: ClientOptions = {}): Promise<VolumeInfo> {
    return toVolumeInfo(await clientFor(options).json<WireVolumeInfo>("GET", `/v1/volumes/${encodeURIComponent(name)}`));
  }

  /**
   * Deletes a volume and its files. While a running sandbox mounts it: a `ConflictError` (409
   * `invalid_state`); no such volume: a `NotFoundError`.
   */
  static async delete(name: string, options: ClientOptions = {}): Promise<void> {
    await clientFor(options).json<void>("DELETE", `/v1/volumes/${encodeURIComponent(name)}`);
  }
}
