/**
 * Compile-time checks of the types derived from the schema: this file only has to compile (`tsc` fails the
 * test otherwise). Each `@ts-expect-error` is a call the types must refuse.
 */
import type { ListItem, ListPaths, Notifier, ResponseBody, Operation, Schemas } from "../src/index.js";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
const check = <T extends true>(): T | undefined => undefined;

check<Equal<ResponseBody<Operation<"/api/v1/notifications", "post">>, Schemas["AcceptOutput"]>>();
check<Equal<ResponseBody<Operation<"/api/v1/recipients/{user_id}", "delete">>, undefined>>();
check<Equal<ListItem<"/api/v1/templates">, Schemas["TemplateListItem"]>>();
check<Equal<ListItem<"/inbox/v1/messages">, Schemas["InboxItem"]>>();
// Every cursor-paginated list of the API is a ListPaths, and nothing else is (campaigns answer one list).
check<
  Equal<
    ListPaths,
    | "/api/v1/dead-letters"
    | "/api/v1/event-endpoint/attempts"
    | "/api/v1/notifications"
    | "/api/v1/recipients"
    | "/api/v1/recipients/{user_id}/inbox"
    | "/api/v1/sandbox/messages"
    | "/api/v1/suppressions"
    | "/api/v1/templates"
    | "/api/v1/topics"
    | "/api/v1/workflows"
    | "/inbox/v1/messages"
  >
>();

export async function refused(client: Notifier): Promise<void> {
  // @ts-expect-error: no such path
  await client.request("get", "/api/v1/nowhere");
  // @ts-expect-error: /api/v1/notifications/batch takes no GET
  await client.request("get", "/api/v1/notifications/batch");
  // @ts-expect-error: the path parameter is required
  await client.request("get", "/api/v1/recipients/{user_id}");
  // @ts-expect-error: a body of the wrong shape
  await client.request("put", "/api/v1/topics/{key}", { path: { key: "k" }, body: { name: 3 } });
  // @ts-expect-error: the recipient or topic is required
  await client.send({ template: "t" });
  // @ts-expect-error: an unknown channel
  await client.send({ recipient: "u", template: "t", channels: ["pigeon"] });
  const topic = await client.getTopic("k");
  // @ts-expect-error: the answer's fields are typed
  topic.nonsense;
}
