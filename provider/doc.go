// Package provider talks to language models: one adapter per wire format
// (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages), a
// deterministic tier that never fails, and the Chain that tries tiers in
// order.
//
// Everything crosses it in one provider-neutral shape: a Request (system
// prompt, transcript of Messages, tools, output schema) in, a Turn (text,
// tool calls in the model's order, refusal, stop reason, usage) out. Items
// only one wire format can read back (reasoning blocks) travel in the
// transcript as Opaque; a tier of another format never sees them, and the
// Chain records the drop.
//
// Usage is normalised once for every format (see Usage); a provider that
// reports none gives a nil *Usage, never zeros. Errors are *Error, with a
// Kind that says whether another tier may be tried (Retryable): transport
// failures, timeouts, 429 and 5xx fall through to the next tier; a refusal
// is an answer and a 4xx is the request's fault, so neither does. The SDKs'
// own retries are off: whoever calls counts every try.
//
// Rooms: types.go (the neutral shapes), config.go (TierConfig, New),
// errors.go (Error, classification, Retry-After), opaque.go (what crosses
// between tiers), chat.go, responses.go, anthropic.go (the adapters),
// deterministic.go, chain.go.
//
// It imports no package of this module: the engine builds on it.
package provider
