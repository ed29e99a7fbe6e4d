/** The README's examples, compiled with the tests (never run): an example that no longer type-checks fails them. */
import { createServer } from "node:http";

import { BadRequestError, Notifier, NotifierError, WebhookVerificationError, webhooks } from "../src/index.js";

export async function examples(): Promise<void> {
  const notifier = new Notifier({ baseUrl: "http://127.0.0.1:8000", apiKey: process.env["NOTIFIER_KEY"]! });
  const n = await notifier.send({ recipient: "u-42", template: "order_shipped", payload: { order_id: "A-1001" } });
  console.log(n.id, n.status);
  console.log((await notifier.get(n.id)).deliveries[0]?.status);

  const results = await notifier.sendBatch([
    { recipient: "u-1", template: "order_shipped", payload: { order_id: "A-1" } },
    { topic: "all-users", template: "spring_sale" },
  ]);
  for (const result of results) {
    if (result instanceof NotifierError) console.error(result.code, result.fields);
    else console.log(result.id, result.duplicate);
  }

  for await (const item of notifier.notifications({ status: "failed", limit: 100 })) {
    console.log(item.id, item.template);
  }
  for await (const template of notifier.templates()) console.log(template.key, template.published_version);
  for await (const message of notifier.list("/api/v1/sandbox/messages", { query: { channel: "email" } })) {
    console.log(message.address, message.content);
  }
  const inbox = notifier.list("/api/v1/recipients/{user_id}/inbox", {
    path: { user_id: "u-42" },
    query: { unread: true },
  });
  for await (const item of inbox) console.log(item.title);

  await notifier.request("put", "/api/v1/templates/{key}", {
    path: { key: "welcome" },
    body: { category: "transactional", content: { en: { email: { subject: "Hi {{ name }}", text: "Hi" } } } },
  });
  const preview = await notifier.request("post", "/api/v1/templates/{key}/preview", {
    path: { key: "welcome" },
    body: { payload: { name: "Bo" } },
  });
  console.log(preview);
  const endpoint = await notifier.request("put", "/api/v1/event-endpoint", {
    body: { url: "https://shop.example.com/notifier-events", events: ["delivery.sent", "delivery.failed"] },
  });
  console.log(endpoint.secret);

  try {
    await notifier.send({ recipient: "u-42", template: "order_shipped", category: "nonsense" });
  } catch (error) {
    if (error instanceof BadRequestError) console.log(error.code, error.fields);
    else throw error;
  }

  createServer(async (request, response) => {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    try {
      const event = webhooks.verify(Buffer.concat(chunks), request.headers, process.env["NOTIFIER_EVENTS_SECRET"]!);
      console.log(event);
      response.writeHead(204).end();
    } catch (error) {
      if (!(error instanceof WebhookVerificationError)) throw error;
      response.writeHead(400).end();
    }
  }).listen(3000);
}
