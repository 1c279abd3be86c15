// edgevlm's chat page. It speaks the server's own OpenAI endpoint, streamed, and keeps the
// conversation in localStorage. Earlier images are resent with each request, as any OpenAI
// client does: the server answers them from their summaries, without CLIP or their tokens.
"use strict";

const STORE = "edgevlm.chat.v1";
const KEY_STORE = "edgevlm.key";
const $ = (id) => document.getElementById(id);

let chat = loadChat();
let info = null;
let running = null; // {turn, controller} while an answer is coming
let attached = []; // {url, name, kind} of each image or PDF waiting to be sent
const views = new Map(); // turn id -> its <section>
const readLabels = new WeakMap(); // attachment -> its chip's "reading"/"read" label

// -- storage ----------------------------------------------------------------------------

function freshChat() {
  return { settings: { detail: "auto", pool: "", maxTokens: "", temperature: "" }, turns: [], kv: null };
}

function loadChat() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE));
    if (!saved || !Array.isArray(saved.turns)) return freshChat();
    for (const turn of saved.turns) {
      if (turn.state === "waiting" || turn.state === "streaming") turn.state = "dropped"; // reloaded mid-answer
      if (!turn.images) turn.images = turn.image ? [turn.image] : []; // saved before several images
      delete turn.image;
    }
    return { ...freshChat(), ...saved };
  } catch {
    return freshChat();
  }
}

function saveChat() {
  try {
    localStorage.setItem(STORE, JSON.stringify(chat));
  } catch {
    notice("This conversation is too large for the browser's storage: it will not survive a reload.");
  }
}

function notice(text) {
  const el = $("notice");
  el.textContent = text;
  el.hidden = !text;
}

// -- the server -------------------------------------------------------------------------

function headers() {
  const key = localStorage.getItem(KEY_STORE);
  const h = { "Content-Type": "application/json" };
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function askForKey() {
  const key = window.prompt("This server needs its API key (edgevlm serve --api-key):");
  if (key) localStorage.setItem(KEY_STORE, key.trim());
  return Boolean(key);
}

async function loadInfo() {
  try {
    let response = await fetch("/edgevlm/info", { headers: headers() });
    if (response.status === 401 && askForKey()) response = await fetch("/edgevlm/info", { headers: headers() });
    if (!response.ok) throw new Error((await errorOf(response)).message);
    info = await response.json();
    $("model-name").textContent = info.model.id;
    showFacts(info);
  } catch (err) {
    $("model-name").textContent = `not connected (${err.message})`;
  }
}

async function errorOf(response) {
  try {
    const body = await response.json();
    return { message: body.error?.message || JSON.stringify(body), param: body.error?.param || "",
             code: body.error?.code || "" };
  } catch {
    return { message: `${response.status} ${response.statusText}`, param: "", code: "" };
  }
}

function showFacts(facts) {
  const plan = facts.plan || {};
  const rows = [
    ["model", `${facts.model.id} (${facts.model.parameter_size}, ${facts.model.quantization})`],
    ["file", facts.model.file],
    ["device", plan.device],
    ["GPU layers", plan.n_layers === undefined ? "" : `${plan.n_gpu_layers} of ${plan.n_layers}`],
    ["n_ctx", `${facts.model.n_ctx}${plan.n_seq > 1 ? ` × ${plan.n_seq} sequences` : ""}`],
    ["KV type", plan.type_k],
    ["visual tokens / view", facts.model.visual_tokens_per_view],
    ["most tiles", plan.max_tiles],
    ["image layout", plan.layout],
    ["max tokens", facts.defaults.max_tokens],
    ["pool", facts.defaults.pool],
    ["temperature", facts.defaults.temperature],
  ];
  const list = $("facts");
  list.replaceChildren();
  for (const [name, value] of rows) {
    if (value === undefined || value === "") continue;
    list.append(Object.assign(document.createElement("dt"), { textContent: name }),
                Object.assign(document.createElement("dd"), { textContent: String(value) }));
  }
}

// -- requests ---------------------------------------------------------------------------

function userMessage(turn, detail) {
  if (!turn.images.length) return { role: "user", content: turn.text };
  // Images as image_url parts, a PDF as a file part (each of its pages becomes an image), a
  // clip as a video_url part (its frames become images, each after its time).
  const parts = turn.images.map((a) => (a.kind === "pdf"
    ? { type: "file", file: { file_data: a.url, filename: a.name } }
    : a.kind === "video"
      ? { type: "video_url", video_url: { url: a.url } }
      : { type: "image_url", image_url: { url: a.url, detail } }));
  return { role: "user", content: [{ type: "text", text: turn.text }, ...parts] };
}

function history(upTo) {
  // Finished turns only: a refused image or an empty answer is not part of the conversation.
  return chat.turns.slice(0, chat.turns.indexOf(upTo))
    .filter((t) => (t.state === "done" || t.state === "stopped") && t.answer.trim());
}

function requestBody(turn, past) {
  const s = chat.settings;
  const messages = [];
  for (const t of past) messages.push(userMessage(t, s.detail), { role: "assistant", content: t.answer });
  messages.push(userMessage(turn, s.detail));
  // edgevlm.progress: the prefill's progress comes as chunks with an empty delta.
  const body = { model: info ? info.model.id : "", messages, stream: true, edgevlm: { progress: true } };
  if (s.maxTokens) body.max_tokens = Number(s.maxTokens);
  if (s.temperature !== "") body.temperature = Number(s.temperature);
  if (s.pool) body.edgevlm.pool = s.pool === "auto" ? "auto" : Number(s.pool);
  // "/find every street sign" asks the model for boxes: the server puts them on the photo.
  const find = /^\/find\s+(.+)/s.exec(turn.text.trim());
  if (find) body.edgevlm.find = find[1].trim();
  return body;
}

async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data) yield data;
    }
  }
}

async function run(turn) {
  const controller = new AbortController();
  const past = history(turn);
  running = { turn, controller };
  Object.assign(turn, { state: "waiting", answer: "", error: "", imageError: "", numbers: null, progress: null });
  setBusy(true);
  const started = performance.now();
  const timer = setInterval(() => showWaiting(turn, started), 250);
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody(turn, past)), signal: controller.signal });
    if (!response.ok) {
      await refused(turn, response);
      return;
    }
    turn.state = await readStream(turn, past, response);
  } catch (err) {
    turn.state = controller.signal.aborted ? "stopped" : "dropped";
    if (!controller.signal.aborted) turn.error = `connection lost (${err.message})`;
  } finally {
    clearInterval(timer);
    forgetUploads(turn);
    running = null;
    setBusy(false);
    saveChat();
    update(turn);
  }
}

async function readStream(turn, past, response) {
  for await (const data of sseData(response)) {
    if (data === "[DONE]") return turn.state === "error" ? "error" : "done";
    const chunk = JSON.parse(data);
    if (chunk.error) {
      turn.error = chunk.error.message;
      turn.state = "error";
      continue;
    }
    const delta = chunk.choices?.[0]?.delta?.content;
    if (delta) {
      turn.answer += delta;
      turn.state = "streaming";
    }
    if (chunk.edgevlm?.progress) {
      turn.progress = chunk.edgevlm.progress; // shown by the waiting timer
      continue;
    }
    if (chunk.edgevlm) took(turn, past, chunk.edgevlm);
    update(turn);
  }
  turn.error = turn.error || "the connection ended before the answer did";
  return "dropped";
}

async function refused(turn, response) {
  const error = await errorOf(response);
  if (response.status === 401 && askForKey()) {
    turn.error = "API key set: retry";
  } else if (["invalid_image", "invalid_document", "invalid_video"].includes(error.code) ||
             /image_url|video_url|\.file/.test(error.param)) {
    turn.imageError = error.message; // the server's own words, next to the image
  } else {
    turn.error = error.message;
  }
  turn.state = "error";
}

function took(turn, past, numbers) {
  turn.numbers = numbers;
  chat.kv = numbers.kv;
  for (const found of numbers.summaries || []) {
    const earlier = past[found.turn - 1];
    if (earlier && earlier.images.length) {
      earlier.summary = found.summary;
      update(earlier);
    }
  }
  showKv(chat.kv);
}

// -- rendering --------------------------------------------------------------------------

function view(turn) {
  let section = views.get(turn.id);
  if (!section) {
    section = $("turn-template").content.firstElementChild.cloneNode(true);
    section.dataset.turn = turn.id;
    section.querySelector(".retry").addEventListener("click", () => { if (!running) run(turn); });
    views.set(turn.id, section);
    $("chat").append(section);
    $("empty").hidden = true;
  }
  return section;
}

function update(turn) {
  const section = view(turn);
  const q = (sel) => section.querySelector(sel);
  q(".user-text").textContent = turn.text;
  q(".answer").textContent = turn.answer;
  section.dataset.state = turn.state;
  q(".status").textContent = statusText(turn);
  q(".numbers").textContent = numbersText(turn.numbers);
  const timeline = q(".timeline");
  timeline.textContent = timelineText(turn.numbers);
  timeline.hidden = !timeline.textContent;
  const last = chat.turns[chat.turns.length - 1] === turn;
  q(".retry").hidden = !(last && (turn.state === "dropped" || (turn.state === "error" && !turn.imageError)));
  showImage(section, turn);
}

function statusText(turn) {
  if (turn.state === "stopped") return "stopped";
  if (turn.state === "dropped") return `${turn.error || "connection lost"}: retry?`;
  if (turn.state === "error" && turn.error) return turn.error;
  return "";
}

function numbersText(n) {
  if (!n) return "";
  const cached = n.cached_tokens ? ` (${n.cached_tokens} cached)` : "";
  return `TTFT ${n.ttft_s.toFixed(2)} s · decode ${n.decode_tok_s.toFixed(1)} tok/s · ` +
    `prefill ${n.prefill_tokens} tokens${cached} · CLIP ${n.clip_encodes}` +
    (n.shown_again && n.shown_again.length
      ? ` · image${n.shown_again.length > 1 ? "s" : ""} ${n.shown_again.join(", ")} shown again` : "") +
    (n.summary_wait_s ? ` · waited ${n.summary_wait_s.toFixed(2)} s for the earlier photo's summary` : "");
}

function clock(seconds) {
  // A frame's time in its clip, to a tenth: 1:05.5
  const tenths = Math.round(seconds * 10);
  const secs = (tenths % 600) / 10;
  return `${Math.floor(tenths / 600)}:${secs < 10 ? "0" : ""}${secs.toFixed(1)}`;
}

function timelineText(n) {
  // A clip's frames as the model saw them: each block's times (Qwen-VL shows two frames in one).
  if (!n || !n.video || !n.video.length) return "";
  const frames = n.video.reduce((sum, b) => sum + b.times_s.length, 0);
  const blocks = n.video.map((b) => b.times_s.map(clock).join("+")).join(" · ");
  const merged = frames !== n.video.length ? ` in ${n.video.length} blocks` : "";
  return `video: ${frames} frames${merged}, at ${blocks}`;
}

function progressText(p) {
  // The prefill's progress, as the server streams it (edgevlm.progress).
  if (!p) return "";
  const stage = p.stage === "summary" ? "summarising the earlier image" : "reading";
  const views = p.views_total ? ` ${p.views_done}/${p.views_total} views,` : "";
  return `${stage}:${views} ${p.tokens_done}/${p.tokens_total} tokens`;
}

function showWaiting(turn, started) {
  if (turn.state !== "waiting") return;
  const n = turn.images.length;
  const what = turn.progress ? progressText(turn.progress)
    : n > 1 ? `reading the ${n} attachments` : n ? `reading the ${turn.images[0].kind === "video" ? "video" : "image"}`
      : "reading the prompt";
  view(turn).querySelector(".status").textContent = `${what}… ${((performance.now() - started) / 1000).toFixed(1)} s`;
}

function showImage(section, turn) {
  // The first image with the grid the server chose for it; any others (and PDFs) beside it.
  const first = turn.images[0]?.kind === "image" || (turn.images[0] && !turn.images[0].kind)
    ? turn.images[0] : undefined; // the server's grid is for the message's first image
  const figure = section.querySelector(".saw");
  figure.hidden = !first;
  section.querySelector(".more-images").replaceChildren(
    ...turn.images.filter((a) => a !== first).map((a) => attachmentChip(a)));
  const error = section.querySelector(".image-error");
  error.textContent = turn.imageError || "";
  error.hidden = !turn.imageError;
  const summary = section.querySelector(".summary");
  summary.hidden = turn.summary === undefined || turn.summary === null;
  section.querySelector(".summary-text").textContent = turn.summary || "(the summary was empty)";
  if (!first) return;
  const photo = figure.querySelector(".photo");
  if (photo.getAttribute("src") !== first.url) photo.src = first.url;
  drawGrid(figure, turn.imageError ? null : turn.numbers);
  drawBoxes(figure, turn.imageError ? null : turn.numbers);
}

function drawBoxes(figure, numbers) {
  // What the model found (/find), in the photo's own pixels: placed over the photo as shown.
  const layer = figure.querySelector(".boxes");
  const photo = figure.querySelector(".photo");
  const place = () => {
    const [w, h] = [photo.naturalWidth, photo.naturalHeight];
    layer.replaceChildren(...(numbers?.boxes || []).filter(() => w && h).map((b) => {
      const box = document.createElement("span");
      const [x1, y1, x2, y2] = b.box;
      box.className = "box";
      Object.assign(box.style, { left: `${(100 * x1) / w}%`, top: `${(100 * y1) / h}%`,
        width: `${(100 * (x2 - x1)) / w}%`, height: `${(100 * (y2 - y1)) / h}%` });
      box.dataset.label = b.label || "";
      box.title = `${b.label || "found"}: ${b.box.map((v) => Math.round(v)).join(", ")}`;
      return box;
    }));
  };
  if (photo.complete) place(); else photo.addEventListener("load", place, { once: true });
}

function drawGrid(figure, numbers) {
  const canvas = figure.querySelector(".canvas");
  const tiles = figure.querySelector(".tiles");
  const photo = figure.querySelector(".photo");
  const [cols, rows] = numbers ? numbers.grid : [0, 0];
  tiles.replaceChildren();
  canvas.classList.toggle("global-only", !(cols && rows));
  figure.dataset.grid = `${cols}x${rows}`;
  figure.querySelector(".saw-caption").textContent = sawCaption(numbers);
  if (!(cols && rows)) {
    canvas.style.aspectRatio = "";
    photo.removeAttribute("style");
    return;
  }
  const [cw, ch] = numbers.canvas;
  const [x, y, w, h] = numbers.image_box;
  const pct = (part, whole) => `${(100 * part) / whole}%`;
  canvas.style.aspectRatio = `${cw} / ${ch}`;
  Object.assign(photo.style, { left: pct(x, cw), top: pct(y, ch), width: pct(w, cw), height: pct(h, ch) });
  tiles.style.gridTemplateColumns = `repeat(${cols}, 1fr)`;
  tiles.style.gridTemplateRows = `repeat(${rows}, 1fr)`;
  for (let r = 1; r <= rows; r++) {
    for (let c = 1; c <= cols; c++) {
      const tile = document.createElement("div");
      tile.className = numbers.pool > 1 ? "tile pooled" : "tile";
      tile.textContent = `${r},${c}`;
      tile.title = `tile row ${r}, column ${c}${numbers.pool > 1 ? `, pooled ${numbers.pool}×${numbers.pool}` : ""}`;
      tiles.append(tile);
    }
  }
}

function sawCaption(n) {
  if (!n) return "";
  // mtmd's families (Qwen, Gemma, …) lay the image out themselves: no global view or tiles of
  // edgevlm's; InternVL and LFM2-VL are cut into their processor's tiles and a thumbnail.
  const shown = n.layout && n.layout.startsWith("mtmd-")
    ? (n.n_tiles ? `${n.grid[0]}×${n.grid[1]} tiles and a thumbnail, as its processor cuts them`
      : "the whole image, as its family lays it out")
    : n.n_tiles
      ? `global view + ${n.grid[0]}×${n.grid[1]} tiles${n.pool > 1 ? `, pooled ${n.pool}×${n.pool} (dashed)` : ""}`
      : "global view only";
  return `What the model saw: ${shown} · ${n.visual_tokens} visual tokens (${n.layout})`;
}

function showKv(kv) {
  const bar = $("kv");
  if (!kv) {
    $("kv-label").textContent = "KV cache: empty";
    for (const part of ["text", "summaries", "images"]) bar.querySelector(`.kv-${part}`).style.width = "0";
    return;
  }
  for (const part of ["text", "summaries", "images"]) {
    bar.querySelector(`.kv-${part}`).style.width = `${(100 * kv[part]) / kv.n_ctx}%`;
  }
  const used = kv.text + kv.summaries + kv.images;
  const label = $("kv-label");
  label.replaceChildren(`KV cache ${used} / ${kv.n_ctx}: `);
  for (const [part, name] of [["text", "text"], ["summaries", "summaries"], ["images", "live images"]]) {
    const key = Object.assign(document.createElement("span"), { className: `key key-${part}` });
    label.append(key, `${name} ${kv[part]} `);
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// -- composing --------------------------------------------------------------------------

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function prepareImage(file) {
  // Sent as it is unless it has more pixels than the model can use; a file the browser cannot
  // decode is sent too, so the server says what is wrong with it.
  const original = await readDataUrl(file);
  const limit = info ? info.defaults.useful_pixels : null;
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch {
    return { url: original, name: file.name };
  }
  const pixels = bitmap.width * bitmap.height;
  if (!limit || pixels <= limit) return { url: original, name: file.name };
  const scale = Math.sqrt(limit / pixels);
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(bitmap.width * scale);
  canvas.height = Math.round(bitmap.height * scale);
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  return { url: canvas.toDataURL("image/jpeg", 0.92), name: file.name };
}

function isPdf(file) {
  return file.type === "application/pdf" || file.name.toLowerCase().endsWith(".pdf");
}

function isVideo(file) {
  return file.type.startsWith("video/") || /\.(mp4|m4v|mov|mkv|webm|avi)$/i.test(file.name);
}

async function attach(files) {
  // Several at once are shown in one question, in the order chosen.
  for (const file of files || []) {
    if (isPdf(file)) {
      attached.push({ url: await readDataUrl(file), name: file.name, kind: "pdf" });
    } else if (isVideo(file)) {
      attached.push({ url: await readDataUrl(file), name: file.name, kind: "video" });
    } else if (!file.type || file.type.startsWith("image/")) {
      attached.push({ ...(await prepareImage(file)), kind: "image" });
    } else {
      notice(`${file.name} is not an image, a PDF or a video.`);
      continue;
    }
    notice("");
    readAhead(attached[attached.length - 1]);
  }
  showAttachments();
}

// The server reads an attachment while the question is typed (POST /v1/files): its views are
// encoded and, opening a chat, its block prefilled into the image-prefix cache, so the question
// pays only for itself. The message still carries the image itself (the server finds what it
// read by its pixels); a server that keeps no uploads just reads it with the question.
async function readAhead(a) {
  const h = headers();
  delete h["Content-Type"]; // the browser sets multipart's, with its boundary
  try {
    const form = new FormData();
    form.append("purpose", "vision");
    form.append("file", await (await fetch(a.url)).blob(), a.name);
    const response = await fetch("/v1/files", { method: "POST", headers: h, body: form });
    if (!response.ok) return;
    a.fileId = (await response.json()).id;
    a.read = "reading";
    showRead(a);
    for (let tries = 0; tries < 1200 && attached.includes(a); tries++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      const file = await fetch(`/v1/files/${a.fileId}`, { headers: h });
      if (!file.ok) break;
      if ((await file.json()).status === "processed") {
        a.read = "read";
        break;
      }
    }
  } catch {
    delete a.read; // the question reads it then
  }
  showRead(a);
}

function showRead(a) {
  // Only the label changes: the chips themselves stay (re-drawing them would drop what the
  // user is pointing at).
  const label = readLabels.get(a);
  if (!label) return;
  label.textContent = a.read || "";
  label.hidden = !a.read;
}

function forgetUploads(turn) {
  // What was read stays in the server's caches; the upload itself is not needed once sent.
  const h = headers();
  for (const a of turn.images || []) {
    if (a.fileId) fetch(`/v1/files/${a.fileId}`, { method: "DELETE", headers: h }).catch(() => {});
    delete a.fileId;
    delete a.read;
  }
}

function attachmentChip(a, onRemove) {
  const chip = Object.assign(document.createElement("span"), { className: "chip" });
  chip.append(a.kind === "pdf" || a.kind === "video"
    ? Object.assign(document.createElement("span"), { className: "pdf", textContent: a.kind === "pdf" ? "PDF" : "VIDEO" })
    : Object.assign(document.createElement("img"), { src: a.url, alt: a.name }));
  chip.append(Object.assign(document.createElement("span"), { className: "muted name", textContent: a.name }));
  if (onRemove) {
    const label = Object.assign(document.createElement("span"), { className: "muted read" });
    readLabels.set(a, label);
    showRead(a);
    chip.append(label);
  }
  if (onRemove) {
    const remove = Object.assign(document.createElement("button"), { type: "button", textContent: "×" });
    remove.setAttribute("aria-label", `Remove ${a.name}`);
    remove.addEventListener("click", onRemove);
    chip.append(remove);
  }
  return chip;
}

function showAttachments() {
  $("attachment").replaceChildren(...attached.map((a, k) => attachmentChip(a, () => {
    attached.splice(k, 1);
    showAttachments();
  })));
  $("attachment").hidden = !attached.length;
  $("file-input").value = "";
}

function detach() {
  attached = [];
  showAttachments();
}

function submit() {
  const text = $("prompt").value.trim();
  if (running || (!text && !attached.length)) return;
  const several = attached.length > 1 || attached.some((a) => a.kind === "pdf");
  const asked = several ? "Describe these." : "Describe this image.";
  const turn = { id: `t${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`,
                 text: text || asked, images: [...attached], answer: "", state: "waiting" };
  chat.turns.push(turn);
  $("prompt").value = "";
  detach();
  saveChat();
  update(turn);
  view(turn).scrollIntoView({ block: "end" });
  run(turn);
}

function newChat() {
  if (running) running.controller.abort();
  chat = { ...freshChat(), settings: chat.settings };
  views.clear();
  for (const section of document.querySelectorAll("#chat .turn")) section.remove();
  $("empty").hidden = false;
  showKv(null);
  saveChat();
}

// -- wiring -----------------------------------------------------------------------------

function wireSettings() {
  const fields = { detail: "set-detail", pool: "set-pool", maxTokens: "set-max-tokens", temperature: "set-temperature" };
  for (const [name, id] of Object.entries(fields)) {
    $(id).value = chat.settings[name] ?? "";
    $(id).addEventListener("change", () => { chat.settings[name] = $(id).value; saveChat(); });
  }
  const open = (shown) => {
    $("settings").hidden = !shown;
    $("open-settings").setAttribute("aria-expanded", String(shown));
    if (shown) $("set-detail").focus();
  };
  $("open-settings").addEventListener("click", () => open($("settings").hidden));
  $("close-settings").addEventListener("click", () => open(false));
  $("settings").addEventListener("keydown", (e) => { if (e.key === "Escape") open(false); });
}

function wireComposer() {
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submit();
    } else if (e.key === "Escape" && running) {
      running.controller.abort();
    }
  });
  $("stop").addEventListener("click", () => running && running.controller.abort());
  $("new-chat").addEventListener("click", newChat);
  $("file-input").addEventListener("change", () => attach([...$("file-input").files]));
  document.querySelector("label.attach").addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); $("file-input").click(); }
  });
  document.addEventListener("paste", (e) => {
    const files = [...(e.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/") || isPdf(f));
    if (files.length) { e.preventDefault(); attach(files); }
  });
  window.addEventListener("dragover", (e) => { e.preventDefault(); document.body.classList.add("dragging"); });
  window.addEventListener("dragleave", () => document.body.classList.remove("dragging"));
  window.addEventListener("drop", (e) => {
    e.preventDefault();
    document.body.classList.remove("dragging");
    attach([...(e.dataTransfer?.files || [])]);
  });
}

function start() {
  wireSettings();
  wireComposer();
  for (const turn of chat.turns) update(turn);
  showKv(chat.kv);
  loadInfo();
  $("prompt").focus();
}

start();
