/**
 * Sandcell's TypeScript SDK: stateful isolated sandboxes for AI agents, on a `sandcell serve`
 * daemon. Start with `Sandbox.create()`.
 */

export { Sandbox } from "./sandbox.js";
export { Mount, secret } from "./types.js";
export type {
  CreateSandboxOptions,
  EnableAutoSnapshotOptions,
  ListSandboxesOptions,
  RunOnceMetrics,
  RunOnceOptions,
  RunOnceResult,
  SandboxMetrics,
} from "./sandbox.js";
export { Run } from "./runs.js";
export type {
  Budgets,
  BudgetsInput,
  ForkedFrom,
  ForkRunOptions,
  RunEvent,
  RunEventsOptions,
  RunInfo,
  RunMode,
  RunStatus,
  RunUsage,
  SnapshotPolicy,
  StartRunOptions,
  StepSandbox,
  Validate,
  WaitOptions,
} from "./runs.js";
export { Build, Template } from "./templates.js";
export type { BuildLogsOptions, BuildTemplateOptions, WaitBuildOptions } from "./templates.js";
export { Volume } from "./volumes.js";
export type { VolumeInfo } from "./volumes.js";
export { Threads, threads } from "./threads.js";
export type { CreateThreadOptions, ThreadInfo } from "./threads.js";
export { Memories, inferDone, memory } from "./memory.js";
export type {
  AddMemoryOptions,
  InferJob,
  InferStatus,
  ListMemoriesOptions,
  MatchedBy,
  Memory,
  MemoryRanking,
  MemoryScope,
  MemorySearchResults,
  SearchMemoriesOptions,
  WaitInferOptions,
} from "./memory.js";
export type {
  EgressDecision,
  EgressEvent,
  EgressEventPage,
  EgressEventsOptions,
  EgressProtocol,
  IterEgressEventsOptions,
  NetworkInfo,
  SecretState,
} from "./network.js";
export type { GitCloneOptions, GitCloneResult } from "./git.js";
export type { PreviewInfo, PreviewOptions, PreviewRoute, PreviewUrlOptions } from "./previews.js";
export { Snapshot } from "./snapshots.js";
export type {
  AutoSnapshotSettings,
  CreateSnapshotOptions,
  ForkOptions,
  KernelState,
  SnapshotManifest,
  VolumeCarry,
  VolumeCopy,
} from "./snapshots.js";
export { BackgroundProcess } from "./commands.js";
export type {
  Command,
  ExecCallbacks,
  ExecEvent,
  ExecOptions,
  ExecResult,
  KillOptions,
  OutputFrom,
  ProcessEvent,
  ProcessInfo,
  ProcessOutput,
  StartProcessOptions,
} from "./commands.js";
export { Execution, Result } from "./code.js";
export type {
  ArtifactInfo,
  CodeDone,
  ContextInfo,
  ContextRef,
  CreateContextOptions,
  ExecutionError,
  MimeBundle,
  RunCodeOptions,
  Variables,
  VariablesOptions,
} from "./code.js";
export { FileExport } from "./files.js";
export type { Artifact, FileInfo, ImportResult, ImportSource, UploadSource, WriteOptions } from "./files.js";
export { Commands, Files } from "./namespaces.js";
export type { RunCommandOptions } from "./namespaces.js";
export { Terminal } from "./pty.js";
export type { AttachTerminalOptions, TerminalOptions } from "./pty.js";
export { system } from "./system.js";
export type { BackendInfo, SystemInfo } from "./system.js";
export { DEFAULT_API_URL } from "./config.js";
export type { ClientOptions } from "./config.js";
export {
  AuthenticationError,
  BuildError,
  ConflictError,
  ConnectionError,
  InvalidArgumentError,
  LimitExceededError,
  NotFoundError,
  PermissionDeniedError,
  SandboxGoneError,
  SandcellError,
  ServerError,
  TimeoutError,
} from "./errors.js";
export type { ErrorBody } from "./errors.js";
export type {
  AllowPolicy,
  BuildEvent,
  BuildInfo,
  BuildState,
  BuiltImage,
  ExitCause,
  ExitInfo,
  HostMount,
  KernelRestore,
  Language,
  LimitsInput,
  MountMode,
  Network,
  NetworkPolicy,
  NetworkPolicyInput,
  Packages,
  PackagesReport,
  RestoreReport,
  RestoredVolume,
  SandboxInfo,
  SandboxLimits,
  SandboxState,
  Secret,
  Size,
  SkippedVariable,
  StepReport,
  StringMap,
  TemplateInfo,
  VolumeMount,
} from "./types.js";
