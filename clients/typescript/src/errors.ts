// Errors: every problem document (RFC 9457) the server answers with becomes a
// LedgerError, of the subclass its stable `code` names; the client's own
// refusals (a person's no, a step already in doubt) have classes of their own.

import type { Action, Outcome } from "./types.js";

/** One failing location of a request, as a problem document's `errors` lists it. */
export interface FieldError {
  location: string;
  message: string;
}

/** A problem document as the server sends it. */
export interface Problem {
  type?: string;
  title?: string;
  status: number | undefined;
  detail?: string;
  code: string;
  instance?: string;
  errors?: FieldError[];
  action?: Action;
  recorded?: Outcome;
  stop_reason?: string;
  [member: string]: unknown;
}

/**
 * A refusal of the ledger, or of the client on the ledger's behalf. For an
 * answer of the server that is a problem document: `status` and the stable
 * `code` to branch on, `detail` for people, and the extension members some
 * codes carry (`action`, `recorded`, `stopReason`, `errors`); `problem` is
 * the whole document. `status` is undefined when no request failed (a
 * person's no raised by run.call, say).
 */
export class LedgerError extends Error {
  /** The HTTP status, if a request failed. */
  readonly status: number | undefined;
  /** The stable code of the problem (branch on this, never on detail). */
  readonly code: string;
  /** What went wrong, for people. */
  readonly detail: string;
  /** The request's URN ("urn:request:<id>"): quote it when reporting a problem. */
  readonly instance: string | undefined;
  /** The failing locations (invalid_arguments, schema_violation, invalid). */
  readonly errors: FieldError[];
  /** The recorded action (step_key_reused), or the action as it stands (a client-side refusal). */
  readonly action: Action | undefined;
  /** The outcome as recorded (outcome_conflict). */
  readonly recorded: Outcome | undefined;
  /** Why the run stopped (run_stopped). */
  readonly stopReason: string | undefined;
  /** The whole problem document, with any member not named above. */
  readonly problem: Problem;
  /** The Retry-After header in seconds, when the server sent one. */
  readonly retryAfter: number | undefined;

  constructor(problem: Problem, options: { retryAfter?: number; cause?: unknown } = {}) {
    const head = [problem.status, problem.code].filter((x) => x !== undefined && x !== "").join(" ");
    const text = problem.detail || problem.title || "";
    super(head && text ? `${head}: ${text}` : head || text, options.cause !== undefined ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    this.status = problem.status;
    this.code = problem.code;
    this.detail = problem.detail ?? "";
    this.instance = problem.instance;
    this.errors = problem.errors ?? [];
    this.action = problem.action;
    this.recorded = problem.recorded;
    this.stopReason = problem.stop_reason;
    this.problem = problem;
    this.retryAfter = options.retryAfter;
  }
}

/** 401: no, a malformed or an unknown bearer token. */
export class Unauthorized extends LedgerError {}
/** 403: the role does not allow it, or separation of duties forbids it. */
export class Forbidden extends LedgerError {}
/** 404: an unknown id, or another tenant's. */
export class NotFound extends LedgerError {}
/** 429: over a rate limit or a cap; see retryAfter. */
export class RateLimited extends LedgerError {}
/** 422 step_key_reused: the step key was used in this run for another body; `action` is the recorded one. */
export class StepKeyReused extends LedgerError {}
/** 422 invalid_arguments: the arguments fail the tool's schema; `errors` lists each location. */
export class InvalidArguments extends LedgerError {}
/** 422 unknown_tool: no tool of that name is declared. */
export class UnknownTool extends LedgerError {}
/** 422 tool_not_allowed: this run's agent may not call the tool. */
export class ToolNotAllowed extends LedgerError {}
/** 422 outcome_not_allowed: the outcome is not one the tool may report. */
export class OutcomeNotAllowed extends LedgerError {}
/** 409 action_in_doubt: an earlier write of the run is running, uncertain or in review. */
export class ActionInDoubt extends LedgerError {}
/** 409 run_stopped: the run has ended, or this step made it stop; `stopReason` says why. */
export class RunStopped extends LedgerError {}
/** 409 run_cancelled: the run's cancel was accepted. */
export class RunCancelled extends LedgerError {}
/** 409 not_client_driven: the run's agent is not driven by a client. */
export class NotClientDriven extends LedgerError {}
/** 409 not_approved: the action is not approved. */
export class NotApproved extends LedgerError {}
/** 409 approval_stale: the approval passed its execute_by. */
export class ApprovalStale extends LedgerError {}
/** 409 attempt_open: the action already has an open attempt; follow /next. */
export class AttemptOpen extends LedgerError {}
/** 409 attempt_closed: the lease lapsed or the attempt is closed. */
export class AttemptClosed extends LedgerError {}
/** 409 outcome_conflict: another outcome was recorded; `recorded` is it. */
export class OutcomeConflict extends LedgerError {}
/** 409 stale_decision: the directive answered is no longer the current one. */
export class StaleDecision extends LedgerError {}
/** 403 bad_attempt_token: the token is not this attempt's. */
export class BadAttemptToken extends LedgerError {}
/** 422 invalid_finish: the finish's outcome or stop reason is not allowed. */
export class InvalidFinish extends LedgerError {}
/** 422 idempotency_key_reused: a run submission's key was used with another body. */
export class IdempotencyKeyReused extends LedgerError {}
/** 400: a malformed request (invalid, invalid_json, schema_violation, idempotency_key_invalid). */
export class Invalid extends LedgerError {}
/** 409 conflict: the stored state does not allow it. */
export class Conflict extends LedgerError {}
/** 409 request_in_progress: the same idempotency key is still being processed; retry after retryAfter. */
export class RequestInProgress extends LedgerError {}
/** 5xx: a fault of the server; its cause is in the server's log under `instance`. */
export class ServerError extends LedgerError {}

const byCode: Record<string, typeof LedgerError> = {
  unauthorized: Unauthorized,
  forbidden: Forbidden,
  not_found: NotFound,
  rate_limited: RateLimited,
  too_many_pending_approvals: RateLimited,
  step_key_reused: StepKeyReused,
  invalid_arguments: InvalidArguments,
  unknown_tool: UnknownTool,
  tool_not_allowed: ToolNotAllowed,
  outcome_not_allowed: OutcomeNotAllowed,
  action_in_doubt: ActionInDoubt,
  run_stopped: RunStopped,
  run_cancelled: RunCancelled,
  not_client_driven: NotClientDriven,
  not_approved: NotApproved,
  approval_stale: ApprovalStale,
  attempt_open: AttemptOpen,
  attempt_closed: AttemptClosed,
  outcome_conflict: OutcomeConflict,
  stale_decision: StaleDecision,
  bad_attempt_token: BadAttemptToken,
  invalid_finish: InvalidFinish,
  idempotency_key_reused: IdempotencyKeyReused,
  invalid: Invalid,
  invalid_json: Invalid,
  schema_violation: Invalid,
  idempotency_key_invalid: Invalid,
  forbidden_role: Forbidden,
  agent_not_bound: Forbidden,
  route_not_found: NotFound,
  conflict: Conflict,
  request_in_progress: RequestInProgress,
};

const byStatus: Record<number, typeof LedgerError> = {
  400: Invalid,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  409: Conflict,
  429: RateLimited,
};

/** The LedgerError of the class a problem's code (else its status) names. */
export function errorFromProblem(problem: Problem, retryAfter?: number): LedgerError {
  const status = problem.status ?? 0;
  const cls = byCode[problem.code] ?? byStatus[status] ?? (status >= 500 ? ServerError : LedgerError);
  return new cls(problem, { retryAfter });
}

/** The server could not be reached, or its answer was not a readable one. */
export class TransportError extends LedgerError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super({ status: undefined, code: "transport", detail: message }, options);
  }
}

/**
 * The action will not run: a person or a rule said no, it expired, or it
 * was cancelled or superseded. `action` is the action as it stands.
 */
export class NotExecuted extends LedgerError {
  constructor(action: Action, code: string, message?: string) {
    super({ status: undefined, code, detail: message ?? `action ${action.id} (${action.tool}) is ${action.state}`, action });
  }
}

/** The action was denied, by a person or by a rule. */
export class Denied extends NotExecuted {}

/** The action's approval expired before anyone decided. */
export class Expired extends NotExecuted {}

/**
 * The step's action already has an attempt open, uncertain or in review (a
 * replay of a step key whose call this process did not see end): never run
 * it again blind; call run.resume(handlers) first.
 */
export class NeedsRecovery extends LedgerError {
  constructor(action: Action) {
    super({
      status: undefined,
      code: "needs_recovery",
      detail: `action ${action.id} (${action.tool}) is ${action.state}: resume the run first`,
      action,
    });
  }
}
