/** Notifier's TypeScript client: `new Notifier({baseUrl, apiKey})`, typed by the server's OpenAPI schema. */
export { DEFAULT_RETRY, Notifier, USER_AGENT, newDedupKey, retryAfterSeconds, retryDelay } from "./client.js";
export type { NotifierOptions, Page, RetryPolicy } from "./client.js";
export {
  AuthenticationError,
  BadRequestError,
  ConflictError,
  NotFoundError,
  NotifierConnectionError,
  NotifierError,
  PermissionDeniedError,
  RateLimitedError,
  ServerError,
  WebhookVerificationError,
  errorFor,
  isRetryable,
} from "./errors.js";
export type { ErrorBody, ErrorFields } from "./errors.js";
export * from "./types.js";
export { VERSION } from "./version.js";
export * as webhooks from "./webhooks.js";
