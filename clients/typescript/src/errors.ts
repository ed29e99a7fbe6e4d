/** Errors thrown by the client: one class per kind of answer, all carrying `status`, `code` and `fields`. */
import type { components } from "./schema.js";

/** The API's error body: `{"error": {"code", "message", "fields"}}`. */
export type ErrorBody = components["schemas"]["Error"];
/** Reasons per field, by dotted path ("recipient.user_id"); empty when no field is at fault. */
export type ErrorFields = components["schemas"]["ErrorDetail"]["fields"];

/** Any error answered by Notifier, or no answer at all (`status` is null for connection failures). */
export class NotifierError extends Error {
  override name = "NotifierError";
  readonly status: number | null;
  /** Notifier's machine code: invalid, not_found, scope_missing, rate_limited, … ("" when the body had none). */
  readonly code: string;
  readonly fields: ErrorFields;
  /** Seconds the server asked to wait (Retry-After), if it said. */
  readonly retryAfter: number | null;

  constructor(
    message: string,
    options: { status?: number | null; code?: string; fields?: ErrorFields; retryAfter?: number | null } = {},
  ) {
    super(message);
    this.status = options.status ?? null;
    this.code = options.code ?? "";
    this.fields = options.fields ?? {};
    this.retryAfter = options.retryAfter ?? null;
  }
}

/** 400: invalid input; `fields` names each wrong field with its reasons. */
export class BadRequestError extends NotifierError {
  override name = "BadRequestError";
}
/** 401: no API key (or inbox token), or not a valid one. */
export class AuthenticationError extends NotifierError {
  override name = "AuthenticationError";
}
/** 403: a category, priority or scope this API client may not use. */
export class PermissionDeniedError extends NotifierError {
  override name = "PermissionDeniedError";
}
/** 404: no such object (or not one of this client's). */
export class NotFoundError extends NotifierError {
  override name = "NotFoundError";
}
/** 409: the dedup_key was used before with a different body. */
export class ConflictError extends NotifierError {
  override name = "ConflictError";
}
/** 429: over the client's rate, or low-priority load shed; `retryAfter` says when to come back. */
export class RateLimitedError extends NotifierError {
  override name = "RateLimitedError";
}
/** 5xx: Notifier or its database is unavailable. */
export class ServerError extends NotifierError {
  override name = "ServerError";
}
/** No answer: the connection failed or timed out (after the retries). */
export class NotifierConnectionError extends NotifierError {
  override name = "NotifierConnectionError";
}
/** A status event whose signature, id or timestamp does not verify: do not trust its body. */
export class WebhookVerificationError extends Error {
  override name = "WebhookVerificationError";
}

const BY_STATUS: Record<number, typeof NotifierError> = {
  400: BadRequestError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  429: RateLimitedError,
};

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Return the error for an HTTP status and Notifier's error body (anything else in the body is ignored). */
export function errorFor(status: number, body: unknown, retryAfter: number | null = null): NotifierError {
  const detail = isRecord(body) && isRecord(body["error"]) ? body["error"] : {};
  const Class = status >= 500 ? ServerError : (BY_STATUS[status] ?? NotifierError);
  const message = typeof detail["message"] === "string" && detail["message"] ? detail["message"] : `HTTP ${status}`;
  const code = typeof detail["code"] === "string" ? detail["code"] : "";
  const fields = isRecord(detail["fields"]) ? (detail["fields"] as ErrorFields) : {};
  return new Class(message, { status, code, fields, retryAfter });
}

/** Return whether a failure may succeed when tried again: 429, 5xx, or no answer. */
export function isRetryable(failure: NotifierError): boolean {
  if (failure instanceof NotifierConnectionError) return true;
  return failure.status !== null && (failure.status === 429 || failure.status >= 500);
}
