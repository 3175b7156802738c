// @pgdurable/client against the real HTTP endpoints: start, run, result, streamRun,
// send (and its duplicate), streamThread, and a stream that outlives a database blip
// (the server's statements terminated mid-read: a transient `error` frame, then a
// reconnect from the last cursor, exact to the character), and the AI SDK's chat over the
// transport when a second message rolls the first answer back, or interrupts it from the
// same chat (double-texting).
//
// Run by tests/test_streams_browser.py, which serves tests/_stream_http.py with a real
// worker, bundles this file from the client's source (esbuild) and passes what to
// expect in PGDURABLE_LIVE (JSON). Without it, every test here is skipped.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { AbstractChat } from "ai";
import { PgDurableChatTransport, PgDurableClient, PgDurableHttpError } from "../src/index.ts";

const live = process.env.PGDURABLE_LIVE ? JSON.parse(process.env.PGDURABLE_LIVE) : null;
const skip = live ? false : "PGDURABLE_LIVE is not set (tests/test_streams_browser.py sets it)";
const session = { "X-Test-Auth": "yes" };  // the test server's stand-in for a session

async function textOf(items) {
  let text = "";
  for await (const item of items) if (item.kind === "text") text += item.text;
  return text;
}

test("start, streamRun, result and run", { skip }, async () => {
  const app = new PgDurableClient({ api: live.api, headers: session });
  const { run_id, token } = await app.start("long", live.run.state);
  assert.match(run_id, /^[0-9a-f-]{36}$/);
  assert.ok(token, "a read token for the run");
  // a browser holds only the run's token
  const reader = new PgDurableClient({ api: live.api, token });
  assert.equal(await textOf(reader.streamRun(run_id)), live.run.expected);
  const done = await reader.result(run_id);
  assert.equal(done.status, "completed");
  assert.equal(done.result, live.run.expected.length);
  assert.deepEqual(await reader.run(run_id), done);
  // the token is for that run only; without a session (authorize says no), no start
  const other = await app.start("long", { ...live.run.state, words: 1 });
  await assert.rejects(reader.run(other.run_id), (e) => e instanceof PgDurableHttpError && e.status === 403);
  await assert.rejects(new PgDurableClient({ api: live.api }).start("long", {}),
    (e) => e instanceof PgDurableHttpError && e.status === 403);
});

test("send, its duplicate, and the thread's stream of its answer", { skip }, async () => {
  const writer = new PgDurableClient({ api: live.api, token: live.thread.token });
  const d = await writer.send(live.thread.key, live.thread.message, { messageId: "n1" });
  assert.equal(d.duplicate, false);
  assert.equal(d.message_id, "n1");
  assert.ok(d.token, "a read token for the thread");
  const again = await writer.send(live.thread.key, live.thread.message, { messageId: "n1" });
  assert.equal(again.duplicate, true);
  assert.equal(again.run_id, d.run_id);
  const reader = new PgDurableClient({ api: live.api, token: d.token });
  let following;
  const text = await textOf(reader.streamThread(live.thread.key, { message: "latest", onMessage: (id) => { following = id; } }));
  assert.equal(text, live.thread.expected);
  assert.equal(following, "n1");
  // answered: "latest" has nothing to follow, and says which message that is
  let answered;
  assert.equal(await textOf(reader.streamThread(live.thread.key, { message: "latest", onAnswered: (id) => { answered = id; } })), "");
  assert.equal(answered, "n1");
  await assert.rejects(writer.send(live.thread.key, { text: "other payload" }, { messageId: "n1" }),
    (e) => e instanceof PgDurableHttpError && e.status === 409);
});

test("a stream outlives a database blip: retried from its cursor, exact", { skip }, async () => {
  const app = new PgDurableClient({ api: live.api, headers: session });
  const { run_id, token } = await app.start("long", live.blip.state);
  const gets = [];
  const fetchCounting = (url, init) => {
    if (String(url).includes("/stream")) gets.push(init?.headers?.["Last-Event-ID"] ?? null);
    return fetch(url, init);
  };
  const reader = new PgDurableClient({ api: live.api, token, fetch: fetchCounting, backoff: [50, 500] });
  let text = "";
  for await (const item of reader.streamRun(run_id)) {
    if (item.kind !== "text") continue;
    text += item.text;
    if (!existsSync(live.blip.ready)) writeFileSync(live.blip.ready, run_id);  // the test terminates the server's connections now
  }
  assert.equal(text, live.blip.expected);
  assert.ok(gets.length >= 2, `the stream was not resumed (requests: ${JSON.stringify(gets)})`);
  assert.equal(gets[0], null);
  assert.ok(gets.slice(1).every((c) => typeof c === "string" && c.length > 0), JSON.stringify(gets));
  while (!existsSync(live.blip.done)) await sleep(10);  // the test saw its terminations
});

/** The AI SDK's chat without a UI framework: its state is a plain object. */
class NodeChat extends AbstractChat {
  constructor(init) {
    const state = {
      status: "ready", error: undefined, messages: [],
      pushMessage(m) { this.messages = this.messages.concat(m); },
      popMessage() { this.messages = this.messages.slice(0, -1); },
      replaceMessage(i, m) { this.messages = this.messages.map((x, j) => (j === i ? structuredClone(m) : x)); },
      snapshot: (x) => structuredClone(x),
    };
    super({ ...init, state });
  }
}

const text = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

test("double-texting rollback in the AI SDK's chat: the first answer is discarded, the second stands alone", { skip }, async () => {
  const words = (w) => (m) => ({ text: text(m), id: m.id, words: w });
  const first = new PgDurableChatTransport({ api: live.api, threadId: live.rollback.key, token: live.rollback.token, toMessage: words(live.rollback.words) });
  const chat = new NodeChat({ id: live.rollback.key, transport: first });
  const answering = chat.sendMessage({ text: "r0" });
  while (!(chat.messages.length === 2 && text(chat.messages[1]).length > 40)) await sleep(10);
  // the second message, sent while the first is answered, with rollback
  const second = new PgDurableChatTransport({ api: live.api, threadId: live.rollback.key, token: live.rollback.token, doubleText: "rollback", toMessage: words(30) });
  const chat2 = new NodeChat({ id: live.rollback.key, transport: second });
  await chat2.sendMessage({ text: "r1" });
  await answering;
  assert.equal(chat.status, "ready");
  assert.equal(chat2.status, "ready");
  assert.equal(text(chat2.messages[1]), live.rollback.expected);  // r1's answer, without r0's
  assert.equal(text(chat.messages[1]), "", "r0's answer was discarded: nothing of it, nor of r1's, stays");
});

test("double-texting interrupt in one AI SDK chat: each answer in its own assistant message", { skip }, async () => {
  const it = live.interrupt;
  const transport = new PgDurableChatTransport({ api: live.api, threadId: it.key, token: it.token, doubleText: "interrupt",
    toMessage: (m) => ({ text: text(m), id: m.id, words: text(m) === "i0" ? it.words : 30 }) });
  const chat = new NodeChat({ id: it.key, transport });
  const answering = chat.sendMessage({ text: "i0" });
  while (!(chat.messages.length === 2 && text(chat.messages[1]).length > 40)) await sleep(10);
  // the second message, sent from the same chat while the first is answered
  await Promise.all([answering, chat.sendMessage({ text: "i1" })]);
  assert.deepEqual(chat.messages.map((m) => m.role), ["user", "assistant", "user", "assistant"]);
  const first = text(chat.messages[1]);
  // i0's answer up to the interrupt, nothing of the answer that followed
  assert.ok(first.length >= 40 && first.length < it.first.length && it.first.startsWith(first), first);
  assert.equal(text(chat.messages[3]), it.expected);  // the re-run step's answer to i0 and i1, once
});
