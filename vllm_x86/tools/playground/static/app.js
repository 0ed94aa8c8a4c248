// The playground page: Models, Chat, Structured output and Server views over the
// playground's /api (contract: vllm_x86/tools/playground/app.py). Plain ES module, no
// build step, no library: every URL is relative ("api/models"), so the page works at "/"
// (`vllm-x86 playground`) and at "/playground/" (`vllm-x86 serve --playground`).
//
// The streamed answers are read from the fetch body and parsed as server-sent events
// here (EventSource cannot POST), and the stop button aborts that fetch.

import { drawChart } from "./charts.js";
import { renderMarkdown } from "./markdown.js";

const KEY_STORE = "vllm-x86-playground-key";
const METRICS_EVERY_MS = 2000;
const METRICS_KEEP = 60; // samples: two minutes
const byId = (id) => document.getElementById(id);
const inView = (view, testid) => byId(`view-${view}`).querySelector(`[data-testid="${testid}"]`);

const state = {
  models: [],
  roots: [],
  defaultId: null,
  status: null,
  pulls: {}, // name -> timer
  history: [], // chat messages of the conversation (user/assistant)
  streaming: null, // AbortController of the answer being streamed
  lastRequest: null, // {endpoint: "chat"|"completions", body}
  examples: { schemas: [], regex: [], choice: [] },
  samples: [], // metrics samples
  statusTimer: null,
  myLoad: false, // a load this page started and still watches
};

// ---------------------------------------------------------------- API access

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorText(resp) {
  const fallback = `The playground answered HTTP ${resp.status} ${resp.statusText || ""}`.trim() + ".";
  let body;
  try {
    body = await resp.json();
  } catch {
    return fallback;
  }
  if (typeof body?.error === "string") return body.error;
  if (typeof body?.error?.message === "string") return body.error.message;
  if (typeof body?.detail === "string") return body.detail;
  if (Array.isArray(body?.detail)) return body.detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
  if (typeof body?.message === "string") return body.message;
  return fallback;
}

let keyPrompt = null; // one dialog at a time, shared by concurrent 401s

function askKey(reason) {
  if (keyPrompt) return keyPrompt;
  const dialog = byId("key-dialog");
  byId("key-reason").textContent = reason || "This playground was started with an API key.";
  byId("key-input").value = "";
  keyPrompt = new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        const key = byId("key-input").value.trim();
        const ok = dialog.returnValue === "ok" && key !== "";
        if (ok) sessionStorage.setItem(KEY_STORE, key);
        keyPrompt = null;
        resolve(ok);
      },
      { once: true },
    );
    dialog.showModal();
  });
  return keyPrompt;
}

async function apiFetch(path, { method = "GET", body, signal } = {}) {
  for (;;) {
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = `Bearer ${key}`;
    const resp = await fetch(`api/${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
    if (resp.status !== 401) return resp;
    const reason = await errorText(resp);
    if (key) sessionStorage.removeItem(KEY_STORE);
    if (!(await askKey(reason))) throw new ApiError(401, `${reason} Reload the page to enter the key.`);
  }
}

async function apiJson(path, options) {
  const resp = await apiFetch(path, options);
  if (!resp.ok) throw new ApiError(resp.status, await errorText(resp));
  return resp.json();
}

function showError(view, message) {
  const box = inView(view, "error");
  box.textContent = message;
  box.hidden = false;
}

function clearError(view) {
  const box = inView(view, "error");
  box.textContent = "";
  box.hidden = true;
}

function describeError(err) {
  if (err instanceof ApiError) return err.message;
  if (err instanceof TypeError) return "The playground did not answer: is `vllm-x86 playground` still running?";
  return String(err?.message || err);
}

// ---------------------------------------------------------------- tabs

function showView(view) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const on = tab.dataset.view === view;
    tab.setAttribute("aria-selected", String(on));
    byId(`view-${tab.dataset.view}`).hidden = !on;
  }
  if (location.hash !== `#${view}`) history.replaceState(null, "", `#${view}`);
  if (view === "server") {
    refreshServer();
    drawMetrics(); // at the view's own width, now that it is shown
  }
  if (view === "structured" && !state.examplesLoaded) loadExamples();
  if (view === "chat") byId("prompt").focus();
}

// ---------------------------------------------------------------- formatting

function formatParams(n) {
  if (n == null) return null;
  if (n >= 1e9) return `${(n / 1e9).toFixed(n >= 1e10 ? 0 : 1)}B parameters`;
  if (n >= 1e6) return `${Math.round(n / 1e6)}M parameters`;
  return `${n} parameters`;
}

function formatBytes(n) {
  if (n == null) return null;
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

function node(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) el.append(c);
  return el;
}

// ---------------------------------------------------------------- models view

async function loadModels() {
  try {
    const data = await apiJson("models");
    state.models = data.models || [];
    state.roots = data.roots || [];
    state.defaultId = data.default || state.models.find((m) => m.default)?.id || null;
    renderModels();
    renderRoots();
  } catch (err) {
    byId("model-list").replaceChildren(node("p", { class: "muted", text: "The model list is not available." }));
    showError("models", describeError(err));
  }
}

function renderRoots() {
  byId("roots").replaceChildren(...state.roots.map((r) => node("li", {}, node("code", { text: r }))));
  if (state.roots.length && !byId("local-path").value) byId("local-path").placeholder = `${state.roots[0]}/…`;
}

function isModel(st, model) {
  return !!st?.model && (st.model === model.id || st.model === model.path || st.model === model.name);
}

function isLoaded(model) {
  return state.status?.state === "ready" && isModel(state.status, model);
}

function isLoading(model) {
  return state.status?.state === "starting" && isModel(state.status, model);
}

function modelPrecision(model) {
  const q = (model.quantization || "").toLowerCase();
  if (model.source === "prepacked" || q.startsWith("x86_")) {
    if (q.includes("int4")) return "int4";
    if (q.includes("int8")) return "int8";
  }
  return null;
}

function renderModels() {
  const list = byId("model-list");
  if (!state.models.length) {
    list.replaceChildren(node("p", { class: "muted", text: "No model found. Pull one with `vllm-x86 pull`, or give a folder below." }));
    return;
  }
  list.replaceChildren(...state.models.map(renderModelRow));
}

function renderModelRow(model) {
  const loaded = isLoaded(model);
  const loading = isLoading(model);
  const badges = node("span", { class: "badges" });
  if (model.default) badges.append(node("span", { class: "badge accent", text: "default" }));
  if (model.checked === true) badges.append(node("span", { class: "badge ok", text: "checked", title: "`vllm-x86 check` passed it" }));
  if (model.checked === false) badges.append(node("span", { class: "badge warn", text: "not checked" }));
  if (loaded) badges.append(node("span", { class: "badge ok strong", text: `loaded · ${state.status.precision || ""}` }));
  if (loading) badges.append(node("span", { class: "badge warn", text: "starting…" }));

  const meta = [
    model.architecture,
    formatParams(model.params),
    formatBytes(model.size_bytes),
    model.quantization || model.dtype,
    model.source === "catalog" && !model.pulled ? "not downloaded" : model.source,
  ].filter(Boolean);

  const actions = node("div", { class: "model-actions" });
  if (model.source === "catalog" && !model.pulled) {
    actions.append(
      node("button", { "data-testid": "pull", onclick: () => pullModel(model) }, "Download"),
      node("progress", { "data-testid": "pull-progress", hidden: true, max: 1 }),
      node("span", { class: "pull-msg muted small" }),
    );
  }
  const precision = modelPrecision(model);
  const loadBtn = node(
    "button",
    {
      "data-testid": "load",
      class: model.id === state.defaultId || state.models.length === 1 ? "primary" : "",
      disabled: loading,
      title: precision
        ? `A prepacked ${precision} model: loads as ${precision}`
        : model.source === "catalog" && !model.pulled
          ? "Downloads it first, then loads it"
          : null,
      onclick: () => (model.source === "catalog" && !model.pulled ? pullModel(model, true) : loadModel(model.id, precision)),
    },
    loaded ? "Reload" : "Load",
  );
  actions.append(loadBtn);
  if (loaded) actions.append(node("button", { "data-testid": "unload", class: "ghost", onclick: unloadModel }, "Unload"));

  return node(
    "div",
    { class: `model-row${model.default ? " is-default" : ""}${loaded ? " is-loaded" : ""}`, "data-testid": "model-row", "data-id": model.id },
    node(
      "div",
      { class: "model-main" },
      node("div", { class: "model-name" }, node("span", { text: model.name || model.id }), badges),
      node("div", { class: "model-meta", text: meta.join(" · ") }),
      model.description ? node("div", { class: "model-desc", text: model.description }) : null,
    ),
    actions,
  );
}

function readMaxModelLen() {
  const raw = byId("max-model-len").value.trim();
  if (!raw) return { value: null };
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 16 || n > 131072) {
    return { error: `Max context must be a whole number of tokens between 16 and 131072 (you typed ${raw}); leave it empty for the model's default.` };
  }
  return { value: n };
}

async function loadModel(id, precisionOverride = null) {
  clearError("models");
  const mml = readMaxModelLen();
  if (mml.error) return showError("models", mml.error);
  const precision = precisionOverride || byId("precision").value;
  if (precisionOverride) byId("precision").value = precisionOverride;
  try {
    const answer = await apiJson("load", { method: "POST", body: { model: id, precision, max_model_len: mml.value } });
    state.myLoad = true;
    setStatus({ ...(state.status || {}), state: answer.state || "starting", model: answer.model || id, precision, error: null, elapsed_s: 0 });
  } catch (err) {
    showError("models", describeError(err));
  }
  pollStatus();
}

async function loadPath() {
  clearError("models");
  const path = byId("local-path").value.trim();
  if (!path) return showError("models", "Type the absolute path of a model folder first.");
  if (!path.startsWith("/")) return showError("models", `The path must be absolute, starting with "/" (you typed ${path}).`);
  let model;
  try {
    model = await apiJson("models/inspect", { method: "POST", body: { path } });
  } catch (err) {
    return showError("models", describeError(err));
  }
  if (!state.models.some((m) => m.id === model.id)) {
    state.models.push(model);
    renderModels();
  }
  await loadModel(model.id, modelPrecision(model));
}

async function unloadModel() {
  clearError("models");
  try {
    setStatus(await apiJson("unload", { method: "POST" }));
  } catch (err) {
    showError("models", describeError(err));
  }
  pollStatus();
}

async function pullModel(model, thenLoad = false) {
  clearError("models");
  const row = document.querySelector(`[data-testid="model-row"][data-id="${CSS.escape(model.id)}"]`);
  try {
    await apiJson("pull", { method: "POST", body: { name: model.id } });
  } catch (err) {
    return showError("models", describeError(err));
  }
  const bar = row?.querySelector('[data-testid="pull-progress"]');
  const msg = row?.querySelector(".pull-msg");
  const button = row?.querySelector('[data-testid="pull"]');
  if (button) button.disabled = true;
  const loadButton = row?.querySelector('[data-testid="load"]');
  if (loadButton) loadButton.disabled = true;
  if (bar) bar.hidden = false;
  const tick = async () => {
    let job;
    try {
      job = await apiJson(`pull/${encodeURIComponent(model.id)}`);
    } catch (err) {
      showError("models", describeError(err));
      return;
    }
    if (bar) {
      if (job.total) {
        bar.max = job.total;
        bar.value = job.bytes || 0;
      } else {
        bar.removeAttribute("value"); // indeterminate
      }
    }
    if (msg) {
      const pct = job.total ? ` ${Math.floor((100 * (job.bytes || 0)) / job.total)} %` : "";
      msg.textContent = `${job.message || job.state}${pct}`;
    }
    if (job.state === "done") {
      await loadModels();
      if (thenLoad) await loadModel(model.id);
    } else if (job.state === "failed") {
      showError("models", job.error || `Downloading ${model.id} failed.`);
      if (button) button.disabled = false;
      if (loadButton) loadButton.disabled = false;
      if (bar) bar.hidden = true;
    } else {
      setTimeout(tick, 700);
    }
  };
  tick();
}

// ---------------------------------------------------------------- status

function setStatus(st) {
  const before = state.status;
  state.status = st;
  const word = st?.state || "idle";
  const el = byId("status");
  let text = `Status: ${word}`;
  if (st?.model) text += ` · ${st.served_name || st.model}`;
  if (st?.precision) text += ` · ${st.precision}`;
  if (word === "ready" && st.max_model_len) text += ` · ${st.max_model_len} tokens of context`;
  if (word === "ready" && st.ready_s != null) text += ` · started in ${st.ready_s.toFixed(1)} s`;
  if (word === "starting" && st.message) text += ` · ${st.message}`;
  if (word === "starting" && st.elapsed_s != null) text += ` · ${st.elapsed_s.toFixed(0)} s`;
  if (word === "idle") text += " · no model loaded: press Load next to a model";
  el.textContent = text;
  el.dataset.state = word;
  byId("status-dot").dataset.state = word;
  byId("load-progress").hidden = word !== "starting";
  byId("go-chat").hidden = word !== "ready";

  const pill = byId("header-status");
  pill.dataset.state = word;
  pill.textContent = word === "ready" ? [st.served_name || st.model, st.precision, "ready"].filter(Boolean).join(" · ") : word === "starting" ? "starting…" : word === "failed" ? "load failed" : "no model loaded";

  const attached = st?.mode === "attached";
  document.body.classList.toggle("attached", attached);
  byId("attached-note").hidden = !attached;
  if (st?.error && word !== "starting") showError("models", st.error);
  else if (word === "starting") clearError("models");
  if (word === "ready" && before?.state === "starting" && state.myLoad) {
    state.myLoad = false;
    byId("go-chat").focus();
  }
  byId("chat-model").textContent =
    word === "ready"
      ? `Chatting with ${st.served_name || st.model}${[st.precision, st.max_model_len ? `${st.max_model_len} tokens of context` : null].filter(Boolean).length ? ` (${[st.precision, st.max_model_len ? `${st.max_model_len} tokens of context` : null].filter(Boolean).join(", ")})` : ""}`
      : word === "starting"
        ? "The model is starting; send when the status says ready."
        : "No model loaded: load one in Models.";
  if (!before || before.state !== word || before.model !== st?.model || before.precision !== st?.precision) renderModels();
  renderServerStatus();
}

async function pollStatus() {
  clearTimeout(state.statusTimer);
  let next = 5000;
  try {
    const st = await apiJson("status");
    setStatus(st);
    if (st.state === "starting") next = 1000;
  } catch (err) {
    byId("header-status").textContent = "playground not answering";
    byId("header-status").dataset.state = "failed";
    next = 3000;
    if (err instanceof ApiError && err.status === 401) next = 30000;
  }
  state.statusTimer = setTimeout(pollStatus, next);
}

// The model server's own URL for the "copy as API request" snippets: the back end's
// base_url; under `serve --playground` the page's own origin; else a placeholder that
// the snippet explains (PORT_NOTE).
const PORT_PLACEHOLDER = "http://127.0.0.1:PORT";
const PORT_NOTE = "PORT: the model server's port, which `vllm-x86 daemon status` prints";

function modelServerBase() {
  const st = state.status || {};
  const base = st.base_url || st.daemon?.base_url || st.daemon?.url || (st.mode === "attached" ? location.origin : PORT_PLACEHOLDER);
  return base.replace(/\/+$/, "").replace(/\/v1$/, "");
}

// ---------------------------------------------------------------- chat

function readNumber(id, label, { integer = false, min = -Infinity, max = Infinity, minExclusive = false, allowEmpty = false, extra = null }) {
  const raw = byId(id).value.trim();
  if (raw === "") return allowEmpty ? { value: null } : { error: `${label} is empty: type a number.` };
  const n = Number(raw);
  const kind = integer ? "a whole number" : "a number";
  let range = "";
  if (Number.isFinite(min) && Number.isFinite(max)) range = ` ${minExclusive ? "above" : "from"} ${min} ${minExclusive ? "and up to" : "to"} ${max}`;
  else if (Number.isFinite(min)) range = ` of at least ${min}`;
  const bad = !Number.isFinite(n) || (integer && !Number.isInteger(n)) || (minExclusive ? n <= min : n < min) || n > max || (extra && !extra(n));
  if (bad) return { error: `${label} must be ${kind}${range} (you typed ${raw}).` };
  return { value: n };
}

function readSettings() {
  // max tokens has no upper bound here: the server knows the model's context, and says
  const checks = {
    temperature: readNumber("temperature", "Temperature", { min: 0, max: 2 }),
    top_p: readNumber("top-p", "Top-p", { min: 0, max: 1, minExclusive: true }),
    top_k: readNumber("top-k", "Top-k", { integer: true, min: -1, extra: (n) => n !== 0 }),
    max_tokens: readNumber("max-tokens", "Max tokens", { integer: true, min: 1 }),
    seed: readNumber("seed", "Seed", { integer: true, allowEmpty: true }),
  };
  for (const [name, r] of Object.entries(checks)) {
    if (r.error) {
      if (name === "top_k") return { error: `Top-k must be -1 (no limit) or a whole number of at least 1 (you typed ${byId("top-k").value.trim()}).` };
      return { error: r.error };
    }
  }
  const stops = byId("stop-strings").value.split("\n").filter((s) => s !== "");
  if (stops.length > 4) return { error: `At most 4 stop strings, one per line (you gave ${stops.length}).` };
  const sampling = {
    temperature: checks.temperature.value,
    top_p: checks.top_p.value,
    max_tokens: checks.max_tokens.value,
  };
  if (checks.top_k.value !== -1) sampling.top_k = checks.top_k.value;
  if (checks.seed.value !== null) sampling.seed = checks.seed.value;
  if (stops.length) sampling.stop = stops;
  return { sampling, system: byId("system-prompt").value.trim() };
}

// Yields the data of each server-sent event of a fetch body (one string per event).
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block
          .split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, ""))
          .join("\n");
        if (data) yield data;
      }
    }
    const tail = buffer.trim();
    if (tail.startsWith("data:")) yield tail.slice(5).trim();
  } finally {
    reader.releaseLock();
  }
}

function addBubble(role, text) {
  byId("empty-hint")?.remove();
  const bubble = node("div", { class: `bubble ${role}` });
  if (role === "user") bubble.append(node("div", { class: "who", text: "You" }), node("div", { class: "text", text }));
  byId("transcript").append(bubble);
  return bubble;
}

function scrollTranscript() {
  const t = byId("transcript");
  t.scrollTop = t.scrollHeight;
}

function setStreaming(controller) {
  state.streaming = controller;
  byId("send").disabled = !!controller;
  byId("stop").disabled = !controller;
  byId("so-run").disabled = !!controller;
}

async function sendChat() {
  if (state.streaming) return;
  clearError("chat");
  const prompt = byId("prompt").value;
  if (!prompt.trim()) return showError("chat", "Type a message first.");
  const settings = readSettings();
  if (settings.error) return showError("chat", settings.error);
  const mode = byId("mode").value;
  const endpoint = mode === "chat" ? "chat" : "completions";
  const body = {};
  if (state.status?.served_name) body.model = state.status.served_name;
  if (mode === "chat") {
    body.messages = [...(settings.system ? [{ role: "system", content: settings.system }] : []), ...state.history, { role: "user", content: prompt }];
  } else {
    body.prompt = prompt;
  }
  Object.assign(body, settings.sampling, { stream: true, stream_options: { include_usage: true } });
  state.lastRequest = { endpoint, body };
  renderSnippet(state.snippetKind || "curl");

  addBubble("user", prompt);
  byId("prompt").value = "";
  const bubble = addBubble("assistant");
  bubble.append(node("div", { class: "who", text: mode === "chat" ? "Model" : "Completion" }));
  const answer = node("div", { class: `answer${mode === "completion" ? " plain" : ""}`, "data-testid": "answer", "data-state": "streaming" });
  const stats = node("div", { class: "answer-stats muted small", "data-testid": "answer-stats", text: "waiting for the first token…" });
  bubble.append(answer, stats);
  if (mode === "completion") answer.append(node("span", { class: "prompt-echo", text: prompt }), node("span", { class: "completion" }));
  scrollTranscript();

  const controller = new AbortController();
  setStreaming(controller);
  const t0 = performance.now();
  let tFirst = null;
  let text = "";
  let usage = null;
  let pieces = 0;
  let finish = null;
  let frame = 0;
  const render = () => {
    frame = 0;
    if (mode === "chat") answer.innerHTML = renderMarkdown(text);
    else answer.querySelector(".completion").textContent = text;
    scrollTranscript();
  };
  const scheduleRender = () => {
    if (!frame) frame = requestAnimationFrame(render);
  };

  let outcome = "done";
  let problem = null;
  try {
    const resp = await apiFetch(endpoint, { method: "POST", body, signal: controller.signal });
    if (!resp.ok) throw new ApiError(resp.status, await errorText(resp));
    for await (const data of sseEvents(resp.body)) {
      if (data === "[DONE]") break;
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch {
        continue;
      }
      if (chunk.error) throw new ApiError(500, chunk.error.message || String(chunk.error));
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      const piece = mode === "chat" ? choice.delta?.content || "" : choice.text || "";
      if (piece) {
        if (tFirst === null) {
          tFirst = performance.now();
          stats.textContent = "streaming…";
        }
        text += piece;
        pieces++;
        scheduleRender();
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  } catch (err) {
    if (err?.name === "AbortError") outcome = "stopped";
    else {
      outcome = "error";
      problem = describeError(err);
    }
  }
  if (frame) cancelAnimationFrame(frame);
  render();
  const tEnd = performance.now();
  setStreaming(null);
  answer.dataset.state = outcome;

  const ttft = tFirst === null ? null : (tFirst - t0) / 1000;
  const parts = [];
  if (ttft !== null) parts.push(`TTFT ${ttft.toFixed(2)} s`);
  const completionTokens = usage?.completion_tokens ?? pieces;
  if (tFirst !== null && completionTokens > 1 && tEnd > tFirst) parts.push(`${((completionTokens - 1) / ((tEnd - tFirst) / 1000)).toFixed(1)} tok/s`);
  if (usage) parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
  if (outcome === "stopped") {
    stats.textContent = `Stopped by you after ${pieces} tokens.${parts.length ? ` ${parts.join(" · ")}` : ""}`;
    stats.classList.add("stopped");
  } else if (outcome === "error") {
    stats.textContent = "No answer: see the message below.";
    showError("chat", problem);
  } else {
    if (finish === "length") parts.push("cut at max tokens");
    stats.textContent = parts.join(" · ") || "empty answer";
  }
  if (outcome !== "error" && mode === "chat") {
    state.history.push({ role: "user", content: prompt }, { role: "assistant", content: text });
  }
  if (outcome === "error" && !text) bubble.classList.add("failed");
  scrollTranscript();
}

function stopChat() {
  state.streaming?.abort();
}

function newConversation() {
  stopChat();
  state.history = [];
  byId("transcript").replaceChildren(node("p", { class: "muted empty-hint", id: "empty-hint", text: "A new conversation. Ask anything." }));
  clearError("chat");
}

// ---------------------------------------------------------------- copy as API request

function shellQuote(s) {
  return `'${s.replace(/'/g, "'\\''")}'`;
}

function pyLiteral(value, indent = 0) {
  if (value !== null && typeof value === "object") {
    const flat = pyInline(value);
    if (flat.length + 4 * indent < 88) return flat;
  }
  const pad = "    ".repeat(indent);
  const inner = "    ".repeat(indent + 1);
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    if (value.every((v) => typeof v !== "object" || v === null) && JSON.stringify(value).length < 60) return `[${value.map((v) => pyLiteral(v)).join(", ")}]`;
    return `[\n${value.map((v) => `${inner}${pyLiteral(v, indent + 1)},`).join("\n")}\n${pad}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return `{\n${entries.map(([k, v]) => `${inner}${JSON.stringify(k)}: ${pyLiteral(v, indent + 1)},`).join("\n")}\n${pad}}`;
}

function pyInline(value) {
  if (value === null || value === undefined) return "None";
  if (typeof value === "boolean") return value ? "True" : "False";
  if (typeof value === "number") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(pyInline).join(", ")}]`;
  return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pyInline(v)}`).join(", ")}}`;
}

// arguments the OpenAI client takes by name; the rest (top_k, structured_outputs) go in extra_body
const OPENAI_ARGS = new Set(["model", "messages", "prompt", "temperature", "top_p", "max_tokens", "seed", "stop", "stream", "stream_options", "response_format", "n", "presence_penalty", "frequency_penalty", "logprobs"]);

function curlSnippet(req) {
  const path = req.endpoint === "chat" ? "chat/completions" : "completions";
  const body = { model: state.status?.served_name || "MODEL", ...req.body };
  const lines = [
    ...(modelServerBase() === PORT_PLACEHOLDER ? [`# ${PORT_NOTE}`] : []),
    `curl ${req.body.stream ? "-N " : ""}${modelServerBase()}/v1/${path} \\`,
    `  -H "Content-Type: application/json" \\`,
    ...(sessionStorage.getItem(KEY_STORE) ? [`  -H "Authorization: Bearer $VLLM_API_KEY" \\`] : []),
    `  -d ${shellQuote(JSON.stringify(body, null, 2))}`,
  ];
  return lines.join("\n");
}

function pythonSnippet(req) {
  const body = { model: state.status?.served_name || "MODEL", ...req.body };
  const args = [];
  const extra = {};
  for (const [k, v] of Object.entries(body)) {
    if (OPENAI_ARGS.has(k)) args.push(`    ${k}=${pyLiteral(v, 1)},`);
    else extra[k] = v;
  }
  if (Object.keys(extra).length) args.push(`    extra_body=${pyLiteral(extra, 1)},`);
  const chat = req.endpoint === "chat";
  const call = chat ? "client.chat.completions.create" : "client.completions.create";
  const lines = [
    "import os",
    "",
    "from openai import OpenAI",
    "",
    ...(modelServerBase() === PORT_PLACEHOLDER ? [`# ${PORT_NOTE}`] : []),
    `client = OpenAI(base_url=${JSON.stringify(`${modelServerBase()}/v1`)}, api_key=os.environ.get("VLLM_API_KEY", "EMPTY"))`,
  ];
  if (body.stream) {
    lines.push(`stream = ${call}(`, ...args, ")", "for chunk in stream:");
    lines.push(
      chat
        ? '    if chunk.choices and chunk.choices[0].delta.content:\n        print(chunk.choices[0].delta.content, end="", flush=True)'
        : '    if chunk.choices:\n        print(chunk.choices[0].text, end="", flush=True)',
    );
    lines.push("print()");
  } else {
    lines.push(`response = ${call}(`, ...args, ")", chat ? "print(response.choices[0].message.content)" : "print(response.choices[0].text)");
  }
  return lines.join("\n");
}

function renderSnippet(kind) {
  state.snippetKind = kind;
  const pre = byId("api-snippet");
  if (!state.lastRequest) {
    pre.textContent = "Send a message first; its request appears here.";
    return null;
  }
  const text = kind === "python" ? pythonSnippet(state.lastRequest) : curlSnippet(state.lastRequest);
  pre.textContent = text;
  pre.dataset.kind = kind;
  return text;
}

async function copySnippet(kind, button) {
  const text = renderSnippet(kind);
  if (!text) return;
  const label = button.textContent;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "copied";
  } catch {
    const range = document.createRange();
    range.selectNodeContents(byId("api-snippet"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    button.textContent = "selected: Ctrl+C";
  }
  setTimeout(() => (button.textContent = label), 1500);
}

// ---------------------------------------------------------------- structured output

const SO_PROMPTS = {
  json_schema: "Describe a fictional person as JSON.",
  regex: "Give an example.",
  choice: "Pick the answer that fits best.",
};
// prompts for the back end's examples (by name); others get one made from the name
const EXAMPLE_PROMPTS = {
  "person (nested object)": "Describe a fictional person as JSON.",
  "sentiment (enum)": "What is the sentiment of this review, as JSON? 'The food was great and the staff friendly.'",
  "yes or no with a reason": "Is the Pacific the largest ocean? Answer as JSON.",
  "ISO date": "When did the first person walk on the Moon? Give the date.",
  "US phone number": "Make up a US phone number.",
  "IPv4 address": "Give the IP address of a home router.",
  "hex colour": "Give the hex code of a dark blue.",
  "yes/no answer": "Is water wet? Answer and say why.",
  sentiment: "What is the sentiment of this review? 'The food was great and the staff friendly.'",
  "yes / no": "Is Paris the capital of France?",
  language: "Which programming language is the Linux kernel mostly written in?",
  colour: "What colour is the sky on a clear day?",
};

function examplePrompt(mode, ex) {
  if (ex.prompt) return ex.prompt;
  if (EXAMPLE_PROMPTS[ex.name]) return EXAMPLE_PROMPTS[ex.name];
  const what = ex.name.replace(/\s*\(.*\)\s*$/, "");
  if (mode === "json_schema") return `Give a realistic example of a ${what}, as JSON.`;
  if (mode === "regex") return `Give an example of a ${what}.`;
  return `${what}: pick the answer that fits best.`;
}

async function loadExamples() {
  try {
    state.examples = await apiJson("examples");
    state.examplesLoaded = true;
  } catch (err) {
    showError("structured", describeError(err));
  }
  fillExamples();
}

function examplesFor(mode) {
  const key = { json_schema: "schemas", regex: "regex", choice: "choice" }[mode];
  return state.examples?.[key] || [];
}

function fillExamples() {
  const mode = byId("so-mode").value;
  const select = byId("so-example");
  const list = examplesFor(mode);
  select.replaceChildren(node("option", { value: "", text: list.length ? "(your own)" : "(no examples)" }), ...list.map((ex, i) => node("option", { value: String(i), text: ex.name })));
  byId("so-schema-label").textContent = { json_schema: "Schema (JSON)", regex: "Regular expression", choice: "Choices (one per line)" }[mode];
  if (list.length) {
    select.value = "0";
    applyExample();
  } else {
    byId("so-schema").value = "";
    byId("so-prompt").value = SO_PROMPTS[mode];
  }
}

function applyExample() {
  const mode = byId("so-mode").value;
  const ex = examplesFor(mode)[Number(byId("so-example").value)];
  if (!ex) return;
  const area = byId("so-schema");
  if (mode === "json_schema") area.value = JSON.stringify(ex.schema, null, 2);
  else if (mode === "regex") area.value = ex.pattern;
  else area.value = (ex.choices || []).join("\n");
  byId("so-prompt").value = examplePrompt(mode, ex);
}

function setVerdict(ok, text) {
  const v = byId("so-verdict");
  v.hidden = false;
  v.dataset.verdict = ok ? "valid" : "invalid";
  v.textContent = text;
}

async function runStructured() {
  if (state.streaming) return;
  clearError("structured");
  const mode = byId("so-mode").value;
  const spec = byId("so-schema").value;
  const prompt = byId("so-prompt").value.trim();
  const maxTokens = readNumber("so-max-tokens", "Max tokens", { integer: true, min: 1 });
  if (maxTokens.error) return showError("structured", maxTokens.error);
  if (!prompt) return showError("structured", "Type a prompt first.");
  const body = { messages: [{ role: "user", content: prompt }], max_tokens: maxTokens.value, temperature: 0, stream: false };
  if (state.status?.served_name) body.model = state.status.served_name;
  let schema = null;
  let choices = null;
  if (mode === "json_schema") {
    try {
      schema = JSON.parse(spec);
    } catch (err) {
      return showError("structured", `The schema is not valid JSON: ${err.message}.`);
    }
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) return showError("structured", "The schema must be a JSON object, like {\"type\": \"object\", ...}.");
    const name = (examplesFor(mode)[Number(byId("so-example").value)]?.name || "answer").replace(/[^\w-]/g, "_").slice(0, 64);
    body.response_format = { type: "json_schema", json_schema: { name, schema } };
  } else if (mode === "regex") {
    if (!spec.trim()) return showError("structured", "Type a regular expression first.");
    body.structured_outputs = { regex: spec };
  } else {
    choices = spec.split("\n").map((s) => s.trim()).filter(Boolean);
    if (choices.length < 2) return showError("structured", "Give at least two choices, one per line.");
    body.structured_outputs = { choice: choices };
  }
  state.lastRequest = { endpoint: "chat", body };
  renderSnippet(state.snippetKind || "curl");

  const out = byId("so-output");
  out.textContent = "…";
  const verdict = byId("so-verdict");
  verdict.hidden = true;
  verdict.textContent = "";
  delete verdict.dataset.verdict;
  byId("so-stats").textContent = "running…";
  const controller = new AbortController();
  setStreaming(controller);
  const t0 = performance.now();
  try {
    const answer = await apiJson("chat", { method: "POST", body, signal: controller.signal });
    const seconds = (performance.now() - t0) / 1000;
    const text = answer.choices?.[0]?.message?.content ?? "";
    const finish = answer.choices?.[0]?.finish_reason;
    const u = answer.usage;
    byId("so-stats").textContent = `${seconds.toFixed(2)} s${u ? ` · ${u.completion_tokens} tokens` : ""}${finish === "length" ? " · cut at max tokens" : ""}`;
    if (mode === "json_schema") {
      try {
        out.textContent = JSON.stringify(JSON.parse(text), null, 2);
      } catch {
        out.textContent = text;
      }
      const check = await apiJson("validate", { method: "POST", body: { schema, text } });
      if (check.json_ok && check.schema_ok) setVerdict(true, "valid: JSON that matches the schema");
      else if (!check.json_ok) setVerdict(false, `invalid: not JSON${check.errors?.length ? ` (${check.errors.join("; ")})` : ""}`);
      else setVerdict(false, `invalid: JSON, but against the schema: ${(check.errors || []).join("; ")}`);
    } else if (mode === "regex") {
      out.textContent = text;
      const check = await apiJson("validate", { method: "POST", body: { regex: spec, text } });
      setVerdict(check.schema_ok, check.schema_ok ? "valid: the whole answer matches the pattern" : `invalid: ${(check.errors || []).join("; ") || "the answer does not match the pattern"}`);
    } else {
      out.textContent = text;
      const check = await apiJson("validate", { method: "POST", body: { choice: choices, text } });
      setVerdict(check.schema_ok, check.schema_ok ? "valid: one of the choices" : `invalid: ${(check.errors || []).join("; ") || "not one of the choices"}`);
    }
  } catch (err) {
    out.textContent = "";
    byId("so-stats").textContent = "";
    if (err?.name !== "AbortError") showError("structured", describeError(err));
  } finally {
    setStreaming(null);
  }
}

// ---------------------------------------------------------------- server

function renderServerStatus() {
  const st = state.status;
  if (!st) return;
  const word = st.state || "idle";
  byId("server-model").textContent =
    word === "idle"
      ? "none (idle)"
      : [st.served_name || st.model || "?", st.precision, word, st.max_model_len ? `${st.max_model_len} tokens of context` : null, st.mode === "attached" ? "served by this `vllm-x86 serve`" : st.mode ? `${st.mode} mode` : null].filter(Boolean).join(" · ");
}

async function refreshServer() {
  try {
    await apiJson("health");
    byId("server-health").textContent = "playground: healthy";
    byId("server-health").dataset.state = "ok";
  } catch (err) {
    byId("server-health").textContent = `playground: not healthy (${describeError(err)})`;
    byId("server-health").dataset.state = "failed";
  }
  try {
    const info = await apiJson("server");
    if (info.status) setStatus(info.status);
    const doctor = info.doctor || {};
    byId("server-doctor").textContent = doctor.doctor_text || info.doctor_text || JSON.stringify(doctor, null, 2);
    const st = info.status || state.status;
    const model = st?.state === "ready" ? "model server: ready" : `model server: ${st?.state || "idle"}`;
    byId("server-health").textContent = `playground: healthy · ${model}`;
  } catch (err) {
    byId("server-doctor").textContent = describeError(err);
  }
}

async function pollMetrics() {
  try {
    if (document.visibilityState === "visible" && state.status?.state === "ready") {
      const m = await apiJson("metrics");
      state.samples.push(m);
    } else {
      state.samples.push({ ok: false, time: Date.now() / 1000 });
    }
  } catch {
    state.samples.push({ ok: false, time: Date.now() / 1000 });
  }
  if (state.samples.length > METRICS_KEEP + 1) state.samples.splice(0, state.samples.length - METRICS_KEEP - 1);
  drawMetrics();
  setTimeout(pollMetrics, METRICS_EVERY_MS);
}

function drawMetrics() {
  const s = state.samples.slice(-METRICS_KEEP);
  const pick = (k) => s.map((m) => (m.ok && m[k] != null ? m[k] : null));
  const tps = s.map((m, i) => {
    const prev = i > 0 ? s[i - 1] : state.samples[state.samples.length - s.length - 1];
    if (!m.ok || !prev?.ok || m.generation_tokens_total == null || prev.generation_tokens_total == null) return null;
    const dt = m.time - prev.time;
    const dn = m.generation_tokens_total - prev.generation_tokens_total;
    return dt > 0 && dn >= 0 ? dn / dt : null;
  });
  const kv = pick("kv_cache_usage").map((v) => (v == null ? null : v * 100));
  const windowS = Math.round((s.length * METRICS_EVERY_MS) / 1000);
  const opts = { window_s: windowS };
  const series = [
    ["running", pick("running"), { ...opts, min_top: 4, format: (v) => String(Math.round(v)) }],
    ["waiting", pick("waiting"), { ...opts, min_top: 4, format: (v) => String(Math.round(v)) }],
    ["tps", tps, { ...opts, min_top: 10, format: (v) => String(Math.round(v * 10) / 10) }],
    ["kv", kv, { ...opts, max: 100, format: (v) => `${Math.round(v)}%` }],
  ];
  for (const [name, values, o] of series) {
    drawChart(byId(`chart-${name}`), values, o);
    const last = [...values].reverse().find((v) => v !== null);
    byId(`val-${name}`).textContent = last === undefined ? "" : name === "kv" ? `${last.toFixed(1)} %` : name === "tps" ? last.toFixed(1) : String(Math.round(last));
  }
}

// ---------------------------------------------------------------- wiring

function wire() {
  for (const tab of document.querySelectorAll("[role=tab]")) tab.addEventListener("click", () => showView(tab.dataset.view));
  byId("go-chat").addEventListener("click", () => showView("chat"));
  byId("load-path").addEventListener("click", loadPath);
  byId("local-path").addEventListener("keydown", (e) => e.key === "Enter" && loadPath());
  byId("send").addEventListener("click", sendChat);
  byId("stop").addEventListener("click", stopChat);
  byId("new-chat").addEventListener("click", newConversation);
  byId("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      sendChat();
    }
  });
  byId("copy-curl").addEventListener("click", (e) => copySnippet("curl", e.currentTarget));
  byId("copy-python").addEventListener("click", (e) => copySnippet("python", e.currentTarget));
  byId("so-mode").addEventListener("change", fillExamples);
  byId("so-example").addEventListener("change", applyExample);
  byId("so-run").addEventListener("click", runStructured);
  byId("doctor-refresh").addEventListener("click", refreshServer);
  byId("key-cancel").addEventListener("click", () => byId("key-dialog").close("cancel"));
}

wire();
const first = location.hash.slice(1);
showView(["models", "chat", "structured", "server"].includes(first) ? first : "models");
loadModels();
pollStatus();
drawMetrics();
setTimeout(pollMetrics, 500);
