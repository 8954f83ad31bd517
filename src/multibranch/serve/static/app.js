// The page of `multibranch serve`: translate with n-best alternatives (POST translate) and draw the
// attention of a chosen translation as a heat map table (POST attention); for a classifier (info.task),
// label texts with every label's probability (POST classify). Plain JS, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const KIND_NAMES = { cross: "cross (target \u2192 source)", encoder_self: "encoder self", decoder_self: "decoder self" };
let info = null;        // GET info
let chosen = null;      // {source, target, element}: the translation whose attention is drawn
let attentionCall = 0;  // answers of older attention calls are ignored

// ---- talking to the server -------------------------------------------------------------------------

function describe(response, data) {
  const detail = data && data.detail;
  let text;
  if (typeof detail === "string") {
    text = detail;
  } else if (Array.isArray(detail)) {  // FastAPI validation errors
    text = detail.map((d) => {
      const where = (d.loc || []).filter((part) => part !== "body").join(".");
      return (where ? where + ": " : "") + d.msg;
    }).join("; ");
  } else {
    text = response.statusText || "the request failed";
  }
  return `Error ${response.status}: ${text}`;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    throw new Error(`could not reach the server (${err.message})`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch (_) {
    // not JSON: described by the status alone
  }
  if (!response.ok) throw new Error(describe(response, data));
  return data;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

// ---- model description -----------------------------------------------------------------------------

async function loadInfo() {
  try {
    info = await api("info");
  } catch (err) {
    $("model-info").textContent = "";
    showError(err.message);
    return;
  }
  const parts = [info.kind, `${info.engine} engine`];
  if (info.task === "classification") {
    parts.unshift("classifier");
    parts.push(`labels: ${info.labels.join(", ")}`);
    useClassifierLayout();
  }
  if (info.decode) parts.push(`beam ${info.decode.beam}`);
  if (info.parameters) parts.push(`${(info.parameters / 1e6).toFixed(2)}M parameters`);
  $("model-info").textContent = parts.filter(Boolean).join(" \u00b7 ");
  const beam = info.decode ? info.decode.beam : 1;
  $("nbest").max = beam;
  $("nbest").value = Math.min(3, beam);
  if (info.attention) {
    fillKinds();
  }
}

function useClassifierLayout() {
  document.title = "multibranch: classify";
  $("source-label").textContent = "Texts to classify (one per line)";
  $("nbest-label").hidden = true;
  $("translate").textContent = "Classify";
  $("results-title").textContent = "Labels";
  $("results-hint").textContent = "The most probable label first, with every label's probability.";
}

// ---- translation and classification ----------------------------------------------------------------

// What the page asks of the server for each task: the route, the request, and how to show the answer.
const TASKS = {
  translation: {
    empty: "Type a sentence to translate.", busy: "translating",
    request: (texts) => ["translate", { texts, nbest: Number($("nbest").value) || 1 }],
    show: (list, texts, data) => texts.forEach((source, i) => list.append(sentenceItem(source, translationList(source, data.translations[i])))),
    done: () => { $("attention").hidden = true; chosen = null; },
  },
  classification: {
    empty: "Type a text to classify.", busy: "classifying",
    request: (texts) => ["classify", { texts, probs: true }],
    show: (list, texts, data) => texts.forEach((source, i) => list.append(sentenceItem(source, labelList(data.probabilities[i])))),
    done: () => {},
  },
};

async function submit() {
  const task = TASKS[info && info.task === "classification" ? "classification" : "translation"];
  const texts = $("source").value.split("\n").map((line) => line.trim()).filter((line) => line);
  showError("");
  if (!texts.length) {
    showError(task.empty);
    return;
  }
  $("translate").disabled = true;
  $("status").textContent = `${task.busy}\u2026`;
  try {
    const data = await api(...task.request(texts));
    const list = $("sentences");
    list.replaceChildren();
    task.show(list, texts, data);
    $("results").hidden = false;
    task.done();
  } catch (err) {
    showError(err.message);
  } finally {
    $("translate").disabled = false;
    $("status").textContent = "";
  }
}

function span(className, text) {
  const element = document.createElement("span");
  element.className = className;
  element.textContent = text;
  return element;
}

function sentenceItem(source, answers) {
  const item = document.createElement("li");
  item.className = "sentence";
  const src = document.createElement("div");
  src.className = "source";
  src.textContent = source;
  item.append(src, answers);
  return item;
}

function translationList(source, hypotheses) {
  const hyps = document.createElement("ol");
  hyps.className = "nbest";
  for (const hyp of hypotheses) {
    const row = document.createElement("li");
    row.className = "hyp";
    row.tabIndex = 0;
    row.append(span("text", hyp.text), span("score", hyp.score.toFixed(3)));
    row.addEventListener("click", () => choose(source, hyp.text, row));
    row.addEventListener("keydown", (event) => { if (event.key === "Enter") choose(source, hyp.text, row); });
    hyps.append(row);
  }
  return hyps;
}

function labelList(probabilities) {
  const labels = document.createElement("ol");
  labels.className = "labels";
  const ranked = Object.entries(probabilities).sort((a, b) => b[1] - a[1]);
  for (const [name, probability] of ranked) {
    const row = document.createElement("li");
    row.className = "label";
    const bar = span("bar", "");
    bar.style.width = `${(100 * probability).toFixed(1)}%`;
    row.append(span("text", name), bar, span("score", probability.toFixed(3)));
    labels.append(row);
  }
  return labels;
}

// ---- attention -------------------------------------------------------------------------------------

function option(value, label) {
  const element = document.createElement("option");
  element.value = value;
  element.textContent = label;
  return element;
}

function fillKinds() {
  const kinds = Object.keys(info.attention);
  $("kind").replaceChildren(...kinds.map((kind) => option(kind, KIND_NAMES[kind] || kind)));
  if (kinds.includes("cross")) $("kind").value = "cross";
  fillLayers();
}

function fillLayers() {
  const available = info.attention[$("kind").value];
  const previous = $("layer").value;
  const layers = [...Array(available.layers).keys()];
  $("layer").replaceChildren(...layers.map((layer) => option(layer, String(layer))));
  $("layer").value = previous !== "" && Number(previous) < available.layers ? previous : available.layers - 1;
  fillUnits();
}

function fillUnits() {
  const available = info.attention[$("kind").value];
  const layer = Number($("layer").value);
  const heads = available.heads[layer];
  const branches = available.branches[layer];
  const previous = $("unit").value;
  const options = [];
  if (branches > 1) {
    for (let b = 0; b < branches; b++) options.push(option(`branch:${b}`, `branch ${b} (mean of ${heads / branches} heads)`));
  } else {
    options.push(option("branch:0", `all ${heads} heads (mean)`));
  }
  for (let h = 0; h < heads; h++) options.push(option(`head:${h}`, `head ${h}`));
  $("unit").replaceChildren(...options);
  if (options.some((o) => o.value === previous)) $("unit").value = previous;
}

function choose(source, target, element) {
  document.querySelectorAll(".hyp.selected").forEach((row) => row.classList.remove("selected"));
  element.classList.add("selected");
  chosen = { source, target };
  $("attention").hidden = false;
  const available = Boolean(info && info.attention);
  $("attention-unavailable").hidden = available;
  $("attention-view").hidden = !available;
  if (available) drawAttention();
}

async function drawAttention() {
  if (!chosen) return;
  const [unit, index] = $("unit").value.split(":");
  const label = $("unit").selectedOptions[0].textContent;
  const request = { text: chosen.source, target: chosen.target, kind: $("kind").value, layer: Number($("layer").value) };
  request[unit] = Number(index);
  const call = ++attentionCall;
  showError("");
  $("attention-caption").textContent = "computing\u2026";
  try {
    const map = await api("attention", request);
    if (call === attentionCall) drawHeatmap(map, label);
  } catch (err) {
    if (call === attentionCall) {
      $("attention-caption").textContent = "";
      $("heatmap").replaceChildren();
      showError(err.message);
    }
  }
}

function drawHeatmap(map, label) {
  const top = Math.max(...map.weights.flat(), 1e-9);  // shades relative to the largest weight
  const head = document.createElement("tr");
  head.append(document.createElement("th"));
  for (const token of map.columns) {
    const th = document.createElement("th");
    th.className = "col";
    th.textContent = token;
    head.append(th);
  }
  const thead = document.createElement("thead");
  thead.append(head);
  const tbody = document.createElement("tbody");
  map.weights.forEach((row, i) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.className = "row";
    th.textContent = map.rows[i];
    tr.append(th);
    row.forEach((weight, j) => {
      const td = document.createElement("td");
      td.className = "cell";
      td.dataset.weight = weight;
      td.style.backgroundColor = `rgba(29, 78, 216, ${Math.min(1, Math.max(0, weight / top)).toFixed(3)})`;
      td.title = `${map.rows[i]} \u2192 ${map.columns[j]}: ${weight.toFixed(3)}`;
      tr.append(td);
    });
    tbody.append(tr);
  });
  $("heatmap").replaceChildren(thead, tbody);
  $("attention-caption").textContent = `${map.module}, ${label}: rows are queries, columns keys; the darkest cell `
    + `has the largest weight (${top.toFixed(2)}); hover a cell for its value.`;
}

// ---- wiring ----------------------------------------------------------------------------------------

$("translate").addEventListener("click", submit);
$("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) submit();
});
$("kind").addEventListener("change", () => { fillLayers(); drawAttention(); });
$("layer").addEventListener("change", () => { fillUnits(); drawAttention(); });
$("unit").addEventListener("change", drawAttention);
loadInfo();
