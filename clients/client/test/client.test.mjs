// @pgdurable/client without a server: SSE parsing, resume with Last-Event-ID after a
// dropped connection or a transient error frame (a terminal one and a 4xx end it), the
// ChatTransport's UI message chunks (a rollback is a reset-step), its stable answer id and
// the replay of a finished last answer, and a reload's replay of two answers (enqueue), each
// into its own assistant message. Against the real endpoints: live.test.mjs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { AbstractChat } from "ai";
import { PgDurableClient, PgDurableChatTransport, parseSSE } from "../dist/index.js";

const enc = new TextEncoder();
const body = (text, { cut = false } = {}) => {
  let sent = false;
  return new ReadableStream({
    pull(c) {  // the text, then the end (or, cut, a lost connection)
      if (!sent) { sent = true; c.enqueue(enc.encode(text)); return; }
      if (cut) c.error(new Error("network lost")); else c.close();
    },
  });
};

test("parseSSE reads events, ids and skips heartbeats", async () => {
  const frames = [];
  for await (const f of parseSSE(body("retry: 1000\n\n: heartbeat\n\nid: 3\nevent: text\ndata: {\"text\":\"a\"}\n\n"))) frames.push(f);
  assert.deepEqual(frames, [{ event: "text", id: "3", data: "{\"text\":\"a\"}" }]);
});

test("a dropped stream resumes from the last event id", async () => {
  const seen = [];
  const fetch = async (url, init) => {
    seen.push(init.headers["Last-Event-ID"] ?? null);
    if (seen.length === 1) return new Response(body("id: 4+2\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"he\"}\n\n", { cut: true }));
    return new Response(body("id: 5\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"llo\"}\n\nevent: done\ndata: {}\n\n"));
  };
  const client = new PgDurableClient({ api: "http://x/agent", fetch, backoff: [1, 2], token: "t" });
  let text = "";
  for await (const item of client.streamRun("r")) if (item.kind === "text") text += item.text;
  assert.equal(text, "hello");
  assert.deepEqual(seen, [null, "4+2"]);
});

test("the ChatTransport sends the user message and streams UI chunks", async () => {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push([init.method ?? "GET", url]);
    if (init.method === "POST") return new Response(JSON.stringify({ action: "wake", run_id: "r", seq: 1, message_id: "u1", duplicate: false, cursor: "0:0", token: null }), { status: 201 });
    return new Response(body(
      "id: 1:1\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"wrong\"}\n\n" +
      "id: 1:2\nevent: event\ndata: {\"run_id\":\"r\",\"seq\":2,\"event\":{\"type\":\"rollback\",\"discard_after\":0}}\n\n" +
      "id: 1:3\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"right\"}\n\nevent: done\ndata: {}\n\n"));
  };
  const t = new PgDurableChatTransport({ api: "/agent", threadId: "chat:1", fetch });
  const stream = await t.sendMessages({ trigger: "submit-message", chatId: "c", messageId: undefined, abortSignal: undefined,
    messages: [{ id: "u1", role: "user", parts: [{ type: "text", text: "hi" }] }] });
  const chunks = [];
  for await (const c of stream) chunks.push(c.type === "text-delta" ? `delta:${c.delta}` : c.type);
  assert.deepEqual(calls.map((c) => c[0]), ["POST", "GET"]);
  assert.ok(calls[1][1].includes("message=u1"));
  assert.deepEqual(chunks, ["start", "start-step", "text-start", "delta:wrong", "reset-step",
    "text-start", "delta:right", "text-end", "finish-step", "finish"]);
});

test("a transient error frame is retried from the cursor; a terminal one and a 4xx end the stream", async () => {
  const seen = [];
  const fetch = async (url, init) => {
    seen.push(init.headers["Last-Event-ID"] ?? null);
    if (seen.length === 1) return new Response(body("id: 7\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"ab\"}\n\nevent: error\ndata: {\"error\":\"connection lost\",\"terminal\":false}\n\n"));
    if (seen.length === 2) return new Response("{\"error\":\"slow down\"}", { status: 429 });
    return new Response(body("id: 8\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"cd\"}\n\nevent: done\ndata: {}\n\n"));
  };
  const client = new PgDurableClient({ api: "http://x/agent", fetch, backoff: [1, 2] });
  let text = "";
  for await (const item of client.streamRun("r")) if (item.kind === "text") text += item.text;
  assert.equal(text, "abcd");
  assert.deepEqual(seen, [null, "7", "7"]);

  const terminal = new PgDurableClient({ api: "http://x/agent", backoff: [1, 2],
    fetch: async () => new Response(body("event: error\ndata: {\"error\":\"no run r\",\"terminal\":true}\n\n")) });
  await assert.rejects(async () => { for await (const _ of terminal.streamRun("r")) { /* none */ } }, /no run r/);
  const refused = new PgDurableClient({ api: "http://x/agent", backoff: [1, 2],
    fetch: async () => new Response("{\"error\":\"not allowed\"}", { status: 403 }) });
  await assert.rejects(async () => { for await (const _ of refused.streamRun("r")) { /* none */ } },
    (e) => e.name === "PgDurableHttpError" && e.status === 403);
  // retries are bounded by maxRetries, error frames included
  let calls = 0;
  const failing = new PgDurableClient({ api: "http://x/agent", backoff: [1, 2], maxRetries: 2,
    fetch: async () => { calls += 1; return new Response(body("event: error\ndata: {\"error\":\"down\"}\n\n")); } });
  await assert.rejects(async () => { for await (const _ of failing.streamRun("r")) { /* none */ } }, /gave up after 2 reconnects \(down\)/);
  assert.equal(calls, 3);
});

test("reconnectToStream: the answer's stable id; a finished last answer replayed whole, or null", async () => {
  const urls = [];
  const fetch = async (url) => {
    urls.push(url);
    if (url.includes("message=pending")) return new Response(null, { status: 204, headers: { "X-PgDurable-Message": "u1" } });
    return new Response(body("id: 1:3\nevent: text\ndata: {\"run_id\":\"r\",\"text\":\"whole\"}\n\nevent: done\ndata: {}\n\n"));
  };
  const t = new PgDurableChatTransport({ api: "/agent", threadId: "chat:1", fetch });
  const chunks = [];
  for await (const c of await t.reconnectToStream({ chatId: "c" })) chunks.push(c);
  assert.deepEqual(chunks[0], { type: "start", messageId: "answer-u1" });
  assert.equal(chunks.filter((c) => c.type === "text-delta").map((c) => c.delta).join(""), "whole");
  assert.ok(urls[1].endsWith("/threads/chat%3A1/stream?message=u1&rollback=end"), urls[1]);
  const off = new PgDurableChatTransport({ api: "/agent", threadId: "chat:1", fetch, resumeFinished: false });
  assert.equal(await off.reconnectToStream({ chatId: "c" }), null);
});

const sse = (...frames) => frames.map(([event, id, data]) => `${id ? `id: ${id}\n` : ""}event: ${event}\ndata: ${JSON.stringify(data)}\n\n`).join("");

test("a message's stream ends with done naming the next message", async () => {
  const client = new PgDurableClient({ api: "/agent", fetch: async () => new Response(body(sse(
    ["text", "1:1", { run_id: "r", text: "a0" }], ["done", null, { next: "u2" }]))) });
  const items = [];
  for await (const item of client.streamThread("chat:1", { message: "u1" })) items.push(item);
  assert.deepEqual(items.map((i) => i.kind), ["text", "done"]);
  assert.equal(items[1].next, "u2");
});

/** The AI SDK's chat without a UI framework (as live.test.mjs's). */
class NodeChat extends AbstractChat {
  constructor(init) {
    const state = {
      status: "ready", error: undefined, messages: init.messages ?? [],
      pushMessage(m) { this.messages = this.messages.concat(m); },
      popMessage() { this.messages = this.messages.slice(0, -1); },
      replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? structuredClone(m) : x)); },
      snapshot: (x) => structuredClone(x),
    };
    super({ ...init, state });
  }
}
const textOf = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

test("reconnectToStream after a reload with two answers: each replayed into its own message", async () => {
  // the page kept u1's answer cut and none of u2's (enqueued while u1's streamed)
  const urls = [];
  const fetch = async (url) => {
    urls.push(url);
    if (url.includes("message=pending")) {  // the server resolves it to u1 (its answer unfinished)
      return new Response(body(sse(["text", "1:2", { run_id: "r", text: "first " }],
        ["text", "1:3", { run_id: "r", text: "answer" }], ["done", null, { next: "u2" }])),
      { headers: { "X-PgDurable-Message": "u1" } });
    }
    assert.ok(url.includes("message=u2"), url);
    return new Response(body(sse(["text", "1:5", { run_id: "r", text: "second" }],
      ["event", "1:6", { run_id: "r", seq: 6, event: { type: "end" } }], ["done", null, { next: null }])),
    { headers: { "X-PgDurable-Message": "u2" } });
  };
  const t = new PgDurableChatTransport({ api: "/agent", threadId: "chat:1", fetch });
  const chunks = [];
  for await (const c of await t.reconnectToStream({ chatId: "c" })) chunks.push(c.type === "text-delta" ? `delta:${c.delta}` : c.type === "start" ? `start:${c.messageId}` : c.type);
  assert.deepEqual(chunks, ["start:answer-u1", "start-step", "text-start", "delta:first ", "delta:answer",
    "text-end", "finish-step", "start:answer-u2", "start-step", "text-start", "delta:second", "text-end",
    "finish-step", "finish"]);
  assert.equal(urls.length, 2);

  const user = (id, text) => ({ id, role: "user", parts: [{ type: "text", text }] });
  const kept = [user("u1", "one"), { id: "answer-u1", role: "assistant", parts: [{ type: "text", text: "fir", state: "streaming" }] }, user("u2", "two")];
  const chat = new NodeChat({ id: "chat:1", messages: kept, transport: t });
  await chat.resumeStream();
  assert.equal(chat.status, "ready");
  assert.deepEqual(chat.messages.map((m) => [m.id, m.role, textOf(m)]), [
    ["u1", "user", "one"], ["answer-u1", "assistant", "first answer"],
    ["u2", "user", "two"], ["answer-u2", "assistant", "second"]]);
});
