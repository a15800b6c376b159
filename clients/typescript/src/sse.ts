// A reader of Server-Sent Events (the text/event-stream format of the HTML
// standard) over the body of a fetch answer.

/** One dispatched event of an event stream. */
export interface SSEMessage {
  /** The last `id:` seen (carried over from earlier events when this one had none). */
  id: string;
  /** The `event:` field, "message" when absent. */
  event: string;
  /** The `data:` lines, joined by newlines. */
  data: string;
}

/**
 * The events of an event stream, in order. Comments and `retry:` are
 * skipped; an event without data is not dispatched, as the standard says.
 */
export async function* parseSSE(body: ReadableStream<Uint8Array>): AsyncGenerator<SSEMessage> {
  const decoder = new TextDecoder("utf-8");
  const reader = body.getReader();
  let buffer = "";
  let lastId = "";
  let event = "";
  let data: string[] = [];
  let sawCR = false;

  function* lines(chunk: string): Generator<string> {
    buffer += chunk;
    let start = 0;
    for (let i = 0; i < buffer.length; i++) {
      const c = buffer[i];
      if (c === "\n" && sawCR) {
        // The \n of a \r\n whose \r ended the previous line.
        sawCR = false;
        start = i + 1;
        continue;
      }
      sawCR = false;
      if (c === "\r" || c === "\n") {
        yield buffer.slice(start, i);
        sawCR = c === "\r";
        start = i + 1;
      }
    }
    buffer = buffer.slice(start);
  }

  function field(line: string): SSEMessage | undefined {
    if (line === "") {
      if (data.length === 0) {
        event = "";
        return undefined;
      }
      const msg = { id: lastId, event: event || "message", data: data.join("\n") };
      event = "";
      data = [];
      return msg;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (name) {
      case "id":
        if (!value.includes("\0")) lastId = value;
        break;
      case "event":
        event = value;
        break;
      case "data":
        data.push(value);
        break;
      default:
        // retry: and unknown fields are ignored.
        break;
    }
    return undefined;
  }

  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      for (const line of lines(decoder.decode(value, { stream: true }))) {
        const msg = field(line);
        if (msg) yield msg;
      }
    }
    // An event not closed by a blank line is incomplete: not dispatched.
    for (const line of lines(decoder.decode())) {
      const msg = field(line);
      if (msg) yield msg;
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
