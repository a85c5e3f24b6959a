/**
 * The SDK against the committed OpenAPI document (docs/openapi.json, generated from the
 * server; $SANDCELL_OPENAPI names another copy, such as a newer daemon's /openapi.json), with
 * no daemon:
 *  - every request call in src/*.ts names a path and method the document has;
 *  - each `Wire*` interface (the answers as sent) declares only properties its schema has,
 *    with compatible types, and covers every required property or lists it as ignored;
 *  - the SDK's methods, run against a fake `fetch`, send bodies their request schemas accept
 *    (the server refuses unknown keys) and query parameters the document lists, and parse
 *    samples of their response schemas reading no key the schema lacks.
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { FileExport, Mount, Run, Sandbox, Snapshot, Template, Volume, memory, system, threads } from "sandcell";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Schema = { [key: string]: any };

const here = dirname(fileURLToPath(import.meta.url));
const srcDir = resolve(here, "../src");
const doc: Schema = JSON.parse(readFileSync(process.env["SANDCELL_OPENAPI"] ?? resolve(here, "../../../docs/openapi.json"), "utf8"));
const schemas: Record<string, Schema> = doc.components.schemas;

// ---- the document's schemas ----

function refName(s: Schema): string | undefined {
  return typeof s.$ref === "string" ? s.$ref.split("/").pop() : undefined;
}

function typesOf(s: Schema): string[] {
  return s.type === undefined ? [] : [s.type].flat();
}

/** `s` with `$ref` followed, `allOf` merged and a `oneOf [X, null]` made a nullable X. */
function resolveSchema(s: Schema): Schema {
  const name = refName(s);
  if (name !== undefined) return resolveSchema(schemas[name]!);
  if (Array.isArray(s.allOf)) {
    const merged: Schema = { type: "object", properties: {}, required: [] };
    for (const part of s.allOf) {
      const r = resolveSchema(part);
      Object.assign(merged.properties, r.properties ?? {});
      merged.required.push(...(r.required ?? []));
    }
    return merged;
  }
  if (Array.isArray(s.oneOf)) {
    const branches = s.oneOf.filter((b: Schema) => b.type !== "null");
    if (branches.length === 1 && branches.length < s.oneOf.length) {
      const inner = resolveSchema(branches[0]);
      return { ...inner, type: [...typesOf(inner), "null"] };
    }
  }
  return s;
}

/**
 * The object shapes of a value of several shapes: a `oneOf` of objects, or an `allOf` one of
 * whose parts is (a build log's numbered event: each event's shape with its number), each
 * shape merged with the other parts; undefined for a value of one shape.
 */
function shapesOf(s: Schema): Schema[] | undefined {
  // References followed, not resolved: resolveSchema would merge the allOf.
  let r = s;
  for (let name = refName(r); name !== undefined; name = refName(r)) r = schemas[name]!;
  if (Array.isArray(r.oneOf)) {
    const branches = r.oneOf.filter((b: Schema) => b.type !== "null").map(resolveSchema);
    return branches.length > 1 && branches.every((b: Schema) => b.properties !== undefined) ? branches : undefined;
  }
  if (!Array.isArray(r.allOf)) return undefined;
  const parts: Schema[] = r.allOf;
  const at = parts.findIndex((p) => shapesOf(p) !== undefined);
  if (at === -1) return undefined;
  return shapesOf(parts[at]!)!.map((shape) => {
    const merged: Schema = { type: "object", properties: {}, required: [] };
    for (const part of parts.map((p, i) => (i === at ? shape : resolveSchema(p)))) {
      Object.assign(merged.properties, part.properties ?? {});
      merged.required.push(...(part.required ?? []));
    }
    return merged;
  });
}

/** The component a schema refers to, directly or as the one non-null branch of a `oneOf`. */
function schemaName(s: Schema): string | undefined {
  const branches = Array.isArray(s.oneOf) ? s.oneOf.filter((b: Schema) => b.type !== "null") : [];
  return refName(branches.length === 1 ? branches[0] : s);
}

function jsonType(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

/** Why `value` does not fit `s` (empty: it fits). */
function validate(value: unknown, s: Schema, where: string): string[] {
  if (Array.isArray(s.oneOf) && refName(s) === undefined) {
    const tries = s.oneOf.map((b: Schema) => validate(value, b, where));
    return tries.some((t: string[]) => t.length === 0) ? [] : tries.flat();
  }
  const r = resolveSchema(s);
  // A reference to a schema of several shapes.
  if (Array.isArray(r.oneOf) && r !== s) return validate(value, r, where);
  const ts = typesOf(r);
  const actual = jsonType(value);
  if (ts.length > 0 && !ts.includes(actual) && !(actual === "integer" && ts.includes("number"))) {
    return [`${where}: sent a ${actual}, the schema wants ${ts.join("|")}`];
  }
  if (Array.isArray(r.enum) && !r.enum.includes(value)) return [`${where}: ${JSON.stringify(value)} is not one of ${r.enum}`];
  const errors: string[] = [];
  if (actual === "object") {
    const obj = value as Record<string, unknown>;
    const props: Schema = r.properties ?? {};
    for (const [k, v] of Object.entries(obj)) {
      if (k in props) errors.push(...validate(v, props[k], `${where}.${k}`));
      else if (r.additionalProperties === false) errors.push(`${where}: key "${k}" is not a property (the server refuses it)`);
      else if (typeof r.additionalProperties === "object") errors.push(...validate(v, r.additionalProperties, `${where}.${k}`));
    }
    for (const k of r.required ?? []) if (!(k in obj)) errors.push(`${where}: required "${k}" not sent`);
  }
  if (actual === "array" && r.items !== undefined) {
    (value as unknown[]).forEach((v, i) => errors.push(...validate(v, r.items, `${where}[${i}]`)));
  }
  return errors;
}

const TEMPLATES = Object.keys(doc.paths).sort((a, b) => b.replace(/\{[^}]+\}/g, "").length - a.replace(/\{[^}]+\}/g, "").length);

/** The document's template and operation for a concrete path (or a path with `{}` holes). */
function operation(method: string, path: string): { template: string; op: Schema } {
  for (const template of TEMPLATES) {
    const pattern = new RegExp(`^${template.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{[^}]+\}/g, "[^/]+")}$`);
    if (pattern.test(path)) {
      const op = doc.paths[template][method.toLowerCase()];
      assert.ok(op, `${method} ${path}: the document has ${template} but not ${method}`);
      return { template, op };
    }
  }
  assert.fail(`${method} ${path}: no path of the document matches`);
}

// ---- every request call in the sources names a documented path and method ----

/**
 * How the sources' path helpers expand (each checked against its definition below); `$1`
 * takes the captured rest of the path, itself a string or template literal.
 */
const HELPERS: [RegExp, string[], string][] = [
  [/^filesPath\(\w+(?:, ("[^"]*"))?\)$/, ["/v1/sandboxes/{}/files$1"], "function filesPath(id: string, rest = \"\"): string {\n  return `/v1/sandboxes/${id}/files${rest}`;"],
  [/^this\.path\(("[^"]*")?\)$/, ["/v1/sandboxes/{}$1"], "private path(rest = \"\"): string {\n    return `/v1/sandboxes/${this.id}${rest}`;"],
  [/^variablesPath\([^)]*\)\)*$/, ["/v1/sandboxes/{}/contexts/{}/variables"], "return `/v1/sandboxes/${id}/contexts/${encodeURIComponent(contextId(context ?? \"python\"))}/variables`;"],
  [/^`\$\{this\.path\}([^`]*)`$/, ["/v1/sandboxes/{}/processes/{}$1"], "return `/v1/sandboxes/${this.sandboxId}/processes/${this.pid}`;"],
  // A memory call is checked in both scopes: a sandbox's and the owner's.
  [
    /^memoriesPath\(this\.sandboxId(?:, ("[^"]*"|`[^`]*`))?\)$/,
    ["/v1/sandboxes/{}/memories$1", "/v1/memories$1"],
    "return sandboxId === undefined ? `/v1/memories${rest}` : `/v1/sandboxes/${sandboxId}/memories${rest}`;",
  ],
];

function sources(): [string, string][] {
  return readdirSync(srcDir)
    .filter((f) => f.endsWith(".ts"))
    .map((f) => [f, readFileSync(join(srcDir, f), "utf8")]);
}

/** The path expression after `"METHOD",` up to the `,` or `)` that ends the argument. */
function argumentAt(text: string, start: number): string {
  let depth = 0;
  let quote: string | undefined;
  let holes = 0; // open `${` in a template literal
  for (let i = start; i < text.length; i++) {
    const c = text[i]!;
    if (quote === "`") {
      if (c === "$" && text[i + 1] === "{") {
        holes++;
        i++;
      } else if (c === "}" && holes > 0) holes--;
      else if (c === "`" && holes === 0) quote = undefined;
      continue;
    }
    if (quote !== undefined) {
      if (c === quote) quote = undefined;
      continue;
    }
    if (c === '"' || c === "`") quote = c;
    else if ("({[".includes(c)) depth++;
    else if (")}]".includes(c)) {
      if (depth === 0) return text.slice(start, i).trim();
      depth--;
    } else if (c === "," && depth === 0) return text.slice(start, i).trim();
  }
  return text.slice(start).trim();
}

/** The paths a path expression can be (more than one for a helper that serves several routes). */
function expandPath(expr: string): string[] | undefined {
  if (/^"[^"]*"$/.test(expr)) return [expr.slice(1, -1)];
  for (const [pattern, expansions] of HELPERS) {
    const m = pattern.exec(expr);
    if (!m) continue;
    // A captured literal is expanded in turn; other captured text is the path as written.
    const rests = m[1] === undefined ? [""] : /^["`]/.test(m[1]) ? expandPath(m[1]) : [m[1]];
    if (rests === undefined) return undefined;
    return expansions.flatMap((e) => rests.map((rest) => e.replace("$1", rest)));
  }
  if (/^`[^`]*`$/.test(expr)) {
    // `${id}` and `${encodeURIComponent(…)}` are one path segment each.
    return [expr.slice(1, -1).replace(/\$\{(?:[^{}]|\{[^}]*\})*\}/g, "{}")];
  }
  return undefined;
}

test("every request call in src/*.ts names a path and method of the document", () => {
  const all = sources();
  const text = all.map(([, t]) => t).join("\n");
  for (const [, , definition] of HELPERS) {
    assert.ok(text.includes(definition), `openapi.test HELPERS: the sources no longer define ${definition.split("\n")[0]}`);
  }
  let calls = 0;
  for (const [file, source] of all) {
    for (const m of source.matchAll(/"(GET|POST|PUT|PATCH|DELETE)",\s*/g)) {
      const expr = argumentAt(source, m.index! + m[0].length);
      const line = source.slice(0, m.index).split("\n").length;
      const paths = expandPath(expr);
      assert.ok(paths !== undefined, `src/${file}:${line}: cannot read the path ${expr}: add its helper to HELPERS in openapi.test.ts`);
      for (const path of paths) operation(m[1]!, path.replace(/\{\}/g, "x"));
      calls++;
    }
  }
  // The terminal's WebSocket (ws.ts) builds its URL apart.
  const pty = /\/v1\/sandboxes\/\$\{[^}]+\}\/pty/.exec(text);
  assert.ok(pty, "the terminal's path is no longer /v1/sandboxes/{id}/pty");
  operation("GET", "/v1/sandboxes/x/pty");
  assert.ok(calls > 40, `only ${calls} request calls found: the pattern in openapi.test.ts no longer finds them`);
});

// ---- the Wire* interfaces against their schemas ----

interface WireModel {
  /** The schema, or null with why there is none. */
  schema: string | { none: string };
  /** Required properties not declared, and why. */
  ignored?: Record<string, string>;
}

const EXIT_EVENT = "also the `exit` stream event's data, which is ExecOutput without the output";
const WIRE: Record<string, WireModel> = {
  WireSandbox: { schema: "SandboxInfo" },
  WireLimits: { schema: "LimitsInfo" },
  WireRestore: { schema: { none: "SandboxInfo.restore and Forked.restore have no schema in the document" } },
  WireExit: { schema: "ExecOutput", ignored: { stdout: EXIT_EVENT, stderr: EXIT_EVENT } },
  WireProcessOutput: { schema: "ProcessOutput" },
  WireProcess: { schema: "ProcessView" },
  WireFile: { schema: "FileInfo" },
  WireExport: { schema: "ExportInfo" },
  WireMetrics: { schema: "SandboxUsage" },
  WireAutoSnapshot: { schema: "AutoSnapshot" },
  WireSnapshot: { schema: "SnapshotInfo" },
  WireVolumeCopy: { schema: "VolumeCopyInfo" },
  WireDone: { schema: "CodeDoneInfo" },
  WireCodeResult: { schema: "CodeResult" },
  WireContext: { schema: "ContextView" },
  WireBackend: { schema: { none: "SystemInfo.backends' items are untyped objects in the document" } },
  WireRun: { schema: "RunInfo" },
  WireBudgets: { schema: "Budgets" },
  WireRunUsage: { schema: "RunUsage" },
  WireForkedFrom: { schema: "ForkedFrom" },
  WireStepSandbox: { schema: "StepSandbox" },
  WireThread: { schema: "ThreadInfo" },
  WireMemory: { schema: "Memory" },
  WireMemoryList: { schema: "MemoryList" },
  WireInferJob: { schema: "InferJob" },
  WireNetworkInfo: { schema: "NetworkInfo" },
  WireEgressEvent: { schema: "EgressEventInfo" },
  WireEgressEventList: { schema: "EgressEventList" },
  WireGitCloneResult: { schema: "GitCloneResult" },
  WirePreviewInfo: { schema: "PreviewInfo" },
  WirePackagesReport: { schema: "PackagesReport" },
  WireSecret: { schema: "SecretInput" },
  WireSecretState: { schema: "SecretState" },
  WireSecretList: { schema: "SecretList" },
  WireStepReport: { schema: "StepReport" },
  WireBuiltImage: { schema: "BuiltImage" },
  WireBuildInfo: { schema: "BuildInfo" },
  WireTemplateInfo: { schema: "TemplateInfo" },
  WireMount: { schema: "MountInput" },
  WireVolumeInfo: { schema: "VolumeInfo" },
};

/** Named TypeScript types and the JSON types they hold. */
const NAMED: Record<string, string[]> = {
  string: ["string"],
  number: ["integer", "number"],
  boolean: ["boolean"],
  null: ["null"],
  Language: ["string"],
  NetworkPolicy: ["string", "object"],
  EgressProtocol: ["string"],
  EgressDecision: ["string"],
  SandboxState: ["string"],
  ExitCause: ["string"],
  'FileInfo["kind"]': ["string"],
  'CodeDone["status"]': ["string"],
  RunMode: ["string"],
  MemoryScope: ["string"],
  InferStatus: ["string"],
  MatchedBy: ["string"],
  MemoryRanking: ["string"],
  BuildState: ["string"],
  MountMode: ["string"],
  StringMap: ["object"],
  MimeBundle: ["object"],
  ExecutionError: ["object"],
};

interface Member {
  name: string;
  optional: boolean;
  type: string;
}

/** Splits `text` at `sep` outside brackets. */
function splitTop(text: string, sep: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if ("{[(<".includes(c)) depth++;
    else if ("}])>".includes(c)) depth--;
    else if (c === sep && depth === 0) {
      out.push(text.slice(start, i));
      start = i + 1;
    }
  }
  out.push(text.slice(start));
  return out.map((s) => s.trim()).filter((s) => s !== "");
}

/** The `Wire*` interfaces of the sources: name, what they extend, their members. */
function wireInterfaces(): Map<string, { extends?: string; members: Member[] }> {
  const found = new Map<string, { extends?: string; members: Member[] }>();
  for (const [, source] of sources()) {
    const text = source.replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
    for (const m of text.matchAll(/interface (Wire\w+)(?: extends (\w+))? \{/g)) {
      let depth = 1;
      let i = m.index! + m[0].length;
      const start = i;
      while (depth > 0) {
        if (text[i] === "{") depth++;
        if (text[i] === "}") depth--;
        i++;
      }
      const members = splitTop(text.slice(start, i - 1), ";").map((decl): Member => {
        const d = /^(\w+)(\?)?:\s*([\s\S]+)$/.exec(decl);
        assert.ok(d, `${m[1]}: cannot read the member "${decl}"`);
        return { name: d[1]!, optional: d[2] === "?", type: d[3]!.replace(/\s+/g, " ") };
      });
      found.set(m[1]!, { extends: m[2], members });
    }
  }
  return found;
}

/** The JSON types a TypeScript type holds (undefined: any). */
function accepts(type: string, interfaces: Set<string>): Set<string> | undefined {
  const out = new Set<string>();
  for (const part of splitTop(type, "|")) {
    if (part === "undefined") continue;
    if (part === "unknown" || part === "any") return undefined;
    if (/^".*"$/.test(part)) out.add("string");
    else if (part.endsWith("[]")) out.add("array");
    else if (part.startsWith("{") || part.startsWith("Record<") || interfaces.has(part)) out.add("object");
    else if (NAMED[part] !== undefined) NAMED[part]!.forEach((t) => out.add(t));
    else assert.fail(`openapi.test: no JSON type known for the TypeScript type ${part}: add it to NAMED`);
  }
  return out;
}

test("each Wire* interface declares only what its schema has, with compatible types", () => {
  const found = wireInterfaces();
  const names = new Set(found.keys());
  assert.deepEqual([...names].filter((n) => !(n in WIRE)), [], "Wire* interfaces missing from WIRE in openapi.test.ts");
  assert.deepEqual(Object.keys(WIRE).filter((n) => !names.has(n)), [], "WIRE names interfaces the sources no longer have");
  const problems: string[] = [];
  for (const [name, model] of Object.entries(WIRE)) {
    if (typeof model.schema !== "string") continue;
    assert.ok(model.schema in schemas, `${name}: the document has no schema ${model.schema}`);
    const r = resolveSchema(schemas[model.schema]!);
    const props: Schema = r.properties ?? {};
    const required = new Set<string>(r.required ?? []);
    const own = found.get(name)!;
    const members = [...own.members, ...(own.extends ? found.get(own.extends)?.members ?? [] : [])];
    for (const m of members) {
      const where = `${name}.${m.name}`;
      if (!(m.name in props)) {
        problems.push(`${where}: ${model.schema} has no property "${m.name}" (the server never sends it)`);
        continue;
      }
      const sent = typesOf(resolveSchema(props[m.name]));
      const held = accepts(m.type, names);
      const wrong = held === undefined ? [] : sent.filter((t) => !held.has(t));
      if (wrong.length > 0) {
        problems.push(`${where}: ${model.schema}.${m.name} may be ${sent.join("|")}, the field (${m.type}) holds no ${wrong.join("|")}`);
      }
      if (!m.optional && !required.has(m.name)) {
        problems.push(`${where}: not optional, but ${model.schema}.${m.name} is not required (it may be absent)`);
      }
    }
    const declared = new Set(members.map((m) => m.name));
    for (const p of required) {
      if (!declared.has(p) && !(p in (model.ignored ?? {}))) {
        problems.push(`${name}: required property ${model.schema}.${p} is neither declared nor ignored in WIRE`);
      }
    }
  }
  assert.deepEqual(problems, [], "Wire* interfaces that do not fit docs/openapi.json");
});

test("the Packages interface (sent, never read) names the installers the Packages schema has, each a list", () => {
  const text = readFileSync(join(srcDir, "types.ts"), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
  const body = /export interface Packages \{([^}]*)\}/.exec(text);
  assert.ok(body, "types.ts no longer declares `export interface Packages`");
  const members = splitTop(body[1]!, ";").map((decl) => {
    const d = /^(\w+)\?:\s*([\s\S]+)$/.exec(decl);
    assert.ok(d, `Packages: "${decl}" is not an optional member`);
    return { name: d[1]!, type: d[2]!.trim() };
  });
  const props: Schema = resolveSchema(schemas["Packages"]!).properties ?? {};
  assert.deepEqual(members.map((m) => m.name).sort(), Object.keys(props).sort());
  for (const m of members) {
    assert.ok(m.type.endsWith("[]"), `Packages.${m.name}: ${m.type} is not a list`);
    assert.deepEqual(typesOf(resolveSchema(props[m.name])), ["array"], `Packages.${m.name}`);
  }
  const create: Schema = resolveSchema(schemas["CreateSandbox"]!).properties;
  assert.equal(schemaName(create["packages"]), "Packages");
});

test("the Secret interface (sent, never read) has the members the SecretInput schema has, all required", () => {
  const text = readFileSync(join(srcDir, "types.ts"), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
  const body = /export interface Secret \{([^}]*)\}/.exec(text);
  assert.ok(body, "types.ts no longer declares `export interface Secret`");
  const members = splitTop(body[1]!, ";").map((decl) => {
    const d = /^(\w+):\s*([\s\S]+)$/.exec(decl);
    assert.ok(d, `Secret: "${decl}" is not a required member`);
    return { name: d[1]!, type: d[2]!.trim() };
  });
  const schema = resolveSchema(schemas["SecretInput"]!);
  const props: Schema = schema.properties ?? {};
  assert.deepEqual(members.map((m) => m.name).sort(), Object.keys(props).sort());
  assert.deepEqual([...(schema.required ?? [])].sort(), Object.keys(props).sort());
  assert.ok(members.find((m) => m.name === "hosts")!.type.endsWith("[]"));
  // Sent as they are wherever secrets are given: at create (and restore), to a fork, live.
  for (const body of ["CreateSandbox", "ForkSnapshot", "SetSecrets"]) {
    const secrets: Schema = resolveSchema(schemas[body]!).properties["secrets"];
    assert.deepEqual(typesOf(secrets), ["array"], body);
    assert.equal(schemaName(secrets.items), "SecretInput", body);
  }
});

test("the Mount types (sent, never read) have the members the MountInput schema has; MountMode its modes", () => {
  const text = readFileSync(join(srcDir, "types.ts"), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
  const schema = resolveSchema(schemas["MountInput"]!);
  const props = Object.keys(schema.properties ?? {}).sort();
  assert.deepEqual(schema.required, ["path"]);
  // Each kind's members, camelCase, without the other kind's (`never`).
  const members = (name: string): string[] => {
    const body = new RegExp(`export interface ${name} \\{([^}]*)\\}`).exec(text);
    assert.ok(body, `types.ts no longer declares \`export interface ${name}\``);
    return splitTop(body[1]!, ";")
      .filter((decl) => !decl.endsWith(": never"))
      .map((decl) => decl.split(/\??:/)[0]!.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`));
  };
  const host = members("HostMount");
  const volume = members("VolumeMount");
  assert.deepEqual([...new Set([...host, ...volume])].sort(), props);
  assert.deepEqual(host.sort(), ["host_path", "mode", "path"]);
  assert.deepEqual(volume.sort(), ["mode", "path", "volume"]);
  const modes = /export type MountMode = ([^;]*);/.exec(text);
  assert.ok(modes, "types.ts no longer declares `export type MountMode`");
  assert.deepEqual([...modes[1]!.matchAll(/"(\w+)"/g)].map((m) => m[1]), schemas["MountMode"]!.enum);
  const create: Schema = resolveSchema(schemas["CreateSandbox"]!).properties;
  assert.deepEqual(typesOf(create["mounts"]), ["array"]);
  assert.equal(schemaName(create["mounts"].items), "MountInput");
});

test("VolumeCarry (createSnapshot's `volumes`) has the values the VolumeCarry schema has", () => {
  const text = readFileSync(join(srcDir, "snapshots.ts"), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
  const carry = /export type VolumeCarry = ([^;]*);/.exec(text);
  assert.ok(carry, "snapshots.ts no longer declares `export type VolumeCarry`");
  assert.deepEqual([...carry[1]!.matchAll(/"(\w+)"/g)].map((m) => m[1]), schemas["VolumeCarry"]!.enum);
  const create: Schema = resolveSchema(schemas["CreateSnapshot"]!).properties;
  assert.equal(schemaName(create["volumes"]), "VolumeCarry");
});

test("the headers a run's event stream sends are the document's", () => {
  const source = readFileSync(join(srcDir, "runs.ts"), "utf8");
  const sent = [...source.matchAll(/headers\["([\w-]+)"\]|\{ (accept): "text\/event-stream" \}/g)].map((m) => m[1] ?? m[2]!);
  assert.ok(sent.includes("last-event-id") && sent.includes("accept"), `runs.ts no longer sends these headers: ${sent}`);
  const { op } = operation("GET", "/v1/runs/x/events");
  const documented = (op.parameters ?? []).filter((p: Schema) => p.in === "header").map((p: Schema) => String(p.name).toLowerCase());
  // `accept` is HTTP's own; the others must be parameters of the operation.
  assert.deepEqual(sent.filter((h) => h !== "accept" && !documented.includes(h)), []);
});

test("the headers a build's log stream sends are the document's", () => {
  const source = readFileSync(join(srcDir, "templates.ts"), "utf8");
  const sent = [...source.matchAll(/headers\["([\w-]+)"\]|\{ (accept): "text\/event-stream" \}/g)].map((m) => m[1] ?? m[2]!);
  assert.ok(sent.includes("last-event-id") && sent.includes("accept"), `templates.ts no longer sends these headers: ${sent}`);
  const { op } = operation("GET", "/v1/builds/x/logs");
  const documented = (op.parameters ?? []).filter((p: Schema) => p.in === "header").map((p: Schema) => String(p.name).toLowerCase());
  assert.deepEqual(sent.filter((h) => h !== "accept" && !documented.includes(h)), []);
});

test("the BuildEvent type and its mapping know every kind of event the BuildEvent schema has", () => {
  const kinds = shapesOf(schemas["BuildEvent"]!)!.map((shape) => {
    const e = shape.properties.event;
    assert.ok(Array.isArray(e?.enum) && e.enum.length === 1, `a BuildEvent shape without one event name: ${JSON.stringify(shape)}`);
    return String(e.enum[0]);
  });
  const types = readFileSync(join(srcDir, "types.ts"), "utf8");
  const union = /export type BuildEvent =([\s\S]*?)\};\n/.exec(types);
  assert.ok(union, "types.ts no longer declares `export type BuildEvent`");
  assert.deepEqual([...union[1]!.matchAll(/type: "(\w+)"/g)].map((m) => m[1]).sort(), [...kinds].sort(), "BuildEvent's members");
  const mapping = /function toBuildEvent[\s\S]*?\n\}\n/.exec(readFileSync(join(srcDir, "templates.ts"), "utf8"));
  assert.ok(mapping, "templates.ts no longer defines toBuildEvent");
  assert.deepEqual([...mapping[0].matchAll(/case "(\w+)":/g)].map((m) => m[1]).sort(), [...kinds].sort(), "toBuildEvent's cases");
});

// ---- the SDK's methods against a fake daemon that answers samples of the schemas ----

/** Keys read per schema, and the properties it has. */
type Reads = Map<string, { properties: Set<string>; keys: Set<string> }>;

// Looked up by `await` (then), JSON.stringify (toJSON), inspection and object spreads.
const NOT_READS = new Set(["then", "toJSON", "constructor", "valueOf", "toString", "inspect"]);

/** A value of `s`: `full` gives every property a value, else only the required ones. */
function sample(s: Schema, reads: Reads, full: boolean, label: string): Json {
  label = schemaName(s) ?? label;
  const r = resolveSchema(s);
  const ts = typesOf(r);
  if (ts.includes("null") && !full) return null;
  const shapes = Array.isArray(r.oneOf) ? r.oneOf.filter((b: Schema) => b.type !== "null") : [];
  if (shapes.length > 0 && ts.length === 0) {
    // A value of several shapes (a network policy: a name or { allow: [...] }): the richest
    // one with every property, the first one else.
    return sample(full ? shapes[shapes.length - 1] : shapes[0], reads, full, label);
  }
  if (Array.isArray(r.enum)) return r.enum[0];
  if (r.properties !== undefined) {
    const required = new Set<string>(r.required ?? []);
    const obj: Record<string, Json> = {};
    for (const [k, p] of Object.entries<Schema>(r.properties)) {
      if (full || required.has(k)) obj[k] = sample(p, reads, full, `${label}.${k}`);
    }
    // A value of several shapes may have any property of any of them.
    if (!reads.has(label)) reads.set(label, { properties: new Set(), keys: new Set() });
    const read = reads.get(label)!;
    for (const k of Object.keys(r.properties)) read.properties.add(k);
    return new Proxy(obj, {
      get(target, key, receiver) {
        if (typeof key === "string" && !NOT_READS.has(key)) read.keys.add(key);
        return Reflect.get(target, key, receiver);
      },
      has(target, key) {
        if (typeof key === "string") read.keys.add(key);
        return Reflect.has(target, key);
      },
    });
  }
  for (const t of ts) {
    if (t === "string") return "2026-01-01T00:00:00Z";
    if (t === "integer") return 7;
    if (t === "number") return 1.5;
    if (t === "boolean") return true;
    if (t === "array") {
      if (r.items === undefined) return [];
      // A list of values of several shapes (a build's log events) holds one of each.
      const shapes = shapesOf(r.items);
      const itemLabel = schemaName(r.items) ?? label;
      return shapes === undefined ? [sample(r.items, reads, full, label)] : shapes.map((shape) => sample(shape, reads, full, itemLabel));
    }
    if (t === "object") {
      return typeof r.additionalProperties === "object" ? { key: sample(r.additionalProperties, reads, full, label) } : {};
    }
  }
  return {};
}

interface Sent {
  method: string;
  template: string;
  problems: string[];
  /** The JSON body, when one was sent. */
  body?: unknown;
}

/** Replaces `fetch` with a daemon made of the document for the length of `run`. */
async function withFakeDaemon(full: boolean, run: () => Promise<void>): Promise<{ sent: Sent[]; reads: Reads; failure?: unknown }> {
  const sent: Sent[] = [];
  const reads: Reads = new Map();
  const real = globalThis.fetch;
  globalThis.fetch = (async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    const method = init?.method ?? "GET";
    let found: { template: string; op: Schema };
    try {
      found = operation(method, url.pathname);
    } catch (e) {
      sent.push({ method, template: url.pathname, problems: [(e as Error).message] });
      throw e;
    }
    const { template, op } = found;
    const where = `${method} ${template}`;
    const problems: string[] = [];
    const query = new Set((op.parameters ?? []).filter((p: Schema) => p.in === "query").map((p: Schema) => p.name));
    for (const key of url.searchParams.keys()) {
      if (!query.has(key)) problems.push(`${where}: query parameter "${key}" is not in the document`);
    }
    const content: Schema = op.requestBody?.content ?? {};
    let json: unknown;
    if (typeof init?.body === "string") {
      json = JSON.parse(init.body);
      const schema = content["application/json"]?.schema;
      if (schema === undefined) problems.push(`${where}: sends JSON, the document takes ${Object.keys(content).join(", ") || "no body"}`);
      else problems.push(...validate(json, schema, where));
    } else if ((init?.body === undefined || init.body === null) && op.requestBody?.required === true && content["application/json"] !== undefined) {
      // The server's JSON extractor refuses a missing body.
      problems.push(`${where}: sends no body, the document requires a JSON one`);
    } else if (init?.body !== undefined && init.body !== null && content["application/octet-stream"] === undefined) {
      problems.push(`${where}: sends bytes, the document takes ${Object.keys(content).join(", ") || "no body"}`);
    }
    sent.push({ method, template, problems, body: json });
    const [status, answer] = Object.entries<Schema>(op.responses).find(([code]) => code.startsWith("2"))!;
    const schema = answer.content?.["application/json"]?.schema;
    // A page asked for by its cursor (or `before`) is the last (its next_cursor or
    // next_before null), or a listing never ends.
    const last = url.searchParams.has("cursor") || url.searchParams.has("before");
    const body = schema === undefined ? undefined : sample(schema, reads, full && !last, template);
    return {
      ok: true,
      status: Number(status),
      headers: new Headers(),
      json: async () => body,
      text: async () => JSON.stringify(body),
    } as unknown as Response;
  }) as typeof fetch;
  let failure: unknown;
  try {
    await run();
  } catch (e) {
    failure = e;
  } finally {
    globalThis.fetch = real;
  }
  return { sent, reads, failure };
}

const client = { apiUrl: "http://sandcell.test", apiKey: "sk-test" };

/** Every method that sends a JSON request or parses a JSON answer, each option given. */
async function everyMethod(): Promise<void> {
  const sb = await Sandbox.create({
    ...client,
    template: "python",
    size: "small",
    limits: { memoryMb: 256, cpus: 0.5, pids: 64, diskMb: 100, tmpMb: 10, homeMb: 10, openFiles: 100, execTimeoutSecs: 5 },
    env: { E: "1" },
    labels: { a: "b" },
    metadata: { c: "d" },
    timeoutSecs: 60,
    idleTimeoutSecs: 30,
    ephemeral: true,
    network: "off",
    kernels: ["python", "node"],
    backend: "process",
    checkpointable: true,
    autoSnapshot: { intervalSecs: 60, keep: 2, beforeReclaim: true },
  });
  await Sandbox.create({ ...client, snapshotId: "snap-0123456789ab", labels: { a: "b" } });
  await Sandbox.create({ ...client, snapshotId: "snap-0123456789ab", secrets: [{ name: "API_TOKEN", value: "t0ken", hosts: ["api.example.org"] }] });
  await Sandbox.create({ ...client, network: { allow: ["example.org", "*.example.net:443", "[::1]:8080"] } });
  await Sandbox.create({ ...client, network: ["example.org:443"] });
  await Sandbox.create({ ...client, network: "full" });
  await Sandbox.create({ ...client, packages: { pip: ["numpy", "pandas==2.2.2"], npm: ["@scope/name@1.2.3"], r: ["ggplot2"] } });
  await Sandbox.create({ ...client, packages: { npm: ["left-pad"], pip: undefined } });
  await Sandbox.create({ ...client, packages: {} });
  await Sandbox.create({
    ...client,
    network: ["api.example.org"],
    secrets: [
      { name: "API_TOKEN", value: "t0ken", hosts: ["api.example.org", "*.example.net:443"] },
      { name: "OTHER", value: "v", hosts: ["example.com"] },
    ],
  });
  await Sandbox.create({ ...client, secrets: [] });
  await Sandbox.create({
    ...client,
    mounts: [
      Mount.fromHost("/srv/data", "/workspace/data"),
      Mount.fromVolume("cache", "/home/sandbox/cache", "rw"),
      { hostPath: "/srv/src", path: "/tmp/src", mode: "overlay" },
      { volume: "out", path: "/workspace" },
    ],
  });
  await Sandbox.create({ ...client, mounts: [] });
  await Sandbox.get(sb.id, client);
  await Sandbox.list({ ...client, label: { a: "b" }, metadata: { c: "d" }, state: ["running", "paused"] });
  await Sandbox.fork("snap-0123456789ab", { ...client, count: 2, labels: { a: "b" }, metadata: { c: "d" }, timeoutSecs: 60, idleTimeoutSecs: 30, ephemeral: true });
  await Sandbox.fork("snap-0123456789ab", { ...client, secrets: [{ name: "API_TOKEN", value: "t0ken", hosts: ["api.example.org"] }] });
  await sb.refresh();
  await sb.setTimeout(90);
  await sb.pause();
  await sb.resume();
  await sb.metrics();
  await sb.network();
  await sb.setNetwork("loopback");
  await sb.setNetwork(["example.org", "127.0.0.1:8080"]);
  await sb.setNetwork({ allow: ["a.example.org"] });
  await sb.secrets();
  await sb.setSecrets([{ name: "API_TOKEN", value: "t0ken", hosts: ["api.example.org", "*.example.net:443"] }]);
  await sb.setSecrets([]);
  await sb.egressEvents({ limit: 50, before: 12 });
  await sb.egressEvents();
  for await (const event of sb.iterEgressEvents({ pageSize: 10 })) assert.equal(typeof event.id, "number");
  await sb.gitClone("https://git.example.org/team/repo.git", { path: "/workspace/src", branch: "main", depth: 1, username: "me", password: "token" });
  await sb.gitClone("https://me:token@git.example.org/repo");
  await sb.preview(8000, { ttlSecs: 60, public: true });
  await sb.preview(3000, { public: false });
  await sb.preview(65535);
  await sb.previewUrl(8000, { route: "path", ttlSecs: 30 });
  await sb.previewUrl(8000);
  assert.equal(typeof sb.getHost(8000), "string");
  await sb.exec("ls", { env: { E: "1" }, cwd: "/", timeout: 5, stdin: "x" });
  await sb.exec(["ls", "-l"]);
  const proc = await sb.startProcess("top", { env: { E: "1" }, cwd: "/", timeout: 5, stdin: true, pty: { rows: 24, cols: 80 }, bufferBytes: 4096 });
  // A terminal size from elsewhere may carry more than rows and columns.
  const size = { rows: 24, cols: 80, pixels: 0 };
  await sb.startProcess("top", { pty: size });
  await proc.output({ stdoutFrom: 1, stderrFrom: 2 });
  await proc.write("x");
  await proc.closeStdin();
  await proc.resize(30, 100);
  await proc.kill({ signal: "SIGTERM", tree: true });
  await sb.processes();
  await sb.killProcess(12, { signal: 9, tree: true });
  await sb.runCode("1", { language: "python", timeout: 2 });
  await sb.runCode("1", { context: "ctx", timeout: 2 });
  await sb.createContext({ language: "node", cwd: "/", env: { E: "1" } });
  await sb.listContexts();
  await sb.deleteContext("ctx");
  await sb.interrupt("ctx");
  await sb.restartContext("ctx");
  await sb.getVariables({ context: "ctx", names: ["a", "b"] });
  await sb.setVariables({ a: 1 }, { context: "ctx" });
  await sb.clearVariables({ context: "ctx", names: ["a"] });
  await sb.writeFile("/x", "text", { mode: 0o644, append: true });
  await sb.ls("/");
  await sb.stat("/x");
  await sb.exists("/x");
  await sb.mkdir("/d");
  await sb.remove("/x", { recursive: true });
  await sb.rename("/a", "/b");
  await sb.importFiles("/x", { text: "t" }, { mode: 0o755 });
  await sb.importFiles("/x", { base64: "eA==" });
  await sb.importFiles("/x", { hostPath: "/h" });
  await sb.importFiles("/x", { exportId: "exp-0123456789ab" });
  const exported = await sb.exportFiles("/x");
  await FileExport.get(exported.id, client);
  await FileExport.list({ ...client, sandboxId: sb.id });
  await exported.delete();
  await sb.artifacts();
  const snap = await sb.createSnapshot({ name: "n", description: "d", tags: { t: "v" }, volumes: "copy" });
  await sb.createSnapshot({ volumes: "mount" });
  // Options built elsewhere may hold more than CreateSnapshotOptions names (here a client's).
  const spread = { ...client, name: "n" };
  await sb.createSnapshot(spread);
  await sb.listSnapshots();
  await Snapshot.get(snap.id, client);
  await Snapshot.list({ ...client, sandboxId: sb.id });
  await snap.fork({ count: 1 });
  await snap.fork({ secrets: [{ name: "API_TOKEN", value: "t0ken", hosts: ["api.example.org"] }] });
  await snap.delete();
  await sb.getAutoSnapshot();
  await sb.setAutoSnapshot({ intervalSecs: 60, keep: 2, beforeReclaim: true });
  await sb.enableAutoSnapshot({ intervalMins: 1, keep: 2 });
  await sb.disableAutoSnapshot();
  await system(client);
  const run = await Run.start("task", {
    ...client,
    model: "openai/m",
    mode: "tools",
    sandbox: sb,
    template: "python",
    context: "c",
    budgets: { maxIterations: 5, maxDepth: 2, maxSubCalls: 3, tokenBudget: 1000, costLimitUsd: 0.5, timeoutSecs: 60.5, cellTimeoutSecs: 10, maxOutputTokens: 512 },
    keepSandbox: true,
    validate: { command: "python3 -m pytest -q", timeoutS: 30.5, maxAttempts: 2 },
  });
  await Run.start("task", { ...client, sandbox: "sb-0123456789ab", budgets: { tokenBudget: null }, validate: "true" });
  await Run.start("task", { ...client, snapshots: "every_step", keepSnapshots: true, threadId: "th-0123456789abcdef" });
  await Run.run("task", { ...client, budgets: {}, timeout: 5 });
  await Run.get(run.id, client);
  await Run.list({ ...client, limit: 10 });
  await Run.list(client);
  await run.refresh();
  await run.wait({ timeout: 1 });
  await run.listEvents({ after: 3 });
  await run.cancel();
  await Run.resume(run.id, client);
  await run.resume();
  const fork = await Run.fork(run.id, {
    ...client,
    fromStep: 1,
    task: "again",
    model: "openai/m",
    budgets: { maxIterations: 3, tokenBudget: 100 },
    validate: { command: "true", timeoutS: 5, maxAttempts: 1 },
    keepSandbox: true,
    wait: true,
  });
  await fork.refresh();
  await run.fork({ fromStep: 2 });
  await Run.stepSandbox(run.id, 1, client);
  await run.stepSandbox(2);
  const th = threads(client);
  const made = await th.create({ name: "n" });
  await th.create();
  await th.list({ limit: 5 });
  await th.list();
  await th.get(made.id);
  await th.rename(made.id, "m");
  await th.delete(made.id);
  for (const scope of [sb.memory, memory(client)]) {
    const m = await scope.add("text", { category: "notes", metadata: { k: "v" } });
    await scope.add("text");
    await scope.search("query", { limit: 5, category: "notes" });
    await scope.search("query");
    await scope.list({ category: "notes", limit: 1500 });
    await scope.list();
    await scope.get(m.id);
    await scope.delete(m.id);
    const job = await scope.add("facts", { infer: true, category: "notes", metadata: { k: "v" } });
    await scope.add("facts", { infer: true });
    await scope.inferStatus(job);
    await scope.inferJobs({ limit: 5 });
    await scope.inferJobs();
  }
  // A run without a sandbox (the required-only answers) has none to give.
  if (run.info.sandboxId !== null) await run.sandbox();
  const build = await Template.build("app:v1", {
    ...client,
    dockerfile: "FROM debian:bookworm\nRUN true\n",
    context: new Uint8Array([0x1f, 0x8b, 0x08, 0]),
    buildArgs: { V: "1" },
    noCache: true,
    allowHosts: ["example.org", "*.example.net:443"],
    offline: false,
    wait: true,
  });
  await Template.build("app", { ...client, dockerfile: "FROM tiny:v1\n" });
  // A context folder, packed here (its Dockerfile is not read when one is given).
  await Template.build("app", { ...client, dockerfile: "FROM tiny:v1\n", context: srcDir, offline: true });
  await build.info();
  await build.listLogs({ after: 3 });
  await build.listLogs();
  await build.cancel();
  await Template.getBuild(build.id, client);
  await Template.listBuilds(client);
  await Template.cancelBuild(build.id, client);
  await Template.list(client);
  await Template.get("app:v1", client);
  await Template.delete("app:v1", client);
  await Volume.create("cache", client);
  await Volume.list(client);
  await Volume.get("cache", client);
  await Volume.delete("cache", client);
  await sb.kill();
}

/** Operations everyMethod leaves out, and why. */
const NOT_EXERCISED: Record<string, string> = {
  "GET /v1/keys": "keys are managed with the CLI; the SDK has no method for them",
  "POST /v1/keys": "keys are managed with the CLI; the SDK has no method for them",
  "DELETE /v1/keys/{key_id}": "keys are managed with the CLI; the SDK has no method for them",
  "POST /v1/sandboxes/{id}/exec/stream": "an event stream: its events have no schema in the document",
  "POST /v1/sandboxes/{id}/code/stream": "an event stream: its events have no schema in the document",
  "GET /v1/sandboxes/{id}/processes/{pid}/stream": "an event stream: its events have no schema in the document",
  "GET /v1/sandboxes/{id}/files/content": "bytes, not JSON (its path is checked with the other calls)",
  "GET /v1/exports/{export_id}/content": "bytes, not JSON (its path is checked with the other calls)",
  "GET /v1/sandboxes/{id}/pty": "a WebSocket (its path is checked with the other calls)",
};

for (const full of [true, false]) {
  test(`requests fit the document and answers are read as it says (${full ? "every property" : "required only"})`, async () => {
    const { sent, reads, failure } = await withFakeDaemon(full, everyMethod);
    const problems = sent.flatMap((s) => s.problems);
    for (const [label, read] of reads) {
      const unknown = [...read.keys].filter((k) => !read.properties.has(k));
      if (unknown.length > 0) problems.push(`reads ${unknown.join(", ")} of ${label}, which has no such property`);
    }
    assert.deepEqual(problems, [], "requests the document does not accept, answers read beyond their schemas");
    if (failure !== undefined) throw failure;
    // Every operation of the document was exercised, but those listed apart.
    const covered = new Set(sent.map((s) => `${s.method} ${s.template}`));
    const documented = Object.entries<Schema>(doc.paths).flatMap(([t, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${t}`));
    const missed = documented.filter((o) => !covered.has(o) && !(o in NOT_EXERCISED));
    assert.deepEqual(missed, [], "operations neither exercised by everyMethod nor listed in NOT_EXERCISED");
    // `preview`'s options are CreatePreview's properties, each sent when given; with none the
    // body is an empty object (the document requires one).
    const previewBodies = sent.filter((s) => s.template === "/v1/sandboxes/{id}/previews/{port}").map((s) => s.body as Record<string, unknown>);
    const keys = new Set(previewBodies.flatMap((b) => Object.keys(b)));
    assert.deepEqual([...keys].sort(), Object.keys(resolveSchema(schemas["CreatePreview"]!).properties).sort());
    assert.ok(previewBodies.some((b) => Object.keys(b).length === 0), JSON.stringify(previewBodies));
  });
}
