// The browser test's page (tests/test_streams_browser.py): the AI SDK's framework-free
// chat (`AbstractChat` from `ai`, the class @ai-sdk/react's `Chat` extends) over
// PgDurableChatTransport, against pgdurable's HTTP endpoints mounted at /agent.
//
// The page keeps its messages in sessionStorage, as an app keeps them in its store, and on
// load rebuilds the chat from them and resumes an answer still being written
// (`resumeStream` -> the transport's `reconnectToStream`): a reload mid-answer continues.
//
// Parameters in the URL's fragment: thread (the chat's thread key), token (a scoped
// stream token with scope write), api (default /agent), words (sent with each message).
// Bundled by `npm run bundle:test` (the test bundles it into its own folder).
import { AbstractChat } from "ai";
import { PgDurableChatTransport } from "../../src/index.ts";

const params = new URLSearchParams(location.hash.slice(1));
const thread = params.get("thread") ?? "chat:page";
const token = params.get("token") ?? undefined;
const api = params.get("api") ?? "/agent";
const words = params.get("words");  // the test app's answer length (tests/_stream_app.py)
const storeKey = `pgdurable-chat:${thread}`;

const $messages = document.getElementById("messages");
const $status = document.getElementById("status");

function textOf(message) {
  return message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
}

function render(chat) {
  const rows = chat.messages.map((m) => {
    const div = document.createElement("div");
    div.className = `message ${m.role}`;
    div.dataset.id = m.id;
    div.textContent = textOf(m);
    return div;
  });
  $messages.replaceChildren(...rows);
  $status.textContent = chat.error ? `error: ${chat.error.message}` : chat.status;
  document.body.dataset.status = chat.status;
}

/** The chat's state (what @ai-sdk/react keeps in React state): rendered and stored on change. */
class PageState {
  constructor(messages, changed) {
    this.list = messages;
    this.status = "ready";
    this.error = undefined;
    this.changed = changed;
  }
  get messages() { return this.list; }
  set messages(messages) { this.list = messages; this.changed(); }
  pushMessage(message) { this.messages = this.list.concat(message); }
  popMessage() { this.messages = this.list.slice(0, -1); }
  replaceMessage(index, message) {
    this.messages = [...this.list.slice(0, index), this.snapshot(message), ...this.list.slice(index + 1)];
  }
  snapshot(thing) { return structuredClone(thing); }
}

class PageChat extends AbstractChat {
  constructor(init) {
    let chat;
    const state = new PageState(init.messages ?? [], () => chat && chat.changed());
    super({ ...init, state });
    chat = this;
  }
  setStatus(update) { super.setStatus(update); this.changed(); }
  changed() {
    sessionStorage.setItem(storeKey, JSON.stringify(this.messages));
    render(this);
  }
}

let stored = [];
try { stored = JSON.parse(sessionStorage.getItem(storeKey) ?? "[]"); } catch { stored = []; }

const chat = new PageChat({
  id: thread,
  messages: stored,
  transport: new PgDurableChatTransport({
    api, threadId: thread, token,
    toMessage: (m) => ({ text: textOf(m), id: m.id, ...(words ? { words: Number(words) } : {}) }),
  }),
  onError: (err) => console.error("chat error", err),
});
window.pgdurableChat = chat;
render(chat);

document.getElementById("send").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("prompt");
  const text = input.value;
  input.value = "";
  if (text) void chat.sendMessage({ text });
});

// An answer may still be being written (a reload mid-answer): resume it; the transport
// replays a finished last answer whole (resumeFinished), so a part stored before is
// completed. `data-resumed` tells the test the resume has ended.
void chat.resumeStream().finally(() => { document.body.dataset.resumed = "yes"; });
