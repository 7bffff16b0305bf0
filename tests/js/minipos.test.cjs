// The interactive figures' JavaScript (docs/assets/figures/minipos.js) against the golden vectors
// of its families (spec/vectors): every case, every value, with the family's float64 tolerance.
// Run with Node's built-in runner: `node --test tests/js` (tests/test_docs_js.py does, under pytest).
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");

const ROOT = path.resolve(__dirname, "..", "..");
const mp = require(path.join(ROOT, "docs", "assets", "figures", "minipos.js"));

function family(name) {
  const file = JSON.parse(fs.readFileSync(path.join(ROOT, "spec", "vectors", `${name}.json`), "utf8"));
  assert.equal(file.family, name);
  assert.ok(file.cases.length > 0, `${name} has no cases`);
  return file.cases;
}

// Compare the expected outputs of every case (all of them, or those named in `only`) with what
// `run` returns ({name: array or list}).
function check(name, run, only) {
  const cases = family(name);
  let values = 0;
  for (const c of cases) {
    const got = run(c.inputs, c.params);
    for (const [out, expected] of Object.entries(c.expected)) {
      if (only && !only.includes(out)) continue;
      assert.ok(out in got, `${name}/${c.name}: the port gives no ${out}`);
      const where = c.where ? c.where[out] : undefined;
      const r = mp.compare(got[out], expected, c.tolerance.float64, where);
      assert.ok(!r.shape, `${name}/${c.name}/${out}: ${got[out].data ? got[out].data.length : got[out].length} values, expected ${expected.data.length}`);
      assert.ok(r.ok, `${name}/${c.name}/${out}: ${r.bad.length} of ${r.compared} values differ; first at flat index `
        + `${r.bad[0] && r.bad[0][0]}: got ${r.bad[0] && r.bad[0][1]}, expected ${r.bad[0] && r.bad[0][2]}`);
      values += r.compared;
    }
  }
  return { cases: cases.length, values };
}

test("sinusoidal_table: the sinusoidal dot-product figure", () => {
  const n = check("sinusoidal_table", (i, p) => ({ table: mp.sinusoidalTable(i.positions, p.dim, p.base, p.layout) }));
  assert.ok(n.cases >= 7 && n.values > 0);
});

test("rope: the rotating-pair figure", () => {
  check("rope", (i, p) => ({
    out: mp.applyRope(i.x, i.positions, { layout: p.layout, base: p.base, rotary_dim: p.rotary_dim,
      attention_factor: p.attention_factor, inv_freq: i.inv_freq }),
  }));
});

test("rope_scores: the score depends on m - n only", () => {
  check("rope_scores", (i, p) => ({
    scores: mp.ropeScores(i.q, i.k, i.q_positions, i.k_positions, { layout: p.layout, base: p.base, rotary_dim: p.rotary_dim }),
  }));
});

test("rope_scaling: the frequency-spectrum figure", () => {
  check("rope_scaling", (i, p) => {
    const [invFreq, factor] = mp.ROPE_SCALING[p.kind](p);
    return { inv_freq: invFreq, attention_factor: [factor] };
  });
});

test("alibi_slopes: the per-head bias figure", () => {
  check("alibi_slopes", (i, p) => ({ slopes: mp.alibiSlopes(p.num_heads) }));
});

test("alibi_bias: the per-head bias figure", () => {
  check("alibi_bias", (i, p) => ({ bias: mp.alibiBias(i.slopes, i.q_positions, i.k_positions, p.symmetric) }));
});

test("t5_bucket: the bucket figure, float32 as transformers and exact", () => {
  check("t5_bucket", (i, p) => ({ bucket: i.relative_position.data.map((n) => mp.t5Bucket(n, p)) }));
});

test("t5_bias: the bucket figure's bias", () => {
  check("t5_bias", (i, p) => ({ bias: mp.t5Bias(i.table, i.q_positions, i.k_positions, p) }));
});

test("attention_grad's forward output: the attention-pattern figure", () => {
  // The family's other outputs (lse, dq, dk, dv, dbias) are the backward's, which the figures do not port.
  const n = check("attention_grad", (i, p) => ({
    out: mp.attention(i.q, i.k, i.v, { bias: i.bias, mask: i.mask, scale: p.scale }).out,
  }), ["out"]);
  assert.ok(n.values > 0);
});

test("a wrong port fails: one value moved by more than the tolerance is reported", () => {
  const c = family("alibi_slopes").find((x) => x.name === "heads_12");
  const got = mp.alibiSlopes(12);
  got[9] *= 1 + 1e-9;                                     // 1e-9 relative: beyond rtol = atol = 1e-12
  const r = mp.compare(got, c.expected.slopes, c.tolerance.float64);
  assert.equal(r.ok, false);
  assert.deepEqual(r.bad.map((b) => b[0]), [9]);
});

test("hand-worked values: ALiBi's 12-head slopes and T5's last bucket at 91", () => {
  // Press et al. 2022: 12 heads take the 8-head slopes 2^-1 ... 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  const want = [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5].map((e) => Math.pow(2, -e));
  mp.alibiSlopes(12).forEach((m, h) => assert.ok(Math.abs(m - want[h]) < 1e-15, `head ${h}`));
  // T5, 32 buckets, max_distance 128, bidirectional: |n| = 90 is bucket 14, 91 starts bucket 15.
  assert.equal(mp.t5Bucket(-90, {}), 14);
  assert.equal(mp.t5Bucket(-91, {}), 15);
  assert.equal(mp.t5Bucket(-5000, {}), 15);
});
