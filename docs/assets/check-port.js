// "Check my port": compare a port's outputs with the golden vectors, in the browser, offline.
//
// The rule is spec/check_port.py's: an output matches when every value satisfies
// |got - expected| <= atol + rtol |expected| with the case's tolerance for the chosen precision,
// only where the case's `where` mask is true. The page (docs/check-port.md) embeds every family of
// spec/vectors and the axis names of check_port.py when the site is built; this file holds the
// checking (pure functions, also run by Node: tests/js/check-port.test.cjs) and the page's UI.
(function (root, factory) {
  "use strict";
  var api = factory();
  if (typeof module === "object" && module.exports) module.exports = api;
  else root.miniposCheckPort = api;
  if (typeof document !== "undefined") {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", function () { api.mount(); });
    else api.mount();
  }
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  var SHOWN = 20;                                     // mismatches listed per output (all are counted)

  // ------------------------------------------------------------------ reading a submission

  function flatten(x, shape, out, depth) {
    if (Array.isArray(x)) {
      if (shape.length <= depth) shape.push(x.length);
      else if (shape[depth] !== x.length) throw new Error("a ragged nested list (rows of different lengths)");
      for (var i = 0; i < x.length; i++) flatten(x[i], shape, out, depth + 1);
    } else {
      if (depth !== shape.length) throw new Error("a ragged nested list (numbers at different depths)");
      out.push(x);
    }
  }

  // An output as given: {shape, data} (the spec's array form, dtype optional), a nested list, or a
  // number (shape []). Returns {shape, data}.
  function toArray(x) {
    if (x !== null && typeof x === "object" && !Array.isArray(x)) {
      if (!Array.isArray(x.data) || !Array.isArray(x.shape)) throw new Error("an array object needs \"shape\" and \"data\"");
      return { shape: x.shape.slice(), data: x.data.slice() };
    }
    if (typeof x === "number" || typeof x === "boolean") return { shape: [], data: [x] };
    if (!Array.isArray(x)) throw new Error("expected an array, a nested list or a number, got " + (x === null ? "null" : typeof x));
    var shape = [], data = [];
    flatten(x, shape, data, 0);
    return { shape: shape, data: data };
  }

  function sameShape(a, b) {
    return a.length === b.length && a.every(function (n, i) { return n === b[i]; });
  }

  function unravel(flat, shape) {
    var idx = new Array(shape.length);
    for (var i = shape.length - 1; i >= 0; i--) { idx[i] = flat % shape[i]; flat = Math.floor(flat / shape[i]); }
    return idx;
  }

  // "h = 0, t = 3 (position 5), s = 1" for a flat index, with the axis letters of check_port.py.
  function label(flat, shape, letters, inputs) {
    var idx = unravel(flat, shape), parts = [];
    var named = letters ? letters.split("") : [];
    var lead = idx.length - named.length;
    idx.forEach(function (k, i) {
      var letter = i >= lead ? named[i - lead] : null;
      var text = (letter || "axis " + i) + " = " + k;
      var src = letter === "t" ? (inputs.q_positions || inputs.positions) : letter === "s" ? inputs.k_positions :
                letter === "n" ? inputs.relative_position : letter === "r" ? inputs.relative_pos : null;
      if (src && src.data && src.shape.length === 1 && k < src.data.length && letter !== "n" && letter !== "r") {
        text += " (position " + src.data[k] + ")";
      }
      if ((letter === "n" || letter === "r") && src && src.data) text = letter + " = " + src.data[flat];
      parts.push(text);
    });
    return parts.length ? parts.join(", ") : "the scalar";
  }

  function num(v) { return typeof v === "boolean" ? Number(v) : v; }

  // ------------------------------------------------------------------ checking

  // submission: {family?, precision?, outputs: {case name: {output name: array} | array}}
  // familyDoc: the family's golden-vector JSON; axes: check_port.AXES[family] or undefined.
  function checkFamily(familyDoc, submission, precision, axes) {
    precision = precision || submission.precision || "float64";
    if (precision !== "float64" && precision !== "float32") throw new Error("precision must be float64 or float32");
    var given = submission.outputs || submission.cases;
    if (!given || typeof given !== "object") throw new Error("the JSON needs an \"outputs\" object: {case name: {output name: array}}");
    var names = familyDoc.cases.map(function (c) { return c.name; });
    var report = { family: familyDoc.family, precision: precision, cases: [], extra: [], passed: 0, failed: 0,
                   missing: 0, values: 0 };
    report.extra = Object.keys(given).filter(function (n) { return names.indexOf(n) < 0; });
    familyDoc.cases.forEach(function (c) {
      var entry = { name: c.name, description: c.description, outputs: [], status: "passed" };
      if (!(c.name in given)) { entry.status = "missing"; report.missing++; report.cases.push(entry); return; }
      var outs = given[c.name], expectedNames = Object.keys(c.expected);
      if (Array.isArray(outs) || typeof outs === "number" || (outs && outs.data && outs.shape)) {
        if (expectedNames.length !== 1) {
          entry.status = "failed";
          entry.error = "the case has " + expectedNames.length + " outputs (" + expectedNames.join(", ") +
                        "): give an object {output name: array}";
          report.failed++; report.cases.push(entry); return;
        }
        var single = {}; single[expectedNames[0]] = outs; outs = single;
      }
      var tol = c.tolerance[precision];
      expectedNames.forEach(function (out) {
        var exp = c.expected[out], res = { name: out, compared: 0, bad: [], count: 0 };
        var alias = out.replace(/[^A-Za-z0-9_]/g, "_");
        var raw = out in outs ? outs[out] : outs[alias];
        if (raw === undefined) { res.error = "not given"; entry.outputs.push(res); entry.status = "failed"; return; }
        var got;
        try { got = toArray(raw); } catch (e) { res.error = e.message; entry.outputs.push(res); entry.status = "failed"; return; }
        if (!sameShape(got.shape, exp.shape)) {
          res.error = "shape [" + got.shape.join(", ") + "], expected [" + exp.shape.join(", ") + "]";
          entry.outputs.push(res); entry.status = "failed"; return;
        }
        var where = c.where ? c.where[out] : null;
        for (var i = 0; i < exp.data.length; i++) {
          if (where && !where.data[i]) continue;
          res.compared++;
          var g = num(got.data[i]), e = num(exp.data[i]);
          var ok = typeof g === "number" && isFinite(g) && Math.abs(g - e) <= tol.atol + tol.rtol * Math.abs(e);
          if (!ok) {
            res.count++;
            if (res.bad.length < SHOWN) {
              res.bad.push({ index: i, at: label(i, exp.shape, axes && axes[out], c.inputs), got: g, expected: e,
                             diff: typeof g === "number" ? Math.abs(g - e) : NaN, allowed: tol.atol + tol.rtol * Math.abs(e) });
            }
          }
        }
        report.values += res.compared;
        if (res.count) entry.status = "failed";
        entry.outputs.push(res);
      });
      if (entry.status === "passed") report.passed++; else report.failed++;
      report.cases.push(entry);
    });
    return report;
  }

  // A submission holding the golden values themselves (what a correct port returns); `change`
  // optionally moves one value: {case, output, index, by}.
  function goldenSubmission(familyDoc, change) {
    var outputs = {};
    familyDoc.cases.forEach(function (c) {
      outputs[c.name] = {};
      Object.keys(c.expected).forEach(function (out) {
        var e = c.expected[out];
        outputs[c.name][out] = { shape: e.shape.slice(), data: e.data.slice() };
      });
    });
    if (change) outputs[change.case][change.output].data[change.index] += change.by;
    return { family: familyDoc.family, precision: "float64", outputs: outputs };
  }

  // ------------------------------------------------------------------ the page

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(v) { return String(v); }                                 // the shortest decimal that reads back
  function small(v) { return typeof v === "number" && isFinite(v) && v !== 0 ? v.toPrecision(3) : String(v); }

  function render(box, report) {
    box.textContent = "";
    var total = report.cases.length;
    var head = el("p", { "class": "minipos-port__summary", "data-failed": report.failed, "data-passed": report.passed,
                         "data-missing": report.missing },
                  report.family + " (" + report.precision + " tolerances): " + report.passed + " of " + total +
                  " cases passed, " + report.failed + " failed, " + report.missing + " not given; " +
                  report.values + " values compared.");
    box.appendChild(head);
    if (report.extra.length) box.appendChild(el("p", {}, "Cases in your file that the family does not have: " + report.extra.join(", ") + "."));
    var list = el("ul", { "class": "minipos-port__cases" });
    report.cases.forEach(function (c) {
      var li = el("li", { "class": "minipos-port__case minipos-port__case--" + c.status });
      li.appendChild(el("strong", {}, c.name + ": " + c.status));
      if (c.error) li.appendChild(el("span", {}, " — " + c.error));
      c.outputs.forEach(function (o) {
        if (!o.error && !o.count) return;
        var p = el("div", {}, o.name + ": " + (o.error ? o.error : o.count + " of " + o.compared + " values differ"));
        li.appendChild(p);
        if (o.bad.length) {
          var t = el("table", { "class": "minipos-port__table" }), tr = el("tr");
          ["where", "got", "expected", "|got − expected|", "allowed"].forEach(function (h) { tr.appendChild(el("th", {}, h)); });
          t.appendChild(el("thead")).appendChild(tr);
          var tb = el("tbody");
          o.bad.forEach(function (b) {
            var r = el("tr");
            [b.at, fmt(b.got), fmt(b.expected), small(b.diff), small(b.allowed)].forEach(function (v) { r.appendChild(el("td", {}, v)); });
            tb.appendChild(r);
          });
          t.appendChild(tb);
          li.appendChild(t);
          if (o.count > o.bad.length) li.appendChild(el("div", {}, "… and " + (o.count - o.bad.length) + " more."));
        }
      });
      list.appendChild(li);
    });
    box.appendChild(list);
  }

  function mount() {
    var root = document.getElementById("minipos-check-port");
    var data = document.getElementById("minipos-vectors");
    if (!root || !data || root.dataset.ready) return;
    root.dataset.ready = "1";
    var spec = JSON.parse(data.textContent), families = Object.keys(spec.families).sort();
    root.textContent = "";
    var controls = el("div", { "class": "minipos-port__controls" });
    var famSel = el("select", { id: "minipos-port-family" });
    families.forEach(function (f) { famSel.appendChild(el("option", { value: f }, f + " (" + spec.families[f].cases.length + " cases)")); });
    var precSel = el("select", { id: "minipos-port-precision" });
    ["float64", "float32"].forEach(function (p) { precSel.appendChild(el("option", { value: p }, p)); });
    var file = el("input", { type: "file", accept: ".json,application/json", id: "minipos-port-file" });
    var drop = el("div", { "class": "minipos-port__drop", tabindex: "0" }, "Drop your outputs' JSON here, or choose a file:");
    drop.appendChild(el("br"));
    drop.appendChild(file);
    var text = el("textarea", { id: "minipos-port-text", rows: "6", placeholder: "…or paste the JSON here" });
    var run = el("button", { type: "button", "class": "md-button md-button--primary", id: "minipos-port-run" }, "Check");
    var golden = el("button", { type: "button", "class": "md-button", id: "minipos-port-golden" }, "Try the golden values");
    var broken = el("button", { type: "button", "class": "md-button", id: "minipos-port-broken" }, "Try with one value wrong");
    var out = el("div", { "class": "minipos-port__report", id: "minipos-port-report", "aria-live": "polite" });
    var lab = function (t, c) { var l = el("label", {}, t + " "); l.appendChild(c); return l; };
    controls.appendChild(lab("family", famSel));
    controls.appendChild(lab("precision", precSel));
    [drop, text].forEach(function (x) { root.appendChild(x); });
    root.insertBefore(controls, drop);
    var buttons = el("div", { "class": "minipos-port__buttons" });
    [run, golden, broken].forEach(function (b) { buttons.appendChild(b); });
    root.appendChild(buttons);
    root.appendChild(out);

    function check(submission) {
      try {
        if (submission.family && spec.families[submission.family]) famSel.value = submission.family;
        if (submission.precision === "float32" || submission.precision === "float64") precSel.value = submission.precision;
        var fam = spec.families[famSel.value];
        render(out, checkFamily(fam, submission, precSel.value, spec.axes[famSel.value]));
      } catch (e) {
        out.textContent = "";
        out.appendChild(el("p", { "class": "minipos-port__error" }, "Could not check: " + e.message));
      }
    }
    function checkText(t) {
      var sub;
      try { sub = JSON.parse(t); } catch (e) { out.textContent = "Not JSON: " + e.message; return; }
      check(sub);
    }
    run.addEventListener("click", function () { checkText(text.value); });
    golden.addEventListener("click", function () {
      var sub = goldenSubmission(spec.families[famSel.value]);
      text.value = JSON.stringify(sub).slice(0, 200000);
      check(sub);
    });
    broken.addEventListener("click", function () {
      var fam = spec.families[famSel.value], c = fam.cases[0], name = Object.keys(c.expected)[0];
      var sub = goldenSubmission(fam, { case: c.name, output: name, index: 0, by: 1e-3 + Math.abs(c.expected[name].data[0]) * 1e-3 });
      text.value = JSON.stringify(sub).slice(0, 200000);
      check(sub);
    });
    file.addEventListener("change", function () {
      if (!file.files.length) return;
      var reader = new FileReader();
      reader.onload = function () { text.value = reader.result; checkText(reader.result); };
      reader.readAsText(file.files[0]);
    });
    drop.addEventListener("dragover", function (e) { e.preventDefault(); drop.classList.add("minipos-port__drop--over"); });
    drop.addEventListener("dragleave", function () { drop.classList.remove("minipos-port__drop--over"); });
    drop.addEventListener("drop", function (e) {
      e.preventDefault();
      drop.classList.remove("minipos-port__drop--over");
      var f = e.dataTransfer.files[0];
      if (!f) return;
      var reader = new FileReader();
      reader.onload = function () { text.value = reader.result; checkText(reader.result); };
      reader.readAsText(f);
    });
  }

  return { toArray: toArray, checkFamily: checkFamily, goldenSubmission: goldenSubmission, label: label, mount: mount };
});
