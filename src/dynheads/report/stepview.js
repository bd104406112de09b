/* Per-step view of the dynheads report. Vanilla JS, no network; data: #stepview-data (dynheads.report.stepview). */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("stepview-data").textContent);
  var picker = document.getElementById("sv-sample");
  var meta = document.getElementById("sv-meta");
  var tokens = document.getElementById("sv-tokens");
  var panel = document.getElementById("sv-panel");
  var entries = [];
  data.runs.forEach(function (run) {
    run.samples.forEach(function (sample) { entries.push({ run: run, sample: sample }); });
  });
  if (!entries.length) {
    document.getElementById("stepview").textContent = "No traced task run in this folder yet (its stages have not run).";
    return;
  }
  entries.forEach(function (entry, i) {
    var option = el("option", null, entry.run.label + ": " + entry.sample.id);
    option.value = String(i);
    picker.appendChild(option);
  });
  picker.addEventListener("change", function () { showSample(entries[Number(picker.value)]); });
  showSample(entries[0]);

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function visible(text) { return text.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205"; }

  function fmt(value) { return typeof value === "number" ? value.toFixed(3) : String(value); }

  function showSample(entry) {
    var s = entry.sample, run = entry.run;
    var metrics = Object.keys(s.metrics).map(function (k) { return k + " " + fmt(s.metrics[k]); }).join(", ");
    var rule = run.score === "copy" ? "Eq. 1 copy score = 1" : "Eq. 2 score > " + run.threshold;
    meta.textContent = run.label + " sample " + s.id + " (" + metrics + "); " +
      (s.question ? "question \u201c" + s.question + "\u201d; " : "") + "answer \u201c" + s.answer + "\u201d; " +
      s.prompt_length + " prompt tokens, " + s.total_steps + " generated" +
      (s.steps.length < s.total_steps ? " (first " + s.steps.length + " shown)" : "") +
      ". A head retrieves when " + rule + ". " + run.samples.length + " of " + run.total_samples +
      " samples of this run are included; chip shade = number of heads.";
    tokens.textContent = "";
    var most = Math.max.apply(null, s.steps.map(function (step) { return step.n; }).concat([1]));
    s.steps.forEach(function (step, t) {
      var chip = el("button", "chip", visible(step.tok));
      chip.type = "button";
      chip.title = "step " + t + ": " + step.n + " head" + (step.n === 1 ? "" : "s");
      chip.style.background = "rgba(29, 63, 143, " + (0.5 * step.n / most).toFixed(3) + ")";
      chip.dataset.step = String(t);
      chip.addEventListener("click", function () { showStep(entry, t); });
      tokens.appendChild(chip);
    });
    var first = s.steps.findIndex(function (step) { return step.n > 0; });
    showStep(entry, first < 0 ? 0 : first);
  }

  function showStep(entry, t) {
    var s = entry.sample, step = s.steps[t], copy = entry.run.score === "copy";
    Array.prototype.forEach.call(tokens.children, function (chip) {
      chip.classList.toggle("sel", chip.dataset.step === String(t));
    });
    panel.textContent = "";
    if (!step) { panel.appendChild(el("p", null, "This sample generated no tokens.")); return; }
    panel.appendChild(el("h3", null, "Step " + t + ": \u201c" + visible(step.tok) + "\u201d \u2014 " + step.n + " head" +
      (step.n === 1 ? "" : "s") + " retrieved" + (step.h.length < step.n ? " (best " + step.h.length + " shown)" : "")));
    var total = s.prompt_length + s.total_steps;
    panel.appendChild(el("div", null, "Whole input (yellow: " + (copy ? "needle" : "supporting facts") +
      "; dashed line: end of prompt; blue: where each head looked)"));
    panel.appendChild(strip(s, step, 0, total));
    if (s.spans.length) {
      var lo = Math.max(0, s.spans[0][0] - 50), hi = Math.min(total, s.spans[s.spans.length - 1][1] + 50);
      panel.appendChild(el("div", null, "Zoom on positions " + lo + "\u2013" + hi));
      panel.appendChild(strip(s, step, lo, hi));
    }
    if (!step.h.length) { panel.appendChild(el("p", null, "No head retrieved at this step.")); return; }
    var table = el("table"), header = el("tr");
    ["head", copy ? "attention on copied token" : "Eq. 2 score", "looked at", "where"].forEach(function (name) {
      header.appendChild(el("th", null, name));
    });
    table.appendChild(header);
    step.h.forEach(function (h) {
      var row = el("tr");
      row.appendChild(el("td", null, "L" + h[0] + "-H" + h[1]));
      row.appendChild(el("td", null, h[3].toFixed(3)));
      row.appendChild(el("td", null, "pos " + h[2]));
      row.appendChild(el("td", "where", where(entry, h[2], step)));
      table.appendChild(row);
    });
    panel.appendChild(table);
  }

  function strip(s, step, lo, hi) {
    var box = el("div", "strip"), width = Math.max(hi - lo, 1);
    function pct(pos) { return (100 * (pos - lo) / width).toFixed(3) + "%"; }
    s.spans.forEach(function (span) {
      var a = Math.max(span[0], lo), b = Math.min(span[1], hi);
      if (b <= a) return;
      var block = el("div", "span");
      block.style.left = pct(a);
      block.style.width = (100 * (b - a) / width).toFixed(3) + "%";
      block.title = "positions " + span[0] + "\u2013" + (span[1] - 1);
      box.appendChild(block);
    });
    if (s.prompt_length > lo && s.prompt_length < hi) {
      var end = el("div", "end");
      end.style.left = pct(s.prompt_length);
      box.appendChild(end);
    }
    step.h.forEach(function (h) {
      if (h[2] < lo || h[2] >= hi) return;
      var tick = el("div", "tick");
      tick.style.left = pct(h[2]);
      tick.title = "L" + h[0] + "-H" + h[1] + " \u2192 pos " + h[2];
      box.appendChild(tick);
    });
    var wrap = el("div"), axis = el("div", "axis");
    axis.appendChild(el("span", null, String(lo)));
    axis.appendChild(el("span", null, String(hi)));
    wrap.appendChild(box);
    wrap.appendChild(axis);
    return wrap;
  }

  function where(entry, pos, step) {
    var s = entry.sample, copy = entry.run.score === "copy";
    function spanName(i) { return copy ? "needle" : "supporting fact " + (i + 1) + " of " + s.spans.length; }
    for (var i = 0; i < s.spans.length; i++) {
      var span = s.spans[i];
      if (pos >= span[0] && pos < span[1]) {
        var text = spanName(i) + ", token " + (pos - span[0] + 1) + " of " + (span[1] - span[0]);
        return copy ? text + "; copies \u201c" + visible(step.tok) + "\u201d" : text;
      }
    }
    if (pos >= s.prompt_length) {
      var generated = s.steps[pos - s.prompt_length];
      return "generated token " + (pos - s.prompt_length) + (generated ? " \u201c" + visible(generated.tok) + "\u201d" : "");
    }
    if (!s.spans.length) return "prompt";
    var best = null;
    s.spans.forEach(function (candidate, j) {
      var before = pos < candidate[0], distance = before ? candidate[0] - pos : pos - candidate[1] + 1;
      if (!best || distance < best.distance) best = { distance: distance, before: before, index: j };
    });
    return "prompt, " + best.distance + " token" + (best.distance === 1 ? "" : "s") + (best.before ? " before " : " after ") +
      "the " + spanName(best.index);
  }
})();
