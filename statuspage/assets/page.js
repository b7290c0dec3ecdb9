// Refreshes the status page from page.json every two seconds, with the
// page's own filters. It writes text only (textContent), never markup, so
// that a run id or a corrupt row cannot inject anything. The words for
// instants and spans repeat page.go's: change both together.
"use strict";
(function () {
  const body = document.body;
  const query = body.dataset.query;
  const url = "page.json" + (query ? "?" + query : "");
  const params = new URLSearchParams(query);
  const filtered = params.has("state") || params.has("run");
  const refresh = document.getElementById("refresh");
  let lastOK = null;

  function span(ms) {
    if (ms <= 0) return "0s";
    if (ms < 1000) return ms + "ms";
    if (ms > 9223372036854) return Math.floor(ms / (365.25 * 24 * 3600 * 1000)) + " years";
    let s = Math.round(ms / 1000);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    s = s % 60;
    let out = h > 0 ? h + "h" + m + "m" + s + "s" : m > 0 ? m + "m" + s + "s" : s + "s";
    return out.replace("m0s", "m").replace("h0m", "h");
  }
  function at(t) { return new Date(t).toISOString().replace(/\.\d+Z$/, "Z"); }
  function expires(l) {
    if (l.expires_in_ms === null) return "-";
    switch (l.state) {
      case "live": return "in " + span(l.expires_in_ms);
      case "expired": return span(-l.expires_in_ms) + " ago";
      case "released": return "released " + span(-l.expires_in_ms) + " ago";
    }
    return "-";
  }
  function takeover(l) {
    switch (l.state) {
      case "live": return "in " + span(l.expires_in_ms);
      case "corrupt": return "never: inspect the row";
    }
    return "possible now";
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function leaseRow(l, force) {
    const tr = el("tr", undefined, "state-" + l.state);
    tr.dataset.run = l.run_id;
    tr.append(el("td", l.run_id));
    if (l.state === "corrupt") {
      const td = el("td", "row does not parse: ", "row");
      td.colSpan = 2;
      td.append(el("code", l.row));
      const st = el("td");
      st.append(el("strong", "CORRUPT"));
      tr.append(td, st, el("td", "-"), el("td", takeover(l)));
    } else {
      const tk = el("td", takeover(l));
      if (l.state === "live" && l.takeover_at !== null) tk.title = "at " + at(l.takeover_at);
      tr.append(el("td", l.holder || "-"), el("td", String(l.fence)), el("td", l.state),
        el("td", expires(l)), tk);
    }
    if (force) {
      const td = el("td");
      if (l.state === "live" || l.state === "expired") {
        const a = el("a", "release…");
        a.href = "release?run=" + encodeURIComponent(l.run_id);
        td.append(a);
      }
      tr.append(td);
    }
    return tr;
  }
  function used(sc) {
    let s = String(sc.used);
    if (sc.limit !== null) {
      s += "/" + sc.limit;
      if (sc.used > sc.limit) s += " (over: the limit was lowered)";
    }
    return s;
  }
  function plural(n, what) { return n === 1 ? "1 " + what : n + " " + what + "s"; }
  function aheadText(ahead) {
    return ahead.length ? ahead.map(w => w.run_id + " (" + plural(w.units, "unit") + ")").join(", ") : "-";
  }
  // The instant the document was judged at, in ms: a waiter's until_ms
  // less its expires_in_ms.
  function nowMS(q) { return q.until_ms - q.expires_in_ms; }
  function explainURL(run) {
    const v = new URLSearchParams(query);
    v.set("explain", run);
    return "?" + v.toString() + "#explain";
  }
  function queueTable(sc, why) {
    const frag = document.createDocumentFragment();
    const h = el("h3", sc.scope + " ");
    h.append(el("span", sc.queue.length + " waiting, " + used(sc) + " used", "note"));
    const table = el("table", undefined, "queue");
    table.dataset.queue = sc.scope;
    const head = el("tr");
    for (const c of ["#", "run", "principal", "priority", "units", "waiting since", "why", ""]) head.append(el("th", c));
    const thead = el("thead");
    thead.append(head);
    const tbody = el("tbody");
    for (const q of sc.queue) {
      const w = (why[sc.scope] || {})[q.run_id] || { blocked_by: "unknown", text: "unknown" };
      const tr = el("tr", undefined, "why-" + w.blocked_by);
      tr.dataset.waiter = q.run_id;
      const since = el("td", span(nowMS(q) - q.enqueued_ms) + " ago");
      if (q.enqueued !== null) since.title = at(q.enqueued);
      const link = el("td");
      const a = el("a", "explain");
      a.href = explainURL(q.run_id);
      link.append(a);
      tr.append(el("td", String(q.position + 1)), el("td", q.run_id), el("td", q.principal || "-"),
        el("td", String(q.priority)), el("td", String(q.units)), since, el("td", w.text), link);
      tbody.append(tr);
    }
    table.append(thead, tbody);
    frag.append(h, table);
    return frag;
  }
  function renderQueues(p) {
    const parts = [];
    let n = 0;
    for (const sc of p.scopes) {
      if (sc.queue.length === 0) continue;
      n += sc.queue.length;
      parts.push(queueTable(sc, p.why || {}));
    }
    const none = el("p", "nobody waits", "empty");
    none.id = "no-queues";
    none.hidden = n > 0;
    document.getElementById("queues").replaceChildren(...parts, none);
  }
  function renderExplain(x) {
    const panel = document.getElementById("explain");
    panel.hidden = x === null;
    if (x === null) return;
    document.getElementById("explain-run").textContent = x.run_id;
    document.getElementById("explain-summary").textContent = x.summary;
    const rows = x.scopes.map(se => {
      const tr = el("tr");
      tr.dataset.scope = se.scope;
      tr.append(el("td", se.scope), el("td", se.used + "/" + se.limit), el("td", String(se.units)),
        el("td", se.queued ? (se.position + 1) + " of " + se.queue_length : "not queued"),
        el("td", String(se.reserved)), el("td", se.why.text), el("td", aheadText(se.ahead)),
        el("td", holders({ slots: se.holders })));
      return tr;
    });
    document.querySelector("#explain-scopes tbody").replaceChildren(...rows);
  }
  function holders(sc) {
    const parts = sc.slots.map(s => s.corrupt ? "CORRUPT row " + JSON.stringify(s.key)
      : s.run_id + " (slot " + s.slot + ", in " + span(s.expires_in_ms) + ")");
    return parts.length ? parts.join(", ") : "-";
  }
  function scopeRow(sc) {
    const tr = el("tr");
    tr.dataset.scope = sc.scope;
    const fill = el("td");
    if (sc.limit !== null) {
      const m = el("meter");
      m.min = 0; m.max = sc.limit; m.value = sc.used;
      fill.append(m);
    }
    tr.append(el("td", sc.scope), el("td", used(sc)), fill, el("td", holders(sc)));
    return tr;
  }
  function empty(cols, text) {
    const tr = el("tr", undefined, "empty");
    const td = el("td", text);
    td.colSpan = cols;
    tr.append(td);
    return tr;
  }
  function render(p) {
    document.getElementById("now").textContent = at(p.now);
    const leases = p.leases.map(l => leaseRow(l, p.force_release));
    document.querySelector("#leases tbody").replaceChildren(
      ...(leases.length ? leases : [empty(7, filtered ? "no leases match these filters" : "no leases")]));
    const scopes = p.scopes.map(scopeRow);
    document.querySelector("#scopes tbody").replaceChildren(
      ...(scopes.length ? scopes : [empty(4, "no slots held")]));
    for (const s of ["live", "expired", "released", "corrupt"]) {
      document.getElementById("count-" + s).textContent = p.counts[s];
    }
    const corrupt = p.counts.corrupt + p.corrupt_slots;
    document.getElementById("corrupt-count").textContent = corrupt;
    document.getElementById("corrupt-banner").hidden = corrupt === 0;
    document.getElementById("showing").textContent = p.leases.length
      ? "leases " + (p.offset + 1) + "–" + (p.offset + p.leases.length) + " of " + p.matched
      : "0 of " + p.matched;
    const hidden = document.getElementById("released-hidden");
    if (hidden) hidden.textContent = p.counts.released;
    const note = document.getElementById("hidden-note");
    if (note && hidden) note.textContent = p.counts.released ? "(" + p.counts.released + " released hidden)" : "";
    renderQueues(p);
    renderExplain(p.explain);
  }
  async function tick() {
    try {
      const r = await fetch(url, { cache: "no-store", credentials: "same-origin" });
      if (!r.ok) throw new Error(r.status + " " + (await r.text()).trim());
      render(await r.json());
      lastOK = new Date();
      refresh.textContent = "Refreshes every 2 seconds.";
      refresh.classList.remove("stale");
    } catch (e) {
      refresh.textContent = "Refresh failed (" + e.message + "); showing the store as of " +
        (lastOK ? at(lastOK) : "page load") + ".";
      refresh.classList.add("stale");
    }
    setTimeout(tick, 2000);
  }
  setTimeout(tick, 2000);
})();
