// The client of the ledger's agent protocol (docs/agent-protocol.md).

export { Client } from "./client.js";
export type { Answer, Begun, ClientOptions, Proposed, RequestOptions, WaitOptions } from "./client.js";
export { Call, Run, beginKey } from "./run.js";
export type {
  CallOptions,
  CallResult,
  CancelAnswer,
  EventsOptions,
  ProposeOptions,
  QueryAnswer,
  ResumeOptions,
  RunEvent,
  ToolHandler,
} from "./run.js";
export * from "./errors.js";
export * from "./types.js";
export { parseSSE } from "./sse.js";
export type { SSEMessage } from "./sse.js";
