/**
 * Drive a running Notifier with the client, one scenario per run: `node live.js <scenario>`.
 *
 * tests/project/test_client_typescript.py starts the server (and the workers a scenario needs), passes its URL and
 * keys in the environment, runs a scenario and checks what it printed (one JSON line) against the database.
 * Every scenario also asserts on its own: a wrong client exits non-zero.
 */
import assert from "node:assert/strict";

import {
  AuthenticationError,
  BadRequestError,
  ConflictError,
  NotFoundError,
  Notifier,
  NotifierError,
  PermissionDeniedError,
  type Notification,
} from "../src/index.js";

const FAST = { maxRetries: 3, budgetSeconds: 5, backoffSeconds: 0.01, maxBackoffSeconds: 0.05 };
const baseUrl = process.env["NOTIFIER_URL"] ?? "";
const apiKey = process.env["NOTIFIER_KEY"] ?? "";
const client = new Notifier({ baseUrl, apiKey, retry: FAST });
const SEND = { template: "shipped", category: "transactional" } as const;

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

async function rejects<E extends NotifierError>(
  promise: Promise<unknown>,
  Class: new (...args: never[]) => E,
): Promise<E> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof Class, `expected ${Class.name}, got ${String(error)}`);
    assert.ok(error instanceof NotifierError);
    return error;
  }
  assert.fail(`expected ${Class.name}, the call succeeded`);
}

/** Send one email, wait until the worker has sent it, and read it back. */
async function send(): Promise<object> {
  const n = await client.send({ recipient: "u-ts", ...SEND, channels: ["email"], payload: { order_id: "A-1" } });
  assert.deepEqual([n.status, n.duplicate, n.deliveries.length], ["accepted", false, 1]);
  let done: Notification | undefined;
  for (const started = Date.now(); Date.now() - started < 60_000; ) {
    const current = await client.get(n.id);
    if (current.deliveries[0]?.status === "sent") {
      done = current;
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  assert.ok(done, "the delivery was not sent within 60 s");
  const delivery = done.deliveries[0]!;
  assert.deepEqual([delivery.channel, delivery.provider, delivery.attempts], ["email", "sandbox", 1]);
  assert.equal(delivery.events.at(-1)?.status, "sent");
  assert.match(done.dedup_key ?? "", /^nc-[0-9a-f]{32}$/);
  return { id: n.id, delivery_id: delivery.id, dedup_key: done.dedup_key, mode: done.mode };
}

/** The same dedup_key is a duplicate, or a conflict with another body; no key, two notifications. */
async function dedup(): Promise<object> {
  const first = await client.send({ recipient: "u-d", ...SEND, payload: { order_id: "1" }, dedup_key: "k-1" });
  const again = await client.send({ recipient: "u-d", ...SEND, payload: { order_id: "1" }, dedup_key: "k-1" });
  assert.deepEqual([again.id, again.duplicate], [first.id, true]);
  const conflict = await rejects(
    client.send({ recipient: "u-d", ...SEND, payload: { order_id: "2" }, dedup_key: "k-1" }),
    ConflictError,
  );
  assert.equal(conflict.status, 409);
  const a = await client.send({ recipient: { user_id: "u-d" }, ...SEND, payload: { order_id: "3" } });
  const b = await client.send({ recipient: "u-d", ...SEND, payload: { order_id: "3" } });
  assert.notEqual(a.id, b.id);
  return { first: first.id, a: a.id, b: b.id, conflict_code: conflict.code };
}

/** Each kind of failure is its class, with the API's status, code, message and fields. */
async function errors(): Promise<object> {
  const nonsense = { recipient: "u-e", template: "shipped", category: "nonsense" };
  const bad = await rejects(client.send(nonsense), BadRequestError);
  assert.deepEqual([bad.status, bad.code], [400, "invalid"]);
  assert.ok(bad.fields["category"]?.length, JSON.stringify(bad.fields));
  const missing = await rejects(client.get("00000000-0000-0000-0000-000000000000"), NotFoundError);
  assert.deepEqual([missing.status, missing.code], [404, "not_found"]);
  const stranger = new Notifier({ baseUrl, apiKey: "wrong", retry: FAST });
  const unauthenticated = await rejects(stranger.get("00000000-0000-0000-0000-000000000000"), AuthenticationError);
  assert.equal(unauthenticated.status, 401);
  const limited = new Notifier({ baseUrl, apiKey: process.env["NOTIFIER_LIMITED_KEY"] ?? "", retry: FAST });
  const forbidden = await rejects(limited.send({ recipient: "u-e", ...SEND }), PermissionDeniedError);
  assert.ok(forbidden.status === 403 && forbidden.code);
  return {
    bad: { code: bad.code, message: bad.message, fields: bad.fields },
    forbidden: { code: forbidden.code, message: forbidden.message },
  };
}

/** A batch with a bad item, the list followed across pages, a topic send and its cancellation. */
async function batch(): Promise<object> {
  const items = Array.from({ length: 60 }, (_, i) => ({
    recipient: `u-b${i}`,
    ...SEND,
    payload: { order_id: `${i}` },
  }));
  const results = await client.sendBatch([...items, { recipient: "u-bad", template: "shipped", category: "nonsense" }]);
  assert.equal(results.length, 61);
  const accepted = results.slice(0, 60).map((r) => {
    assert.ok(!(r instanceof NotifierError), String(r));
    return r.id;
  });
  const bad = results[60];
  assert.ok(bad instanceof BadRequestError && bad.fields["category"], String(bad));
  // The server pages by 50: the iterator follows the cursor across pages without repeats; and by 7 if asked.
  const listed = (await collect(client.notifications())).map((n) => n.id);
  assert.equal(new Set(listed).size, 60);
  assert.deepEqual(new Set(listed), new Set(accepted));
  const bySeven = (await collect(client.notifications({ limit: 7 }))).map((n) => n.id);
  assert.deepEqual(bySeven, listed);
  const firstPage = await client.page("/api/v1/notifications", { query: { limit: 7 } });
  assert.equal(firstPage.items.length, 7);
  assert.ok(firstPage.nextCursor);
  assert.deepEqual(
    (await collect(client.notifications({ user_id: "u-b7" }))).map((n) => n.id),
    [accepted[7]],
  );

  await client.putTopic("ts-news", "News");
  assert.equal((await client.subscribe("ts-news", ["u-t1", "u-t2"])).total, 2);
  await client.unsubscribe("ts-news", "u-t2");
  assert.equal((await client.getTopic("ts-news")).subscribers, 1);
  const later = "2099-01-01T00:00:00Z";
  const topic = await client.sendTopic({ topic: "ts-news", ...SEND, payload: { order_id: "T" }, send_at: later });
  assert.equal(topic.status, "accepted");
  const cancelled = await client.cancel(topic.id);
  assert.equal(cancelled.id, topic.id);
  assert.equal((await client.get(topic.id)).status, "cancelled");
  return { accepted, listed, topic: topic.id };
}

/** Recipients (an id that needs quoting), the other lists, and `request()` for an operation without a method. */
async function recipients(): Promise<object> {
  const odd = await client.putRecipient("u r+1@x", { locale: "de" });
  assert.deepEqual([odd.user_id, odd.locale], ["u r+1@x", "de"]);
  assert.equal((await client.getRecipient("u r+1@x")).user_id, "u r+1@x");
  await client.putRecipient("u-r@x", { email: "r@example.com", timezone: "Europe/Berlin" });
  const bad = await rejects(client.putRecipient("u-r@x", { timezone: "Mars/Olympus" }), BadRequestError);
  assert.ok(bad.fields["timezone"]);
  assert.deepEqual((await collect(client.recipients({ email: "a2@example.com" }))).map((r) => r.user_id), ["u-a2"]);
  const templates = (await collect(client.templates({ limit: 1 }))).map((t) => t.key);
  const topics = (await collect(client.topics({ limit: 2 }))).map((t) => t.key);

  const layout = await client.request("put", "/api/v1/layouts/{key}", {
    path: { key: "brand" },
    body: { html: "<div>ACME</div>{{ content }}" },
  });
  const read = await client.request("get", "/api/v1/layouts/{key}", { path: { key: "brand" } });
  assert.equal(read.html, "<div>ACME</div>{{ content }}");

  await client.deleteRecipient("u-r@x");
  await rejects(client.getRecipient("u-r@x"), NotFoundError);
  return { odd: odd.user_id, templates, topics, layout_version: layout.version };
}

/** Recipients with chat addresses, one at a time and in a batch (a result per item), then chat sent to them. */
async function chatRecipients(): Promise<object> {
  const one = await client.putRecipient("u-chat", { chat: { slack: "U024BE7LH", whatsapp: "+49 151 12345678" } });
  assert.deepEqual(one.chat, { slack: "U024BE7LH", whatsapp: "+4915112345678" }); // stored in E.164
  const bad = await rejects(client.putRecipient("u-chat", { chat: { slack: "ops" } }), BadRequestError);
  assert.ok(bad.fields["chat.slack"]);

  const results = await client.putRecipients([
    { user_id: "u-b1", email: "b1@example.com", chat: { slack: "#ops", telegram: "@newsroom" } },
    { user_id: "u-chat", chat: { telegram: "123456789" } },
    { user_id: "u-b3", chat: { telegram: "not a chat" } },
    { user_id: "u-b4", email: "not an email" },
  ]);
  assert.deepEqual(
    results.map((r) => [r.user_id, r.status]),
    [["u-b1", 201], ["u-chat", 200], ["u-b3", 400], ["u-b4", 400]],
  );
  const refused = results.filter((r) => r.status === 400).map((r) => Object.keys(r.error?.fields ?? {}));
  assert.deepEqual(refused, [["chat.telegram"], ["email"]]);
  assert.deepEqual((await client.getRecipient("u-b1")).chat, { slack: "#ops", telegram: "@newsroom" });
  // A batch item's fields are a PUT's: the chat sent replaces u-chat's whole chat.
  assert.deepEqual((await client.getRecipient("u-chat")).chat, { telegram: "123456789" });

  const user = await client.send({ recipient: "u-b1", template: "deploy", channels: ["slack", "telegram"] });
  const bare = await client.send({ recipient: { chat: { slack: "#alerts" } }, template: "deploy" });
  return { user: user.id, bare: bare.id, refused: refused.length };
}

const scenarios: Record<string, () => Promise<object>> = { send, dedup, errors, batch, recipients, chatRecipients };
const name = process.argv[2] ?? "";
const scenario = scenarios[name];
if (!scenario) throw new Error(`no scenario ${JSON.stringify(name)}: one of ${Object.keys(scenarios).join(", ")}`);
process.stdout.write(JSON.stringify(await scenario()) + "\n");
