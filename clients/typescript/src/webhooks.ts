/**
 * Verify status events on the receiving side: Standard Webhooks signatures, with Node's crypto only.
 *
 * Notifier signs each event with the endpoint's secret (`whsec_<base64 key>`): the headers `webhook-id`,
 * `webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`,
 * several separated by spaces while a secret rotates).
 */
import { createHmac, timingSafeEqual } from "node:crypto";

import { WebhookVerificationError } from "./errors.js";

export const SECRET_PREFIX = "whsec_";
export const DEFAULT_TOLERANCE_SECONDS = 300;

/** Headers as Node's `IncomingMessage.headers`, a fetch `Headers`, or a plain object (any case). */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

function key(secret: string | Uint8Array): Buffer {
  if (typeof secret !== "string") return Buffer.from(secret);
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  if (!encoded || !BASE64.test(encoded)) throw new TypeError("the secret must be 'whsec_' followed by base64");
  return Buffer.from(encoded, "base64");
}

function bytes(body: string | Uint8Array): Buffer {
  return typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
}

/** Return the `webhook-signature` value for a body (`v1,<base64>`). */
export function sign(
  secret: string | Uint8Array,
  message: { msgId: string; timestamp: number; body: string | Uint8Array },
): string {
  const hmac = createHmac("sha256", key(secret));
  hmac.update(`${message.msgId}.${message.timestamp}.`, "utf8");
  hmac.update(bytes(message.body));
  return `v1,${hmac.digest("base64")}`;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof Headers !== "undefined" && headers instanceof Headers) return headers.get(name) ?? undefined;
  for (const [key, value] of Object.entries(headers as Record<string, string | string[] | undefined>)) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value.join(" ") : value;
  }
  return undefined;
}

/**
 * Verify a received event and return its parsed JSON body; throw WebhookVerificationError otherwise.
 *
 * Pass the body exactly as received (the raw bytes or text, before any JSON parsing) and the request headers.
 * Events more than `toleranceSeconds` off this clock are refused, so a captured request cannot be replayed.
 */
export function verify(
  body: string | Uint8Array,
  headers: WebhookHeaders,
  secret: string | Uint8Array,
  options: { toleranceSeconds?: number; now?: number } = {},
): unknown {
  const msgId = header(headers, "webhook-id");
  const stamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!msgId || !stamp || !signatures) {
    throw new WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature header");
  }
  if (!/^\d+$/.test(stamp.trim())) throw new WebhookVerificationError("invalid webhook-timestamp");
  const timestamp = Number(stamp.trim());
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - timestamp) > (options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS)) {
    throw new WebhookVerificationError("webhook-timestamp is outside the tolerance");
  }
  const expected = Buffer.from(sign(secret, { msgId, timestamp, body }), "utf8");
  for (const candidate of signatures.split(/\s+/)) {
    const given = Buffer.from(candidate, "utf8");
    if (candidate.startsWith("v1,") && given.length === expected.length && timingSafeEqual(given, expected)) {
      const text = bytes(body).toString("utf8");
      try {
        return text ? (JSON.parse(text) as unknown) : null;
      } catch {
        throw new WebhookVerificationError("the signed body is not JSON");
      }
    }
  }
  throw new WebhookVerificationError("no matching signature");
}
