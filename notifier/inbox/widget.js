/* <notifier-inbox base-url="https://notifier.example.com" token="…">: a bell with the unread count and a
 * list of the user's in-app notifications that updates live (Server-Sent Events) and marks items read.
 * No dependencies. Keyboard: Tab to the bell, Enter/Space opens, Tab through items, Escape closes.
 * Served by Notifier at GET /inbox/v1/widget.js; the token comes from POST /api/v1/recipients/{id}/inbox-token.
 */
(() => {
  "use strict";
  if (customElements.get("notifier-inbox")) return;

  const STYLE = `
    :host { position: relative; display: inline-block; font: 14px/1.4 system-ui, sans-serif; color: #1a1a1a; }
    button { font: inherit; cursor: pointer; }
    button:focus-visible { outline: 3px solid #1a56db; outline-offset: 2px; }
    .bell { position: relative; background: none; border: 1px solid #767676; border-radius: 8px; padding: 6px 10px; }
    .badge { position: absolute; top: -8px; right: -8px; min-width: 18px; padding: 0 5px; border-radius: 9px;
             background: #b3261e; color: #fff; font-size: 12px; line-height: 18px; text-align: center; }
    .badge[hidden] { display: none; }
    .panel { position: absolute; right: 0; z-index: 1000; width: 320px; max-height: 420px; overflow: auto;
             margin-top: 6px; background: #fff; border: 1px solid #767676; border-radius: 8px;
             box-shadow: 0 4px 16px rgba(0,0,0,.15); }
    .panel[hidden] { display: none; }
    .head { display: flex; justify-content: space-between; align-items: center; padding: 8px 12px;
            border-bottom: 1px solid #ddd; }
    ul { list-style: none; margin: 0; padding: 0; }
    li { padding: 10px 12px; border-bottom: 1px solid #eee; }
    li.unread { background: #eef3fd; }
    li .title { font-weight: 600; }
    li .actions { margin-top: 4px; }
    .link { background: none; border: none; color: #1a56db; padding: 0; text-decoration: underline; }
    .empty { padding: 16px 12px; color: #555; }
    .sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
  `;

  class NotifierInbox extends HTMLElement {
    constructor() {
      super();
      this.items = new Map();
      this.unread = 0;
      this.source = null;
      const root = this.attachShadow({ mode: "open" });
      root.innerHTML = `<style>${STYLE}</style>
        <button class="bell" part="bell" aria-haspopup="true" aria-expanded="false" aria-controls="panel">
          <span aria-hidden="true">&#128276;</span><span class="label sr">Notifications</span>
          <span class="badge" part="badge" hidden>0</span>
        </button>
        <div class="panel" id="panel" part="panel" role="region" aria-label="Notifications" hidden>
          <div class="head"><strong>Notifications</strong>
            <button class="link read-all" type="button">Mark all read</button></div>
          <ul class="list" aria-live="polite"></ul>
        </div>
        <span class="sr status" role="status" aria-live="polite"></span>`;
      this.$ = (sel) => root.querySelector(sel);
      this.$(".bell").addEventListener("click", () => this.toggle());
      this.$(".read-all").addEventListener("click", () => this.readAll());
      root.addEventListener("keydown", (e) => {
        if (e.key === "Escape" && !this.$(".panel").hidden) { this.toggle(false); this.$(".bell").focus(); }
      });
    }

    static get observedAttributes() { return ["token", "base-url"]; }
    attributeChangedCallback() { if (this.isConnected) this.start(); }
    connectedCallback() { this.start(); }
    disconnectedCallback() { if (this.source) this.source.close(); this.source = null; }

    get base() { return (this.getAttribute("base-url") || "").replace(/\/+$/, ""); }
    get token() { return this.getAttribute("token") || ""; }

    async api(path, method = "GET") {
      const res = await fetch(this.base + path, { method, headers: { Authorization: "Bearer " + this.token } });
      if (!res.ok) throw new Error("inbox request failed: " + res.status);
      return res.json();
    }

    async start() {
      if (!this.token) return;
      this.disconnectedCallback();
      try {
        const page = await this.api("/inbox/v1/messages?limit=50");
        page.items.slice().reverse().forEach((item) => this.items.set(item.id, item));
        this.setUnread(page.unread_count);
        this.render();
      } catch (err) { console.warn(err); }
      // EventSource cannot send headers: the token travels in the query. It reconnects by itself and sends
      // Last-Event-ID, so the server replays what was missed.
      this.source = new EventSource(this.base + "/inbox/v1/stream?token=" + encodeURIComponent(this.token));
      this.source.addEventListener("message", (e) => {
        const item = JSON.parse(e.data);
        const isNew = !this.items.has(item.id);
        this.items.set(item.id, item);
        this.render();
        if (isNew) this.$(".status").textContent = "New notification: " + item.title;
        this.dispatchEvent(new CustomEvent("notifier-message", { detail: item }));
      });
      this.source.addEventListener("unread", (e) => this.setUnread(JSON.parse(e.data).unread_count));
      // A refused reconnect (expired token) closes the EventSource for good: tell the page, which can set a
      // fresh `token` attribute (that restarts the widget).
      this.source.addEventListener("error", () => {
        if (this.source && this.source.readyState === EventSource.CLOSED) {
          this.dispatchEvent(new CustomEvent("notifier-disconnected", { bubbles: true }));
        }
      });
    }

    setUnread(n) {
      this.unread = n;
      const badge = this.$(".badge");
      badge.textContent = n > 99 ? "99+" : String(n);
      badge.hidden = n === 0;
      this.$(".label").textContent = n ? `Notifications, ${n} unread` : "Notifications";
    }

    toggle(open) {
      const panel = this.$(".panel");
      const show = open === undefined ? panel.hidden : open;
      panel.hidden = !show;
      this.$(".bell").setAttribute("aria-expanded", String(show));
    }

    async markRead(id) {
      const item = await this.api(`/inbox/v1/messages/${id}/read`, "POST");
      const wasUnread = !(this.items.get(item.id) || {}).read_at;
      this.items.set(item.id, item);
      this.render();
      // Keep keyboard focus in the list: the button just pressed is gone.
      const li = this.shadowRoot.querySelector(`li[data-id="${item.id}"]`);
      if (li) li.focus();
      if (wasUnread && this.unread > 0) this.setUnread(this.unread - 1);  // the stream's `unread` confirms
    }

    async readAll() {
      const res = await this.api("/inbox/v1/messages/read-all", "POST");
      for (const item of this.items.values()) item.read_at = item.read_at || new Date().toISOString();
      this.setUnread(res.unread_count);
      this.render();
    }

    render() {
      const list = this.$(".list");
      const items = [...this.items.values()].sort((a, b) => b.id - a.id);
      list.replaceChildren();
      if (!items.length) {
        const li = document.createElement("li");
        li.className = "empty";
        li.textContent = "No notifications";
        list.append(li);
        return;
      }
      for (const item of items) {
        const li = document.createElement("li");
        li.dataset.id = item.id;
        li.tabIndex = -1;
        li.className = item.read_at ? "read" : "unread";
        const title = document.createElement("div");
        title.className = "title";
        title.textContent = item.title;
        const body = document.createElement("div");
        body.className = "body";
        body.textContent = item.body;
        li.append(title, body);
        if (!item.read_at) {
          const actions = document.createElement("div");
          actions.className = "actions";
          const btn = document.createElement("button");
          btn.type = "button";
          btn.className = "link mark-read";
          btn.textContent = "Mark read";
          btn.setAttribute("aria-label", "Mark read: " + item.title);
          btn.addEventListener("click", () => this.markRead(item.id));
          actions.append(btn);
          li.append(actions);
        }
        list.append(li);
      }
    }
  }

  customElements.define("notifier-inbox", NotifierInbox);
})();
