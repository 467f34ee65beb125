// nmt serve's web page: translates as one types (debounced), through the server's public API only.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { settings: null, langs: [], names: {}, timer: null, controller: null, seq: 0, last: null };

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function apiKey() {
  return $("api-key").value.trim();
}

async function post(path, data, signal) {
  const key = apiKey();
  if (key) data.append("api_key", key);
  const response = await fetch(path, { method: "POST", body: data, signal });
  let body;
  try {
    body = await response.json();
  } catch (e) {
    body = { error: response.status + " " + response.statusText };
  }
  if (!response.ok) throw new Error(body.error || String(response.status));
  return body;
}

function option(code, name) {
  const o = document.createElement("option");
  o.value = code;
  o.textContent = name;
  return o;
}

function sources() {
  return state.langs.filter((l) => l.targets.length > 0);
}

function targetsOf(source) {
  if (source === "auto") {
    const all = new Set();
    sources().forEach((l) => l.targets.forEach((t) => all.add(t)));
    return [...all].sort();
  }
  const lang = state.langs.find((l) => l.code === source);
  return lang ? lang.targets : [];
}

function fillTargets(wanted) {
  const select = $("target");
  const keep = wanted || select.value;
  select.replaceChildren(...targetsOf($("source").value).map((c) => option(c, state.names[c] || c)));
  if ([...select.options].some((o) => o.value === keep)) select.value = keep;
  updateSwap();
}

function updateSwap() {
  const source = $("source").value === "auto" ? state.last && state.last.detected : $("source").value;
  $("swap").disabled = !source || !targetsOf($("target").value).includes(source);
}

function updateCount() {
  const n = $("input").value.length;
  $("count").textContent = n + " / " + state.settings.charLimit;
  $("count").classList.toggle("over", n > state.settings.charLimit);
}

function schedule() {
  updateCount();
  clearTimeout(state.timer);
  $("detected").textContent = "";
  if ($("input").value.trim() === "") {
    if (state.controller) state.controller.abort();
    state.seq += 1;
    setOutput("", []);
    $("status").textContent = "";
    return;
  }
  $("status").textContent = "Translating\u2026";
  state.timer = setTimeout(translateNow, state.settings.frontendTimeout);
}

function setOutput(text, alternatives) {
  const output = $("output");
  output.value = text;
  output.readOnly = true;
  $("send").hidden = true;
  $("edit").hidden = !(state.settings.suggestions && text);
  const list = $("alternatives");
  list.replaceChildren(...alternatives.filter((a) => a && a !== text).map((a) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = a;
    button.title = "Use this translation";
    button.addEventListener("click", () => {
      const current = output.value;
      setOutput(a, alternatives.filter((x) => x !== a).concat([current]));
      output.focus();
    });
    item.appendChild(button);
    return item;
  }));
  $("alternatives-box").hidden = list.children.length === 0;
}

async function translateNow() {
  clearTimeout(state.timer);
  const q = $("input").value;
  if (q.trim() === "") return;
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  const seq = ++state.seq;
  const data = new FormData();
  data.append("q", q);
  data.append("source", $("source").value);
  data.append("target", $("target").value);
  data.append("format", "text");
  data.append("alternatives", String(Math.min(3, state.settings.alternativesLimit ?? 3)));
  try {
    const res = await post("translate", data, controller.signal);
    if (seq !== state.seq) return;
    showError("");
    const detected = res.detectedLanguage;
    state.last = { q, source: detected ? detected.language : $("source").value, target: $("target").value,
                   translation: res.translatedText, detected: detected ? detected.language : null };
    setOutput(res.translatedText, res.alternatives || []);
    $("status").textContent = "";
    if (detected) {
      $("detected").textContent = "Detected: " + (state.names[detected.language] || detected.language) +
        " (" + Math.round(detected.confidence) + "%)";
    }
    updateSwap();
  } catch (e) {
    if (e.name === "AbortError" || seq !== state.seq) return;
    $("status").textContent = "";
    showError(e.message);
  }
}

function swap() {
  const source = $("source").value === "auto" ? state.last && state.last.detected : $("source").value;
  const target = $("target").value;
  if (!source) return;
  $("source").value = target;
  fillTargets(source);
  if ($("output").value) $("input").value = $("output").value;
  setOutput("", []);
  schedule();
}

async function copy() {
  const text = $("output").value;
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {
    $("output").select();
    document.execCommand("copy");
  }
  $("status").textContent = "Copied";
}

function edit() {
  const output = $("output");
  output.readOnly = false;
  output.focus();
  $("edit").hidden = true;
  $("send").hidden = false;
  $("status").textContent = "Correct the translation, then send it";
}

async function sendSuggestion() {
  if (!state.last) return;
  const data = new FormData();
  data.append("q", state.last.q);
  data.append("s", $("output").value);
  data.append("source", state.last.source);
  data.append("target", state.last.target);
  data.append("translation", state.last.translation);
  try {
    await post("suggest", data);
    $("output").readOnly = true;
    $("send").hidden = true;
    $("status").textContent = "Thank you: the correction is kept";
  } catch (e) {
    showError(e.message);
  }
}

function setMode(files) {
  $("mode-text").setAttribute("aria-pressed", String(!files));
  $("mode-files").setAttribute("aria-pressed", String(files));
  $("text-panel").hidden = files;
  $("file-panel").hidden = !files;
}

async function translateFile() {
  const file = $("file").files[0];
  if (!file) return;
  const data = new FormData();
  data.append("file", file);
  data.append("source", $("source").value);
  data.append("target", $("target").value);
  $("translate-file").disabled = true;
  $("download").hidden = true;
  $("file-status").textContent = "Translating " + file.name + "\u2026";
  try {
    const res = await post("translate_file", data);
    const link = $("download");
    link.href = res.translatedFileUrl;
    link.download = "";
    link.textContent = "Download the translation of " + file.name;
    link.hidden = false;
    $("file-status").textContent = "Done";
    showError("");
  } catch (e) {
    $("file-status").textContent = "";
    showError(e.message);
  } finally {
    $("translate-file").disabled = false;
  }
}

function describeLimits(s) {
  let text = "Up to " + s.charLimit + " characters";
  if (s.batchLimit) text += " and " + s.batchLimit + " lines";
  text += " a request.";
  if (s.filesTranslation) {
    text += " Files: " + s.supportedFilesFormat.join(", ");
    if (s.fileCharLimit) text += ", up to " + s.fileCharLimit + " characters of text";
    text += ".";
  }
  if (s.keyRequired) text += " An API key is required.";
  return text;
}

async function init() {
  let settings, langs;
  try {
    [settings, langs] = await Promise.all([
      fetch("frontend/settings").then((r) => r.json()),
      fetch("languages").then((r) => r.json()),
    ]);
  } catch (e) {
    showError("Cannot load the server's settings: " + e.message);
    return;
  }
  state.settings = settings;
  state.langs = langs;
  langs.forEach((l) => { state.names[l.code] = l.name; });

  const source = $("source");
  if (settings.autoDetect) source.appendChild(option("auto", "Auto Detect"));
  sources().forEach((l) => source.appendChild(option(l.code, l.name)));
  const params = new URLSearchParams(window.location.search);
  const wanted = params.get("source") || settings.language.source.code;
  if ([...source.options].some((o) => o.value === wanted)) source.value = wanted;
  fillTargets(params.get("target") || settings.language.target.code);

  $("input").maxLength = settings.charLimit;
  $("key-row").hidden = !settings.keyRequired;
  $("api-key").value = localStorage.getItem("nmt-api-key") || "";
  $("limits").textContent = describeLimits(settings);
  if (settings.filesTranslation) {
    $("mode-files").hidden = false;
    $("formats").textContent = settings.supportedFilesFormat.join(", ");
    $("file").accept = settings.supportedFilesFormat.join(",");
  }

  $("input").addEventListener("input", schedule);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); translateNow(); }
  });
  source.addEventListener("change", () => { fillTargets(); schedule(); });
  $("target").addEventListener("change", () => { updateSwap(); schedule(); });
  $("swap").addEventListener("click", swap);
  $("clear").addEventListener("click", () => { $("input").value = ""; schedule(); $("input").focus(); });
  $("copy").addEventListener("click", copy);
  $("edit").addEventListener("click", edit);
  $("send").addEventListener("click", sendSuggestion);
  $("api-key").addEventListener("input", () => { localStorage.setItem("nmt-api-key", apiKey()); schedule(); });
  $("mode-text").addEventListener("click", () => setMode(false));
  $("mode-files").addEventListener("click", () => setMode(true));
  $("file").addEventListener("change", () => { $("translate-file").disabled = !$("file").files.length; });
  $("translate-file").addEventListener("click", translateFile);

  document.body.classList.add("ready");
  if (params.get("q")) { $("input").value = params.get("q"); }
  updateCount();
  if ($("input").value) translateNow();
  $("input").focus();
}

document.addEventListener("DOMContentLoaded", init);
