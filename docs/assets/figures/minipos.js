// minipos in JavaScript: the functions the site's interactive figures draw, written as minipos
// writes them (the Python functions of the same names, module by module), in float64.
//
// It is a port, and the golden vectors check it like any other: tests/js/minipos.test.cjs feeds
// every function here the cases of its family in spec/vectors and compares with the family's
// float64 tolerance (`node --test tests/js`, run by tests/test_docs_js.py). Arrays are
// {shape: [...], data: [...]} in row-major order, as in the golden vectors; scalars are numbers.
//
// Loaded as a classic script (window.minipos) by the site and with require() by Node: no modules,
// no network, no dependencies.
(function (root, factory) {
  "use strict";
  if (typeof module === "object" && module.exports) module.exports = factory();
  else root.minipos = factory();
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  // ------------------------------------------------------------------ arrays

  function size(shape) {
    return shape.reduce(function (a, b) { return a * b; }, 1);
  }

  function array(shape, fill) {
    var data = new Array(size(shape));
    for (var i = 0; i < data.length; i++) data[i] = fill === undefined ? 0 : fill;
    return { shape: shape.slice(), data: data };
  }

  function strides(shape) {
    var s = new Array(shape.length), acc = 1;
    for (var i = shape.length - 1; i >= 0; i--) { s[i] = acc; acc *= shape[i]; }
    return s;
  }

  // The element of `a` at `index` (an index into a shape that `a` broadcasts to, aligned right).
  function at(a, index) {
    var off = index.length - a.shape.length, st = strides(a.shape), flat = 0;
    for (var i = 0; i < a.shape.length; i++) {
      var k = a.shape[i] === 1 ? 0 : index[i + off];
      flat += k * st[i];
    }
    return a.data[flat];
  }

  function positions(p) {
    // an int n means arange(n), as in minipos
    if (typeof p === "number") { var out = []; for (var i = 0; i < p; i++) out.push(i); return out; }
    return Array.isArray(p) ? p.slice() : p.data.slice();
  }

  // ------------------------------------------------------------------ minipos.sinusoidal

  function sinusoidalFrequencies(dim, base, layout) {
    base = base === undefined ? 10000.0 : base;
    layout = layout || "interleaved";
    var half = Math.floor(dim / 2), w = [];
    for (var i = 0; i < half; i++) {
      var e = layout === "tensor2tensor" ? -i / Math.max(half - 1, 1) : (i * -2.0) / dim;
      w.push(Math.pow(base, e));                                // w_i = base^(-2i/D) or base^(-i/(D/2 - 1))
    }
    return w;
  }

  function sinusoidalTable(pos, dim, base, layout) {
    layout = layout || "interleaved";
    pos = positions(pos);
    var w = sinusoidalFrequencies(dim, base, layout), half = w.length, out = array([pos.length, dim]);
    for (var t = 0; t < pos.length; t++) {
      for (var i = 0; i < half; i++) {
        var a = pos[t] * w[i], s = Math.sin(a), c = Math.cos(a);
        if (layout === "interleaved") { out.data[t * dim + 2 * i] = s; out.data[t * dim + 2 * i + 1] = c; }
        else { out.data[t * dim + i] = s; out.data[t * dim + half + i] = c; }   // [sin | cos], zero column if odd
      }
    }
    return out;
  }

  // ------------------------------------------------------------------ minipos.rope

  function ropeInvFreq(dim, base) {
    base = base === undefined ? 10000.0 : base;
    var out = [];
    for (var i = 0; i < dim / 2; i++) out.push(Math.pow(base, (-2.0 * i) / dim));   // θ_i = base^(-2i/D)
    return out;
  }

  // Rotate x (..., T, D) by R(m) at each position m (Eq. 34); options as apply_rope's keywords.
  function applyRope(x, pos, opts) {
    opts = opts || {};
    var layout = opts.layout || "interleaved", D = x.shape[x.shape.length - 1];
    var T = x.shape[x.shape.length - 2], R = opts.rotary_dim == null ? D : opts.rotary_dim;
    var invFreq = opts.inv_freq ? positions(opts.inv_freq) : ropeInvFreq(R, opts.base);
    var f = opts.attention_factor === undefined ? 1.0 : opts.attention_factor;
    pos = positions(pos);
    var out = { shape: x.shape.slice(), data: x.data.slice() }, lead = x.data.length / (T * D);
    for (var b = 0; b < lead; b++) {
      for (var t = 0; t < T; t++) {
        var row = (b * T + t) * D;
        for (var i = 0; i < R / 2; i++) {
          var angle = pos[t] * invFreq[i], c = f * Math.cos(angle), s = f * Math.sin(angle);
          var ia = layout === "interleaved" ? 2 * i : i, ib = layout === "interleaved" ? 2 * i + 1 : i + R / 2;
          var xa = x.data[row + ia], xb = x.data[row + ib];
          out.data[row + ia] = xa * c + -xb * s;                // x ⊙ cos + rot(x) ⊙ sin, rot(x)_a = -x_b
          out.data[row + ib] = xb * c + xa * s;                 //                         rot(x)_b = +x_a
        }
      }
    }
    return out;
  }

  // R(i) q_i · R(j) k_j for q (H, T, D), k (H, S, D): the rope_scores family, (H, T, S).
  function ropeScores(q, k, qpos, kpos, opts) {
    var rq = applyRope(q, qpos, opts), rk = applyRope(k, kpos, opts);
    var H = q.shape[0], T = q.shape[1], S = k.shape[1], D = q.shape[2], out = array([H, T, S]);
    for (var h = 0; h < H; h++)
      for (var t = 0; t < T; t++)
        for (var s = 0; s < S; s++) {
          var acc = 0;
          for (var d = 0; d < D; d++) acc += rq.data[(h * T + t) * D + d] * rk.data[(h * S + s) * D + d];
          out.data[(h * T + t) * S + s] = acc;
        }
    return out;
  }

  // ------------------------------------------------------------------ minipos.rope_scaling
  // Each returns [inv_freq, attention_factor], as in minipos (HF's _compute_*_parameters).

  function ntkBase(base, ratio, dim) { return base * Math.pow(ratio, dim / (dim - 2)); }

  function linear(p) {
    return [ropeInvFreq(p.dim, p.base).map(function (w) { return w / p.factor; }), 1.0];
  }

  function ntk(p) { return [ropeInvFreq(p.dim, ntkBase(p.base, p.factor, p.dim)), 1.0]; }

  function dynamic(p) {
    var L = p.original_max_position_embeddings, n = Math.max(p.seq_len, L);
    return [ropeInvFreq(p.dim, ntkBase(p.base, (p.factor * n) / L - (p.factor - 1.0), p.dim)), 1.0];
  }

  function yarnMscale(scale, mscale) {
    mscale = mscale === undefined ? 1.0 : mscale;
    return scale <= 1 ? 1.0 : 0.1 * mscale * Math.log(scale) + 1.0;
  }

  function yarnCorrectionDim(rotations, dim, base, L) {
    return (dim * Math.log(L / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
  }

  function yarnRamp(dim, base, L, betaFast, betaSlow, truncate) {
    var low = yarnCorrectionDim(betaFast, dim, base, L), high = yarnCorrectionDim(betaSlow, dim, base, L);
    if (truncate) { low = Math.floor(low); high = Math.ceil(high); }
    low = Math.max(low, 0); high = Math.min(high, dim - 1);
    if (low === high) high += 0.001;                            // HF's guard against a zero-width ramp
    var out = [];
    for (var i = 0; i < dim / 2; i++) out.push(Math.min(1, Math.max(0, (i - low) / (high - low))));
    return out;
  }

  function yarn(p) {
    var base = p.base, factor = p.factor, L = p.original_max_position_embeddings;
    var betaFast = p.beta_fast == null ? 32.0 : p.beta_fast, betaSlow = p.beta_slow == null ? 1.0 : p.beta_slow;
    var truncate = p.truncate == null ? true : p.truncate, af;
    if (p.attention_factor != null) af = p.attention_factor;
    else if (p.mscale && p.mscale_all_dim) af = yarnMscale(factor, p.mscale) / yarnMscale(factor, p.mscale_all_dim);
    else af = yarnMscale(factor);
    var ramp = yarnRamp(p.dim, base, L, betaFast, betaSlow, truncate);
    var inv = ropeInvFreq(p.dim, base).map(function (w, i) {
      var g = 1.0 - ramp[i];                                    // extrapolation weight
      return ((1.0 - g) * w) / factor + g * w;                  // (1 - g) w / s + g w
    });
    return [inv, af];
  }

  function llama3(p) {
    var L = p.original_max_position_embeddings, factor = p.factor;
    var lo = p.low_freq_factor == null ? 1.0 : p.low_freq_factor, hi = p.high_freq_factor == null ? 4.0 : p.high_freq_factor;
    var inv = ropeInvFreq(p.dim, p.base).map(function (w) {
      var lam = (2 * Math.PI) / w;
      var a = hi > lo ? (L / lam - lo) / (hi - lo) : 0.0;
      var medium = ((1 - a) * w) / factor + a * w;
      var scaled = lam > L / lo ? w / factor : medium;
      return lam < L / hi ? w : scaled;
    });
    return [inv, 1.0];
  }

  function longrope(p) {
    var L = p.original_max_position_embeddings, factor = p.factor == null ? p.max_position_embeddings / L : p.factor;
    var af = p.attention_factor;
    if (af == null) af = factor <= 1 ? 1.0 : Math.sqrt(1 + Math.log(factor) / Math.log(L));
    var lists = p.seq_len > L ? p.long_factor : p.short_factor;
    return [ropeInvFreq(p.dim, p.base).map(function (w, i) { return w / lists[i]; }), af];
  }

  var ROPE_SCALING = { linear: linear, ntk: ntk, dynamic: dynamic, yarn: yarn, llama3: llama3, longrope: longrope };

  // ------------------------------------------------------------------ minipos.alibi

  function alibiSlopes(H) {
    var P = 1;
    while (P * 2 <= H) P *= 2;                                  // 2^floor(log2 H)
    var e = [];
    for (var h = 1; h <= P; h++) e.push((8.0 * h) / P);         // m_h = 2^(-8h/P)
    for (var k = 1; k < 2 * (H - P); k += 2) e.push((4.0 * k) / P);   // every other slope of the 2P sequence
    return e.map(function (x) { return Math.pow(2, -x); });
  }

  function alibiBias(slopes, qpos, kpos, symmetric) {
    slopes = positions(slopes); qpos = positions(qpos); kpos = positions(kpos);
    var H = slopes.length, T = qpos.length, S = kpos.length, out = array([H, T, S]);
    for (var h = 0; h < H; h++)
      for (var t = 0; t < T; t++)
        for (var s = 0; s < S; s++) {
          var rel = kpos[s] - qpos[t];                           // j - i
          if (symmetric) rel = -Math.abs(rel);
          out.data[(h * T + t) * S + s] = slopes[h] * rel;       // -m_h (i - j)
        }
    return out;
  }

  // ------------------------------------------------------------------ minipos.t5

  var f32 = Math.fround;

  function t5PerDir(bidirectional, K) { return bidirectional ? Math.floor(K / 2) : K; }

  // The log branch before truncation, in float32 as transformers computes it (minipos.t5._float32_x).
  function t5Float32X(m, P, M) {
    var E = Math.floor(P / 2);
    var ratio = f32(f32(m) / f32(E));
    var logRatio = f32(Math.log(ratio));
    return f32(f32(logRatio / f32(Math.log(M / E))) * f32(P - E));
  }

  // b(m) >= E + k under real arithmetic: m^W >= M^k E^(W-k), W = P - E (BigInt where the logs are too close).
  function t5Reached(n, k, E, W, M) {
    var gap = W * Math.log(n) - (k * Math.log(M) + (W - k) * Math.log(E));
    if (Math.abs(gap) > 1e-12 * (W * Math.log(M) + 1.0)) return gap > 0;
    var big = function (x, e) { var r = 1n, b = BigInt(x); for (var i = 0; i < e; i++) r *= b; return r; };
    return big(n, W) >= big(M, k) * big(E, W - k);
  }

  function t5LogBucket(m, P, M, exact) {
    var E = Math.floor(P / 2);
    if (m < E) return m;
    if (!exact) return Math.min(E + Math.trunc(t5Float32X(m, P, M)), P - 1);
    var W = P - E, b = E;
    for (var k = 1; k < W; k++) { if (t5Reached(m, k, E, W, M)) b = E + k; else break; }
    return b;
  }

  // T5's bucket of relative_position n = key - query (minipos.t5.relative_position_bucket).
  function t5Bucket(n, opts) {
    opts = opts || {};
    var bidi = opts.bidirectional === undefined ? true : opts.bidirectional;
    var K = opts.num_buckets || 32, M = opts.max_distance || 128, exact = !!opts.exact;
    var P = t5PerDir(bidi, K);
    n = Math.max(-M, Math.min(M, n));                           // |n| >= M is in the last bucket anyway
    var offset = 0, m;
    if (bidi) { offset = n > 0 ? P : 0; m = Math.abs(n); }
    else m = Math.max(-n, 0);                                    // future keys -> distance 0
    return offset + t5LogBucket(m, P, M, exact);
  }

  function t5Bias(table, qpos, kpos, opts) {
    qpos = positions(qpos); kpos = positions(kpos);
    var H = table.shape[1], T = qpos.length, S = kpos.length, out = array([H, T, S]);
    for (var t = 0; t < T; t++)
      for (var s = 0; s < S; s++) {
        var b = t5Bucket(kpos[s] - qpos[t], opts);
        for (var h = 0; h < H; h++) out.data[(h * T + t) * S + s] = table.data[b * H + h];
      }
    return out;
  }

  // ------------------------------------------------------------------ minipos.attention

  function softmaxRow(row) {
    var m = -Infinity, i;
    for (i = 0; i < row.length; i++) if (row[i] > m) m = row[i];
    if (!isFinite(m)) m = 0.0;                                   // a row masked throughout: zeros, not NaN
    var e = row.map(function (x) { return Math.exp(x - m); }), total = 0;
    for (i = 0; i < e.length; i++) total += e[i];
    return e.map(function (x) { return total > 0 ? x / total : 0; });
  }

  // out = softmax(scale q·k + bias, masked) v for q (..., H, T, D), k (..., H, S, D), v (..., H, S, Dv);
  // bias and mask broadcast to (..., H, T, S). Returns {out, weights}.
  function attention(q, k, v, opts) {
    opts = opts || {};
    var nd = q.shape.length, T = q.shape[nd - 2], D = q.shape[nd - 1], S = k.shape[nd - 2], Dv = v.shape[nd - 1];
    var lead = q.shape.slice(0, nd - 2), L = size(lead);
    var scale = opts.scale == null ? 1 / Math.sqrt(D) : opts.scale;
    var out = array(lead.concat([T, Dv])), weights = array(lead.concat([T, S])), ls = strides(lead);
    for (var b = 0; b < L; b++) {
      var idx = ls.map(function (st, i) { return Math.floor(b / st) % lead[i]; });
      for (var t = 0; t < T; t++) {
        var row = [];
        for (var s = 0; s < S; s++) {
          var full = idx.concat([t, s]), acc = 0;
          for (var d = 0; d < D; d++) acc += q.data[(b * T + t) * D + d] * scale * k.data[(b * S + s) * D + d];
          if (opts.bias) acc += at(opts.bias, full);
          if (opts.mask && !at(opts.mask, full)) acc = -Infinity;
          row.push(acc);
        }
        var p = softmaxRow(row);
        for (s = 0; s < S; s++) {
          weights.data[(b * T + t) * S + s] = p[s];
          for (var e = 0; e < Dv; e++) out.data[(b * T + t) * Dv + e] += p[s] * v.data[(b * S + s) * Dv + e];
        }
      }
    }
    return { out: out, weights: weights };
  }

  function causalMask(T, S) {
    var m = array([T, S], false);
    for (var t = 0; t < T; t++) for (var s = 0; s < S; s++) m.data[t * S + s] = s <= t + (S - T);
    return m;
  }

  // ------------------------------------------------------------------ comparing with a golden vector

  // The spec's rule: |got - expected| <= atol + rtol |expected|, only where `where` is true.
  function compare(got, expected, tol, where) {
    var bad = [], gd = Array.isArray(got) ? got : got.data, ed = expected.data;
    if (gd.length !== ed.length) return { ok: false, shape: true, bad: [], compared: 0 };
    var n = 0;
    for (var i = 0; i < ed.length; i++) {
      if (where && !where.data[i]) continue;
      n++;
      var g = typeof gd[i] === "boolean" ? Number(gd[i]) : gd[i], e = typeof ed[i] === "boolean" ? Number(ed[i]) : ed[i];
      if (!(Math.abs(g - e) <= tol.atol + tol.rtol * Math.abs(e))) bad.push([i, g, e]);
    }
    return { ok: bad.length === 0, bad: bad, compared: n };
  }

  return {
    size: size, array: array, at: at,
    sinusoidalFrequencies: sinusoidalFrequencies, sinusoidalTable: sinusoidalTable,
    ropeInvFreq: ropeInvFreq, applyRope: applyRope, ropeScores: ropeScores,
    ROPE_SCALING: ROPE_SCALING, yarnMscale: yarnMscale,
    alibiSlopes: alibiSlopes, alibiBias: alibiBias,
    t5Bucket: t5Bucket, t5Bias: t5Bias,
    softmaxRow: softmaxRow, attention: attention, causalMask: causalMask,
    compare: compare
  };
});
