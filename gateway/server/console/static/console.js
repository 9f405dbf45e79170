// The agent-gateway console: the approvals inbox (live through server-sent events), the calls
// timeline and a call's story, the overview's charts (inline SVG drawn from the server's counts),
// what-if replay, the chain's verify status. Everything shown goes in through textContent or
// attributes set one by one, never HTML: an agent's command is text, whatever it holds.
"use strict";

// The session's key: handed to this page in the sign-in's redirect (#key=...), kept in this tab's
// storage (this origin's alone: another port of the host cannot read it, unlike the cookie) and
// sent with every request; without it the cookie opens nothing.
function sessionKey() {
  const found = /^#key=([A-Za-z0-9_-]+)$/.exec(window.location.hash);
  if (found) {
    sessionStorage.setItem("agw_console_key", found[1]);
    history.replaceState(null, "", window.location.pathname);
  }
  return sessionStorage.getItem("agw_console_key") || "";
}
let csrf = sessionKey();
const byId = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("data-") || key.startsWith("aria-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child !== null && child !== undefined && child !== "") node.append(child);
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

// A path or command that may break only after a "/" or a space, never inside a word.
function breakable(text) {
  const span = el("span", { class: "path" });
  const parts = String(text).split(/(?<=\/)/);
  parts.forEach((part, i) => {
    span.append(part);
    if (i < parts.length - 1) span.append(el("wbr"));
  });
  return span;
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
  opts.headers["X-CSRF-Token"] = csrf;
  if (opts.method && opts.method !== "GET") opts.headers["Content-Type"] = "application/json";
  const response = await fetch("/console/api/" + path, opts);
  if (response.status === 401) {
    window.location.assign("/console/login");
    throw new Error("signed out");
  }
  const body = await response.json().catch(() => ({ error: "the answer was not JSON" }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// --- views ------------------------------------------------------------------------------------
const VIEWS = ["inbox", "calls", "call", "overview", "replay"];

function show(view) {
  for (const v of VIEWS) byId(v).hidden = v !== view;
  for (const a of document.querySelectorAll("nav a.tab")) a.classList.toggle("current", a.id === "tab-" + view || (view === "call" && a.id === "tab-calls"));
}

function route() {
  const hash = window.location.hash.replace(/^#/, "");
  if (hash.startsWith("call/")) {
    show("call");
    openCall(decodeURIComponent(hash.slice(5)));
  } else if (VIEWS.includes(hash) && hash !== "call") {
    show(hash);
    if (hash === "calls") loadCalls();
    if (hash === "overview") loadOverview();
  } else {
    show("inbox");
  }
}

// --- approvals ---------------------------------------------------------------------------------
let shown = [];
let selected = 0;
let notifiedFor = 0;

function fact(list, name, value) {
  list.append(el("dt", { text: name }), el("dd", {}, typeof value === "string" ? breakable(value) : value));
}

function groupList(title, groups, cls) {
  if (!groups.length) return null;
  const dd = el("dd", { class: cls });
  for (const g of groups) {
    const line = g.items.length > 1 || (g.items.length === 1 && !g.summary.includes(g.items[0]))
      ? el("details", { class: "group " + (g.tone || "") }, el("summary", { text: g.summary }),
        el("ul", {}, ...g.items.map((i) => el("li", {}, breakable(i)))),
        g.count > g.items.length ? el("p", { class: "note", text: (g.count - g.items.length) + " more" }) : null)
      : el("div", { class: "group " + (g.tone || "") }, breakable(g.summary));
    dd.append(line);
  }
  return [el("dt", { text: title }), dd];
}

function card(item, index) {
  const left = el("span", { class: "left", "data-expires": String(item.expires) });
  const c = item.card || { runs: [], reads: [], writes: [], rules: [] };
  const will = el("dl", { class: "will" });
  for (const [title, groups, cls] of [["runs", c.runs, "runs"], ["reads", c.reads, "reads"], ["writes", c.writes, "writes"]]) {
    const parts = groupList(title, groups, cls);
    if (parts) will.append(...parts);
  }
  if (!c.reads.length && !c.writes.length && c.recorded) will.append(el("dt", { text: "paths" }), el("dd", { text: "none checked by the jail" }));
  const rules = el("dl", { class: "rules" });
  for (const r of c.rules) {
    rules.append(el("dt", { text: "rule" }), el("dd", {}, el("b", { class: "rule-id", text: r.rule }), " ", el("span", { class: "why", text: r.why })));
    rules.append(el("dt", { text: "risk" }), el("dd", { class: r.risk ? "risk" : "risk none", text: r.risk || "the rule names none" }));
  }
  const facts = el("dl", { class: "facts" });
  fact(facts, "cwd", item.cwd);
  if (item.env.length === 0) fact(facts, "env", "(none besides the sandbox's own)");
  for (const v of item.env) {
    const origin = v.from === "call" ? (v.overrides ? "this call, overrides the stored value" : "this call") : "stored (env tool)";
    fact(facts, "env " + v.name, v.value + "  (" + origin + ")");
  }
  fact(facts, "why", item.reason);
  const heads = [];
  if (item.files) for (const f of item.files) {
    const state = f.error ? "cannot be bound (" + f.error + "): an approval of this call is void"
      : f.kind && f.kind.endsWith("-lookup") ? "module lookup" : f.absent ? "absent (bound as absent: planting it voids the approval)"
      : f.bytes + " bytes, sha256 " + f.sha256;
    fact(facts, "file", f.path + "  " + state + "  (" + f.why + ")");
    if (f.head && !(f.kind || "").endsWith("-lookup")) heads.push(el("pre", { class: "file-head", text: f.path + ":\n" + f.head.join("\n")
      + (f.head_complete ? "" : "\n... (first lines only: gateway approvals show " + item.call_id + ")") }));
  }
  fact(facts, "digest", item.digest);
  const reason = el("input", { class: "reason", type: "text", placeholder: "reason for a denial (reaches the agent and the audit log)", maxLength: 4000 });
  const status = el("span", { class: "error" });
  const answer = (verb, body) => async () => {
    status.textContent = "";
    try {
      // the digest shown: an answer binds to this exact request (the fleet's store checks it)
      await api("approvals/" + encodeURIComponent(item.call_id) + "/" + verb, { method: "POST", body: JSON.stringify({ ...body(), digest: item.digest }) });
      await loadApprovals();
    } catch (err) {
      status.textContent = String(err.message || err);
    }
  };
  const deny = answer("deny", () => ({ reason: reason.value }));
  reason.addEventListener("keydown", (event) => {
    if (event.key === "Enter") { event.preventDefault(); deny(); }
    if (event.key === "Escape") reason.blur();
  });
  const actions = el("div", { class: "actions" },
    el("button", { class: "approve", type: "button", text: "Approve once", title: "a", onclick: answer("approve", () => ({})) }),
    el("button", { class: "approve-session", type: "button", text: "Approve for this session", title: "s", onclick: answer("approve", () => ({ scope: "session" })) }),
    reason,
    el("button", { class: "deny", type: "button", text: "Deny", title: "d", onclick: deny }),
    status);
  const li = el("li", { class: "approval" + (index === selected ? " selected" : ""), "data-call-id": item.call_id, tabIndex: -1 },
    el("div", { class: "head" }, el("span", { class: "who", text: item.principal + " · " + item.tool + (item.host ? " · on " + item.host : "") }), left,
      el("a", { class: "call-id", href: "#call/" + encodeURIComponent(item.call_id), text: "call " + item.call_id })),
    el("pre", { class: "command", text: item.command }),
    will, rules,
    el("details", { class: "more" }, el("summary", { text: "cwd, environment, files, digest (" + item.command_chars + " characters of command, shown whole)" }), facts, ...heads),
    actions);
  li.addEventListener("click", () => select(shown.findIndex((s) => s.call_id === item.call_id), false));
  return li;
}

function select(index, scroll) {
  const cards = document.querySelectorAll("li.approval");
  if (!cards.length) return;
  selected = Math.max(0, Math.min(cards.length - 1, index));
  cards.forEach((c, i) => c.classList.toggle("selected", i === selected));
  if (scroll) cards[selected].scrollIntoView({ block: "nearest" });
}

function title() {
  const n = shown.length;
  document.title = (n ? "(" + n + ") waiting · " : "") + "agent-gateway console";
  byId("count").textContent = String(n);
  byId("count").classList.toggle("zero", n === 0);
  if (n > notifiedFor && "Notification" in window && Notification.permission === "granted") {
    const first = shown[shown.length - 1];
    new Notification(n === 1 ? "1 call waits for a supervisor" : n + " calls wait for a supervisor",
      { body: first.principal + ": " + first.command.slice(0, 120), tag: "agw-inbox" });
  }
  notifiedFor = n;
}

async function loadApprovals() {
  let body;
  try {
    body = await api("approvals");
    byId("inbox-error").hidden = true;
  } catch (err) {
    byId("inbox-error").textContent = "could not load the approvals: " + (err.message || err);
    byId("inbox-error").hidden = false;
    return;
  }
  const list = byId("approvals");
  const typed = {};
  const open = {};
  for (const li of list.children) {
    typed[li.dataset.callId] = li.querySelector("input.reason").value;
    open[li.dataset.callId] = Array.from(li.querySelectorAll("details")).map((d) => d.open);
  }
  const focused = document.activeElement && document.activeElement.classList.contains("reason")
    ? document.activeElement.closest("li").dataset.callId : null;
  const was = shown[selected] ? shown[selected].call_id : null;
  shown = body.approvals;
  const keep = shown.findIndex((s) => s.call_id === was);
  selected = keep >= 0 ? keep : Math.min(selected, Math.max(0, shown.length - 1));
  list.replaceChildren(...shown.map((item, i) => {
    const li = card(item, i);
    if (typed[item.call_id]) li.querySelector("input.reason").value = typed[item.call_id];
    const details = li.querySelectorAll("details");
    (open[item.call_id] || []).forEach((o, k) => { if (details[k]) details[k].open = o; });
    return li;
  }));
  if (focused) {
    const box = list.querySelector('li[data-call-id="' + CSS.escape(focused) + '"] input.reason');
    if (box) box.focus();
  }
  byId("inbox-empty").hidden = shown.length > 0;
  title();
  tick();
}

function tick() {
  const now = Date.now() / 1000;
  for (const span of document.querySelectorAll("span.left")) {
    const left = Math.max(0, Math.round(Number(span.dataset.expires) - now));
    span.textContent = left >= 120 ? Math.floor(left / 60) + " min left" : left + " s left";
    span.classList.toggle("urgent", left < 30);
  }
}

function keys(event) {
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  const target = event.target;
  if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT")) return;
  if (byId("inbox").hidden) return;
  const cards = document.querySelectorAll("li.approval");
  const current = cards[selected];
  const click = (selector) => { if (current) current.querySelector(selector).click(); };
  switch (event.key) {
    case "j": select(selected + 1, true); break;
    case "k": select(selected - 1, true); break;
    case "a": click("button.approve"); break;
    case "s": click("button.approve-session"); break;
    case "d": click("button.deny"); break;
    case "r": if (current) { event.preventDefault(); current.querySelector("input.reason").focus(); } break;
    default: return;
  }
}

function listen() {
  const source = new EventSource("/console/api/events?csrf=" + encodeURIComponent(csrf));
  const live = byId("live");
  source.addEventListener("hello", () => {
    live.textContent = "live";
    live.className = "live on";
    loadApprovals();
  });
  for (const kind of ["added", "answered", "withdrawn"]) {
    source.addEventListener(kind, () => {
      loadApprovals();
      if (!byId("calls").hidden) loadCalls();
    });
  }
  source.onerror = () => {
    live.textContent = "live: reconnecting";
    live.className = "live off";
    fetch("/console/api/session", { credentials: "same-origin", headers: { "X-CSRF-Token": csrf } }).then((r) => {
      if (r.status === 401) window.location.assign("/console/login");
    });
  };
}

// --- calls -------------------------------------------------------------------------------------
function filters() {
  const params = new URLSearchParams();
  for (const [key, value] of new FormData(byId("filters"))) if (value) params.set(key, value);
  return params;
}

function when(ts) {
  const t = String(ts || "");
  return t.slice(0, 10) + " " + t.slice(11, 19);
}

function decided(c) {
  const text = (c.decision || "-") + (c.rule ? " · " + c.rule : "") + (c.final && c.final !== c.decision ? " → " + c.final : "");
  return el("span", { class: "decision " + (c.final || c.decision || ""), text });
}

function outcome(c) {
  let text = c.outcome + (c.exit_code !== null && c.exit_code !== undefined ? " · exit " + c.exit_code : "");
  if (c.error && c.outcome !== "ok") text += " · " + c.error;
  return text;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  return n < 1024 ? n + " B" : n < 1048576 ? (n / 1024).toFixed(1) + " KiB" : (n / 1048576).toFixed(1) + " MiB";
}

function took(ms) {
  if (ms === null || ms === undefined) return "-";
  return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(1) + " s";
}

let oldest = null;

function callRow(c) {
  const expand = el("button", { type: "button", class: "expand", text: "▸", "aria-label": "show the call's records" });
  const row = el("tr", { class: "call " + (c.final || c.decision || ""), "data-call-id": c.call_id },
    el("td", {}, expand),
    el("td", { "data-label": "when" }, el("a", { class: "call-link", href: "#call/" + encodeURIComponent(c.call_id), text: when(c.when), title: "call " + c.call_id })),
    el("td", { "data-label": "principal", text: c.principal || "-" }),
    el("td", { "data-label": "tool", text: c.tool || "-" }),
    el("td", { "data-label": "command", class: "what" }, breakable(c.command || "-"), c.parent ? el("span", { class: "note", text: "  (part of " + c.parent + ")" }) : null),
    el("td", { "data-label": "decision" }, decided(c)),
    el("td", { "data-label": "approved by", text: c.approved_by || (c.decision === "ask" ? (c.approval_how || "not yet") : "-") }),
    el("td", { "data-label": "outcome", class: "outcome " + c.outcome, text: outcome(c) }),
    el("td", { "data-label": "took", class: "num", text: took(c.duration_ms) }),
    el("td", { "data-label": "bytes", class: "num", text: bytes(c.bytes) }));
  expand.onclick = async () => {
    const next = row.nextElementSibling;
    if (next && next.classList.contains("records")) {
      next.remove();
      expand.textContent = "▸";
      return;
    }
    expand.textContent = "▾";
    const body = await api("audit/" + encodeURIComponent(c.call_id));
    const list = el("ol", { class: "records" }, ...body.records.map((r) => el("li", {},
      el("span", { class: "event", text: r.event }), " ", el("span", { class: "note", text: when(r.ts) + " · seq " + r.seq }),
      el("details", {}, el("summary", { text: "JSON" }), el("pre", { class: "record", text: JSON.stringify(r, null, 1) })))));
    row.after(el("tr", { class: "records" }, el("td", { colSpan: 10 }, list)));
  };
  return row;
}

async function loadRecords() {
  let body;
  try {
    body = await api("audit?" + filters().toString());
  } catch (err) {
    byId("matched").textContent = "could not load the log: " + (err.message || err);
    return;
  }
  byId("matched").textContent = body.matched + " records match" + (body.truncated ? ", newest " + body.items.length + " shown" : "");
  byId("records").tBodies[0].replaceChildren(...body.items.map(({ record: r, summary }) => el("tr", { class: r.decision || "" },
    el("td", { "data-label": "when", text: when(r.ts) }), el("td", { "data-label": "seq", text: String(r.seq ?? "") }),
    el("td", { "data-label": "event", text: r.event || "" }), el("td", { "data-label": "principal", text: r.principal || "" }),
    el("td", { "data-label": "tool", text: r.tool || "" }), el("td", { "data-label": "decision", class: "decision " + (r.decision || ""), text: r.decision || "" }),
    el("td", { "data-label": "rule", text: r.rule || "" }),
    el("td", { "data-label": "call" }, r.call_id ? el("a", { href: "#call/" + encodeURIComponent(r.call_id), text: r.call_id }) : ""),
    el("td", { "data-label": "what", class: "what" }, breakable(summary)))));
}

async function loadCalls(more) {
  const asRecords = byId("as-records").checked;
  byId("records").hidden = !asRecords;
  byId("timeline").hidden = asRecords;
  if (asRecords) {
    byId("more").hidden = true;
    return loadRecords();
  }
  const params = filters();
  if (more && oldest !== null) params.set("before_seq", String(oldest));
  let body;
  try {
    body = await api("calls?" + params.toString());
  } catch (err) {
    byId("matched").textContent = "could not load the calls: " + (err.message || err);
    return;
  }
  const rows = body.calls.map(callRow);
  if (more) byId("timeline").tBodies[0].append(...rows);
  else byId("timeline").tBodies[0].replaceChildren(...rows);
  if (body.calls.length) oldest = body.next_before ?? body.calls[body.calls.length - 1].first_seq;
  byId("matched").textContent = more ? "" : body.matched + " calls match" + (body.truncated ? ", newest " + body.calls.length + " shown" : "")
    + (body.dropped ? " (the console keeps the newest calls only: " + body.dropped + " older ones are read by gateway audit calls)" : "");
  byId("more").hidden = !body.truncated;
}

async function openCall(callId) {
  byId("call-id").textContent = callId;
  byId("call-body").replaceChildren(el("p", { class: "note", text: "loading..." }));
  let body;
  try {
    body = await api("audit/" + encodeURIComponent(callId));
  } catch (err) {
    byId("call-body").replaceChildren(el("p", { class: "error", text: String(err.message || err) }));
    return;
  }
  const c = body.call;
  const facts = el("dl", { class: "facts" });
  fact(facts, "command", c.command || "-");
  fact(facts, "who", (c.principal || "-") + " · " + (c.tool || "-"));
  fact(facts, "decision", decided(c));
  fact(facts, "outcome", outcome(c) + " · took " + took(c.duration_ms) + " · " + bytes(c.bytes));
  if (c.waited_ms !== null && c.waited_ms !== undefined) fact(facts, "waited", took(c.waited_ms) + " for " + (c.approved_by || "an answer"));
  if (c.parent) fact(facts, "part of", el("a", { href: "#call/" + encodeURIComponent(c.parent), text: c.parent }));
  const story = el("ol", { class: "story" }, ...body.story.map((s) => el("li", { class: "step " + s.step },
    el("span", { class: "step-name", text: s.step }), el("time", { text: when(s.ts) }), el("span", { class: "text" }, breakable(s.text)))));
  const parts = body.parts.length ? el("div", {}, el("h3", { text: "Parts it carried" }),
    el("ul", {}, ...body.parts.map((p) => el("li", {}, el("a", { href: "#call/" + encodeURIComponent(p.call_id), text: p.call_id }), " " + p.command)))) : null;
  const raw = el("details", { class: "raw" }, el("summary", { text: "raw JSON (" + body.records.length + " records)" }),
    ...body.records.map((r) => el("pre", { class: "record", text: JSON.stringify(r, null, 1) })));
  byId("call-body").replaceChildren(...[facts, el("h3", { text: "What happened" }), story, parts, raw].filter(Boolean));
}

// --- overview ----------------------------------------------------------------------------------
const COLOURS = ["allow", "ask", "deny", "other"];
let lastOverview = null;

// Charts are drawn in the page's own units (a viewBox as wide as the box they go in, up to 720),
// so their text stays readable on a phone; they are drawn again when the window changes width.
function chartWidth(box, columns) {
  const inner = box.clientWidth / (columns || 1) - 30;
  return Math.max(260, Math.min(720, Math.round(inner)));
}

function legend(names) {
  return el("p", { class: "legend" }, ...names.map((n) => el("span", { class: "key " + n, text: n })));
}

function stackedBars(o, width) {
  const height = 220, left = 36, bottom = 28, top = 10;
  const n = o.per_bucket.length;
  const max = Math.max(1, ...o.per_bucket.map((b) => COLOURS.reduce((s, d) => s + b[d], 0)));
  const bw = (width - left - 4) / Math.max(1, n);
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + height, class: "chart per-bucket", role: "img", "aria-label": "calls per " + o.bucket + " by decision" });
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  for (const tickValue of [0, Math.round(max / 2), max]) {
    chart.append(svg("line", { x1: left, x2: width, y1: y(tickValue), y2: y(tickValue), class: "grid" }),
      svg("text", { x: left - 4, y: y(tickValue) + 4, class: "axis", "text-anchor": "end", text: String(tickValue) }));
  }
  const every = Math.max(1, Math.ceil(n / Math.max(3, Math.floor(width / 90))));
  o.per_bucket.forEach((b, i) => {
    let base = 0;
    const x = left + i * bw;
    for (const d of COLOURS) {
      if (!b[d]) continue;
      const r = svg("rect", { x: x + 1, width: Math.max(1, bw - 2), y: y(base + b[d]), height: y(base) - y(base + b[d]), class: "bar " + d, "data-at": b.at, "data-decision": d, "data-count": b[d] },
        svg("title", { text: b.at + ": " + b[d] + " " + d }));
      chart.append(r);
      base += b[d];
    }
    if (i % every === 0) chart.append(svg("text", { x: x + bw / 2, y: height - 8, class: "axis", "text-anchor": "middle", text: o.bucket === "hour" ? b.at.slice(11) + "h" : b.at.slice(5) }));
  });
  return chart;
}

function hbars(rows, cls, labelOf, width) {
  const rowH = 36;
  const max = Math.max(1, ...rows.map((r) => r.count));
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + Math.max(rowH, rows.length * rowH), class: "chart hbars " + cls, role: "img" });
  rows.forEach((r, i) => {
    const label = labelOf(r);
    const fits = Math.floor(width / 8);
    const short = label.length > fits ? label.slice(0, fits - 1) + "…" : label;
    chart.append(svg("text", { x: 0, y: i * rowH + 13, class: "label", text: short }, svg("title", { text: label })),
      svg("rect", { x: 0, y: i * rowH + 17, height: 12, width: Math.max(2, (width - 60) * r.count / max), class: "bar deny", "data-name": label, "data-count": r.count }),
      svg("text", { x: Math.max(2, (width - 60) * r.count / max) + 6, y: i * rowH + 29, class: "axis", text: String(r.count) }));
  });
  return chart;
}

function stackedRows(rows, width) {
  const rowH = 30, labelW = Math.min(140, width / 3);
  const max = Math.max(1, ...rows.map((r) => r.calls));
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + Math.max(rowH, rows.length * rowH), class: "chart principals", role: "img" });
  rows.forEach((r, i) => {
    chart.append(svg("text", { x: 0, y: i * rowH + 18, class: "label", text: r.principal.length > 18 ? r.principal.slice(0, 17) + "…" : r.principal }, svg("title", { text: r.principal })));
    let x = labelW;
    for (const d of COLOURS) {
      if (!r[d]) continue;
      const w = (width - labelW - 50) * r[d] / max;
      chart.append(svg("rect", { x, y: i * rowH + 6, height: 16, width: Math.max(1, w), class: "bar " + d, "data-principal": r.principal, "data-decision": d, "data-count": r[d] },
        svg("title", { text: r.principal + ": " + r[d] + " " + d })));
      x += w;
    }
    chart.append(svg("text", { x: x + 6, y: i * rowH + 18, class: "axis", text: String(r.calls) }));
  });
  return chart;
}

function waitBars(w, width) {
  const height = 190, bottom = 28, top = 26;
  const n = w.buckets.length;
  const max = Math.max(1, ...w.buckets.map((b) => b.count));
  const bw = width / n;
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + height, class: "chart waits", role: "img", "aria-label": "approvals' waiting times" });
  w.buckets.forEach((b, i) => {
    const h = (height - top - bottom) * b.count / max;
    chart.append(svg("rect", { x: i * bw + 8, width: bw - 16, y: height - bottom - h, height: Math.max(0, h), class: "bar ask", "data-label": b.label, "data-count": b.count }, svg("title", { text: b.label + ": " + b.count })),
      svg("text", { x: i * bw + bw / 2, y: height - bottom - h - 4, class: "axis", "text-anchor": "middle", text: String(b.count) }),
      svg("text", { x: i * bw + bw / 2, y: height - 8, class: width < 500 ? "axis small" : "axis", "text-anchor": "middle", text: width < 500 ? b.label.replace("under ", "<").replace("over ", ">") : b.label }));
  });
  return chart;
}

function panel(id, heading, ...children) {
  return el("div", { class: "panel", id }, el("h3", { text: heading }), ...children);
}

async function loadOverview() {
  const params = new URLSearchParams();
  for (const [key, value] of new FormData(byId("range"))) if (value) params.set(key, value);
  const summary = byId("overview-summary");
  summary.textContent = "counting...";
  let o;
  try {
    o = await api("overview?" + params.toString());
  } catch (err) {
    summary.textContent = "could not count: " + (err.message || err);
    return;
  }
  lastOverview = o;
  drawOverview(o);
}

function drawOverview(o) {
  const summary = byId("overview-summary");
  const w = o.waits;
  const charts = byId("charts");
  const width = chartWidth(charts, charts.clientWidth >= 1136 ? 2 : 1);  // the grid's columns (console.css)
  summary.textContent = o.calls + " calls from " + when(o.since) + " to " + when(o.until) + " UTC, " + o.denied.count + " denied"
    + (o.dropped ? " (" + o.dropped + " of the oldest calls are not kept by the console: gateway audit calls reads them)" : "");
  const stats = "answered " + w.answered + ", timed out " + w.timed_out + ", withdrawn " + w.withdrawn + ", waiting now " + w.waiting
    + (w.median_ms !== null ? " · median " + took(w.median_ms) + ", 90% within " + took(w.p90_ms) + ", longest " + took(w.max_ms) : "");
  const none = (list) => (list.top.length ? null : el("p", { class: "empty", text: "none" }));
  const more = (list) => (list.others ? el("p", { class: "note", text: list.others + " more in other entries" }) : null);
  byId("charts").replaceChildren(
    panel("chart-per-bucket", "Calls per " + o.bucket + " by decision", legend(COLOURS), stackedBars(o, width)),
    panel("chart-denied-rules", "Top denied rules", none(o.denied.rules), hbars(o.denied.rules.top, "rules", (r) => r.name, width), more(o.denied.rules)),
    panel("chart-denied-commands", "Top denied commands", none(o.denied.commands), hbars(o.denied.commands.top, "commands", (r) => r.name, width), more(o.denied.commands)),
    panel("chart-waits", "Approvals' waiting times", el("p", { class: "note waits-stats", text: stats }), waitBars(w, width)),
    panel("chart-principals", "Per principal", legend(COLOURS), stackedRows(o.principals, width),
      o.principals_others ? el("p", { class: "note", text: o.principals_others + " more principals" }) : null));
}

// --- what-if replay ---------------------------------------------------------------------------
async function runReplay(event) {
  event.preventDefault();
  const form = new FormData(byId("replay-form"));
  const summary = byId("replay-summary");
  const body = {};
  const file = form.get("file");
  if (file && file.size) body.policy = await file.text();
  else if (form.get("policy_file")) body.policy_file = form.get("policy_file");
  for (const key of ["since", "until"]) if (form.get(key)) body[key] = form.get(key);
  summary.textContent = "replaying...";
  byId("replay-result").replaceChildren();
  let report;
  try {
    report = await api("replay", { method: "POST", body: JSON.stringify(body) });
  } catch (err) {
    summary.textContent = "replay refused: " + (err.message || err);
    return;
  }
  const skipped = Object.values(report.not_replayed);
  summary.textContent = report.draft + ": " + report.replayed + " calls replayed, " + report.changed + " would change, "
    + report.unchanged + " unchanged" + (skipped.length ? ", " + skipped.reduce((n, s) => n + s.count, 0) + " not replayed" : "");
  const parts = [];
  if (report.groups.length) {
    const flips = report.groups.map((g) => ({ ...g, label: (g.from.rule || "(no rule)") + ": " + g.from.decision + " → " + g.to.decision + (g.to.rule !== g.from.rule ? " (" + (g.to.rule || "no rule") + ")" : "") }));
    parts.push(el("h3", { text: "Decisions that would flip, by rule" }), flipChart(flips, chartWidth(byId("replay-result"))));
    const table = el("table", { class: "changes" },
      el("thead", {}, el("tr", {}, ...["rule now", "decision now", "under the draft", "draft's rule", "calls"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...report.groups.map((g) => el("tr", { class: "change" },
        el("td", { "data-label": "rule now", text: g.from.rule || "(no rule)" }), el("td", { "data-label": "decision now" }, el("span", { class: "decision " + g.from.decision, text: g.from.decision })),
        el("td", { "data-label": "under the draft" }, el("span", { class: "decision " + g.to.decision, text: g.to.decision })),
        el("td", { "data-label": "draft's rule", text: g.to.rule || "(no rule)" }), el("td", { "data-label": "calls", class: "num", text: String(g.count) })))));
    parts.push(table);
  }
  for (const g of report.groups) {
    const rows = g.calls.map((c) => el("tr", {}, el("td", { "data-label": "when" }, el("a", { href: "#call/" + encodeURIComponent(c.call_id), text: when(c.ts) })),
      el("td", { "data-label": "principal", text: c.principal }), el("td", { "data-label": "tool", text: c.tool }),
      el("td", { "data-label": "command", class: "what" }, breakable(c.command)), el("td", { "data-label": "why", text: c.reason || "" })));
    parts.push(el("details", { class: "group-calls" }, el("summary", { text: g.count + " × " + g.from.decision + " (" + (g.from.rule || "no rule") + ") → " + g.to.decision + " (" + (g.to.rule || "no rule") + ")" }),
      el("table", { class: "replay" }, el("tbody", {}, ...rows)),
      g.shown < g.count ? el("p", { class: "note", text: (g.count - g.shown) + " more not shown" }) : null));
  }
  for (const s of skipped) parts.push(el("p", { class: "note", text: "not replayed (" + s.why + "): " + s.count }));
  byId("replay-result").replaceChildren(...parts);
}

function flipChart(flips, width) {
  const rowH = 36;
  const max = Math.max(1, ...flips.map((f) => f.count));
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + flips.length * rowH, class: "chart flips", role: "img", "aria-label": "decisions that would flip, by rule" });
  flips.forEach((f, i) => {
    const w = Math.max(2, (width - 60) * f.count / max);
    chart.append(svg("text", { x: 0, y: i * rowH + 13, class: "label", text: f.label }),
      svg("rect", { x: 0, y: i * rowH + 17, height: 12, width: w, class: "bar " + f.to.decision, "data-rule": f.from.rule || "", "data-to": f.to.decision, "data-count": f.count }, svg("title", { text: f.label + ": " + f.count })),
      svg("text", { x: w + 6, y: i * rowH + 29, class: "axis", text: String(f.count) }));
  });
  return chart;
}

// --- verify ------------------------------------------------------------------------------------
async function loadVerify() {
  const badge = byId("verify");
  try {
    const v = await api("verify");
    badge.className = "verify " + v.state;
    badge.textContent = v.state === "ok" ? "audit log: verified (" + v.records + " records)"
      : v.state === "checking" ? "audit log: checking..." : "audit log: BROKEN";
    badge.title = v.describe || "";
  } catch (err) {
    badge.className = "verify broken";
    badge.textContent = "audit log: status unknown";
  }
}

// --- start -------------------------------------------------------------------------------------
async function start() {
  const session = await api("session");
  byId("who").textContent = "signed in as " + session.supervisor;
  byId("logout").onclick = async () => {
    await fetch("/console/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf } });
    sessionStorage.removeItem("agw_console_key");
    window.location.assign("/console/login");
  };
  if ("Notification" in window && Notification.permission === "default") {
    byId("notify").hidden = false;
    byId("notify").onclick = () => Notification.requestPermission().then(() => { byId("notify").hidden = true; });
  }
  byId("filters").onsubmit = (event) => {
    event.preventDefault();
    loadCalls();
  };
  byId("refresh").onclick = () => loadCalls();
  byId("as-records").onchange = () => loadCalls();
  byId("more").onclick = () => loadCalls(true);
  byId("range").onsubmit = (event) => {
    event.preventDefault();
    loadOverview();
  };
  for (const b of document.querySelectorAll("#range button.span")) {
    b.onclick = () => {
      byId("range").elements.since.value = b.dataset.since;
      byId("range").elements.until.value = "";
      loadOverview();
    };
  }
  byId("replay-form").onsubmit = runReplay;
  byId("call-close").onclick = () => { window.location.hash = "#calls"; };
  document.addEventListener("keydown", keys);
  let drawn = window.innerWidth;
  window.addEventListener("resize", () => {
    if (lastOverview && !byId("overview").hidden && Math.abs(window.innerWidth - drawn) > 40) {
      drawn = window.innerWidth;
      drawOverview(lastOverview);
    }
  });
  window.addEventListener("hashchange", route);
  listen();
  route();
  await loadApprovals();
  loadVerify();
  setInterval(tick, 1000);
  setInterval(loadVerify, 5000);
}

document.addEventListener("DOMContentLoaded", start);
