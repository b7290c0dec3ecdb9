// Refreshes the status page from status.json every two seconds, with the
// page's own filters. It writes text only (textContent), never markup, so
// that a run id or a corrupt row cannot inject anything. The words for
// instants and spans repeat page.go's: change both together.
"use strict";
(function () {
  const body = document.body;
  const query = body.dataset.query;
  const url = "status.json" + (query ? "?" + query : "");
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
      case "live": return l.until === null ? "at until_ms " + l.until_ms : "at " + at(l.until);
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
      tr.append(el("td", l.holder || "-"), el("td", String(l.fence)), el("td", l.state),
        el("td", expires(l)), el("td", takeover(l)));
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
      ...(leases.length ? leases : [empty(7, query ? "no leases match these filters" : "no leases")]));
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
