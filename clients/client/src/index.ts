/**
 * @pgdurable/client: the browser and Node client of pgdurable's HTTP endpoints
 * (`pgdurable.http.create_app`, see docs/streaming.md).
 *
 * - `PgDurableClient`: `start`, `send`, `run`, `result`, and `streamRun` /
 *   `streamThread`: Server-Sent Events read over `fetch`, resumed after any
 *   network loss, 5xx, 408/429 or transient `error` event with `Last-Event-ID`
 *   (the cursor of the last delivered event: exact to the character) and a
 *   jittered exponential backoff.
 * - `PgDurableChatTransport`: a `ChatTransport` for the Vercel AI SDK's
 *   `useChat` (package `ai`, v5+): each user message is sent to the chat's
 *   thread, and its answer streamed back as UI message chunks.
 */
import type { ChatTransport, UIMessage, UIMessageChunk } from "ai";

/** One event of a pgdurable stream. */
export type StreamItem =
  | { kind: "text"; cursor: string; runId: string; text: string }
  | { kind: "event"; cursor: string; runId: string; seq: number; event: unknown }
  | { kind: "done"; next?: string | null };

/** In a chain of answers (`reconnectToStream`): the answer to message `id` follows. */
export type AnswerItem = { kind: "answer"; id: string };

export interface ClientOptions {
  /** Where the endpoints are mounted, e.g. "/agent" or "https://host/agent". */
  api: string;
  /** A stream token (`app.stream_token(...)`), or a function returning one. */
  token?: string | (() => string | undefined | Promise<string | undefined>);
  /** Extra headers of every request (e.g. your session's). */
  headers?: Record<string, string>;
  /** `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** First and longest wait (ms) between two reconnects (jittered ±50 %). */
  backoff?: [number, number];
  /** Give up after this many reconnects in a row without an event (default: never). */
  maxRetries?: number;
}

export type DoubleText = "reject" | "enqueue" | "interrupt" | "rollback";

export interface Delivery {
  action: "wake" | "deliver";
  run_id: string;
  seq: number;
  message_id: string;
  duplicate: boolean;
  cursor: string | null;
  token: string | null;
}

export interface RunStatus {
  run_id: string;
  status: string;
  result: unknown;
  error: unknown;
}

/** An HTTP error of the endpoints (status and the server's one-line message). */
export class PgDurableHttpError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
    this.name = "PgDurableHttpError";
  }
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      reject(signal.reason ?? new DOMException("aborted", "AbortError"));
    }, { once: true });
  });

/** Parse an SSE byte stream into (event, id, data) frames. */
export async function* parseSSE(
  body: ReadableStream<Uint8Array>,
): AsyncGenerator<{ event: string; id: string | undefined; data: string }> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let event = "message";
  let id: string | undefined;
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) yield { event, id, data: data.join("\n") };
          event = "message";
          id = undefined;
          data = [];
        } else if (line.startsWith(":")) {
          // a comment: the server's heartbeat
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") event = val;
          else if (field === "id") id = val;
          else if (field === "data") data.push(val);
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** Options of a stream (`streamRun`, `streamThread`). */
export interface StreamOptions {
  /** Resume after this cursor (an item's `cursor`). */
  after?: string;
  signal?: AbortSignal;
  /** The message a thread stream follows (`message: "latest"` resolved). */
  onMessage?: (messageId: string) => void;
  /** `message: "latest"` is answered already: nothing streamed; its id. */
  onAnswered?: (messageId: string) => void;
}

export class PgDurableClient {
  readonly api: string;
  private readonly opts: ClientOptions;

  constructor(opts: ClientOptions) {
    this.opts = opts;
    this.api = opts.api.replace(/\/+$/, "");
  }

  private async headers(extra?: Record<string, string>): Promise<Record<string, string>> {
    const h: Record<string, string> = { ...(this.opts.headers ?? {}), ...(extra ?? {}) };
    const t = typeof this.opts.token === "function" ? await this.opts.token() : this.opts.token;
    if (t) h["Authorization"] = `Bearer ${t}`;
    return h;
  }

  private get fetch(): typeof fetch {
    return this.opts.fetch ?? globalThis.fetch.bind(globalThis);
  }

  private async json<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const init: RequestInit = {
      method,
      headers: await this.headers(body === undefined ? {} : { "Content-Type": "application/json" }),
    };
    if (body !== undefined) init.body = JSON.stringify(body);
    if (signal) init.signal = signal;
    const r = await this.fetch(this.api + path, init);
    const text = await r.text();
    const parsed = text ? JSON.parse(text) : {};
    if (!r.ok) throw new PgDurableHttpError(r.status, parsed.error ?? r.statusText);
    return parsed as T;
  }

  /** Start a run of `task` (your `authorize` must allow it); its id and a read token. */
  start(task: string, state?: unknown, opts: { queue?: string } = {}): Promise<{ run_id: string; token: string | null }> {
    return this.json("POST", "/runs", { task, state, ...opts });
  }

  /** Send a message to a thread (double-texting strategy optional). */
  send(thread: string, message: unknown, opts: { messageId?: string; doubleText?: DoubleText; signal?: AbortSignal } = {}): Promise<Delivery> {
    const body: Record<string, unknown> = { message };
    if (opts.messageId) body.message_id = opts.messageId;
    if (opts.doubleText) body.double_text = opts.doubleText;
    return this.json("POST", `/threads/${encodeURIComponent(thread)}/messages`, body, opts.signal);
  }

  /** A run's status, result and error. */
  run(runId: string): Promise<RunStatus> {
    return this.json("GET", `/runs/${encodeURIComponent(runId)}`);
  }

  /** Wait for a run's end (following its stream) and return its status. */
  async result(runId: string, signal?: AbortSignal): Promise<RunStatus> {
    for await (const item of this.streamRun(runId, { signal })) {
      if (item.kind === "done") break;
    }
    return this.run(runId);
  }

  /** A run's stream, resumed after network losses, until its end. */
  streamRun(runId: string, opts: StreamOptions = {}): AsyncGenerator<StreamItem> {
    return this.stream(`/runs/${encodeURIComponent(runId)}/stream`, {}, opts);
  }

  /**
   * A thread's stream: with `message`, exactly that message's answer, from
   * where it starts until it is answered (it ends at an `interrupted` or
   * `rollback` marker that stops it, or where a later message's answer
   * begins; its `done` item names the message sent after it, `next`).
   * `"latest"`: the thread's last message (nothing when it is answered
   * already: `onAnswered` is told its id); `"pending"`: the message before the
   * first unanswered one (the last when all are answered, as `"latest"`).
   * `onMessage` is told the id of the message whose answer this is (the
   * server's `X-PgDurable-Message`: `"latest"` / `"pending"` resolved), before
   * the first item; a reconnect follows that message, not a newer one.
   * `endOnRollback` is kept for callers of earlier releases: a message's
   * stream now always ends at the rollback marker that discards its answer.
   */
  streamThread(thread: string, opts: { message?: string; endOnRollback?: boolean } & StreamOptions = {}): AsyncGenerator<StreamItem> {
    const params: Record<string, string> = {};
    if (opts.message) params.message = opts.message;
    if (opts.message && opts.endOnRollback) params.rollback = "end";
    return this.stream(`/threads/${encodeURIComponent(thread)}/stream`, params, opts);
  }

  private async *stream(
    path: string,
    params: Record<string, string>,
    opts: StreamOptions,
  ): AsyncGenerator<StreamItem> {
    let cursor = opts.after;
    const [first, longest] = this.opts.backoff ?? [250, 5000];
    let wait = first;
    let failures = 0;
    let lastError: unknown;
    for (;;) {
      const q = new URLSearchParams(params);
      const headers = await this.headers(cursor ? { "Last-Event-ID": cursor } : {});
      try {
        const init: RequestInit = { headers };
        if (opts.signal) init.signal = opts.signal;
        const r = await this.fetch(`${this.api}${path}${q.size ? "?" + q : ""}`, init);
        if (r.status === 204) {  // nothing to follow (a thread's last message answered)
          const answered = r.headers.get("X-PgDurable-Message");
          if (answered !== null) opts.onAnswered?.(answered);
          return;
        }
        if (!r.ok || !r.body) {
          const text = await r.text();
          let msg = r.statusText;
          try { msg = JSON.parse(text).error ?? msg; } catch { /* not JSON */ }
          // 4xx: the request is wrong or refused (terminal), but for a timeout or a rate limit
          if (r.status < 500 && r.status !== 408 && r.status !== 429) throw new PgDurableHttpError(r.status, msg);
          throw new TransientError(`${r.status} ${msg}`);
        }
        const answering = r.headers.get("X-PgDurable-Message");
        if (answering !== null && params.message !== answering) {
          params.message = answering;  // "latest" resolved: a reconnect follows this message
          opts.onMessage?.(answering);
        }
        for await (const f of parseSSE(r.body)) {
          if (f.event !== "error") { failures = 0; wait = first; }
          if (f.event === "done") {  // a message's answer: the id of the message after it
            let next: string | null | undefined;
            try { next = (JSON.parse(f.data) as { next?: string | null }).next; } catch { next = undefined; }
            yield next === undefined ? { kind: "done" } : { kind: "done", next };
            return;
          }
          if (f.event === "error") {
            const e = JSON.parse(f.data) as { error?: string; terminal?: boolean };
            // terminal: the run or message does not exist, the cursor is bad; anything
            // else (the database unreachable, a statement that failed) is retried from the cursor
            if (e.terminal) throw new PgDurableHttpError(500, e.error ?? "stream error");
            throw new TransientError(e.error ?? "stream error");
          }
          if (f.id) cursor = f.id;
          const d = JSON.parse(f.data);
          if (f.event === "text") yield { kind: "text", cursor: f.id ?? "", runId: d.run_id, text: d.text };
          else if (f.event === "event") yield { kind: "event", cursor: f.id ?? "", runId: d.run_id, seq: d.seq, event: d.event };
        }
        lastError = new TransientError("the stream ended without its end");
      } catch (err) {
        if (err instanceof PgDurableHttpError || opts.signal?.aborted) throw err;
        lastError = err;  // a lost connection or a transient error: resume from the cursor
      }
      failures += 1;
      if (this.opts.maxRetries !== undefined && failures > this.opts.maxRetries) {
        const why = lastError instanceof Error ? lastError.message : String(lastError);
        throw new Error(`stream ${path}: gave up after ${failures - 1} reconnects (${why})`);
      }
      await sleep(wait * (0.5 + Math.random()), opts.signal);
      wait = Math.min(wait * 2, longest);
    }
  }
}

/** A failure worth a reconnect (a 5xx, a 408/429, a transient `error` frame). */
class TransientError extends Error {}

export interface ChatTransportOptions extends ClientOptions {
  /** The thread of the chat (default: the chat id useChat passes). */
  threadId?: string;
  /** The double-texting strategy of the messages this transport sends. */
  doubleText?: DoubleText;
  /** The message payload sent for a UI message (default: `{ text, id }`). */
  toMessage?: (message: UIMessage) => unknown;
  /**
   * `reconnectToStream` when the thread's last answer is already finished: replay
   * it (default, `true`), so that a page that kept a part of it (reloaded just as it
   * ended, or reopened later) gets all of it, in the same assistant message; or
   * answer `null` (`false`), as useChat's default transport does.
   */
  resumeFinished?: boolean;
}

/** The id of the assistant message answering the user message `messageId`. */
export function answerId(messageId: string): string {
  return `answer-${messageId}`;
}

function textOf(message: UIMessage): string {
  return message.parts.map((p) => (p.type === "text" ? p.text : "")).join("");
}

/**
 * A `ChatTransport` for `useChat` over a pgdurable thread: see the module doc.
 * Text arrives as `text-delta`s; an interrupt ends the partial answer's step;
 * a rollback is a `reset-step` (the AI SDK removes the step's parts).
 */
export class PgDurableChatTransport<UI_MESSAGE extends UIMessage = UIMessage> implements ChatTransport<UI_MESSAGE> {
  readonly client: PgDurableClient;
  readonly resumeStreamIsReplay = true;
  private readonly opts: ChatTransportOptions;

  constructor(opts: ChatTransportOptions) {
    this.opts = opts;
    this.client = new PgDurableClient(opts);
  }

  private thread(chatId: string): string {
    return this.opts.threadId ?? chatId;
  }

  async sendMessages(options: Parameters<ChatTransport<UI_MESSAGE>["sendMessages"]>[0]): Promise<ReadableStream<UIMessageChunk>> {
    const thread = this.thread(options.chatId);
    const last = [...options.messages].reverse().find((m) => m.role === "user");
    if (!last) throw new Error("PgDurableChatTransport: no user message to send");
    const payload = this.opts.toMessage ? this.opts.toMessage(last) : { text: textOf(last), id: last.id };
    const sendOpts: { messageId?: string; doubleText?: DoubleText; signal?: AbortSignal } = { messageId: last.id };
    if (this.opts.doubleText) sendOpts.doubleText = this.opts.doubleText;
    if (options.abortSignal) sendOpts.signal = options.abortSignal;
    await this.client.send(thread, payload, sendOpts);
    const items = this.client.streamThread(thread, { message: last.id, endOnRollback: true, ...(options.abortSignal ? { signal: options.abortSignal } : {}) });
    return this.chunks(items, answerId(last.id));
  }

  async reconnectToStream(options: Parameters<ChatTransport<UI_MESSAGE>["reconnectToStream"]>[0]): Promise<ReadableStream<UIMessageChunk> | null> {
    const thread = this.thread(options.chatId);
    const signal = options.abortSignal ? { signal: options.abortSignal } : {};
    let following: string | undefined;
    let answered: string | undefined;
    // every answer from the one before the first unanswered message, each replayed
    // whole into its own assistant message (answerId), one after the other
    let items = this.client.streamThread(thread, {
      message: "pending", endOnRollback: true, ...signal,
      onMessage: (id) => { following = id; },
      onAnswered: (id) => { answered = id; },
    });
    let first = await items.next();
    if (first.done && answered !== undefined && (this.opts.resumeFinished ?? true)) {
      following = answered;  // finished: replayed whole, from its start to its end
      items = this.client.streamThread(thread, { message: answered, endOnRollback: true, ...signal });
      first = await items.next();
    }
    if (first.done) return null;  // nothing to resume
    const client = this.client;
    const rest = items;
    const head = first.value;
    const id = following;
    async function* chain(): AsyncGenerator<StreamItem | AnswerItem> {
      if (id !== undefined) yield { kind: "answer", id };
      let next: string | null | undefined;
      if (head.kind === "done") next = head.next;
      yield head;
      for await (const item of rest) {
        if (item.kind === "done") next = item.next;
        yield item;
      }
      while (next) {  // the answer to the message sent after it, in its own message
        const current: string = next;
        next = undefined;
        yield { kind: "answer", id: current };
        for await (const item of client.streamThread(thread, { message: current, ...signal })) {
          if (item.kind === "done") next = item.next;
          yield item;
        }
      }
    }
    return this.chunks(chain());
  }

  /**
   * Stream items as UI message chunks (exported for other UIs). `messageId`: the
   * assistant message's id in the `start` chunk, the same for a send and for every
   * replay of its answer, so that a replay after a reload replaces the message a
   * page kept (useChat's stored messages) instead of adding a second one.
   */
  chunks(items: AsyncGenerator<StreamItem | AnswerItem>, messageId?: string): ReadableStream<UIMessageChunk> {
    let part = 0;
    let open: string | null = null;
    let started = false;
    const closeText = (out: UIMessageChunk[]) => {
      if (open) out.push({ type: "text-end", id: open });
      open = null;
    };
    const begin = (out: UIMessageChunk[], id?: string) => {
      out.push(id === undefined ? { type: "start" } : { type: "start", messageId: id }, { type: "start-step" });
      started = true;
    };
    return new ReadableStream<UIMessageChunk>({
      async start(controller) {
        const head: UIMessageChunk[] = [];
        if (messageId !== undefined) begin(head, messageId);
        for (const c of head) controller.enqueue(c);
        try {
          for await (const item of items) {
            const out: UIMessageChunk[] = [];
            if (item.kind === "answer") {
              // the next answer of a chain: the AI SDK starts a new message on a new id
              if (started) { closeText(out); out.push({ type: "finish-step" }); }
              begin(out, answerId(item.id));
            } else if (!started) {
              begin(out);
            }
            if (item.kind === "answer") {
              // nothing more
            } else if (item.kind === "text") {
              if (!open) { open = `text-${++part}`; out.push({ type: "text-start", id: open }); }
              out.push({ type: "text-delta", id: open, delta: item.text });
            } else if (item.kind === "event") {
              const ev = item.event as { type?: string } | null;
              if (ev?.type === "rollback") {
                open = null;
                out.push({ type: "reset-step" });  // the unfinished answer is discarded
              } else if (ev?.type === "interrupted") {
                closeText(out);
                out.push({ type: "finish-step" }, { type: "start-step" });
              } else if (ev?.type !== "end") {
                closeText(out);
                out.push({ type: "data-pgdurable", data: ev } as UIMessageChunk);
              }
            } else {
              closeText(out);
            }
            for (const c of out) controller.enqueue(c);
          }
          const out: UIMessageChunk[] = [];
          if (!started) begin(out);
          closeText(out);
          for (const c of out) controller.enqueue(c);
          controller.enqueue({ type: "finish-step" });
          controller.enqueue({ type: "finish" });
          controller.close();
        } catch (err) {
          controller.enqueue({ type: "error", errorText: err instanceof Error ? err.message : String(err) });
          controller.close();
        }
      },
      async cancel() {
        await items.return(undefined);
      },
    });
  }
}
