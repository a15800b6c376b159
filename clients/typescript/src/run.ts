// The run handle of the agent protocol: propose, call (a tool call inside a
// durable attempt), next, resume after a restart, finish, and the run's
// events.

import { createHash } from "node:crypto";

import type { Client, Proposed } from "./client.js";
import {
  AttemptClosed,
  AttemptOpen,
  BadAttemptToken,
  Denied,
  Expired,
  LedgerError,
  NeedsRecovery,
  NotExecuted,
  StaleDecision,
  TransportError,
} from "./errors.js";
import { parseSSE } from "./sse.js";
import type {
  Action,
  Attempt,
  AttemptError,
  BeginResponse,
  Directive,
  EffectFact,
  JSONValue,
  NextResponse,
  Outcome,
  RunAccepted,
  RunView,
  TimelineEvent,
  Usage,
} from "./types.js";
import { terminalRunStates } from "./types.js";

/** Options of a proposal. */
export interface ProposeOptions {
  /** What the model step that chose this call consumed. */
  usage?: Usage;
  /** An earlier action of the run this one replaces. */
  supersedes?: string;
}

/** Options of run.call. */
export interface CallOptions extends ProposeOptions {
  /** The agent's step key (Idempotency-Key of the proposal): its identity in the run. */
  stepKey: string;
  /** How long each long-poll for approval waits on the server, in seconds. Default 30. */
  waitSeconds?: number;
  /** Heartbeat every this many milliseconds. Default: a third of the lease. */
  heartbeatIntervalMs?: number;
  /** Give up waiting for approval with this signal (the action stays as it is). */
  signal?: AbortSignal;
  /** Give up waiting for approval after this many milliseconds: NotExecuted with code not_decided. */
  approvalTimeoutMs?: number;
  /** Told once when the action must wait for a person's approval. */
  onWait?: (action: Action) => void;
}

/** Options of run.resume. */
export interface ResumeOptions {
  /** Heartbeat every this many milliseconds. Default: a third of the lease. */
  heartbeatIntervalMs?: number;
  /** Stop following /next after this many directives (a guard). Default 100. */
  maxSteps?: number;
  /** Why an open attempt this process does not hold is abandoned. */
  abandonReason?: string;
  /** Told of each directive before resume follows it. */
  onDirective?: (directive: Directive) => void;
}

/** What a tool's query said about a dedup key. */
export type QueryAnswer = EffectFact | { effect: EffectFact; detail?: JSONValue };

/** What a tool's cancel said. */
export type CancelAnswer = boolean | { confirmed: boolean; detail?: JSONValue };

/**
 * The agent's hands for one tool when resuming a run: what the tool says
 * about a dedup key (query), whether it cancelled a call (cancel), and the
 * call itself (execute, for execute and resend directives). A handler that
 * throws in query or cancel is posted as a failed observation (recorded as
 * unknown, asked again).
 */
export interface ToolHandler {
  query?(dedupKey: string, directive: Directive): Promise<QueryAnswer> | QueryAnswer;
  cancel?(dedupKey: string, directive: Directive): Promise<CancelAnswer> | CancelAnswer;
  execute?(call: Call): Promise<JSONValue | void> | JSONValue | void;
}

/** What call (or an execute of resume) did. */
export interface CallResult<T> {
  /** The action as the complete left it (or as the replay found it). */
  action: Action;
  /** The attempt as the complete left it (undefined for a replay of a finished step). */
  attempt: Attempt | undefined;
  /** The outcome reported (undefined for a replay of a finished step). */
  outcome: Outcome | undefined;
  /** What the callback returned. */
  value: T | undefined;
  /** The step had finished before: its call was not made again. */
  replayed: boolean;
}

/** One event of a run's event stream. */
export interface RunEvent {
  /** The SSE id: the event's seq, to resume after with lastEventId. */
  id: string;
  /** The event's type, e.g. "action.approved". */
  type: string;
  /** The timeline entry, redacted as /timeline shows it. */
  data: TimelineEvent;
}

/** Options of run.events. */
export interface EventsOptions {
  /** Resume after this event id (seq). */
  lastEventId?: string;
  /** Stop with this signal. */
  signal?: AbortSignal;
  /** Reconnect when the stream breaks before the run's end. Default true. */
  reconnect?: boolean;
  /** Give up after this many broken connections in a row that brought no event. Default 5. */
  maxReconnects?: number;
}

/**
 * The begin's idempotency key of attempt `attemptNo` of the call named by
 * `scope` (run.call: the run's id and the step key; resume: the run's id
 * and the action's id). Derived, so sending the begin again after a broken
 * connection gets the same attempt and token, and a later attempt gets a
 * key of its own.
 */
export function beginKey(scope: string, attemptNo: number): string {
  return `begin:${createHash("sha256").update(scope, "utf8").digest("hex").slice(0, 40)}:${attemptNo}`;
}

/** A run of a client-driven agent, as this client drives it. */
export class Run {
  /** The run's id. */
  readonly id: string;
  /** The client it talks through. */
  readonly client: Client;
  /** The answer of the submission, when this handle came from startRun. */
  readonly accepted: RunAccepted | undefined;

  constructor(client: Client, id: string, accepted?: RunAccepted) {
    this.client = client;
    this.id = id;
    this.accepted = accepted;
  }

  /** The run as it stands (GET /v1/runs/{id}). */
  get(): Promise<RunView> {
    return this.client.getRun(this.id);
  }

  /** Requests the run's cancellation. */
  cancel(reason?: string): Promise<Record<string, unknown>> {
    return this.client.cancelRun(this.id, reason);
  }

  /**
   * Proposes one tool call under the agent's step key. A replay of the same
   * key and body answers the same action (replayed: true); the key with
   * another body throws StepKeyReused (its `action` is the recorded one).
   */
  async propose(tool: string, args: JSONValue, stepKey: string, options: ProposeOptions = {}): Promise<Proposed> {
    const body: Record<string, unknown> = { tool, arguments: args };
    if (options.usage) body.usage = options.usage;
    if (options.supersedes) body.supersedes = options.supersedes;
    const res = await this.client.request<Action>("POST", `/v1/runs/${encodeURIComponent(this.id)}/actions`, {
      body,
      idempotencyKey: stepKey,
    });
    return { ...res.body, replayed: res.replayed };
  }

  /** What to do now (GET /v1/runs/{id}/next). */
  async next(): Promise<NextResponse> {
    return (await this.client.request<NextResponse>("GET", `/v1/runs/${encodeURIComponent(this.id)}/next`)).body;
  }

  /**
   * Ends the run: "completed" (with the agent's output) or "failed" (with a
   * stop reason of the failed family). Throws ActionInDoubt while an action
   * is running, uncertain or in review.
   */
  async finish(
    outcome: "completed" | "failed",
    options: { output?: JSONValue; stopReason?: string; usage?: Usage } = {},
  ): Promise<RunView> {
    const body: Record<string, unknown> = { outcome };
    if (options.output !== undefined) body.output = options.output;
    if (options.stopReason) body.stop_reason = options.stopReason;
    if (options.usage) body.usage = options.usage;
    // A replay of the same finish answers the same: safe to send again.
    return (await this.client.request<RunView>("POST", `/v1/runs/${encodeURIComponent(this.id)}/finish`, { body, retrySafe: true })).body;
  }

  /**
   * The run's events, oldest first, until the run's terminal event. A
   * stream that breaks is reopened with Last-Event-ID, so no event is seen
   * twice or missed.
   */
  async *events(options: EventsOptions = {}): AsyncGenerator<RunEvent> {
    const reconnect = options.reconnect ?? true;
    const maxReconnects = options.maxReconnects ?? 5;
    let last = options.lastEventId;
    let failures = 0; // breaks in a row that brought no event
    let idle = 0; // streams in a row that brought no event
    let runEnded = false;
    const path = `/v1/runs/${encodeURIComponent(this.id)}/events`;
    for (;;) {
      let got = 0;
      let broke: unknown = undefined;
      try {
        const headers: Record<string, string> = {};
        if (last !== undefined) headers["Last-Event-ID"] = last;
        const res = await this.client.stream(path, { headers, signal: options.signal });
        for await (const msg of parseSSE(res.body!)) {
          got++;
          if (msg.id) last = msg.id;
          const data = JSON.parse(msg.data) as TimelineEvent;
          yield { id: msg.id, type: msg.event, data };
          if (endsRun(data)) return;
        }
      } catch (err) {
        if (options.signal?.aborted || !reconnect || (err instanceof LedgerError && !(err instanceof TransportError))) throw err;
        broke = err;
      }
      // The stream ended before the run's terminal event: the server cut
      // it (a write timeout, a restart), or the connection broke. A run
      // that has ended gets one more stream, to drain what the cut one did
      // not carry.
      if (runEnded || !reconnect) return;
      idle = got > 0 ? 0 : idle + 1;
      if (broke !== undefined) {
        failures = got > 0 ? 1 : failures + 1;
        if (failures > maxReconnects) throw broke;
      } else if (got > 0) {
        failures = 0;
      }
      const run = await this.get();
      runEnded = terminalRunStates.includes(run.state);
      if (idle > 0 && !runEnded) await sleep(Math.min(100 * 2 ** idle, 2000), options.signal);
    }
  }

  /**
   * Runs one tool call inside an attempt: proposes it under opts.stepKey,
   * waits for its approval (Denied or Expired on a no), begins an attempt
   * (durable before fn runs), heartbeats while fn runs, and completes it
   * with what fn reported through the Call (call.succeeded, call.failed, …)
   * — or, when fn reported nothing, `succeeded` with what fn returned, and
   * when fn threw, `failed` with effect `unknown` for a write (never
   * not_happened: the effect is not known) and `failed` for a read; the
   * error is then thrown on.
   *
   * A step key whose action already finished returns its record without
   * calling fn (replayed: true); one whose call is in doubt throws
   * NeedsRecovery: follow resume. Cancelled or superseded actions throw
   * NotExecuted.
   */
  async call<T extends JSONValue | void>(
    tool: string,
    args: JSONValue,
    opts: CallOptions,
    fn: (call: Call) => Promise<T> | T,
  ): Promise<CallResult<T>> {
    let action: Action = await this.propose(tool, args, opts.stepKey, { usage: opts.usage, supersedes: opts.supersedes });
    if (action.state === "proposed" || action.state === "awaiting_approval") {
      opts.onWait?.(action);
      action = await this.#awaitDecision(action, opts);
    }
    switch (action.state) {
      case "approved":
        break;
      case "succeeded":
      case "failed":
      case "abandoned":
        return { action, attempt: undefined, outcome: undefined, value: undefined, replayed: true };
      case "denied":
        throw new Denied(action, "denied", `action ${action.id} (${action.tool}) was denied`);
      case "expired":
        throw new Expired(action, "expired", `action ${action.id} (${action.tool}) expired before anyone decided`);
      case "proposed":
      case "awaiting_approval":
        throw new NotExecuted(action, "not_decided", `action ${action.id} (${action.tool}) is still ${action.state} after the wait`);
      case "running":
      case "uncertain":
      case "needs_review":
        throw new NeedsRecovery(action);
      default:
        throw new NotExecuted(action, action.state, `action ${action.id} (${action.tool}) was ${action.state}`);
    }
    const begun = await this.client.beginAttempt(action.id, beginKey(`${this.id}\0${opts.stepKey}`, action.attempts.length + 1));
    return runAttempt(this, action, begun, opts.heartbeatIntervalMs, fn);
  }

  async #awaitDecision(action: Action, opts: CallOptions): Promise<Action> {
    if (opts.approvalTimeoutMs === undefined) {
      return this.client.waitAction(action.id, action.version, { waitSeconds: opts.waitSeconds, signal: opts.signal });
    }
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new Error("approval timeout")), opts.approvalTimeoutMs);
    const onAbort = () => ctl.abort(opts.signal?.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await this.client.waitAction(action.id, action.version, { waitSeconds: opts.waitSeconds, signal: ctl.signal });
    } catch (err) {
      if (opts.signal?.aborted || !ctl.signal.aborted) throw err;
      // The wait ran out: the action as it stands, still undecided.
      return this.client.getAction(action.id);
    } finally {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Follows /next for a restarted agent until nothing is left for the agent
   * to do (what remains is propose, a person's approval or review, or the
   * run's end, or an attempt this process holds), and returns that last
   * answer of /next. For each directive: `in_flight` of an attempt this
   * process does not hold (client.holds) — one the crash lost, since only a
   * restarted agent resumes — is abandoned; `query` and `cancel` ask the
   * tool's handler and post its answer as an observation with the
   * directive's decision_id; `execute` and `resend` begin an attempt and run
   * the handler's execute inside it, as call does. A stale decision or an
   * attempt another process opened is read again from /next.
   */
  async resume(handlers: Record<string, ToolHandler>, options: ResumeOptions = {}): Promise<NextResponse> {
    const maxSteps = options.maxSteps ?? 100;
    let next = await this.next();
    for (let step = 0; step < maxSteps; step++) {
      const d = next.directives.find(
        (x) => agentDirectives.has(x.directive) && !(x.directive === "in_flight" && x.attempt_id !== undefined && this.client.holds(x.attempt_id)),
      );
      if (!d) return next;
      options.onDirective?.(d);
      try {
        await this.#follow(d, handlers, options);
      } catch (err) {
        if (!(err instanceof StaleDecision || err instanceof AttemptOpen || err instanceof AttemptClosed)) throw err;
      }
      next = await this.next();
    }
    throw new Error(`resume of ${this.id}: still directives to follow after ${maxSteps} steps`);
  }

  async #follow(d: Directive, handlers: Record<string, ToolHandler>, options: ResumeOptions): Promise<void> {
    const h = d.tool !== undefined ? handlers[d.tool] : undefined;
    switch (d.directive) {
      case "in_flight":
        await this.client.abandon(d.attempt_id!, options.abandonReason ?? "the agent restarted and lost this call");
        return;
      case "query": {
        if (!h?.query) throw new Error(`resume of ${this.id}: no query handler for tool ${d.tool}`);
        let answer: QueryAnswer;
        try {
          answer = await h.query(d.dedup_key!, d);
        } catch (err) {
          await this.client.observe(d.attempt_id!, { decision_id: d.decision_id!, kind: "query", error: toAttemptError(err, "query_failed") });
          return;
        }
        const { effect, detail } = typeof answer === "string" ? { effect: answer, detail: undefined } : answer;
        await this.client.observe(d.attempt_id!, { decision_id: d.decision_id!, kind: "query", effect, ...(detail !== undefined ? { detail } : {}) });
        return;
      }
      case "cancel": {
        if (!h?.cancel) throw new Error(`resume of ${this.id}: no cancel handler for tool ${d.tool}`);
        let answer: CancelAnswer;
        try {
          answer = await h.cancel(d.dedup_key!, d);
        } catch (err) {
          await this.client.observe(d.attempt_id!, { decision_id: d.decision_id!, kind: "cancel", error: toAttemptError(err, "cancel_failed") });
          return;
        }
        const { confirmed, detail } = typeof answer === "boolean" ? { confirmed: answer, detail: undefined } : answer;
        await this.client.observe(d.attempt_id!, { decision_id: d.decision_id!, kind: "cancel", confirmed, ...(detail !== undefined ? { detail } : {}) });
        return;
      }
      case "execute":
      case "resend": {
        if (!h?.execute) throw new Error(`resume of ${this.id}: no execute handler for tool ${d.tool}`);
        const execute = h.execute.bind(h);
        const action = await this.client.getAction(d.action_id!);
        const begun = await this.client.beginAttempt(action.id, beginKey(`${this.id}\0${action.id}`, action.attempts.length + 1));
        await runAttempt(this, action, begun, options.heartbeatIntervalMs, (call) => execute(call));
        return;
      }
      default:
        return;
    }
  }
}

/** The directives an agent acts on by itself (the others wait for a person, or are done). */
const agentDirectives = new Set(["in_flight", "query", "cancel", "execute", "resend"]);

/**
 * One tool call inside an attempt that is open: arguments and dedup key
 * to give the tool, the cancel the heartbeats bring, and the outcome to
 * report.
 */
export class Call {
  /** The run. */
  readonly run: Run;
  /** The action as it was approved. */
  readonly action: Action;
  /** The attempt begun. */
  readonly attempt: Attempt;
  /** The canonical, approved arguments: execute exactly these. */
  readonly arguments: JSONValue;
  /** The key the tool must apply the call at most once under. */
  readonly dedupKey: string;
  /** The digest of the approved action. */
  readonly actionDigest: string;
  /** Aborted once the run's cancel was accepted or the lease was lost: stop the call if the tool can. */
  readonly signal: AbortSignal;
  readonly #token: string;
  readonly #abort: AbortController;
  #leaseRemainingS: number;
  #cancelRequested = false;
  #leaseLost = false;
  #outcome: Outcome | undefined;
  #heartbeats = 0;
  #lastHeartbeatError: unknown = undefined;

  constructor(run: Run, action: Action, begun: BeginResponse) {
    this.run = run;
    this.action = action;
    this.attempt = begun.attempt;
    this.arguments = begun.arguments;
    this.dedupKey = begun.dedup_key;
    this.actionDigest = begun.action_digest;
    this.#token = begun.attempt_token;
    this.#leaseRemainingS = begun.lease_remaining_s;
    this.#abort = new AbortController();
    this.signal = this.#abort.signal;
  }

  /** The attempt's id. */
  get attemptId(): string {
    return this.attempt.id;
  }

  /** Whether a heartbeat said the run's cancel was accepted. */
  get cancelRequested(): boolean {
    return this.#cancelRequested;
  }

  /** Whether the lease lapsed or the attempt was closed under this call. */
  get leaseLost(): boolean {
    return this.#leaseLost;
  }

  /** Seconds of lease left at the last begin or heartbeat, by the server's clock. */
  get leaseRemainingS(): number {
    return this.#leaseRemainingS;
  }

  /** How many heartbeats the server answered. */
  get heartbeats(): number {
    return this.#heartbeats;
  }

  /** The last heartbeat that failed without closing the attempt (a network error), if any. */
  get lastHeartbeatError(): unknown {
    return this.#lastHeartbeatError;
  }

  /** The outcome reported so far. */
  get outcome(): Outcome | undefined {
    return this.#outcome;
  }

  /**
   * Sends a heartbeat now, with progress (stored redacted) if given, once:
   * the next beat of the call's heartbeat loop is its retry.
   */
  async heartbeat(progress?: JSONValue): Promise<void> {
    try {
      const hb = await this.run.client.heartbeat(this.attempt.id, this.#token, progress, { retry: false });
      this.#heartbeats++;
      this.#leaseRemainingS = hb.lease_remaining_s;
      if (hb.cancel_requested && !this.#cancelRequested) {
        this.#cancelRequested = true;
        this.#abort.abort(new Error("the run's cancel was accepted"));
      }
    } catch (err) {
      if (err instanceof AttemptClosed || err instanceof BadAttemptToken) {
        this.#leaseLost = true;
        this.#abort.abort(new Error(`attempt ${this.attempt.id} is closed: ${err.code}`));
      }
      throw err;
    }
  }

  /** Reports that the call succeeded (a write: its effect happened). */
  succeeded(output?: JSONValue): void {
    this.#outcome = this.#isWrite()
      ? { status: "succeeded", effect: "happened", ...(output !== undefined ? { output } : {}) }
      : { status: "succeeded", ...(output !== undefined ? { output } : {}) };
  }

  /**
   * Reports that the call failed. For a write, say what became of its
   * effect: `not_happened` only when the tool is sure; default `unknown`.
   */
  failed(options: { effect?: EffectFact; error?: AttemptError | Error; output?: JSONValue } = {}): void {
    this.#outcome = this.#report("failed", options.effect ?? "unknown", options);
  }

  /** Reports that the call timed out (a write's effect is then unknown). */
  timedOut(options: { error?: AttemptError | Error } = {}): void {
    this.#outcome = this.#report("timed_out", "unknown", options);
  }

  /** Reports that the call was cancelled; for a write, with what became of its effect (default unknown). */
  cancelled(options: { effect?: EffectFact; error?: AttemptError | Error } = {}): void {
    this.#outcome = this.#report("cancelled", options.effect ?? "unknown", options);
  }

  /** Reports an outcome as the wire says it. */
  report(outcome: Outcome): void {
    this.#outcome = outcome;
  }

  #isWrite(): boolean {
    return this.action.effect === "write";
  }

  #report(status: Outcome["status"], effect: EffectFact, options: { error?: AttemptError | Error; output?: JSONValue }): Outcome {
    const out: Outcome = { status };
    if (this.#isWrite()) out.effect = effect;
    if (options.error) out.error = toAttemptError(options.error, status);
    if (options.output !== undefined) out.output = options.output;
    return out;
  }

  /** The token of the attempt (secret). */
  get token(): string {
    return this.#token;
  }
}

/** Runs fn inside the attempt begun, heartbeating, and completes it. */
async function runAttempt<T extends JSONValue | void>(
  run: Run,
  action: Action,
  begun: BeginResponse,
  heartbeatIntervalMs: number | undefined,
  fn: (call: Call) => Promise<T> | T,
): Promise<CallResult<T>> {
  const call = new Call(run, action, begun);
  const beat = new Heartbeater(call, heartbeatIntervalMs);
  let value: T | undefined;
  let thrown: { err: unknown } | undefined;
  try {
    value = await fn(call);
  } catch (err) {
    thrown = { err };
  } finally {
    await beat.stop();
  }
  try {
    return await finishAttempt(run, call, value, thrown);
  } finally {
    run.client.release(call.attemptId);
  }
}

async function finishAttempt<T extends JSONValue | void>(
  run: Run,
  call: Call,
  value: T | undefined,
  thrown: { err: unknown } | undefined,
): Promise<CallResult<T>> {
  let outcome = call.outcome;
  if (!outcome) {
    if (thrown) {
      // The call's effect is not known: a write is never reported as not_happened here.
      call.failed({ effect: "unknown", error: toAttemptError(thrown.err, "exception") });
    } else {
      call.succeeded(value === undefined ? undefined : (value as JSONValue));
    }
    outcome = call.outcome!;
  }
  const done = await run.client.complete(call.attemptId, call.token, outcome);
  if (thrown) throw thrown.err;
  return { action: done.action, attempt: done.attempt, outcome, value, replayed: false };
}

/** Heartbeats an attempt on a timer while its call runs. */
class Heartbeater {
  readonly #call: Call;
  readonly #intervalMs: number;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #inflight: Promise<void> | undefined;
  #stopped = false;

  constructor(call: Call, intervalMs: number | undefined) {
    this.#call = call;
    this.#intervalMs = intervalMs ?? Math.max(50, Math.floor((call.leaseRemainingS * 1000) / 3));
    this.#schedule();
  }

  #schedule(): void {
    if (this.#stopped || this.#call.leaseLost) return;
    this.#timer = setTimeout(() => {
      this.#inflight = this.#call.heartbeat().catch(() => undefined).finally(() => {
        this.#inflight = undefined;
        this.#schedule();
      });
    }, this.#intervalMs);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    await this.#inflight;
  }
}

function toAttemptError(err: unknown, code: string): AttemptError {
  if (err && typeof err === "object" && "code" in err && "message" in err && !(err instanceof Error)) {
    return { code: String((err as AttemptError).code || code), message: String((err as AttemptError).message).slice(0, 2000) };
  }
  if (err instanceof Error) {
    const c = (err as { code?: unknown }).code;
    return { code: typeof c === "string" && c !== "" ? c : err.name || code, message: (err.message || err.name).slice(0, 2000) };
  }
  return { code, message: String(err).slice(0, 2000) };
}

/** Whether a timeline entry is the run's move to a terminal state. */
function endsRun(e: TimelineEvent): boolean {
  return e.entity_type === "run" && e.to_state !== undefined && (terminalRunStates as readonly string[]).includes(e.to_state);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
