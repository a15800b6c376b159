// The wire types of the ledger's HTTP API v1 that the agent protocol uses
// (docs/agent-protocol.md, docs/api.md). Field names are the wire's own
// (snake_case): these are the JSON bodies as the server sends them.

/** Any JSON value. */
export type JSONValue = null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };

/** A JSON object. */
export type JSONObject = { [key: string]: JSONValue };

/** States of a run. */
export type RunState =
  | "queued"
  | "running"
  | "awaiting_approval"
  | "needs_review"
  | "stopping"
  | "completed"
  | "stopped"
  | "failed";

/** States of an action. */
export type ActionState =
  | "proposed"
  | "awaiting_approval"
  | "approved"
  | "running"
  | "succeeded"
  | "failed"
  | "uncertain"
  | "needs_review"
  | "denied"
  | "expired"
  | "cancelled"
  | "abandoned"
  | "superseded";

/** Statuses of an attempt. */
export type AttemptStatus = "started" | "succeeded" | "failed" | "timed_out" | "cancelled" | "uncertain";

/** What is known of a write's effect in the world. */
export type EffectFact = "happened" | "not_happened" | "unknown";

/** Whether a tool changes the world. */
export type Effect = "read" | "write";

/** States of an approval. */
export type ApprovalState = "pending" | "granted" | "denied" | "expired" | "invalidated";

/** Model usage of one step; without it token accounting is unavailable, never zero. */
export interface Usage {
  input_tokens: number;
  output_tokens: number;
}

/** Limits of a run given at submission. */
export interface Budgets {
  max_attempts_per_action?: number;
  max_attempts_per_run?: number;
  max_execution_ms?: number;
  deadline_ms?: number;
  max_steps?: number;
  max_tokens?: number;
}

/** The answer to a run submission. */
export interface RunAccepted {
  id: string;
  tenant: string;
  agent: string;
  state: RunState;
  request_digest: string;
  created_at: string;
  links: Record<string, string>;
}

/** An attempt as the API shows it. */
export interface Attempt {
  id: string;
  attempt_no: number;
  status: AttemptStatus;
  effect: EffectFact;
  effect_observation_id?: string;
  error?: AttemptError;
  started_at: string;
  finished_at?: string;
  [member: string]: unknown;
}

/** An approval as the API shows it. */
export interface Approval {
  id: string;
  action_id: string;
  run_id: string;
  action_digest: string;
  state: ApprovalState;
  decided_by?: string;
  reason?: string;
  requested_at: string;
  expires_at?: string;
  decided_at?: string;
  [member: string]: unknown;
}

/** The gate's decision on an action: the rule that decided and the rule set's digest. */
export interface Gate {
  decision: string;
  rule?: string;
  reason?: string;
  rules_digest?: string;
  [member: string]: unknown;
}

/** An action as the API shows it (GET /v1/actions/{id}, and the answer to a proposal). */
export interface Action {
  id: string;
  run_id: string;
  seq: number;
  tool: string;
  tool_version: string;
  effect: Effect;
  state: ActionState;
  version: number;
  action_digest: string;
  arguments: JSONValue;
  dedup_key: string;
  supersedes?: string;
  gate?: Gate;
  created_at: string;
  attempts: Attempt[];
  approvals: Approval[];
  [member: string]: unknown;
}

/** A run as the API shows it (GET /v1/runs/{id}). */
export interface RunView {
  id: string;
  tenant: string;
  agent: string;
  state: RunState;
  stop_reason?: string;
  submitted_by: string;
  created_at: string;
  updated_at: string;
  budget: JSONObject;
  cancellation?: JSONObject;
  actions: Action[];
  [member: string]: unknown;
}

/** An error a tool call reports. */
export interface AttemptError {
  code: string;
  message: string;
}

/** The answer to beginning an attempt. */
export interface BeginResponse {
  attempt: Attempt;
  attempt_token: string;
  dedup_key: string;
  arguments: JSONValue;
  action_digest: string;
  lease_remaining_s: number;
  [member: string]: unknown;
}

/** The answer to a heartbeat. */
export interface HeartbeatResponse {
  lease_remaining_s: number;
  cancel_requested: boolean;
  [member: string]: unknown;
}

/** What a call did, as reported to complete an attempt. */
export interface Outcome {
  status: Exclude<AttemptStatus, "started" | "uncertain">;
  effect?: EffectFact;
  output?: JSONValue;
  error?: AttemptError;
}

/** The answer to completing or abandoning an attempt. */
export interface CompleteResponse {
  attempt: Attempt;
  action: Action;
  [member: string]: unknown;
}

/** Directive kinds of GET /v1/runs/{id}/next. */
export type DirectiveKind =
  | "propose"
  | "wait_approval"
  | "execute"
  | "in_flight"
  | "query"
  | "resend"
  | "cancel"
  | "review"
  | "stop";

/** One thing the agent must do about one action, with the decision it rests on. */
export interface Directive {
  directive: DirectiveKind;
  decision_id?: string;
  action_id?: string;
  attempt_id?: string;
  tool?: string;
  dedup_key?: string;
  lease_remaining_s?: number;
  stop_reason?: string;
  rationale?: string;
  [member: string]: unknown;
}

/** The answer of GET /v1/runs/{id}/next. */
export interface NextResponse {
  run_id: string;
  run_state: RunState;
  directives: Directive[];
  [member: string]: unknown;
}

/** What the agent learned from its tool, in answer to a query or cancel directive. */
export type Observation =
  | { decision_id: string; kind: "query"; effect: EffectFact; detail?: JSONValue }
  | { decision_id: string; kind: "cancel"; confirmed: boolean; detail?: JSONValue }
  | { decision_id: string; kind: "query" | "cancel"; error: AttemptError; detail?: JSONValue };

/** The answer to posting an observation: the record and what /next says now. */
export interface ObservationResponse {
  observation: JSONObject;
  next: Directive[];
  [member: string]: unknown;
}

/** One entry of a run's timeline, the data of each SSE event. */
export interface TimelineEvent {
  seq: number;
  type: string;
  entity_type: string;
  entity_id: string;
  from_state?: string;
  to_state?: string;
  actor?: string;
  data?: JSONValue;
  created_at: string;
  hash: string;
  [member: string]: unknown;
}

/** The states a run ends in. */
export const terminalRunStates: readonly RunState[] = ["completed", "stopped", "failed"];

/** The action states a person's decision leaves behind (no longer waiting for one). */
export const waitingActionStates: readonly ActionState[] = ["proposed", "awaiting_approval"];
