// The site's interactive figures: each <div class="minipos-interactive" data-minipos-figure="name">
// becomes controls and an SVG drawn from window.minipos (minipos.js, the port the golden vectors
// check). Self-contained: no library, no network; the figure redraws on every input.
(function () {
  "use strict";
  var mp = window.minipos;
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf"];

  // ------------------------------------------------------------------ small DOM helpers

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function s(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  var uid = 0;

  function slider(box, label, opts, onInput) {
    var id = "minipos-ctl-" + (++uid);
    var wrap = el("label", { "class": "minipos-control", "for": id });
    var input = el("input", { type: "range", id: id, min: opts.min, max: opts.max, step: opts.step || 1,
                              value: opts.value, "data-name": opts.name || label });
    var out = el("output", { "for": id });
    var show = function () { out.textContent = (opts.format || String)(Number(input.value)); };
    input.addEventListener("input", function () { show(); onInput(Number(input.value)); });
    wrap.appendChild(el("span", {}, label + " "));
    wrap.appendChild(input);
    wrap.appendChild(out);
    box.appendChild(wrap);
    show();
    return input;
  }

  function choice(box, label, options, value, onChange) {
    var id = "minipos-ctl-" + (++uid);
    var wrap = el("label", { "class": "minipos-control", "for": id });
    var sel = el("select", { id: id, "data-name": label });
    options.forEach(function (o) {
      var opt = el("option", { value: o[0] }, o[1]);
      if (o[0] === value) opt.selected = true;
      sel.appendChild(opt);
    });
    sel.addEventListener("change", function () { onChange(sel.value); });
    wrap.appendChild(el("span", {}, label + " "));
    wrap.appendChild(sel);
    box.appendChild(wrap);
    return sel;
  }

  function button(box, label, onClick) {
    var b = el("button", { type: "button", "class": "md-button minipos-button" }, label);
    b.addEventListener("click", onClick);
    box.appendChild(b);
    return b;
  }

  // A plot area: scales, axes with a few ticks, and a group to draw into.
  function plot(svg, box, opts) {
    var x = box.x, y = box.y, w = box.w, h = box.h;
    var fx = opts.xlog ? Math.log : function (v) { return v; };
    var fy = opts.ylog ? Math.log : function (v) { return v; };
    var X = function (v) { return x + ((fx(v) - fx(opts.x0)) / (fx(opts.x1) - fx(opts.x0))) * w; };
    var Y = function (v) { return y + h - ((fy(v) - fy(opts.y0)) / (fy(opts.y1) - fy(opts.y0))) * h; };
    var g = s("g", { "class": "minipos-plot" });
    g.appendChild(s("rect", { x: x, y: y, width: w, height: h, fill: "none", stroke: "currentColor", "stroke-opacity": 0.3 }));
    (opts.xticks || []).forEach(function (t) {
      g.appendChild(s("line", { x1: X(t), x2: X(t), y1: y + h, y2: y + h + 4, stroke: "currentColor" }));
      g.appendChild(s("text", { x: X(t), y: y + h + 16, "text-anchor": "middle", "font-size": 11 }, fmt(t)));
    });
    (opts.yticks || []).forEach(function (t) {
      g.appendChild(s("line", { x1: x - 4, x2: x, y1: Y(t), y2: Y(t), stroke: "currentColor" }));
      g.appendChild(s("text", { x: x - 7, y: Y(t) + 4, "text-anchor": "end", "font-size": 11 }, fmt(t)));
    });
    if (opts.xlabel) g.appendChild(s("text", { x: x + w / 2, y: y + h + 32, "text-anchor": "middle", "font-size": 12 }, opts.xlabel));
    if (opts.ylabel) g.appendChild(s("text", { x: x - 44, y: y + h / 2, "text-anchor": "middle", "font-size": 12,
                                               transform: "rotate(-90 " + (x - 44) + " " + (y + h / 2) + ")" }, opts.ylabel));
    if (opts.title) g.appendChild(s("text", { x: x + w / 2, y: y - 8, "text-anchor": "middle", "font-size": 12 }, opts.title));
    svg.appendChild(g);
    return { X: X, Y: Y, g: g, clip: function (v) { return Math.max(opts.y0, Math.min(opts.y1, v)); } };
  }

  function fmt(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(0).replace("e+", "e");
    if (a >= 100) return String(Math.round(v));
    return String(Math.round(v * 1000) / 1000);
  }

  function polyline(p, xs, ys, attrs) {
    var pts = xs.map(function (xv, i) { return p.X(xv).toFixed(2) + "," + p.Y(p.clip(ys[i])).toFixed(2); }).join(" ");
    var a = { points: pts, fill: "none", "stroke-width": 1.8 };
    Object.keys(attrs || {}).forEach(function (k) { a[k] = attrs[k]; });
    p.g.appendChild(s("polyline", a));
  }

  function newSvg(fig, width, height, label) {
    var svg = s("svg", { viewBox: "0 0 " + width + " " + height, width: width, height: height, role: "img",
                         "aria-label": label, "class": "minipos-interactive__svg" });
    fig.appendChild(svg);
    return svg;
  }

  function clear(svg) { while (svg.firstChild) svg.removeChild(svg.firstChild); }

  function vec(shape, data) { return { shape: shape, data: data }; }

  // A small deterministic generator (mulberry32) for the figures' "random" vectors.
  function rng(seed) {
    return function () {
      seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
      var t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  function normals(r, n) {
    var out = [];
    for (var i = 0; i < n; i++) {
      var u = Math.max(r(), 1e-12), v = r();
      out.push(Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v));
    }
    return out;
  }

  // ------------------------------------------------------------------ 1. RoPE turns a pair

  function ropeRotation(fig, controls, readout) {
    var D = 8, st = { m: 9, n: 4, pair: 0 };
    var r = rng(7), q = normals(r, D), k = normals(r, D);
    var svg = newSvg(fig, 640, 300, "RoPE rotating one pair of q and k");
    function score(m, n) {
      return mp.ropeScores(vec([1, 1, D], q), vec([1, 1, D], k), [m], [n], { layout: "interleaved" }).data[0];
    }
    function draw() {
      clear(svg);
      var theta = mp.ropeInvFreq(D)[st.pair], cx = 150, cy = 150, R = 110;
      var a = 2 * st.pair, b = 2 * st.pair + 1;
      var qr = mp.applyRope(vec([1, D], q), [st.m], { layout: "interleaved" }).data;
      var kr = mp.applyRope(vec([1, D], k), [st.n], { layout: "interleaved" }).data;
      var scaleLen = R / Math.max(1e-9, Math.hypot(q[a], q[b]), Math.hypot(k[a], k[b]));
      svg.appendChild(s("circle", { cx: cx, cy: cy, r: R, fill: "none", stroke: "currentColor", "stroke-opacity": 0.2 }));
      svg.appendChild(s("text", { x: cx, y: 18, "text-anchor": "middle", "font-size": 12 },
                        "pair " + st.pair + " (features " + a + ", " + b + "), θ = " + fmt(theta)));
      [[q[a], q[b], COLORS[0], 0.25, "q"], [qr[a], qr[b], COLORS[0], 1, "R(m)q"],
       [k[a], k[b], COLORS[1], 0.25, "k"], [kr[a], kr[b], COLORS[1], 1, "R(n)k"]].forEach(function (v) {
        var x2 = cx + v[0] * scaleLen, y2 = cy - v[1] * scaleLen;
        svg.appendChild(s("line", { x1: cx, y1: cy, x2: x2, y2: y2, stroke: v[2], "stroke-opacity": v[3], "stroke-width": 3 }));
        svg.appendChild(s("text", { x: x2 + 4, y: y2 - 4, "font-size": 12, fill: v[2], "fill-opacity": Math.max(v[3], 0.5) }, v[4]));
      });
      // right: the score when both positions move together, and when only the query moves
      var xs = [], together = [], alone = [];
      for (var t = 0; t <= 48; t++) { xs.push(t); together.push(score(st.m + t, st.n + t)); alone.push(score(st.m + t, st.n)); }
      var lo = Math.min.apply(null, together.concat(alone)), hi = Math.max.apply(null, together.concat(alone));
      var pad = Math.max(0.1, (hi - lo) * 0.1);
      var p = plot(svg, { x: 360, y: 30, w: 260, h: 210 }, { x0: 0, x1: 48, y0: lo - pad, y1: hi + pad,
        xticks: [0, 16, 32, 48], yticks: [lo, (lo + hi) / 2, hi].map(function (v) { return Math.round(v * 100) / 100; }),
        xlabel: "shift t", title: "score ⟨R(m+t)q, R(·)k⟩, D = 8" });
      polyline(p, xs, alone, { stroke: COLORS[3] });
      polyline(p, xs, together, { stroke: COLORS[2], "stroke-width": 2.5 });
      p.g.appendChild(s("text", { x: 370, y: 258 + 20, "font-size": 11, fill: COLORS[2] }, "key at n + t (both move): flat"));
      p.g.appendChild(s("text", { x: 370, y: 258 + 34, "font-size": 11, fill: COLORS[3] }, "key stays at n: changes"));
      readout.textContent = "m = " + st.m + ", n = " + st.n + ", m − n = " + (st.m - st.n) +
        ": score ⟨R(m)q, R(n)k⟩ = " + score(st.m, st.n).toFixed(6) + " (all 4 pairs).";
    }
    slider(controls, "query position m", { min: 0, max: 64, value: st.m, name: "m" }, function (v) { st.m = v; draw(); });
    slider(controls, "key position n", { min: 0, max: 64, value: st.n, name: "n" }, function (v) { st.n = v; draw(); });
    slider(controls, "pair", { min: 0, max: 3, value: st.pair, name: "pair" }, function (v) { st.pair = v; draw(); });
    button(controls, "shift both by 5", function () {
      st.m += 5; st.n += 5;
      controls.querySelector('[data-name="m"]').value = st.m;
      controls.querySelector('[data-name="n"]').value = st.n;
      controls.querySelectorAll("input").forEach(function (i) { i.dispatchEvent(new Event("input")); });
    });
    draw();
  }

  // ------------------------------------------------------------------ 2. the spectrum under a scaling

  function ropeScaling(fig, controls, readout) {
    var st = { kind: "yarn", factor: 8, base: 10000 }, D = 128, L = 4096;
    var svg = newSvg(fig, 640, 300, "RoPE wavelengths under a scaling");
    function params() {
      var p = { dim: D, base: st.base, factor: st.factor, original_max_position_embeddings: L };
      if (st.kind === "dynamic") p.seq_len = Math.round(st.factor * L);
      return p;
    }
    function draw() {
      clear(svg);
      var plain = mp.ropeInvFreq(D, st.base), res = st.factor === 1 ? [plain, 1] : mp.ROPE_SCALING[st.kind](params());
      var lam0 = plain.map(function (w) { return 2 * Math.PI / w; }), lam = res[0].map(function (w) { return 2 * Math.PI / w; });
      var xs = lam.map(function (_, i) { return i; });
      var top = Math.max(1e8, 4 * Math.max.apply(null, lam));
      var p = plot(svg, { x: 70, y: 24, w: 540, h: 220 }, { x0: 0, x1: D / 2 - 1, y0: 1, y1: top, ylog: true,
        xticks: [0, 16, 32, 48, 63], yticks: [1, 1e2, 1e4, 1e6, 1e8].filter(function (t) { return t <= top; }),
        xlabel: "pair c (0 turns fastest)", ylabel: "wavelength 2π / w (tokens)" });
      [[L, "L = " + L], [st.factor * L, "s·L"]].forEach(function (h, i) {
        p.g.appendChild(s("line", { x1: p.X(0), x2: p.X(D / 2 - 1), y1: p.Y(h[0]), y2: p.Y(h[0]), stroke: "currentColor",
                                    "stroke-dasharray": i ? "2 3" : "5 4", "stroke-opacity": 0.6 }));
        p.g.appendChild(s("text", { x: p.X(1), y: p.Y(h[0]) - 4, "font-size": 11 }, h[1]));
      });
      polyline(p, xs, lam0, { stroke: COLORS[7], "stroke-dasharray": "4 3" });
      polyline(p, xs, lam, { stroke: COLORS[0], "stroke-width": 2.4 });
      var beyond = lam.filter(function (v) { return v > L; }).length;
      readout.textContent = st.kind + ", s = " + st.factor + ": attention factor " + res[1].toFixed(4) +
        " (multiplies cos and sin, so the rotated logits by " + (res[1] * res[1]).toFixed(4) + "); " + beyond +
        " of " + D / 2 + " pairs have a wavelength longer than L (plain RoPE: " +
        lam0.filter(function (v) { return v > L; }).length + "). Dashed grey: plain RoPE.";
    }
    choice(controls, "scaling", [["linear", "linear (PI)"], ["ntk", "NTK-aware"], ["dynamic", "dynamic NTK at s·L"],
                                  ["yarn", "YaRN"], ["llama3", "Llama 3"]], st.kind, function (v) { st.kind = v; draw(); });
    slider(controls, "factor s", { min: 1, max: 32, value: st.factor, name: "factor" }, function (v) { st.factor = v; draw(); });
    choice(controls, "base", [["10000", "10 000"], ["500000", "500 000"]], "10000", function (v) { st.base = Number(v); draw(); });
    draw();
  }

  // ------------------------------------------------------------------ 3. ALiBi's bias per head

  function alibiHeads(fig, controls, readout) {
    var st = { H: 8 };
    var svg = newSvg(fig, 640, 300, "ALiBi slopes and biases per head");
    function draw() {
      clear(svg);
      var m = mp.alibiSlopes(st.H), dist = [];
      for (var d = 0; d <= 64; d++) dist.push(d);
      var p1 = plot(svg, { x: 60, y: 24, w: 220, h: 220 }, { x0: 0.5, x1: Math.max(st.H, 2) + 0.5, y0: 1 / 512, y1: 1, ylog: true,
        xticks: [1, Math.max(1, Math.round(st.H / 2)), st.H], yticks: [1, 1 / 8, 1 / 64, 1 / 512], xlabel: "head h",
        ylabel: "slope m_h", title: "slopes (log scale)" });
      m.forEach(function (v, h) {
        p1.g.appendChild(s("circle", { cx: p1.X(h + 1), cy: p1.Y(v), r: 3.5, fill: COLORS[h % COLORS.length] }));
      });
      var p2 = plot(svg, { x: 360, y: 24, w: 260, h: 220 }, { x0: 0, x1: 64, y0: -16, y1: 0,
        xticks: [0, 16, 32, 48, 64], yticks: [0, -4, -8, -12, -16], xlabel: "distance i − j", title: "bias −m_h (i − j), query at 64" });
      var bias = mp.alibiBias(m, [64], dist.map(function (d) { return 64 - d; }), false);
      m.forEach(function (_, h) {
        polyline(p2, dist, bias.data.slice(h * dist.length, (h + 1) * dist.length), { stroke: COLORS[h % COLORS.length] });
      });
      var pow2 = (st.H & (st.H - 1)) === 0;
      readout.textContent = "H = " + st.H + (pow2 ? " (a power of two): m_h = 2^(−8h/H). " :
        " (not a power of two): the " + (1 << Math.floor(Math.log2(st.H))) + "-head slopes, then every other slope of the " +
        (2 << Math.floor(Math.log2(st.H))) + "-head sequence. ") + "Slopes: " +
        m.slice(0, 12).map(function (v) { return "2^" + fmt(Math.log2(v)); }).join(", ") + (st.H > 12 ? ", …" : "") + ".";
    }
    slider(controls, "heads H", { min: 1, max: 64, value: st.H, name: "H" }, function (v) { st.H = v; draw(); });
    draw();
  }

  // ------------------------------------------------------------------ 4. T5's buckets

  function t5Buckets(fig, controls, readout) {
    var st = { K: 32, M: 128, bidi: true };
    var svg = newSvg(fig, 640, 300, "T5 buckets against the relative position");
    function draw() {
      clear(svg);
      var R = Math.round(1.5 * st.M), xs = [], ys = [], used = {};
      var opts = { bidirectional: st.bidi, num_buckets: st.K, max_distance: st.M };
      for (var n = -R; n <= R; n++) { var b = mp.t5Bucket(n, opts); xs.push(n); ys.push(b); used[b] = true; }
      var p = plot(svg, { x: 60, y: 24, w: 560, h: 220 }, { x0: -R, x1: R, y0: -0.5, y1: st.K - 0.5,
        xticks: [-R, -st.M, 0, st.M, R], yticks: [0, Math.floor(st.K / 2), st.K - 1],
        xlabel: "n = key − query", ylabel: "bucket" });
      [-st.M, st.M].forEach(function (v) {
        p.g.appendChild(s("line", { x1: p.X(v), x2: p.X(v), y1: p.Y(-0.5), y2: p.Y(st.K - 0.5), stroke: "currentColor",
                                    "stroke-dasharray": "4 3", "stroke-opacity": 0.5 }));
      });
      polyline(p, xs, ys, { stroke: COLORS[0], "stroke-width": 2 });
      var P = st.bidi ? Math.floor(st.K / 2) : st.K, last = P - 1, first = null;
      for (var m = 0; m <= st.M; m++) if (mp.t5Bucket(-m, opts) === last) { first = m; break; }
      var unused = [];
      for (var k = 0; k < st.K; k++) if (!used[k]) unused.push(k);
      readout.textContent = (st.bidi ? "Bidirectional (encoder)" : "Causal (decoder)") + ", " + st.K + " buckets, max_distance " +
        st.M + ": keys before the query reach the last bucket (" + last + ") at |n| = " + first + ", not " + st.M +
        "; buckets never used: " + (unused.length ? unused.join(", ") : "none") + ".";
    }
    choice(controls, "num_buckets", [["8", "8"], ["16", "16"], ["32", "32"], ["33", "33"], ["64", "64"], ["128", "128"]], "32",
           function (v) { st.K = Number(v); draw(); });
    slider(controls, "max_distance", { min: 16, max: 1024, step: 16, value: st.M, name: "max_distance" },
           function (v) { st.M = v; draw(); });
    choice(controls, "mode", [["bi", "bidirectional"], ["causal", "causal"]], "bi", function (v) { st.bidi = v === "bi"; draw(); });
    draw();
  }

  // ------------------------------------------------------------------ 5. sinusoidal dot product

  function sinusoidalDot(fig, controls, readout) {
    var st = { D: 64, base: 10000, m2: 100 };
    var svg = newSvg(fig, 640, 300, "Sinusoidal dot product against the offset");
    function draw() {
      clear(svg);
      var K = 256, ks = [], pos = [];
      for (var k = 0; k <= K; k++) ks.push(k);
      for (var t = 0; t <= st.m2 + K; t++) pos.push(t);
      var pe = mp.sinusoidalTable(pos, st.D, st.base, "interleaved"), D = st.D;
      function dot(a, b) { var acc = 0; for (var d = 0; d < D; d++) acc += pe.data[a * D + d] * pe.data[b * D + d]; return acc; }
      var at0 = ks.map(function (k) { return dot(0, k); }), atm = ks.map(function (k) { return dot(st.m2, st.m2 + k); });
      var p = plot(svg, { x: 60, y: 24, w: 560, h: 220 }, { x0: 0, x1: K, y0: -D / 4, y1: D / 2 + 2,
        xticks: [0, 64, 128, 192, 256], yticks: [0, D / 4, D / 2], xlabel: "offset k", ylabel: "PE(m) · PE(m + k)" });
      polyline(p, ks, at0, { stroke: COLORS[0], "stroke-width": 3.5, "stroke-opacity": 0.5 });
      polyline(p, ks, atm, { stroke: COLORS[1], "stroke-dasharray": "5 3" });
      var diff = Math.max.apply(null, at0.map(function (v, i) { return Math.abs(v - atm[i]); }));
      readout.textContent = "D = " + D + ", base " + st.base + ": m = 0 (solid) and m = " + st.m2 +
        " (dashed) give the same curve, largest difference " + diff.toExponential(1) + ": PE(m)·PE(m+k) = Σ cos(k w_i) " +
        "depends on k only, and is D/2 = " + D / 2 + " at k = 0.";
    }
    slider(controls, "D", { min: 8, max: 256, step: 8, value: st.D, name: "D" }, function (v) { st.D = v; draw(); });
    choice(controls, "base", [["100", "100"], ["10000", "10 000"], ["1000000", "1 000 000"]], "10000",
           function (v) { st.base = Number(v); draw(); });
    slider(controls, "second m", { min: 1, max: 1000, value: st.m2, name: "m" }, function (v) { st.m2 = v; draw(); });
    draw();
  }

  // ------------------------------------------------------------------ 6. a layer's attention pattern

  function attentionPattern(fig, controls, readout) {
    var st = { scheme: "alibi", T: 16, head: 0, content: 1.0 }, H = 4, D = 16, maxT = 32;
    var r = rng(11), qAll = normals(r, H * maxT * D), kAll = normals(r, H * maxT * D), vAll = normals(r, H * maxT * 1);
    var table = { shape: [32, H], data: normals(r, 32 * H).map(function (x) { return 2 * x; }) };
    var svg = newSvg(fig, 640, 330, "Attention weights of one head");
    function weights() {
      var T = st.T, h = st.head, c = st.content;
      var q = { shape: [1, T, D], data: qAll.slice(h * maxT * D, h * maxT * D + T * D).map(function (x) { return c * x; }) };
      var k = { shape: [1, T, D], data: kAll.slice(h * maxT * D, h * maxT * D + T * D).map(function (x) { return c * x; }) };
      var v = { shape: [1, T, 1], data: vAll.slice(0, T) }, bias = null, scale = null, pos = [];
      for (var t = 0; t < T; t++) pos.push(t);
      if (st.scheme === "rope") { q = mp.applyRope(q, pos, { layout: "half" }); k = mp.applyRope(k, pos, { layout: "half" }); }
      if (st.scheme === "alibi") bias = mp.alibiBias([mp.alibiSlopes(H)[h]], pos, pos, false);
      if (st.scheme === "t5") {
        var col = { shape: [32, 1], data: table.data.filter(function (_, i) { return i % H === h; }) };
        bias = mp.t5Bias(col, pos, pos, { bidirectional: false });
        scale = 1.0;
      }
      return mp.attention(q, k, v, { bias: bias, mask: mp.causalMask(T, T), scale: scale }).weights;
    }
    function draw() {
      clear(svg);
      var w = weights(), T = st.T, cell = Math.floor(280 / T), x0 = 60, y0 = 24;
      for (var i = 0; i < T; i++)
        for (var j = 0; j < T; j++) {
          var p = w.data[i * T + j], shade = Math.round(255 * (1 - Math.sqrt(p)));
          svg.appendChild(s("rect", { x: x0 + j * cell, y: y0 + i * cell, width: cell, height: cell,
                                      fill: j > i ? "none" : "rgb(" + shade + "," + shade + ",255)",
                                      stroke: "currentColor", "stroke-opacity": 0.08 }));
        }
      svg.appendChild(s("text", { x: x0 + (T * cell) / 2, y: y0 + T * cell + 18, "text-anchor": "middle", "font-size": 12 }, "key j"));
      svg.appendChild(s("text", { x: x0 - 12, y: y0 + (T * cell) / 2, "text-anchor": "middle", "font-size": 12,
                                  transform: "rotate(-90 " + (x0 - 12) + " " + (y0 + (T * cell) / 2) + ")" }, "query i"));
      // right: the last query's weights by distance
      var last = [], ds = [];
      for (var d = 0; d < T; d++) { ds.push(d); last.push(w.data[(T - 1) * T + (T - 1 - d)]); }
      var pl = plot(svg, { x: 400, y: 24, w: 220, h: 200 }, { x0: 0, x1: Math.max(T - 1, 1), y0: 0, y1: 1,
        xticks: [0, Math.floor((T - 1) / 2), T - 1], yticks: [0, 0.5, 1], xlabel: "distance i − j", title: "last query's weights" });
      polyline(pl, ds, last, { stroke: COLORS[0] });
      var eff = 0; last.forEach(function (p, d) { eff += p * d; });
      readout.textContent = { nope: "NoPE: content only; the causal mask is the only source of position.",
        alibi: "ALiBi head " + (st.head + 1) + " (slope " + fmt(mp.alibiSlopes(H)[st.head]) + "): the bias fades far keys.",
        t5: "T5 head " + (st.head + 1) + " (a random table, causal buckets, no 1/√D): a learned bias per bucket.",
        rope: "RoPE (half layout): q and k rotated; the weights still depend on content." }[st.scheme] +
        " Mean distance attended by the last query: " + eff.toFixed(2) + " tokens.";
    }
    choice(controls, "scheme", [["nope", "NoPE"], ["alibi", "ALiBi"], ["t5", "T5 buckets"], ["rope", "RoPE"]], st.scheme,
           function (v) { st.scheme = v; draw(); });
    slider(controls, "T", { min: 4, max: maxT, value: st.T, name: "T" }, function (v) { st.T = v; draw(); });
    slider(controls, "head", { min: 1, max: H, value: 1, name: "head" }, function (v) { st.head = v - 1; draw(); });
    slider(controls, "content scale", { min: 0, max: 3, step: 0.25, value: st.content, name: "content",
                                        format: function (v) { return v.toFixed(2); } }, function (v) { st.content = v; draw(); });
    draw();
  }

  var FIGURES = { "rope-rotation": ropeRotation, "rope-scaling": ropeScaling, "alibi-heads": alibiHeads,
                  "t5-buckets": t5Buckets, "sinusoidal-dot": sinusoidalDot, "attention-pattern": attentionPattern };

  function init() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-minipos-figure]"), function (fig) {
      if (fig.dataset.miniposReady) return;
      var make = FIGURES[fig.dataset.miniposFigure];
      if (!make) throw new Error("unknown interactive figure: " + fig.dataset.miniposFigure);
      fig.dataset.miniposReady = "1";
      fig.textContent = "";
      var controls = el("div", { "class": "minipos-interactive__controls" });
      var readout = el("p", { "class": "minipos-interactive__readout", "aria-live": "polite" });
      fig.appendChild(controls);
      make(fig, controls, readout);
      fig.appendChild(readout);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
