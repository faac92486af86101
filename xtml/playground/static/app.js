// xtml playground: the page's behaviour. Plain JavaScript, no framework, no
// build step; everything it needs comes from this server's /api.

const $ = (id) => document.getElementById(id);

const VIEWS = ["render", "training", "parse", "stream", "grammar"];
const PAGE = 100; // entries of the grammar's "allowed next" list per page
const HELD_QUOTED = 40; // held ids whose text the stream view quotes

const state = {
  template: { name: "kimi-k3" },
  request: "",
  options: {},
  completion: "",
  from: "text",
  thinking: "",
  delta: 1,
  random: false,
  seed: 0,
  position: 0,
  tab: "render",
};

let templates = [];
let dirty = new Set(VIEWS); // views whose inputs changed since they were computed
let renderData = null;
let streamData = null;
let step = -1;
let allowedOffset = 0;
let seq = 0; // each computation's number: an older answer arriving late is dropped
const latest = {};

// -- the API -------------------------------------------------------------------------

// The API key of a server started with --api-key. It comes in the address's
// fragment (#key=...), which the browser never sends, is kept for this tab
// only, and is taken out of the address bar so that a shared link holds none.
const KEY_STORE = "xtml-playground-key";
let apiKey = null;
let keyDeclined = false; // asked once: the API's 401 says the rest

function takeKey() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("key");
  if (given !== null) {
    params.delete("key");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    try {
      sessionStorage.setItem(KEY_STORE, given);
    } catch (e) {
      // No session storage: the key lasts as long as the page.
    }
    return given;
  }
  try {
    return sessionStorage.getItem(KEY_STORE);
  } catch (e) {
    return null;
  }
}

async function api(path, body, again = true) {
  const headers = {};
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  const init = body === undefined ? { headers } : {
    method: "POST", headers: { ...headers, "content-type": "application/json" }, body: JSON.stringify(body),
  };
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    return { error: { message: `the playground server cannot be reached (${e.message})`, field: null } };
  }
  if (response.status === 401 && again && !keyDeclined) {
    const given = window.prompt("This playground asks for its API key (the one it was started with):");
    keyDeclined = !given;
    if (given) {
      apiKey = given.trim();
      try {
        sessionStorage.setItem(KEY_STORE, apiKey);
      } catch (e) {
        // As above: kept for the page only.
      }
      return api(path, body, false);
    }
  }
  let data;
  try {
    data = await response.json();
  } catch (e) {
    return { error: { message: `the server answered ${response.status} without JSON`, field: null } };
  }
  return response.ok ? { data } : { error: data.error || { message: `error ${response.status}` } };
}

function requestBody(extra) {
  return { template: state.template, request: state.request, options: optionValues(), ...extra };
}

function completionBody(extra) {
  return {
    template: state.template, completion: state.completion, from: state.from,
    thinking: state.thinking === "" ? null : state.thinking === "true", ...extra,
  };
}

// -- options ---------------------------------------------------------------------------

// The template picked, as /api/info lists it (none for a pasted file).
function currentTemplate() {
  return templates.find((t) => state.template.name && t.name === state.template.name);
}

// The options every template has a control for (a dialect's own option of one
// of these names is set there).
const FIXED = new Set(["thinking", "thinking_effort", "tool_choice", "response_format", "add_generation_prompt"]);

// Every layout dialect's own option names: one is sent only with its template.
function dialectOptionNames() {
  return new Set(templates.flatMap((t) => Object.keys(t.options || {})).filter((k) => !FIXED.has(k)));
}

function optionValues() {
  const out = {};
  const own = (currentTemplate() || {}).options || {};
  const dialects = dialectOptionNames();
  for (const [key, value] of Object.entries(state.options)) {
    if (value === "" || value === undefined) continue;
    if (dialects.has(key) && !(key in own)) continue;
    if (key === "thinking" || key === "add_generation_prompt" || typeof own[key] === "boolean") out[key] = value === "true";
    else if (key === "response_format") out[key] = { type: value };
    else if (key === "tool_choice") {
      out[key] = ["auto", "none", "required"].includes(value) ? value : { type: "function", function: { name: value } };
    } else out[key] = value;
  }
  return out;
}

function fillSelect(select, values, current) {
  select.replaceChildren(new Option("as the request says", ""));
  for (const v of values) select.append(new Option(v, v));
  select.value = values.includes(current) ? current : "";
}

// A layout dialect's own options (the official template's keyword names), each
// a select like the others.
function drawDialectOptions(tpl) {
  const box = $("dialect-options");
  box.replaceChildren();
  const own = (tpl && tpl.options) || {};
  for (const [name, fallback] of Object.entries(own)) {
    if (FIXED.has(name)) continue;
    const label = document.createElement("label");
    // A true-or-false option is a select; another (a date, say) is text.
    const boolean = typeof fallback === "boolean";
    const select = document.createElement(boolean ? "select" : "input");
    select.dataset.option = name;
    select.id = `opt-own-${name}`;
    if (boolean) {
      select.append(new Option("as the request says", ""), new Option("true", "true"), new Option("false", "false"));
    } else {
      select.placeholder = "as the request says";
    }
    select.value = state.options[name] || "";
    select.addEventListener("change", () => {
      state.options[name] = select.value;
      changed(["render", "training", "grammar"]);
    });
    label.append(`${name} (default ${fallback === null ? "none" : fallback}) `, select);
    box.append(label);
  }
  box.hidden = !box.children.length;
}

function refreshControls() {
  const tpl = currentTemplate();
  drawDialectOptions(tpl);
  const efforts = tpl ? tpl.efforts : (templates[0] ? templates[0].efforts : []);
  fillSelect($("opt-effort"), efforts, state.options.thinking_effort || "");
  let tools = [];
  try {
    const req = JSON.parse(state.request);
    if (req && Array.isArray(req.tools)) {
      tools = req.tools.map((t) => (t && t.function && t.function.name) || (t && t.name)).filter(Boolean);
    }
  } catch (e) {
    // The request is being edited: its error is shown by the render.
  }
  fillSelect($("opt-tool-choice"), ["auto", "none", "required", ...tools], state.options.tool_choice || "");
  for (const el of document.querySelectorAll("#controls > label > [data-option]")) {
    if (el.id !== "opt-effort" && el.id !== "opt-tool-choice") el.value = state.options[el.dataset.option] || "";
  }
}

// -- tokens ----------------------------------------------------------------------------

const infos = new WeakMap(); // token element → the line the info panel shows for it

function shown(tok) {
  // A token that ends inside a character decodes to U+FFFD: its bytes say more.
  if (tok.text.includes("\ufffd") && tok.bytes) return `\u27e8${tok.bytes}\u27e9`;
  return tok.text.replace(/\n/g, "\u21b5\n").replace(/\t/g, "\u21e5");
}

function tokenEl(tok, info) {
  const el = document.createElement("span");
  el.className = tok.marker ? "tok marker" : "tok";
  el.dataset.id = tok.id;
  el.tabIndex = 0;
  el.textContent = shown(tok);
  infos.set(el, info);
  return el;
}

let infoHint = ""; // what the info line says before a token is pointed at

function showInfo(el) {
  const info = infos.get(el);
  if (info) $("info").textContent = info;
}

function renderInfo(tok, msg) {
  const where = msg ? `message ${tok.message} (${msg.role}${sourceName(msg) ? ", " + sourceName(msg) : ""})` : "";
  // A layout dialect's tokens have no element: its format has no markup tree.
  const element = tok.path === null ? "" : ` · element ${tok.path || "(top)"}`;
  return `token ${tok.offset} · id ${tok.id} · ${tok.marker ? "marker" : "text"} ${JSON.stringify(tok.text)}\n` +
    `bytes ${tok.bytes} · ${where}${element}`;
}

function sourceName(msg) {
  if (msg.source !== null && msg.source !== undefined) return `messages[${msg.source}]`;
  return msg.last && msg.role.startsWith("assistant") ? "the generation prompt" : "written by the template";
}

// A view whose inputs no longer compute keeps its last result on screen, marked
// out of date, so that a typo in the request does not blank what was being read.
const STALE_SOURCE = { "request-error": "the request", "completion-error": "the completion",
  "template-error": "the template" };

function markStale(views, error) {
  for (const v of views) {
    const panel = $(`panel-${v}`);
    const note = panel.querySelector(".stale-note");
    panel.classList.toggle("stale", Boolean(error));
    note.hidden = !error;
    note.textContent = error
      ? `Out of date: ${STALE_SOURCE[errorBox(error)]} has an error (shown under it); this is the last result that worked.`
      : "";
  }
}

function errorBox(error) {
  return error.field === "template" ? "template-error"
    : ["completion", "from", "delta", "position", "thinking"].includes(error.field) ? "completion-error"
      : "request-error";
}

function clearError(id) {
  $(id).hidden = true;
  $(id).textContent = "";
}

function showError(error) {
  const box = errorBox(error);
  const where = error.line ? ` (line ${error.line}, column ${error.column})` : "";
  $(box).textContent = error.message + (error.message.includes("line ") ? "" : where);
  $(box).hidden = false;
  if (box === "request-error") $("request").classList.add("bad");
  if (box === "template-error") $("template-file").hidden = false;
}

// -- render and training ---------------------------------------------------------------

async function computeRender() {
  const n = (latest.render = ++seq);
  const { data, error } = await api("/api/render", requestBody());
  if (n !== latest.render) return;
  clearError("request-error");
  clearError("template-error");
  $("request").classList.remove("bad");
  markStale(["render", "training"], error);
  if (error) {
    showError(error);
    return;
  }
  renderData = data;
  dirty.delete("render");
  dirty.delete("training");
  drawRender();
  drawTraining();
}

function drawRender() {
  const data = renderData;
  const byMessage = new Map(data.messages.map((m) => [m.index, m]));
  if (data.messages.length) data.messages[data.messages.length - 1].last = true;
  const flagged = new Set();
  for (const a of data.ambiguous) for (let k = a.tokens[0]; k <= a.tokens[1]; k++) flagged.add(k);
  const box = $("render-tokens");
  box.replaceChildren();
  let group = null;
  let current = -1;
  for (const tok of data.tokens) {
    if (tok.message !== current) {
      current = tok.message;
      const msg = byMessage.get(current);
      group = document.createElement("div");
      group.className = "msg";
      group.dataset.message = current;
      const head = document.createElement("div");
      head.className = "msg-head";
      head.innerHTML = `<b></b> · <span></span> · <span></span>`;
      head.children[0].textContent = `message ${current}: ${msg.role}`;
      head.children[1].textContent = `${msg.tokens} tokens`;
      head.children[2].textContent = sourceName(msg);
      group.append(head);
      box.append(group);
    }
    const el = tokenEl(tok, renderInfo(tok, byMessage.get(tok.message)));
    if (flagged.has(tok.offset)) el.classList.add("ambiguous");
    group.append(el);
  }
  $("render-summary").textContent = `${data.tokens.length} tokens in ${data.messages.length} messages · ` +
    `template ${data.template} · ` + (data.layout
    ? `the format's tokens are their ids (dark), text is ordinary ids (light) · ${data.tree}`
    : "markers are special ids (dark), text is ordinary ids (light)");
  const dropped = $("dropped");
  dropped.replaceChildren();
  const drops = data.dropped || [];
  dropped.hidden = !drops.length;
  for (const d of drops) {
    const li = document.createElement("li");
    const where = d.message < 0 ? `the request's ${d.field}` : `messages[${d.message}].${d.field}`;
    li.textContent = `Not written: ${where} (${d.why}), as the model's own template leaves it out.`;
    dropped.append(li);
  }
  const list = $("ambiguous");
  list.replaceChildren();
  list.hidden = !data.ambiguous.length;
  for (const a of data.ambiguous) {
    const li = document.createElement("li");
    li.textContent = `Marker literal ${JSON.stringify(a.marker)} in the text of message ${a.message} ` +
      `(tokens ${a.tokens[0]}–${a.tokens[1]}): it stays text in token ids, but read back as text it becomes markup.`;
    list.append(li);
  }
}

function drawTraining() {
  const data = renderData;
  const t = data.training;
  const box = $("training-tokens");
  box.replaceChildren();
  $("budget").replaceChildren();
  if (t.error) {
    $("training-summary").textContent = `No training example: ${t.error}`;
    return;
  }
  const byMessage = new Map(data.messages.map((m) => [m.index, m]));
  const tokens = t.same_ids ? data.tokens.slice(0, t.ids.length)
    : t.ids.map((id, k) => ({ id, text: `#${id}`, marker: false, message: 0, offset: k, bytes: "", path: "" }));
  let group = null;
  let current = -1;
  for (const tok of tokens) {
    if (tok.message !== current) {
      current = tok.message;
      group = document.createElement("div");
      group.className = "msg";
      const head = document.createElement("div");
      head.className = "msg-head";
      const msg = byMessage.get(current);
      head.textContent = msg ? `message ${current}: ${msg.role} · ${sourceName(msg)}` : "";
      group.append(head);
      box.append(group);
    }
    const trained = t.mask[tok.offset] === 1;
    const el = tokenEl(tok, `${renderInfo(tok, byMessage.get(tok.message))}\nloss mask: ${trained ? "trained (1)" : "not trained (0)"}`);
    el.classList.add(trained ? "trained" : "untrained");
    group.append(el);
  }
  $("training-summary").textContent = `${t.trained} of ${t.ids.length} ids trained · thinking effort: ` +
    `${t.effort || "off (no budget applies)"} · ${t.overruns.length ? t.overruns.length + " think channel(s) over budget" : "no think channel over budget"}`;
  const table = $("budget");
  const head = table.insertRow();
  for (const h of ["message", "role", "think tokens", `budget (${t.effort || "off"})`, "check"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const budget = t.effort ? t.budgets[t.effort] : undefined;
  const thinks = t.spans.filter((s) => s.channel === t.think_channel && s.message !== null);
  if (!thinks.length) {
    const row = table.insertRow();
    const cell = row.insertCell();
    cell.colSpan = 5;
    cell.textContent = "no think channel in the request's messages";
  }
  for (const s of thinks) {
    const over = t.overruns.some((o) => o.message === s.message);
    const row = table.insertRow();
    for (const v of [`messages[${s.message}]`, s.role, s.body_tokens, budget === undefined ? "none" : budget,
      over ? "over budget" : "ok"]) row.insertCell().textContent = v;
    if (over) row.className = "over";
  }
}

// -- parse -------------------------------------------------------------------------------

async function computeParse() {
  const n = (latest.parse = ++seq);
  const { data, error } = await api("/api/parse", completionBody());
  if (n !== latest.parse) return;
  clearError("completion-error");
  markStale(["parse"], error);
  if (error) {
    showError(error);
    return;
  }
  dirty.delete("parse");
  const diagAt = new Map();
  for (const d of data.diagnostics) {
    const at = Math.min(d.offset, data.tokens.length - 1);
    if (!diagAt.has(at)) diagAt.set(at, []);
    diagAt.get(at).push(d);
  }
  const box = $("parse-tokens");
  box.replaceChildren();
  data.tokens.forEach((tok, k) => {
    const here = diagAt.get(k) || [];
    const el = tokenEl(tok, `token ${k} · id ${tok.id} · ${tok.marker ? "marker" : "text"} ${JSON.stringify(tok.text)}` +
      here.map((d) => `\n${d.kind}: ${d.message}`).join(""));
    if (here.length) el.classList.add("diag");
    el.dataset.offset = k;
    box.append(el);
  });
  $("parse-summary").textContent = `${data.tokens.length} ids, parsed leniently · ${data.diagnostics.length} diagnostic(s)`;
  const list = $("diagnostics");
  list.replaceChildren();
  if (!data.diagnostics.length) {
    const li = document.createElement("li");
    li.className = "none";
    li.textContent = "No diagnostics: the completion is well formed.";
    list.append(li);
  }
  for (const d of data.diagnostics) {
    const li = document.createElement("li");
    li.textContent = `${d.kind} at token ${d.offset}: ${d.message}`;
    const go = document.createElement("button");
    go.type = "button";
    go.textContent = "show";
    go.addEventListener("click", () => {
      const el = box.children[Math.min(d.offset, box.children.length - 1)];
      if (el) el.focus();
    });
    li.append(go);
    list.append(li);
  }
  drawMessage($("parsed-message"), data.message);
  $("openai").textContent = JSON.stringify(data.openai, null, 2);
}

function drawMessage(box, message) {
  const dl = document.createElement("dl");
  const add = (k, v) => {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dl.append(dt, dd);
  };
  add("role", message.role);
  if (message.reasoning_content !== undefined) add("reasoning", message.reasoning_content);
  if (message.content !== undefined) add("content", typeof message.content === "string" ? message.content : JSON.stringify(message.content));
  for (const [k, call] of (message.tool_calls || []).entries()) {
    const f = call.function || {};
    let args = f.arguments;
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch (e) {
      // Arguments that are not JSON are shown as they came.
    }
    add(`tool call ${k}`, `${f.name}(${args})`);
  }
  for (const [k, v] of Object.entries(message)) {
    if (!["role", "content", "reasoning_content", "tool_calls"].includes(k)) add(k, JSON.stringify(v));
  }
  box.replaceChildren(dl);
}

// One line of JSON with a space after each comma and colon: a narrow column
// wraps it between values, not inside a word.
function spaced(value) {
  if (Array.isArray(value)) return `[${value.map(spaced).join(", ")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${spaced(v)}`).join(", ")}}`;
  }
  return JSON.stringify(value);
}

// -- stream ------------------------------------------------------------------------------

async function computeStream() {
  const n = (latest.stream = ++seq);
  const body = completionBody({ delta: state.delta, random: state.random, seed: state.seed });
  const { data, error } = await api("/api/stream", body);
  if (n !== latest.stream) return;
  clearError("completion-error");
  markStale(["stream"], error);
  if (error) {
    showError(error);
    return;
  }
  dirty.delete("stream");
  streamData = data;
  step = Math.min(step, data.steps.length - 1);
  if (step < 0) step = 0;
  drawStep();
}

function drawStep() {
  const data = streamData;
  const s = data.steps[step];
  const end = s.start + s.ids.length;
  const heldFrom = s.held_from;
  const box = $("stream-tokens");
  box.replaceChildren();
  data.tokens.forEach((tok, k) => {
    const el = tokenEl(tok, `token ${k} · id ${tok.id} · ${tok.marker ? "marker" : "text"} ${JSON.stringify(tok.text)}`);
    if (k >= end) el.classList.add("future");
    else el.classList.add(k >= heldFrom ? "held" : "fed");
    if (k >= s.start && k < end) el.classList.add("now");
    box.append(el);
  });
  const total = data.steps.length;
  $("step-label").textContent = s.closed
    ? `step ${step + 1} of ${total}: close() · parser ${s.state}`
    : `step ${step + 1} of ${total}: ids ${s.start}–${end - 1} fed · parser ${s.state}`;
  // The held ids are tokens[held_from .. held_from + held): a few of them are quoted.
  const quoted = data.tokens.slice(heldFrom, heldFrom + Math.min(s.held, HELD_QUOTED)).map((t) => t.text).join("");
  $("held").textContent = s.held
    ? `Held back: ${s.held} id(s) ${JSON.stringify(quoted)}${s.held > HELD_QUOTED ? " …" : ""} — ${s.why}`
    : "Nothing held back: every id read so far is in an event.";
  const events = $("events");
  events.replaceChildren();
  for (const e of s.events) {
    const li = document.createElement("li");
    const { type, ...rest } = e;
    li.textContent = `${type} ${spaced(rest)}`;
    events.append(li);
  }
  if (!s.events.length) events.append(Object.assign(document.createElement("li"), { textContent: "(none)", className: "none" }));
  $("chunks").textContent = s.chunks.length ? s.chunks.map(spaced).join("\n") : "(none)";
  $("step-back").disabled = step <= 0;
  $("step-next").disabled = step >= total - 1;
  $("step-end").disabled = step >= total - 1;
}

// -- grammar -----------------------------------------------------------------------------

async function computeGrammar() {
  const n = (latest.grammar = ++seq);
  const body = { ...requestBody(), ...completionBody({ template: state.template }),
    position: state.position, offset: allowedOffset, limit: PAGE };
  const { data, error } = await api("/api/grammar", body);
  if (n !== latest.grammar) return;
  clearError("completion-error");
  clearError("request-error");
  markStale(["grammar"], error);
  if (error) {
    if (error.field === "position") {
      state.position = 0;
      $("position").value = 0;
    }
    showError(error);
    return;
  }
  dirty.delete("grammar");
  $("grammar-text").textContent = data.grammar;
  $("grammar-missing").hidden = data.available;
  if (!data.available) {
    $("grammar-missing").textContent = data.missing || `The "allowed next" list needs llguidance: ${data.install}`;
    $("grammar-summary").textContent = "";
    $("allowed").replaceChildren();
    $("grammar-tokens").replaceChildren();
    return;
  }
  $("position").max = data.tokens.length;
  const box = $("grammar-tokens");
  box.replaceChildren();
  data.tokens.forEach((tok, k) => {
    const el = tokenEl(tok, `token ${k} · id ${tok.id} · ${JSON.stringify(tok.text)} · click or Enter: ask what may come here`);
    if (k >= data.position) el.classList.add("future");
    if (k === data.position) el.classList.add("pos");
    if (data.refused && k === data.refused.offset) el.classList.add("diag");
    el.dataset.offset = k;
    box.append(el);
  });
  if (data.refused) {
    $("grammar-summary").textContent = `The grammar refuses token ${data.refused.offset} ` +
      `(id ${data.refused.id}, ${JSON.stringify(data.refused.text)}): ${data.refused.why}`;
  } else {
    $("grammar-summary").textContent = `After ${data.position} id(s): ${data.allowed_count.toLocaleString("en")} ` +
      `token(s) allowed next${data.accepting ? " · the grammar may also end here" : ""}`;
  }
  const list = $("allowed");
  list.replaceChildren();
  for (const tok of data.allowed) {
    const el = tokenEl(tok, `id ${tok.id} · ${tok.marker ? "marker" : "text"} ${JSON.stringify(tok.text)}`);
    const small = document.createElement("small");
    small.textContent = tok.id;
    el.append(small);
    list.append(el);
  }
  const last = Math.min(allowedOffset + PAGE, data.allowed_count);
  $("allowed-label").textContent = data.allowed_count
    ? `${allowedOffset + 1}–${last} of ${data.allowed_count.toLocaleString("en")}` : "";
  $("allowed-prev").disabled = allowedOffset === 0;
  $("allowed-next").disabled = last >= data.allowed_count;
}

// -- scheduling ----------------------------------------------------------------------------

const COMPUTE = { render: computeRender, training: computeRender, parse: computeParse, stream: computeStream,
  grammar: computeGrammar };
let timer = null;

function changed(views) {
  for (const v of views) dirty.add(v);
  clearTimeout(timer);
  timer = setTimeout(refresh, 250);
}

function refresh() {
  // The request's render comes first whatever the tab: its errors are the editor's.
  if (dirty.has("render")) computeRender();
  if (state.tab !== "render" && state.tab !== "training" && dirty.has(state.tab)) COMPUTE[state.tab]();
}

function selectTab(name, focus) {
  // The info line described a token of the view being left.
  if (name !== state.tab) $("info").textContent = infoHint;
  state.tab = name;
  for (const v of VIEWS) {
    const tab = $(`tab-${v}`);
    const on = v === name;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`panel-${v}`).hidden = !on;
  }
  if (focus) $(`tab-${name}`).focus();
  refresh();
}

// -- sharing -------------------------------------------------------------------------------

function encodeState() {
  const bytes = new TextEncoder().encode(JSON.stringify(state));
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function decodeState(text) {
  const bin = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
}

function applyState(saved) {
  for (const key of Object.keys(state)) if (saved[key] !== undefined) state[key] = saved[key];
  $("request").value = state.request;
  $("completion").value = state.completion;
  $("completion-from").value = state.from;
  $("completion-thinking").value = state.thinking;
  $("delta").value = state.delta;
  $("delta-random").checked = state.random;
  $("seed").value = state.seed;
  $("position").value = state.position;
  if (state.template.toml !== undefined) {
    $("template-pick").value = "__toml";
    $("template-toml").value = state.template.toml;
    $("template-file").hidden = false;
  } else {
    $("template-pick").value = state.template.name;
    $("template-file").hidden = true;
  }
  refreshControls();
  step = 0;
  allowedOffset = 0;
  dirty = new Set(VIEWS);
  $("info").textContent = infoHint;
  selectTab(VIEWS.includes(state.tab) ? state.tab : "render", false);
}

function readFile(input, then) {
  const file = input.files && input.files[0];
  if (!file) return;
  file.text().then(then, (e) => {
    $("share-note").textContent = `Cannot read ${file.name}: ${e.message}`;
  });
  input.value = "";
}

// -- wiring --------------------------------------------------------------------------------

function wireTokens() {
  for (const id of ["render-tokens", "training-tokens", "parse-tokens", "stream-tokens", "grammar-tokens", "allowed"]) {
    const box = $(id);
    box.addEventListener("mouseover", (e) => {
      const el = e.target.closest(".tok");
      if (el) showInfo(el);
    });
    box.addEventListener("focusin", (e) => {
      const el = e.target.closest(".tok");
      if (el) showInfo(el);
    });
    box.addEventListener("keydown", (e) => {
      const el = e.target.closest(".tok");
      if (!el) return;
      const all = [...box.querySelectorAll(".tok")];
      const k = all.indexOf(el);
      const to = { ArrowRight: k + 1, ArrowLeft: k - 1, Home: 0, End: all.length - 1 }[e.key];
      if (to !== undefined && all[to]) {
        e.preventDefault();
        all[to].focus();
      } else if ((e.key === "Enter" || e.key === " ") && id === "grammar-tokens") {
        e.preventDefault();
        el.click();
      }
    });
  }
  $("grammar-tokens").addEventListener("click", (e) => {
    const el = e.target.closest(".tok");
    if (!el) return;
    state.position = Number(el.dataset.offset);
    $("position").value = state.position;
    allowedOffset = 0;
    changed(["grammar"]);
  });
}

function wire() {
  $("request").addEventListener("input", () => {
    state.request = $("request").value;
    refreshControls();
    changed(["render", "training", "grammar"]);
  });
  $("completion").addEventListener("input", () => {
    state.completion = $("completion").value;
    step = 0;
    changed(["parse", "stream", "grammar"]);
  });
  $("completion-from").addEventListener("change", () => {
    state.from = $("completion-from").value;
    changed(["parse", "stream", "grammar"]);
  });
  $("completion-thinking").addEventListener("change", () => {
    state.thinking = $("completion-thinking").value;
    changed(["parse", "stream"]);
  });
  for (const el of document.querySelectorAll("#controls > label > [data-option]")) {
    el.addEventListener("change", () => {
      state.options[el.dataset.option] = el.value;
      changed(["render", "training", "grammar"]);
    });
  }
  $("template-pick").addEventListener("change", () => {
    const v = $("template-pick").value;
    $("template-file").hidden = v !== "__toml";
    state.template = v === "__toml" ? { toml: $("template-toml").value } : { name: v };
    refreshControls();
    changed(VIEWS);
  });
  $("template-toml").addEventListener("input", () => {
    state.template = { toml: $("template-toml").value };
    changed(VIEWS);
  });
  $("template-upload").addEventListener("change", () => readFile($("template-upload"), (text) => {
    $("template-toml").value = text;
    state.template = { toml: text };
    changed(VIEWS);
  }));
  const tabs = $("tabs");
  tabs.addEventListener("click", (e) => {
    const tab = e.target.closest("[role=tab]");
    if (tab) selectTab(tab.id.slice(4), false);
  });
  tabs.addEventListener("keydown", (e) => {
    const k = VIEWS.indexOf(state.tab);
    const to = { ArrowRight: k + 1, ArrowLeft: k - 1, Home: 0, End: VIEWS.length - 1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    selectTab(VIEWS[(to + VIEWS.length) % VIEWS.length], true);
  });
  const restep = () => {
    state.delta = Math.max(1, Math.min(1000, Number($("delta").value) || 1));
    state.random = $("delta-random").checked;
    state.seed = Number($("seed").value) || 0;
    step = 0;
    changed(["stream"]);
  };
  for (const id of ["delta", "delta-random", "seed"]) $(id).addEventListener("change", restep);
  $("step-back").addEventListener("click", () => { step = Math.max(0, step - 1); drawStep(); });
  $("step-next").addEventListener("click", () => { step = Math.min(streamData.steps.length - 1, step + 1); drawStep(); });
  $("step-end").addEventListener("click", () => { step = streamData.steps.length - 1; drawStep(); });
  $("position").addEventListener("change", () => {
    state.position = Math.max(0, Number($("position").value) || 0);
    allowedOffset = 0;
    changed(["grammar"]);
  });
  $("allowed-prev").addEventListener("click", () => { allowedOffset = Math.max(0, allowedOffset - PAGE); changed(["grammar"]); });
  $("allowed-next").addEventListener("click", () => { allowedOffset += PAGE; changed(["grammar"]); });
  $("share").addEventListener("click", () => {
    const link = `${location.origin}${location.pathname}#s=${encodeState()}`;
    history.replaceState(null, "", link);
    const note = $("share-note");
    note.textContent = "The link to this view is in the address bar.";
    if (navigator.clipboard) {
      navigator.clipboard.writeText(link).then(
        () => { note.textContent = "Link copied: it opens this view, inputs and tab included."; },
        () => { /* no clipboard permission: the address bar has it */ });
    }
  });
  $("download").addEventListener("click", () => {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([JSON.stringify(state, null, 2)], { type: "application/json" }));
    a.download = "xtml-playground.json";
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  });
  $("upload-state").addEventListener("change", () => readFile($("upload-state"), (text) => {
    try {
      applyState(JSON.parse(text));
    } catch (e) {
      $("share-note").textContent = `Not a playground state: ${e.message}`;
    }
  }));
  wireTokens();
}

async function start() {
  apiKey = takeKey();
  infoHint = $("info").textContent;
  wire();
  const { data, error } = await api("/api/info");
  if (error) {
    showError(error);
    return;
  }
  templates = data.templates;
  const pick = $("template-pick");
  for (const t of templates) {
    const option = new Option(t.name, t.name);
    option.title = t.description;
    pick.append(option);
  }
  pick.append(new Option("a template file (paste or open)…", "__toml"));
  // A path is shown by its last parts; the whole of it is the title.
  const parts = data.tokenizer.split("/");
  $("tokenizer").textContent = `tokenizer: ${parts.length > 3 ? "…/" + parts.slice(-2).join("/") : data.tokenizer}`;
  $("tokenizer").title = data.tokenizer;
  let saved = { template: data.template, request: data.example, completion: data.completion };
  if (location.hash.startsWith("#s=")) {
    try {
      saved = decodeState(location.hash.slice(3));
    } catch (e) {
      $("share-note").textContent = `The link's state cannot be read (${e.message}); the example is shown.`;
    }
  }
  applyState(saved);
  document.body.dataset.ready = "true";
}

start();
