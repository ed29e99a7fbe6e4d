/**
 * Types derived from the generated schema (`schema.ts`): what a request to each path and method takes and answers.
 *
 * `paths` and `components` come from the server's OpenAPI document; nothing here is written per operation, so
 * every operation of the schema is typed the moment `schema.ts` is regenerated.
 */
import type { components, paths } from "./schema.js";

export type { components, operations, paths } from "./schema.js";
/** Every schema object of the API by name: `Schemas["NotificationOutput"]`, `Schemas["RecipientInput"]`, … */
export type Schemas = components["schemas"];

export type Method = "get" | "put" | "post" | "delete" | "patch";
/** The operation at a path and method (never when the path has no such method). */
export type Operation<P extends keyof paths, M extends Method> = NonNullable<paths[P][M]>;
/** The paths that answer a method: `PathsFor<"post">` is every path you may POST to. */
export type PathsFor<M extends Method> = {
  [P in keyof paths]: [Operation<P, M>] extends [never] ? never : P;
}[keyof paths];

type Parameters<O> = O extends { parameters: infer X } ? X : never;
/** The path parameters of an operation (`{user_id: string}`), never when it has none. */
export type PathParameters<O> = Parameters<O> extends { path: infer X } ? X : never;
/** The query parameters of an operation, never when it takes none. */
export type QueryParameters<O> = Parameters<O> extends { query?: infer Q } ? Exclude<Q, undefined> : never;
/** The JSON body an operation takes, never when it takes none. */
export type RequestBody<O> = O extends { requestBody?: { content: { "application/json": infer B } } } ? B : never;

type SuccessStatus = 200 | 201 | 202 | 204;
/** What a successful answer holds: the JSON of its 2xx answer, undefined for a 204 without a body. */
export type ResponseBody<O> = O extends { responses: infer R }
  ? {
      [S in keyof R]: S extends SuccessStatus
        ? R[S] extends { content: { "application/json": infer C } }
          ? C
          : undefined
        : never;
    }[keyof R]
  : never;

/** Options of `Notifier.request()`: `path` is required when the operation has path parameters. */
export type RequestOptions<O> = ([PathParameters<O>] extends [never]
  ? { path?: undefined }
  : { path: PathParameters<O> }) & {
  query?: [QueryParameters<O>] extends [never] ? undefined : QueryParameters<O>;
  body?: [RequestBody<O>] extends [never] ? undefined : RequestBody<O>;
  /** On top of the client's headers (the browser inbox's `Authorization: Bearer <inbox token>`). */
  headers?: Record<string, string>;
};

/** The paths of cursor-paginated lists: their GET answers a page with `next_cursor`. */
export type ListPaths = {
  [P in PathsFor<"get">]: ResponseBody<Operation<P, "get">> extends { next_cursor: unknown } ? P : never;
}[PathsFor<"get">];
/** One item of a list's page. */
export type ListItem<P extends ListPaths> =
  ResponseBody<Operation<P, "get">> extends { results: Array<infer T> } ? T : never;

// --- What the hand-written methods take and answer -------------------------------------------------------------

export type NotificationInput = Schemas["NotificationInput"];
/** A notification as the client sends it: the recipient may be given as a bare user id. */
export type SendInput = Omit<NotificationInput, "recipient" | "topic"> & {
  recipient: string | Schemas["NotificationRecipient"];
};
export type SendTopicInput = Omit<NotificationInput, "recipient" | "topic"> & { topic: string };
/** One item of a batch: to a recipient or to a topic. */
export type BatchItem = SendInput | SendTopicInput;
export type Accepted = Schemas["AcceptOutput"];
/** An accepted batch item (the rest of the item's answer: id, duplicate, mode, deliveries…). */
export type BatchAccepted = Schemas["BatchItemOutput"] & { id: string };
export type Notification = Schemas["NotificationDetailOutput"];
