/* <notifier-inbox base-url="https://notifier.example.com" token="…" [locale="de"]>: a bell with the unread count
 * and the user's in-app notifications, live (Server-Sent Events): tabs (all, unread, archived), pages ("Load
 * more"), relative times, an action URL per item (opened on click, counted as a click), mark read, archive,
 * and a link to the user's preference center. English and German; the language is the `locale` attribute, else
 * the recipient's locale, else the browser's. No dependencies. Keyboard: Tab to the bell, Enter/Space opens,
 * Tab through tabs and items, Escape closes and returns focus to the bell.
 * Served by Notifier at GET /inbox/v1/widget.js; the token comes from POST /api/v1/recipients/{id}/inbox-token.
 */
(() => {
  "use strict";
  if (customElements.get("notifier-inbox")) return;

  const STRINGS = {
    en: {
      notifications: "Notifications",
      unreadLabel: (n) => `Notifications, ${n} unread`,
      markAllRead: "Mark all read",
      markRead: "Mark read",
      archive: "Archive",
      unarchive: "Unarchive",
      empty: "No notifications",
      emptyArchived: "Nothing archived",
      loadMore: "Load more",
      tabs: "Notification filters",
      all: "All",
      unread: "Unread",
      archived: "Archived",
      preferences: "Notification settings",
      newItem: (title) => `New notification: ${title}`,
      open: (title) => `Open: ${title}`,
      failed: "Could not load notifications",
    },
    de: {
      notifications: "Benachrichtigungen",
      unreadLabel: (n) => `Benachrichtigungen, ${n} ungelesen`,
      markAllRead: "Alle als gelesen markieren",
      markRead: "Als gelesen markieren",
      archive: "Archivieren",
      unarchive: "Wiederherstellen",
      empty: "Keine Benachrichtigungen",
      emptyArchived: "Nichts archiviert",
      loadMore: "Mehr laden",
      tabs: "Benachrichtigungsfilter",
      all: "Alle",
      unread: "Ungelesen",
      archived: "Archiviert",
      preferences: "Benachrichtigungseinstellungen",
      newItem: (title) => `Neue Benachrichtigung: ${title}`,
      open: (title) => `Öffnen: ${title}`,
      failed: "Benachrichtigungen konnten nicht geladen werden",
    },
  };
  const PAGE = 20;
  // How long the first page waits for the stream to open (it loads anyway when the stream cannot).
  const OPEN_WAIT_MS = 3000;
  const TABS = ["all", "unread", "archived"];
  // An inline bell: icon fonts and emoji are not installed everywhere (an emoji bell renders as an empty box).
  const BELL = `<svg class="icon" viewBox="0 0 24 24" width="20" height="20" aria-hidden="true" focusable="false">
    <path fill="currentColor" d="M12 22a2.5 2.5 0 0 0 2.45-2h-4.9A2.5 2.5 0 0 0 12 22Zm7-6V11a7 7 0 0 0-5.5-6.84V3.5
    a1.5 1.5 0 0 0-3 0v.66A7 7 0 0 0 5 11v5l-2 2v1h18v-1l-2-2Z"/></svg>`;

  const STYLE = `
    :host { position: relative; display: inline-block; font: 14px/1.4 system-ui, sans-serif; color: #1a1a1a; }
    button { font: inherit; cursor: pointer; }
    button:focus-visible, a:focus-visible { outline: 3px solid #1a56db; outline-offset: 2px; }
    .bell { position: relative; display: inline-flex; align-items: center; background: none;
            border: 1px solid #767676; border-radius: 8px; padding: 6px 10px; color: inherit; }
    .badge { position: absolute; top: -8px; right: -8px; min-width: 18px; padding: 0 5px; border-radius: 9px;
             background: #b3261e; color: #fff; font-size: 12px; line-height: 18px; text-align: center; }
    .badge[hidden] { display: none; }
    .panel { position: absolute; right: 0; z-index: 1000; width: 340px; max-height: 480px; overflow: auto;
             margin-top: 6px; background: #fff; border: 1px solid #767676; border-radius: 8px;
             box-shadow: 0 4px 16px rgba(0,0,0,.15); }
    .panel[hidden] { display: none; }
    .head { display: flex; justify-content: space-between; align-items: center; padding: 8px 12px;
            border-bottom: 1px solid #ddd; gap: 8px; }
    .tabs { display: flex; gap: 4px; padding: 6px 12px 0; border-bottom: 1px solid #ddd; }
    .tab { background: none; border: none; border-bottom: 3px solid transparent; padding: 4px 8px; color: #444; }
    .tab[aria-selected="true"] { border-bottom-color: #1a56db; color: #1a1a1a; font-weight: 600; }
    ul { list-style: none; margin: 0; padding: 0; }
    li { padding: 10px 12px; border-bottom: 1px solid #eee; }
    li.unread { background: #eef3fd; }
    li .title { font-weight: 600; }
    li a.title { color: #1a56db; }
    li time { display: block; color: #555; font-size: 12px; margin-top: 2px; }
    li .actions { margin-top: 4px; display: flex; gap: 12px; }
    .link { background: none; border: none; color: #1a56db; padding: 0; text-decoration: underline; }
    .empty { padding: 16px 12px; color: #555; }
    .more { display: block; width: 100%; padding: 8px; background: #f6f6f6; border: none; color: #1a56db; }
    .more[hidden] { display: none; }
    .foot { padding: 8px 12px; border-top: 1px solid #ddd; }
    .foot a { color: #1a56db; }
    .foot a[hidden] { display: none; }
    .sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
  `;

  // Largest unit first: "3 hours ago" rather than "180 minutes ago".
  const UNITS = [["year", 31536000], ["month", 2592000], ["week", 604800], ["day", 86400], ["hour", 3600],
                 ["minute", 60], ["second", 1]];

  function isWebUrl(url) {
    try { return ["http:", "https:"].includes(new URL(url).protocol); } catch (_) { return false; }
  }

  class NotifierInbox extends HTMLElement {
    constructor() {
      super();
      this.tab = "all";
      this.items = new Map();
      this.next = null;
      this.unread = 0;
      this.source = null;
      this.me = null;
      this.runs = 0;        // starts so far: a start that finds a newer one running gives way to it
      this.loads = 0;       // first-page loads so far: only the latest one's answer (and its pages) is shown
      this.arrived = null;  // items the stream sent while a first page was loading
      this.restarting = false;
      this.ticker = null;
      const root = this.attachShadow({ mode: "open" });
      root.innerHTML = `<style>${STYLE}</style>
        <button class="bell" part="bell" type="button" aria-haspopup="true" aria-expanded="false"
                aria-controls="panel">${BELL}<span class="label sr"></span>
          <span class="badge" part="badge" aria-hidden="true" hidden>0</span>
        </button>
        <div class="panel" id="panel" part="panel" role="region" hidden>
          <div class="head"><strong class="heading"></strong>
            <button class="link read-all" type="button"></button></div>
          <div class="tabs" role="tablist">${TABS.map((t) =>
            `<button class="tab" type="button" role="tab" id="tab-${t}" data-tab="${t}" aria-controls="list"
                     aria-selected="${t === "all"}"></button>`).join("")}</div>
          <ul class="list" id="list" role="tabpanel" aria-labelledby="tab-all"></ul>
          <button class="more" type="button" hidden></button>
          <div class="foot"><a class="prefs" part="preferences" target="_blank" rel="noopener" hidden></a></div>
        </div>
        <span class="sr status" role="status" aria-live="polite"></span>`;
      this.$ = (sel) => root.querySelector(sel);
      this.$(".bell").addEventListener("click", () => this.toggle());
      this.$(".read-all").addEventListener("click", () => this.readAll());
      this.$(".more").addEventListener("click", () => this.load(true));
      root.querySelectorAll(".tab").forEach((b) => b.addEventListener("click", () => this.select(b.dataset.tab)));
      root.addEventListener("keydown", (e) => {
        if (e.key === "Escape" && !this.$(".panel").hidden) { this.toggle(false); this.$(".bell").focus(); }
      });
      this.labels();
    }

    static get observedAttributes() { return ["token", "base-url", "locale"]; }
    attributeChangedCallback(name) {
      if (name === "locale") { this.labels(); this.render(); return; }
      this.restart();
    }
    connectedCallback() {
      this.restart();
      // Relative times age: refresh them once a minute.
      this.ticker = setInterval(() => this.render(), 60000);
    }
    disconnectedCallback() {
      this.stop();
      clearInterval(this.ticker);
    }
    // Upgrading an element that already has its attributes calls attributeChangedCallback for each of them and
    // then connectedCallback: they all make one start, after the current task.
    restart() {
      if (this.restarting) return;
      this.restarting = true;
      queueMicrotask(() => {
        this.restarting = false;
        if (this.isConnected) this.start();
      });
    }
    stop() { if (this.source) this.source.close(); this.source = null; }

    get base() { return (this.getAttribute("base-url") || "").replace(/\/+$/, ""); }
    get token() { return this.getAttribute("token") || ""; }
    // The language: the `locale` attribute, else the recipient's, else the browser's; English if unsupported.
    get locale() {
      return this.getAttribute("locale") || (this.me && this.me.locale) || navigator.language || "en";
    }
    get lang() {
      const lang = this.locale.replace("_", "-").split("-")[0].toLowerCase();
      return STRINGS[lang] ? lang : "en";
    }
    get t() { return STRINGS[this.lang]; }

    async api(path, method = "GET") {
      const res = await fetch(this.base + path, { method, headers: { Authorization: "Bearer " + this.token } });
      if (!res.ok) throw new Error("inbox request failed: " + res.status);
      return res.json();
    }

    async start() {
      this.stop();
      if (!this.token) return;
      const run = ++this.runs;
      // The stream opens first and the first page loads once it is open: an item stored meanwhile is then in
      // the page or sent on the stream (or both: the list keeps one per id), never in neither.
      const opened = this.connect();
      try {
        this.me = await this.api("/inbox/v1/me");
      } catch (err) { console.warn(err); }
      if (run !== this.runs) return;
      this.labels();
      await opened;
      if (run !== this.runs) return;
      await this.load(false);
    }

    // Open the stream; resolve once it is open, or failed, or OPEN_WAIT_MS passed.
    connect() {
      // EventSource cannot send headers: the token travels in the query. It reconnects by itself and sends
      // Last-Event-ID, so the server replays what was missed.
      const source = new EventSource(this.base + "/inbox/v1/stream?token=" + encodeURIComponent(this.token));
      this.source = source;
      source.addEventListener("message", (e) => {
        const item = JSON.parse(e.data);
        const isNew = !this.items.has(item.id);
        // A new item belongs in "all" and "unread", never in "archived".
        if (this.tab !== "archived" && !item.archived_at) {
          this.items.set(item.id, item);
          if (this.arrived) this.arrived.set(item.id, item);
          this.render();
        }
        if (isNew) this.$(".status").textContent = this.t.newItem(item.title);
        this.dispatchEvent(new CustomEvent("notifier-message", { detail: item }));
      });
      source.addEventListener("unread", (e) => this.setUnread(JSON.parse(e.data).unread_count));
      // A refused reconnect (expired token) closes the EventSource for good: tell the page, which can set a
      // fresh `token` attribute (that restarts the widget).
      source.addEventListener("error", () => {
        if (this.source === source && source.readyState === EventSource.CLOSED) {
          this.dispatchEvent(new CustomEvent("notifier-disconnected", { bubbles: true }));
        }
      });
      return new Promise((resolve) => {
        source.addEventListener("open", resolve, { once: true });
        source.addEventListener("error", resolve, { once: true });
        setTimeout(resolve, OPEN_WAIT_MS);
      });
    }

    // One page of the current tab: the first (replacing the list) or the next ("Load more").
    async load(more) {
      if (more && !this.next) return;
      const query = new URLSearchParams({ limit: String(PAGE) });
      if (this.tab === "unread") query.set("unread", "true");
      if (this.tab === "archived") query.set("archived", "true");
      if (more) query.set("cursor", this.next);
      // A first page replaces the list: a later first page (a tab switch, a restart) supersedes it and every
      // page asked for before it, so an answer that arrives late never overwrites a newer list.
      const load = more ? this.loads : ++this.loads;
      if (!more) this.arrived = new Map();
      const before = more ? this.items.size : 0;
      try {
        const page = await this.api("/inbox/v1/messages?" + query);
        if (load !== this.loads) return;
        if (!more) {
          this.items = new Map();
          (page.items || page.results || []).forEach((item) => this.items.set(item.id, item));
          // What the stream sent while the page loaded may be newer than the page: keep it.
          for (const [id, item] of this.arrived) this.items.set(id, item);
          this.arrived = null;
        } else {
          (page.items || page.results || []).forEach((item) => this.items.set(item.id, item));
        }
        this.next = page.next_cursor || null;
        this.setUnread(page.unread_count);
        this.render();
      } catch (err) {
        console.warn(err);
        if (load === this.loads) this.$(".status").textContent = this.t.failed;
      }
      if (more && load === this.loads) {
        const items = this.shadowRoot.querySelectorAll("li[data-id]");
        // Keyboard users continue where the new page begins; the button may be gone.
        const first = items[Math.min(before, items.length - 1)];
        if (first) first.focus();
      }
    }

    select(tab) {
      if (!TABS.includes(tab) || tab === this.tab) return;
      this.tab = tab;
      this.shadowRoot.querySelectorAll(".tab").forEach((b) => b.setAttribute("aria-selected", String(b.dataset.tab === tab)));
      this.$(".list").setAttribute("aria-labelledby", "tab-" + tab);
      this.next = null;
      this.items = new Map();
      this.render();
      this.load(false);
    }

    labels() {
      const t = this.t;
      this.$(".panel").setAttribute("aria-label", t.notifications);
      this.$(".heading").textContent = t.notifications;
      this.$(".read-all").textContent = t.markAllRead;
      this.$(".more").textContent = t.loadMore;
      this.$(".tabs").setAttribute("aria-label", t.tabs);
      this.shadowRoot.querySelectorAll(".tab").forEach((b) => { b.textContent = t[b.dataset.tab]; });
      const prefs = this.$(".prefs");
      prefs.textContent = t.preferences;
      if (this.me && isWebUrl(this.me.preferences_url || "")) {
        prefs.href = this.me.preferences_url;
        prefs.hidden = false;
      }
      this.setUnread(this.unread);
    }

    setUnread(n) {
      this.unread = n || 0;
      const badge = this.$(".badge");
      badge.textContent = this.unread > 99 ? "99+" : String(this.unread);
      badge.hidden = this.unread === 0;
      this.$(".label").textContent = this.unread ? this.t.unreadLabel(this.unread) : this.t.notifications;
    }

    // One item fewer unread. An open stream sends the new count itself (before or after our own request's answer
    // arrives), so only without one is the badge counted down here.
    countDown() {
      const live = this.source && this.source.readyState === EventSource.OPEN;
      if (!live && this.unread > 0) this.setUnread(this.unread - 1);
    }

    toggle(open) {
      const panel = this.$(".panel");
      const show = open === undefined ? panel.hidden : open;
      panel.hidden = !show;
      this.$(".bell").setAttribute("aria-expanded", String(show));
    }

    relative(iso) {
      const seconds = (new Date(iso).getTime() - Date.now()) / 1000;
      const fmt = new Intl.RelativeTimeFormat(this.locale, { numeric: "auto" });
      for (const [unit, size] of UNITS) {
        if (Math.abs(seconds) >= size || unit === "second") return fmt.format(Math.round(seconds / size), unit);
      }
      return "";
    }

    focusItem(id) {
      const li = this.shadowRoot.querySelector(`li[data-id="${id}"]`) || this.$(".list li") || this.$(".bell");
      li.focus();
    }

    async markRead(id) {
      const item = await this.api(`/inbox/v1/messages/${id}/read`, "POST");
      const wasUnread = !(this.items.get(item.id) || {}).read_at;
      if (this.tab === "unread") this.items.delete(item.id); else this.items.set(item.id, item);
      this.render();
      // Keep keyboard focus in the list: the button just pressed is gone.
      this.focusItem(item.id);
      if (wasUnread) this.countDown();
    }

    async archive(id, archived) {
      const ids = [...this.items.keys()].sort((a, b) => b - a);
      const next = ids[ids.indexOf(id) + 1] || ids[ids.indexOf(id) - 1];
      const item = await this.api(`/inbox/v1/messages/${id}/${archived ? "archive" : "unarchive"}`, "POST");
      const wasUnread = !(this.items.get(item.id) || {}).read_at;
      // It leaves this tab either way: archived items are only under "archived", and back out of it.
      this.items.delete(item.id);
      this.render();
      this.focusItem(next);
      if (archived && wasUnread) this.countDown();
    }

    // Count the click (keepalive: the request outlives a navigation) and let the link open.
    click(item) {
      fetch(`${this.base}/inbox/v1/messages/${item.id}/click`, {
        method: "POST", keepalive: true, headers: { Authorization: "Bearer " + this.token },
      }).catch((err) => console.warn(err));
      if (!item.read_at) {
        item.read_at = new Date().toISOString();
        this.countDown();
        setTimeout(() => this.render(), 0);
      }
      this.dispatchEvent(new CustomEvent("notifier-click", { detail: item }));
    }

    async readAll() {
      const res = await this.api("/inbox/v1/messages/read-all", "POST");
      if (this.tab === "unread") this.items = new Map();
      for (const item of this.items.values()) item.read_at = item.read_at || new Date().toISOString();
      this.setUnread(res.unread_count);
      this.render();
    }

    action(label, aria, cls, handler) {
      const btn = document.createElement("button");
      btn.type = "button";
      btn.className = "link " + cls;
      btn.textContent = label;
      btn.setAttribute("aria-label", aria);
      btn.addEventListener("click", handler);
      return btn;
    }

    render() {
      const t = this.t;
      const list = this.$(".list");
      const items = [...this.items.values()].sort((a, b) => b.id - a.id);
      list.replaceChildren();
      this.$(".more").hidden = !this.next;
      if (!items.length) {
        const li = document.createElement("li");
        li.className = "empty";
        li.textContent = this.tab === "archived" ? t.emptyArchived : t.empty;
        list.append(li);
        return;
      }
      for (const item of items) {
        const li = document.createElement("li");
        li.dataset.id = item.id;
        li.tabIndex = -1;
        li.className = item.read_at ? "read" : "unread";
        let title;
        if (item.url && isWebUrl(item.url)) {
          title = document.createElement("a");
          title.href = item.url;
          title.target = this.getAttribute("link-target") || "_blank";
          title.rel = "noopener";
          title.setAttribute("aria-label", t.open(item.title));
          title.addEventListener("click", () => this.click(item));
        } else {
          title = document.createElement("div");
        }
        title.className = "title";
        title.textContent = item.title;
        const body = document.createElement("div");
        body.className = "body";
        body.textContent = item.body;
        const time = document.createElement("time");
        time.dateTime = item.created_at;
        time.title = new Date(item.created_at).toLocaleString(this.locale);
        time.textContent = this.relative(item.created_at);
        const actions = document.createElement("div");
        actions.className = "actions";
        if (!item.read_at) {
          actions.append(this.action(t.markRead, `${t.markRead}: ${item.title}`, "mark-read", () => this.markRead(item.id)));
        }
        if (item.archived_at) {
          actions.append(this.action(t.unarchive, `${t.unarchive}: ${item.title}`, "unarchive", () => this.archive(item.id, false)));
        } else {
          actions.append(this.action(t.archive, `${t.archive}: ${item.title}`, "archive", () => this.archive(item.id, true)));
        }
        li.append(title, body, time, actions);
        list.append(li);
      }
    }
  }

  customElements.define("notifier-inbox", NotifierInbox);
})();
