/** The client: one request function with the retry policy, typed by the schema, and methods for the common calls. */
import { randomUUID } from "node:crypto";

import { NotifierConnectionError, NotifierError, errorFor, isRetryable } from "./errors.js";
import type {
  Accepted,
  BatchAccepted,
  BatchItem,
  ListItem,
  ListPaths,
  Method,
  Notification,
  Operation,
  PathsFor,
  QueryParameters,
  RequestOptions,
  ResponseBody,
  Schemas,
  SendInput,
  SendTopicInput,
} from "./types.js";
import { VERSION } from "./version.js";

export const USER_AGENT = `notifier-client-typescript/${VERSION}`;

/**
 * Retry 429, 5xx and connection errors: at most `maxRetries` more attempts within `budgetSeconds` in all.
 *
 * The wait is the server's Retry-After when it sends one, else exponential backoff with jitter from
 * `backoffSeconds` up to `maxBackoffSeconds`. A wait that would end past the budget is not taken: the error is
 * thrown instead, so a call never blocks much longer than the budget.
 */
export interface RetryPolicy {
  maxRetries: number;
  budgetSeconds: number;
  backoffSeconds: number;
  maxBackoffSeconds: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  maxRetries: 3,
  budgetSeconds: 30,
  backoffSeconds: 0.5,
  maxBackoffSeconds: 8,
};

/** Return the seconds to wait before retrying after `failure` on attempt `attempt` (0-based), or null. */
export function retryDelay(
  policy: RetryPolicy,
  attempt: number,
  elapsedSeconds: number,
  failure: NotifierError,
  random: () => number = Math.random,
): number | null {
  if (attempt >= policy.maxRetries || !isRetryable(failure)) return null;
  let wait: number;
  if (failure.retryAfter !== null) {
    wait = Math.max(0, failure.retryAfter);
  } else {
    const ceiling = Math.min(policy.maxBackoffSeconds, policy.backoffSeconds * 2 ** attempt);
    wait = ceiling * (0.5 + random() / 2);
  }
  return elapsedSeconds + wait > policy.budgetSeconds ? null : wait;
}

/** Parse a Retry-After header: delta seconds or an HTTP date. */
export function retryAfterSeconds(value: string | null, now: number = Date.now()): number | null {
  if (!value || !value.trim()) return null;
  const text = value.trim();
  if (/^\d+(\.\d+)?$/.test(text)) return Number(text);
  const when = Date.parse(text);
  return Number.isNaN(when) ? null : Math.max(0, (when - now) / 1000);
}

/** Return a fresh idempotency key: one per send call, reused by that call's retries. */
export function newDedupKey(): string {
  return `nc-${randomUUID().replaceAll("-", "")}`;
}

export interface NotifierOptions {
  /** The server's root, e.g. "https://notifier.example.com" (the API is under /api/v1/). */
  baseUrl: string;
  apiKey: string;
  /** Retries of 429, 5xx and connection errors; `{maxRetries: 0}` turns them off. */
  retry?: Partial<RetryPolicy>;
  /** Each attempt's time limit in milliseconds (default 10,000); one that runs out is a connection error. */
  timeoutMs?: number;
  /** Sent with every request, on top of the client's. */
  headers?: Record<string, string>;
  /** The fetch to use (default: Node's global fetch). */
  fetch?: typeof fetch;
}

/** One page of a list: its items and the cursor of the next (null on the last page). */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

type ListQuery<P extends ListPaths> = Omit<QueryParameters<Operation<P, "get">>, "cursor">;

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = (error as { cause?: unknown }).cause;
  const detail = cause instanceof Error ? `: ${cause.name}: ${cause.message}` : "";
  return `${error.name}: ${error.message}${detail}`;
}

const sleep = (seconds: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

function withDedupKey<T extends { dedup_key?: string }>(item: T): T {
  return item.dedup_key ? item : { ...item, dedup_key: newDedupKey() };
}

function notificationBody(item: BatchItem): Schemas["NotificationInput"] {
  if ("recipient" in item) {
    const { recipient, ...rest } = item;
    return withDedupKey({ ...rest, recipient: typeof recipient === "string" ? { user_id: recipient } : recipient });
  }
  return withDedupKey({ ...item });
}

/**
 * Notifier's API.
 *
 * `request()` reaches every operation of the schema, typed by it; the methods below it cover the common calls.
 * Every call retries what may succeed when tried again; sends carry a `dedup_key` (generated once per call when
 * not given), so a retried send is never sent twice.
 */
export class Notifier {
  readonly baseUrl: string;
  readonly retry: RetryPolicy;
  readonly timeoutMs: number;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;

  constructor(options: NotifierOptions) {
    if (!options.apiKey) throw new TypeError("apiKey is required");
    if (!options.baseUrl) throw new TypeError("baseUrl is required");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.#headers = {
      Authorization: `Bearer ${options.apiKey}`,
      "User-Agent": USER_AGENT,
      Accept: "application/json",
      ...options.headers,
    };
    this.#fetch = options.fetch ?? globalThis.fetch;
  }

  /**
   * Call any operation of the API by its path and method; answer its 2xx JSON (undefined for a 204).
   *
   * `options.path` fills the path's `{parameters}` (each encoded as one segment), `options.query` the query
   * string (undefined values left out), `options.body` the JSON body. Throws a NotifierError subclass.
   */
  async request<M extends Method, P extends PathsFor<M>>(
    method: M,
    path: P,
    ...[options]: {} extends RequestOptions<Operation<P, M>>
      ? [options?: RequestOptions<Operation<P, M>>]
      : [options: RequestOptions<Operation<P, M>>]
  ): Promise<ResponseBody<Operation<P, M>>> {
    const opts = (options ?? {}) as {
      path?: Record<string, string | number>;
      query?: Record<string, unknown>;
      body?: unknown;
      headers?: Record<string, string>;
    };
    const url = this.url(path, opts.path, opts.query);
    const started = Date.now();
    for (let attempt = 0; ; attempt++) {
      let failure: NotifierError;
      try {
        return (await this.#once(method, url, opts.body, opts.headers)) as ResponseBody<Operation<P, M>>;
      } catch (error) {
        if (!(error instanceof NotifierError)) throw error;
        failure = error;
      }
      const wait = retryDelay(this.retry, attempt, (Date.now() - started) / 1000, failure);
      if (wait === null) throw failure;
      await sleep(wait);
    }
  }

  /** Return the URL of a path with its parameters filled in and its query string. */
  url(path: string, parameters?: Record<string, string | number>, query?: Record<string, unknown>): string {
    const filled = path.replace(/\{([^}]+)\}/g, (_, name: string) => {
      const value = parameters?.[name];
      if (value === undefined || value === "") throw new TypeError(`path parameter ${name} is missing`);
      return encodeURIComponent(String(value)); // user ids may hold anything but a slash: one segment each
    });
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value === undefined || value === null) continue;
      search.append(name, Array.isArray(value) ? value.join(",") : String(value));
    }
    const text = search.toString();
    return `${this.baseUrl}${filled}${text ? `?${text}` : ""}`;
  }

  async #once(method: Method, url: string, body: unknown, headers?: Record<string, string>): Promise<unknown> {
    const init: RequestInit = {
      method: method.toUpperCase(),
      headers: { ...this.#headers, ...(body === undefined ? {} : { "Content-Type": "application/json" }), ...headers },
      signal: AbortSignal.timeout(this.timeoutMs),
    };
    if (body !== undefined) init.body = JSON.stringify(body);
    let response: Response;
    let text: string;
    try {
      response = await this.#fetch(url, init);
      text = await response.text();
    } catch (error) {
      throw new NotifierConnectionError(describe(error));
    }
    let parsed: unknown = undefined;
    if (text) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined; // an HTML error page of a proxy: the status says what happened
      }
    }
    if (response.status >= 400) {
      throw errorFor(response.status, parsed, retryAfterSeconds(response.headers.get("Retry-After")));
    }
    return parsed;
  }

  // --- Lists ---------------------------------------------------------------------------------------------------

  /** Fetch one page of a list; pass the previous page's `nextCursor` as `cursor` for the next. */
  async page<P extends ListPaths>(
    path: P,
    options: { path?: Record<string, string | number>; query?: ListQuery<P>; cursor?: string | null } = {},
    headers?: Record<string, string>,
  ): Promise<Page<ListItem<P>>> {
    const query = { ...(options.query as Record<string, unknown>), cursor: options.cursor || undefined };
    const request = this.request as (method: "get", path: string, options: object) => Promise<unknown>;
    const body = (await request.call(this, "get", path, { path: options.path, query, headers })) as {
      results?: ListItem<P>[];
      items?: ListItem<P>[];
      next_cursor?: string | null;
    };
    // Every list answers `results`; the inbox and event attempts answered `items` first (and still do, beside it).
    return { items: body.results ?? body.items ?? [], nextCursor: body.next_cursor || null };
  }

  /**
   * Iterate over every item of a list, following `next_cursor` page by page; a page is fetched only when the
   * iteration gets there. `query.limit` is the page size (1–200), not a total.
   */
  async *list<P extends ListPaths>(
    path: P,
    options: { path?: Record<string, string | number>; query?: ListQuery<P> } = {},
    headers?: Record<string, string>,
  ): AsyncGenerator<ListItem<P>, void, undefined> {
    let cursor: string | null = null;
    do {
      const page: Page<ListItem<P>> = await this.page(path, { ...options, cursor }, headers);
      yield* page.items;
      cursor = page.nextCursor;
    } while (cursor);
  }

  // --- Sending -------------------------------------------------------------------------------------------------

  /** Send one notification to one recipient (a user id, or `{user_id}`); a dedup_key is generated if not given. */
  send(input: SendInput): Promise<Accepted> {
    return this.request("post", "/api/v1/notifications", { body: notificationBody(input) });
  }

  /** Send one notification to a topic's subscribers. */
  sendTopic(input: SendTopicInput): Promise<Accepted> {
    return this.request("post", "/api/v1/notifications", { body: notificationBody(input) });
  }

  /**
   * Send up to 1,000 notifications at once: one result per item, in order, each the accepted notification or
   * the NotifierError that item alone would have had (a bad item fails alone). Items without a dedup_key get one.
   */
  async sendBatch(items: BatchItem[]): Promise<Array<BatchAccepted | NotifierError>> {
    const body = { notifications: items.map(notificationBody) };
    const answer = await this.request("post", "/api/v1/notifications/batch", { body });
    return answer.results.map((item) =>
      item.error || item.id === undefined ? errorFor(item.status || 400, item) : (item as BatchAccepted),
    );
  }

  /** Read a notification with its deliveries and their events. */
  get(notificationId: string): Promise<Notification> {
    const path = { notification_id: notificationId };
    return this.request("get", "/api/v1/notifications/{notification_id}", { path });
  }

  /** Cancel what of a notification is not sent yet. */
  cancel(notificationId: string): Promise<Schemas["CancelOutput"]> {
    const path = { notification_id: notificationId };
    return this.request("post", "/api/v1/notifications/{notification_id}/cancel", { path });
  }

  /** Your notifications, newest first (filters: user_id, status, category; limit is the page size). */
  notifications(query: ListQuery<"/api/v1/notifications"> = {}): AsyncGenerator<Schemas["NotificationOutput"]> {
    return this.list("/api/v1/notifications", { query });
  }

  // --- Recipients and topics -----------------------------------------------------------------------------------

  /** Create or change a recipient: only the fields given change. */
  putRecipient(userId: string, fields: Schemas["RecipientInput"]): Promise<Schemas["RecipientOutput"]> {
    return this.request("put", "/api/v1/recipients/{user_id}", { path: { user_id: userId }, body: fields });
  }

  /** Create or change up to 1,000 recipients, each alone: a result per item (201, 200, 400 with its error). */
  async putRecipients(recipients: Array<Schemas["RecipientBatchItem"]>): Promise<Schemas["RecipientBatchResult"][]> {
    const answer = await this.request("post", "/api/v1/recipients/batch", { body: { recipients } });
    return answer.results;
  }

  getRecipient(userId: string): Promise<Schemas["RecipientOutput"]> {
    return this.request("get", "/api/v1/recipients/{user_id}", { path: { user_id: userId } });
  }

  /** Erase a recipient's personal data. */
  async deleteRecipient(userId: string): Promise<void> {
    await this.request("delete", "/api/v1/recipients/{user_id}", { path: { user_id: userId } });
  }

  /** Recipients, oldest first (filters: email, phone). */
  recipients(query: ListQuery<"/api/v1/recipients"> = {}): AsyncGenerator<Schemas["RecipientListItem"]> {
    return this.list("/api/v1/recipients", { query });
  }

  putTopic(key: string, name = ""): Promise<Schemas["TopicOutput"]> {
    return this.request("put", "/api/v1/topics/{key}", { path: { key }, body: { name } });
  }

  getTopic(key: string): Promise<Schemas["TopicOutput"]> {
    return this.request("get", "/api/v1/topics/{key}", { path: { key } });
  }

  /** Subscribe up to 10,000 user ids per call. */
  subscribe(key: string, userIds: string[]): Promise<Schemas["SubscribersOutput"]> {
    return this.request("post", "/api/v1/topics/{key}/subscribers", { path: { key }, body: { user_ids: userIds } });
  }

  async unsubscribe(key: string, userId: string): Promise<void> {
    const path = { key, user_id: userId };
    await this.request("delete", "/api/v1/topics/{key}/subscribers/{user_id}", { path });
  }

  topics(query: ListQuery<"/api/v1/topics"> = {}): AsyncGenerator<Schemas["TopicListItem"]> {
    return this.list("/api/v1/topics", { query });
  }

  templates(query: ListQuery<"/api/v1/templates"> = {}): AsyncGenerator<Schemas["TemplateListItem"]> {
    return this.list("/api/v1/templates", { query });
  }
}
