/**
 * The client against a scripted loopback server (the real one does not fail on demand): retries, Retry-After,
 * the budget, the reused dedup_key, connection errors, both page shapes and what goes on the wire.
 * Run with `node --test`; tests/project/test_client_typescript.py does.
 */
import assert from "node:assert/strict";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, beforeEach, test } from "node:test";

import {
  BadRequestError,
  Notifier,
  NotifierConnectionError,
  RateLimitedError,
  ServerError,
  USER_AGENT,
  VERSION,
  retryAfterSeconds,
} from "../src/index.js";

type Answer = [status: number, headers: Record<string, string>, body: unknown];
interface Seen {
  at: number;
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: any;
}

const FAST = { maxRetries: 3, budgetSeconds: 5, backoffSeconds: 0.01, maxBackoffSeconds: 0.05 };
const ACCEPTED = { id: "n-1", status: "accepted", duplicate: false, deliveries: [], mode: "live" };
const BUSY = { error: { code: "rate_limited", message: "Slow down.", fields: {} } };
let script: Answer[] = [];
const seen: Seen[] = [];
let server: Server;
let url: string;

before(async () => {
  server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const raw = Buffer.concat(chunks).toString();
      seen.push({
        at: performance.now(),
        method: request.method ?? "",
        path: request.url ?? "",
        headers: request.headers,
        body: raw ? JSON.parse(raw) : undefined,
      });
      const [status, headers, body] = (script.length > 1 ? script.shift() : script[0]) ?? [500, {}, {}];
      const payload = JSON.stringify(body);
      response.writeHead(status, { "Content-Type": "application/json", ...headers });
      response.end(payload);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => new Promise<void>((resolve) => server.close(() => resolve())));
beforeEach(() => {
  seen.length = 0;
});

test("retries honour Retry-After and reuse the generated dedup_key", async () => {
  script = [
    [429, { "Retry-After": "1" }, BUSY],
    [503, {}, {}],
    [202, {}, ACCEPTED],
  ];
  const client = new Notifier({ baseUrl: url, apiKey: "k", retry: FAST });
  const n = await client.send({ recipient: "u-1", template: "t" });
  assert.deepEqual([n.id, n.status], ["n-1", "accepted"]);
  assert.equal(seen.length, 3);
  const keys = new Set(seen.map((s) => s.body.dedup_key));
  assert.equal(keys.size, 1);
  assert.match([...keys][0], /^nc-[0-9a-f]{32}$/);
  assert.ok(seen[1]!.at - seen[0]!.at >= 950, `waited ${seen[1]!.at - seen[0]!.at} ms`); // Retry-After: 1
  assert.deepEqual(seen[0]!.body.recipient, { user_id: "u-1" });
  assert.equal(seen[0]!.method, "POST");
  assert.equal(seen[0]!.path, "/api/v1/notifications");
  assert.equal(seen[0]!.headers["authorization"], "Bearer k");
  assert.equal(seen[0]!.headers["content-type"], "application/json");
  assert.equal(seen[0]!.headers["user-agent"], USER_AGENT);
  assert.equal(USER_AGENT, `notifier-client-typescript/${VERSION}`);
  // The next call makes its own key; a key given is sent as is.
  script = [[202, {}, ACCEPTED]];
  await client.send({ recipient: "u-1", template: "t" });
  await client.send({ recipient: "u-1", template: "t", dedup_key: "mine" });
  assert.ok(!keys.has(seen[3]!.body.dedup_key));
  assert.equal(seen[4]!.body.dedup_key, "mine");
});

test("retries stop at the budget and throw the last error", async () => {
  script = [[503, {}, { error: { code: "database_unavailable", message: "Down.", fields: {} } }]];
  const client = new Notifier({ baseUrl: url, apiKey: "k", retry: FAST });
  const down = await client.send({ recipient: "u-1", template: "t" }).catch((e: unknown) => e);
  assert.ok(down instanceof ServerError);
  assert.deepEqual([down.status, down.code, down.message], [503, "database_unavailable", "Down."]);
  assert.equal(seen.length, 1 + FAST.maxRetries);
  assert.equal(new Set(seen.map((s) => s.body.dedup_key)).size, 1);
  // A Retry-After beyond the budget is not waited for: the 429 is thrown at once.
  seen.length = 0;
  script = [[429, { "Retry-After": "120" }, BUSY]];
  const started = performance.now();
  const limited = await client.send({ recipient: "u-1", template: "t" }).catch((e: unknown) => e);
  assert.ok(limited instanceof RateLimitedError);
  assert.deepEqual([limited.retryAfter, limited.code, seen.length], [120, "rate_limited", 1]);
  assert.ok(performance.now() - started < 2000);
  // 4xx other than 429 are never retried; the error carries the fields.
  seen.length = 0;
  script = [[400, {}, { error: { code: "invalid", message: "No.", fields: { template: ["x"] } } }]];
  const bad = await client.send({ recipient: "u-1", template: "t" }).catch((e: unknown) => e);
  assert.ok(bad instanceof BadRequestError);
  assert.deepEqual([bad.fields, seen.length], [{ template: ["x"] }, 1]);
  // maxRetries: 0 turns retrying off.
  seen.length = 0;
  script = [[503, {}, {}]];
  const once = new Notifier({ baseUrl: url, apiKey: "k", retry: { maxRetries: 0 } });
  await assert.rejects(once.get("x"), ServerError);
  assert.equal(seen.length, 1);
});

test("batches give each item a key, and each result is its notification or its error", async () => {
  script = [
    [
      200,
      {},
      {
        results: [
          { ...ACCEPTED, status: 202 },
          { status: 400, error: { code: "invalid", message: "Bad.", fields: { category: ["no"] } } },
        ],
      },
    ],
  ];
  const client = new Notifier({ baseUrl: url, apiKey: "k", retry: FAST });
  const results = await client.sendBatch([
    { recipient: "u-1", template: "t" },
    { topic: "news", template: "t", dedup_key: "given" },
  ]);
  assert.equal(seen[0]!.path, "/api/v1/notifications/batch");
  const [one, two] = seen[0]!.body.notifications;
  assert.match(one.dedup_key, /^nc-/);
  assert.deepEqual(two, { topic: "news", template: "t", dedup_key: "given" });
  assert.equal((results[0] as { id: string }).id, "n-1");
  assert.ok(results[1] instanceof BadRequestError && results[1].fields["category"]);
});

test("connection errors are retried, then thrown", async () => {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const port = (probe.address() as AddressInfo).port;
  await new Promise<void>((resolve) => probe.close(() => resolve())); // a loopback port nobody listens on
  let calls = 0;
  const counting: typeof fetch = (input, init) => {
    calls++;
    return fetch(input, init);
  };
  const client = new Notifier({ baseUrl: `http://127.0.0.1:${port}`, apiKey: "k", retry: FAST, fetch: counting });
  const failure = await client.send({ recipient: "u-1", template: "t" }).catch((e: unknown) => e);
  assert.ok(failure instanceof NotifierConnectionError);
  assert.equal(failure.status, null);
  assert.match(failure.message, /ECONNREFUSED/);
  assert.equal(calls, 1 + FAST.maxRetries);
});

test("an attempt that times out is a connection error", async () => {
  const silent = createServer(() => undefined); // accepts and never answers
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const port = (silent.address() as AddressInfo).port;
  const baseUrl = `http://127.0.0.1:${port}`;
  const client = new Notifier({ baseUrl, apiKey: "k", retry: { maxRetries: 0 }, timeoutMs: 200 });
  await assert.rejects(client.get("x"), NotifierConnectionError);
  silent.closeAllConnections();
  await new Promise<void>((resolve) => silent.close(() => resolve()));
});

test("lists follow next_cursor in either page shape and send the query as given", async () => {
  // Lists answer `results` (the inbox and event attempts `items` too); a page without next_cursor (or "") is the last.
  script = [
    [200, {}, { results: [{ key: "t1" }, { key: "t2" }], next_cursor: "c2" }],
    [200, {}, { items: [{ key: "t3" }], next_cursor: "" }],
  ];
  const client = new Notifier({ baseUrl: `${url}/`, apiKey: "k", retry: FAST });
  const keys: string[] = [];
  for await (const template of client.templates({ limit: 2 })) keys.push(template.key);
  assert.deepEqual(keys, ["t1", "t2", "t3"]);
  assert.deepEqual(
    seen.map((s) => s.path),
    ["/api/v1/templates?limit=2", "/api/v1/templates?limit=2&cursor=c2"],
  );
  // Stopping early fetches no further page.
  seen.length = 0;
  script = [[200, {}, { results: [{ key: "t1" }, { key: "t2" }], next_cursor: "c2" }]];
  for await (const template of client.templates()) {
    assert.equal(template.key, "t1");
    break;
  }
  assert.equal(seen.length, 1);
  // Path parameters are one segment each; the browser inbox authenticates with the inbox token.
  seen.length = 0;
  script = [[200, {}, { results: [], items: [], unread_count: 0, next_cursor: null }]];
  const inbox = client.list("/inbox/v1/messages", { query: { unread: true } }, { Authorization: "Bearer tok-1" });
  for await (const _ of inbox) assert.fail("no items");
  await client.page("/api/v1/recipients/{user_id}/inbox", { path: { user_id: "u r/1@x" }, query: { limit: 5 } });
  assert.deepEqual(
    seen.map((s) => [s.path, s.headers["authorization"]]),
    [
      ["/inbox/v1/messages?unread=true", "Bearer tok-1"],
      ["/api/v1/recipients/u%20r%2F1%40x/inbox?limit=5", "Bearer k"],
    ],
  );
  // Query lists are comma-separated (stats' group_by).
  seen.length = 0;
  script = [[200, {}, { results: [], from: "2026-11-30", to: "2026-12-01" }]];
  await client.request("get", "/api/v1/stats", {
    query: { from: "2026-11-30", to: "2026-12-01", group_by: "day,channel", mode: "test" },
  });
  assert.equal(seen[0]!.path, "/api/v1/stats?from=2026-11-30&to=2026-12-01&group_by=day%2Cchannel&mode=test");
});

test("Retry-After is read as seconds or as an HTTP date", () => {
  assert.equal(retryAfterSeconds("3"), 3);
  assert.equal(retryAfterSeconds(null), null);
  assert.equal(retryAfterSeconds("soon"), null);
  const now = Date.parse("2026-12-01T00:00:00Z");
  assert.equal(retryAfterSeconds("Tue, 01 Dec 2026 00:00:30 GMT", now), 30);
  assert.equal(retryAfterSeconds("Mon, 30 Nov 2026 00:00:00 GMT", now), 0);
});
