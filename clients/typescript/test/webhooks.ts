/**
 * Verify and sign what tests/project/test_client_typescript.py sends on stdin, and print what came out, so the
 * client is checked against the server's signer and the standardwebhooks library in both directions.
 *
 * Input: `{"secret", "verify": [{"body", "headers", "now"?, "secret"?}], "sign": [{"msgId", "timestamp", "body"}]}`.
 * Output: `{"verified": [<the parsed body> or {"error": <class name>}], "signed": [<webhook-signature>]}`.
 */
import { text } from "node:stream/consumers";

import { WebhookVerificationError, webhooks } from "../src/index.js";

interface Input {
  secret: string;
  verify: Array<{ body: string; headers: Record<string, string>; now?: number; secret?: string }>;
  sign: Array<{ msgId: string; timestamp: number; body: string }>;
}

const input = JSON.parse(await text(process.stdin)) as Input;
const verified = input.verify.map((item) => {
  try {
    // Bytes, as a receiver's raw body: the signature is over them, not over a re-serialised JSON.
    return webhooks.verify(Buffer.from(item.body, "utf8"), item.headers, item.secret ?? input.secret, {
      ...(item.now === undefined ? {} : { now: item.now }),
    });
  } catch (error) {
    if (!(error instanceof WebhookVerificationError)) throw error;
    return { error: error.name };
  }
});
const signed = input.sign.map((item) => webhooks.sign(input.secret, item));
process.stdout.write(JSON.stringify({ verified, signed }) + "\n");
