// The reminder tool's own record of what it did: a JSON-lines file, one
// line per reminder sent, keyed by the dedup key the ledger gave the call.
// Each line is on disk (fsync) before the call reports success, so after a
// crash the tool can say for sure whether a call took effect (query), and
// never applies one dedup key twice (dedup).

import { closeSync, existsSync, fsyncSync, openSync, readFileSync, writeSync } from "node:fs";
import { dirname } from "node:path";

/** One reminder the tool sent. */
export interface Effect {
  dedup_key: string;
  to: string;
  text: string;
  reminder_id: string;
  sent_at: string;
}

/** The tool's effects, in a JSON-lines file. */
export class EffectStore {
  constructor(readonly path: string) {}

  /** Every effect recorded, by dedup key. A torn last line (a crash mid-write) is not an effect. */
  all(): Map<string, Effect> {
    const out = new Map<string, Effect>();
    if (!existsSync(this.path)) return out;
    for (const line of readFileSync(this.path, "utf8").split("\n")) {
      if (line.trim() === "") continue;
      try {
        const e = JSON.parse(line) as Effect;
        if (typeof e.dedup_key === "string" && !out.has(e.dedup_key)) out.set(e.dedup_key, e);
      } catch {
        // A line the crash cut short: the call did not finish writing it.
      }
    }
    return out;
  }

  /** The effect recorded under dedupKey, if any. */
  get(dedupKey: string): Effect | undefined {
    return this.all().get(dedupKey);
  }

  /**
   * Applies an effect at most once per dedup key: the one recorded before,
   * or this one, appended and fsynced before it returns.
   */
  apply(effect: Effect): { effect: Effect; applied: boolean } {
    const before = this.get(effect.dedup_key);
    if (before) return { effect: before, applied: false };
    const created = !existsSync(this.path);
    const fd = openSync(this.path, "a", 0o600);
    try {
      writeSync(fd, JSON.stringify(effect) + "\n");
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    if (created) fsyncDir(dirname(this.path));
    return { effect, applied: true };
  }
}

/** Makes a new file's directory entry durable too. */
function fsyncDir(dir: string): void {
  let fd: number | undefined;
  try {
    fd = openSync(dir, "r");
    fsyncSync(fd);
  } catch {
    // Not every platform can fsync a directory; the file itself is synced.
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}
