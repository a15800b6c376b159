// The HTTP client of the ledger's API v1: one method a route, problem
// documents turned into typed errors, and the run handle of the agent
// protocol (run.ts).

import { LedgerError, RateLimited, RequestInProgress, TransportError, errorFromProblem, type Problem } from "./errors.js";
import { Run } from "./run.js";
import type {
  Action,
  Approval,
  BeginResponse,
  Budgets,
  CompleteResponse,
  HeartbeatResponse,
  JSONValue,
  Observation,
  ObservationResponse,
  Outcome,
  RunAccepted,
  RunView,
} from "./types.js";
import { waitingActionStates } from "./types.js";

/** How to reach the ledger. */
export interface ClientOptions {
  /** The server's address, e.g. "http://127.0.0.1:8080". */
  baseUrl: string;
  /** A bearer token (`lgr_…`); none in dev mode. */
  token?: string;
  /** How long one request may take, in milliseconds (a long-poll adds its wait). Default 30000. */
  timeoutMs?: number;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
  /**
   * How many times a request that is safe to send again is sent again: a
   * GET, one with an idempotency key (startRun, propose, beginAttempt), and
   * those the server answers the same when they come again (complete,
   * heartbeat, finish). It is sent again when the connection fails (refused,
   * reset, no answer within timeoutMs) or the server answers 500, 502, 503,
   * 504, 429 or request_in_progress: after Retry-After when the answer gives
   * one, else after 200 ms, 400 ms, 800 ms … (at most 2 s). Any other answer
   * (a 409 attempt_closed or outcome_conflict, say) throws at once, and a
   * request that is not safe to send again (abandon, observe, approve …) is
   * sent once. Default 2.
   */
  retries?: number;
}

/**
 * The statuses after which a request that is safe to send again is sent
 * again: the server failed (its store, say) or was overloaded, or a proxy in
 * front of it did, and nothing says the request was refused.
 */
const retriedStatuses: ReadonlySet<number> = new Set([429, 500, 502, 503, 504]);

/** Per-request options. */
export interface RequestOptions {
  body?: unknown;
  query?: Record<string, string | number | undefined>;
  headers?: Record<string, string>;
  idempotencyKey?: string;
  timeoutMs?: number;
  signal?: AbortSignal;
  /** The request may be sent again (it answers a replay the same): see ClientOptions.retries. */
  retrySafe?: boolean;
}

/** An answer of the server that is not a problem. */
export interface Answer<T> {
  status: number;
  headers: Headers;
  body: T;
  /** The server answered a replay of an idempotent request (Idempotent-Replayed: true). */
  replayed: boolean;
}

/** An action as a proposal answered it, and whether the step key had been seen with this body. */
export type Proposed = Action & { replayed: boolean };

/** An attempt begun, and whether the begin key had been seen before. */
export type Begun = BeginResponse & { replayed: boolean };

/** Options of waitAction. */
export interface WaitOptions {
  /** How long each long-poll may wait on the server, in seconds (at most 60). Default 30. */
  waitSeconds?: number;
  /** Give up the wait with this signal. */
  signal?: AbortSignal;
}

/** A client of one ledger server, as one principal (its token). */
export class Client {
  /** The server's address, without a trailing slash. */
  readonly baseUrl: string;
  readonly #token: string | undefined;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;
  readonly #retries: number;
  readonly #held = new Set<string>();

  constructor(options: ClientOptions) {
    if (!options || !options.baseUrl) throw new TypeError("Client: baseUrl is required");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#token = options.token;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#retries = options.retries ?? 2;
  }

  /** Whether this client began the attempt and its call has not ended here (begun, not completed or abandoned). */
  holds(attemptId: string): boolean {
    return this.#held.has(attemptId);
  }

  /** Marks an attempt's call as ended in this process (run.call does it). */
  release(attemptId: string): void {
    this.#held.delete(attemptId);
  }

  /**
   * Sends one request and returns its JSON answer; a problem document (or
   * any status of 400 and above) throws the LedgerError its code names, and
   * an unreachable server a TransportError.
   */
  async request<T>(method: string, path: string, options: RequestOptions = {}): Promise<Answer<T>> {
    const safe = method === "GET" || options.idempotencyKey !== undefined || options.retrySafe === true;
    for (let tries = 0; ; tries++) {
      try {
        return await this.#once<T>(method, path, options);
      } catch (err) {
        if (!safe || tries >= this.#retries || options.signal?.aborted) throw err;
        const backoff = Math.min(200 * 2 ** tries, 2000);
        if (err instanceof TransportError) {
          await sleep(backoff);
        } else if (err instanceof RateLimited || err instanceof RequestInProgress || (err instanceof LedgerError && retriedStatuses.has(err.status ?? 0))) {
          await sleep(err.retryAfter !== undefined ? Math.min(err.retryAfter * 1000, 5000) : backoff);
        } else {
          throw err;
        }
      }
    }
  }

  async #once<T>(method: string, path: string, options: RequestOptions): Promise<Answer<T>> {
    const { res, done } = await this.#send(method, path, options, "application/json");
    let text: string;
    try {
      text = await res.text();
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason ?? err;
      throw new TransportError(`${method} ${path}: reading the answer: ${errorMessage(err)}`, { cause: err });
    } finally {
      done();
    }
    if (res.status >= 400) throw problemOf(res, text);
    let body: unknown = undefined;
    if (text !== "") {
      try {
        body = JSON.parse(text);
      } catch (err) {
        throw new TransportError(`${method} ${path}: the answer (${res.status}) is not JSON`, { cause: err });
      }
    }
    return { status: res.status, headers: res.headers, body: body as T, replayed: res.headers.get("Idempotent-Replayed") === "true" };
  }

  /**
   * Opens a streaming GET (an event stream): the answer with its body
   * unread. A problem throws as request does.
   */
  async stream(path: string, options: RequestOptions = {}): Promise<Response> {
    // No time limit: a stream stays open for as long as the run goes on.
    const { res } = await this.#send("GET", path, { ...options, timeoutMs: 0 }, "text/event-stream");
    if (res.status >= 400) throw problemOf(res, await res.text().catch(() => ""));
    if (!res.body) throw new TransportError(`GET ${path}: the answer has no body`);
    return res;
  }

  async #send(method: string, path: string, options: RequestOptions, accept: string): Promise<{ res: Response; done: () => void }> {
    const url = new URL(this.baseUrl + path);
    for (const [k, v] of Object.entries(options.query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = { Accept: accept + ", application/problem+json", ...options.headers };
    if (this.#token) headers["Authorization"] = `Bearer ${this.#token}`;
    if (options.idempotencyKey !== undefined) headers["Idempotency-Key"] = options.idempotencyKey;
    let body: string | undefined;
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    const timeoutMs = options.timeoutMs ?? this.#timeoutMs;
    const { signal, done } = linkSignals(options.signal, timeoutMs);
    try {
      return { res: await this.#fetch(url, { method, headers, body, signal }), done };
    } catch (err) {
      done();
      if (options.signal?.aborted) throw options.signal.reason ?? err;
      if (signal?.aborted) throw new TransportError(`${method} ${path}: no answer within ${timeoutMs} ms`, { cause: err });
      throw new TransportError(`${method} ${path}: ${errorMessage(err)}`, { cause: err });
    }
  }

  /**
   * Submits a run of agent with input under the idempotency key `key`
   * (POST /v1/runs); a replay with the same key and body is the same run.
   */
  async startRun(agent: string, input: JSONValue, key: string, options: { budgets?: Budgets } = {}): Promise<Run> {
    const body: Record<string, unknown> = { agent, input };
    if (options.budgets) body.budgets = options.budgets;
    const res = await this.request<RunAccepted>("POST", "/v1/runs", { body, idempotencyKey: key });
    return new Run(this, res.body.id, res.body);
  }

  /** The handle of an existing run (no request is made): to resume it, read it, finish it. */
  run(runId: string): Run {
    return new Run(this, runId);
  }

  /** GET /v1/runs/{id}. */
  async getRun(runId: string): Promise<RunView> {
    return (await this.request<RunView>("GET", `/v1/runs/${enc(runId)}`)).body;
  }

  /** POST /v1/runs/{id}/cancel. */
  async cancelRun(runId: string, reason?: string): Promise<Record<string, unknown>> {
    return (await this.request<Record<string, unknown>>("POST", `/v1/runs/${enc(runId)}/cancel`, { body: reason ? { reason } : {} })).body;
  }

  /**
   * GET /v1/actions/{id}; with `version` and `waitSeconds` a long-poll that
   * answers once the action's version differs from `version` or the wait ends.
   */
  async getAction(actionId: string, options: { version?: number; waitSeconds?: number; signal?: AbortSignal } = {}): Promise<Action> {
    const query: Record<string, string | number | undefined> = {};
    let timeoutMs: number | undefined;
    if (options.version !== undefined && options.waitSeconds !== undefined) {
      query.version = options.version;
      query.wait = `${options.waitSeconds}s`;
      timeoutMs = this.#timeoutMs + options.waitSeconds * 1000;
    }
    return (await this.request<Action>("GET", `/v1/actions/${enc(actionId)}`, { query, timeoutMs, signal: options.signal })).body;
  }

  /**
   * Long-polls the action from `version` on until no person's decision is
   * awaited any more (it left proposed and awaiting_approval), and returns
   * it as it then stands: approved, denied, expired, or anything else.
   */
  async waitAction(actionId: string, version: number, options: WaitOptions = {}): Promise<Action> {
    const waitSeconds = Math.min(Math.max(options.waitSeconds ?? 30, 1), 60);
    for (;;) {
      const action = await this.getAction(actionId, { version, waitSeconds, signal: options.signal });
      if (!waitingActionStates.includes(action.state)) return action;
      version = action.version;
    }
  }

  /** POST /v1/actions/{id}/attempts: begins an attempt, durable before the answer. */
  async beginAttempt(actionId: string, key: string): Promise<Begun> {
    const res = await this.request<BeginResponse>("POST", `/v1/actions/${enc(actionId)}/attempts`, { body: {}, idempotencyKey: key });
    this.#held.add(res.body.attempt.id);
    return { ...res.body, replayed: res.replayed };
  }

  /**
   * POST /v1/attempts/{id}/heartbeat: renews the lease; says whether the
   * run's cancel was accepted. A heartbeat renews the lease from the
   * server's clock, so one sent again renews it again, to the same end: it
   * is retried as a GET is (ClientOptions.retries). `retry: false` sends it
   * once, as run.call's heartbeats are: the next beat is their retry, and
   * the call's end never waits for a backoff.
   */
  async heartbeat(attemptId: string, attemptToken: string, progress?: JSONValue, options: { retry?: boolean } = {}): Promise<HeartbeatResponse> {
    const body: Record<string, unknown> = { attempt_token: attemptToken };
    if (progress !== undefined) body.progress = progress;
    return (await this.request<HeartbeatResponse>("POST", `/v1/attempts/${enc(attemptId)}/heartbeat`, { body, retrySafe: options.retry ?? true })).body;
  }

  /**
   * POST /v1/attempts/{id}/complete: what the call did. A replay of the same
   * outcome answers the same, so it is retried as a GET is
   * (ClientOptions.retries): a complete whose answer was lost is recorded
   * once. AttemptClosed and OutcomeConflict throw at once.
   */
  async complete(attemptId: string, attemptToken: string, outcome: Outcome): Promise<CompleteResponse> {
    const body = { attempt_token: attemptToken, ...outcome };
    const res = await this.request<CompleteResponse>("POST", `/v1/attempts/${enc(attemptId)}/complete`, { body, retrySafe: true });
    this.#held.delete(attemptId);
    return res.body;
  }

  /** POST /v1/attempts/{id}/abandon: "I lost this call"; recovery decides by the tool's guarantees. */
  async abandon(attemptId: string, reason?: string): Promise<CompleteResponse> {
    const body = reason ? { reason } : {};
    try {
      return (await this.request<CompleteResponse>("POST", `/v1/attempts/${enc(attemptId)}/abandon`, { body })).body;
    } finally {
      this.#held.delete(attemptId);
    }
  }

  /** POST /v1/attempts/{id}/observations: what the tool said about a dedup key. */
  async observe(attemptId: string, observation: Observation): Promise<ObservationResponse> {
    return (await this.request<ObservationResponse>("POST", `/v1/attempts/${enc(attemptId)}/observations`, { body: observation })).body;
  }

  /** GET /v1/approvals: one page of approvals in one state (default pending). */
  async listApprovals(options: { state?: string; limit?: number; cursor?: string } = {}): Promise<{ approvals: Approval[]; next_cursor?: string }> {
    return (await this.request<{ approvals: Approval[]; next_cursor?: string }>("GET", "/v1/approvals", { query: options })).body;
  }

  /** POST /v1/actions/{id}/approve, for the exact digest the approver saw. */
  async approve(actionId: string, actionDigest: string, reason?: string): Promise<{ approval: Approval; action: Action }> {
    return this.#decide("approve", actionId, actionDigest, reason);
  }

  /** POST /v1/actions/{id}/deny, for the exact digest the approver saw. */
  async deny(actionId: string, actionDigest: string, reason?: string): Promise<{ approval: Approval; action: Action }> {
    return this.#decide("deny", actionId, actionDigest, reason);
  }

  async #decide(verb: string, actionId: string, actionDigest: string, reason?: string): Promise<{ approval: Approval; action: Action }> {
    const body: Record<string, unknown> = { action_digest: actionDigest };
    if (reason) body.reason = reason;
    return (await this.request<{ approval: Approval; action: Action }>("POST", `/v1/actions/${enc(actionId)}/${verb}`, { body })).body;
  }

  /** POST /v1/actions/{id}/resolve: a person settles an action in review. */
  async resolve(actionId: string, outcome: "happened" | "not_happened" | "abandon", note?: string): Promise<Record<string, unknown>> {
    const body: Record<string, unknown> = { outcome };
    if (note) body.note = note;
    return (await this.request<Record<string, unknown>>("POST", `/v1/actions/${enc(actionId)}/resolve`, { body })).body;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function enc(id: string): string {
  return encodeURIComponent(id);
}

function errorMessage(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message}: ${cause.message}` : err.message;
  }
  return String(err);
}

/** The LedgerError of an answer of 400 or above. */
function problemOf(res: Response, text: string): LedgerError {
  let problem: Problem | undefined;
  try {
    const doc = JSON.parse(text) as Problem;
    if (doc && typeof doc === "object" && typeof doc.code === "string") problem = doc;
  } catch {
    // Not JSON: described below.
  }
  problem ??= { status: res.status, code: `http_${res.status}`, detail: text.slice(0, 200) };
  if (typeof problem.status !== "number") problem.status = res.status;
  const ra = res.headers.get("Retry-After");
  const retryAfter = ra !== null && /^\d+$/.test(ra) ? Number(ra) : undefined;
  return errorFromProblem(problem, retryAfter);
}

/**
 * A signal that aborts when `outer` does or after timeoutMs (0: never, and
 * then `outer` itself); `done` clears the timer and the link. (AbortSignal.any
 * is not in Node 18.)
 */
function linkSignals(outer: AbortSignal | undefined, timeoutMs: number): { signal: AbortSignal | undefined; done: () => void } {
  if (timeoutMs <= 0) return { signal: outer, done: () => undefined };
  const ctl = new AbortController();
  const onAbort = () => ctl.abort(outer?.reason);
  if (outer) {
    if (outer.aborted) ctl.abort(outer.reason);
    else outer.addEventListener("abort", onAbort, { once: true });
  }
  const timer = setTimeout(() => ctl.abort(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
  return {
    signal: ctl.signal,
    done: () => {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onAbort);
    },
  };
}
