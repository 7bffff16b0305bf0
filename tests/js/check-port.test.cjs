// The "Check my port" page's checker (docs/assets/check-port.js) on the golden vectors themselves:
// the expected outputs pass for every family, a moved value is reported at its place, a missing
// case, a wrong shape and a ragged list are reported as such. Run with `node --test tests/js`.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");

const ROOT = path.resolve(__dirname, "..", "..");
const cp = require(path.join(ROOT, "docs", "assets", "check-port.js"));
const DIR = path.join(ROOT, "spec", "vectors");
const load = (f) => JSON.parse(fs.readFileSync(path.join(DIR, `${f}.json`), "utf8"));
const FAMILIES = fs.readdirSync(DIR).filter((f) => f.endsWith(".json") && !f.startsWith(".")).map((f) => f.slice(0, -5));

test("the golden values pass, family by family, at both precisions", () => {
  assert.ok(FAMILIES.length >= 40, `${FAMILIES.length} families`);
  for (const f of FAMILIES) {
    const doc = load(f);
    for (const precision of ["float64", "float32"]) {
      const r = cp.checkFamily(doc, cp.goldenSubmission(doc), precision);
      assert.equal(r.failed, 0, `${f} ${precision}: ${JSON.stringify(r.cases.find((c) => c.status !== "passed"))}`);
      assert.equal(r.passed, doc.cases.length, f);
      assert.ok(r.values > 0, f);
    }
  }
});

test("a value moved past the tolerance is reported with its place and size", () => {
  const doc = load("alibi_bias");                        // causal_form_h4: bias (H, T, S) = (4, 6, 6)
  const flat = (2 * 6 + 3) * 6 + 5;                       // h = 2, t = 3, s = 5
  const sub = cp.goldenSubmission(doc, { case: "causal_form_h4", output: "bias", index: flat, by: 1e-6 });
  const r = cp.checkFamily(doc, sub, "float64", { bias: "hts" });
  assert.equal(r.failed, 1);
  const c = r.cases.find((x) => x.name === "causal_form_h4");
  assert.equal(c.status, "failed");
  const o = c.outputs[0];
  assert.equal(o.count, 1);
  assert.equal(o.bad[0].index, flat);
  assert.match(o.bad[0].at, /^h = 2, t = 3 \(position \d+\), s = 5 \(position \d+\)$/);
  assert.ok(Math.abs(o.bad[0].diff - 1e-6) < 1e-12);
  // the same change is inside float32's tolerance
  assert.equal(cp.checkFamily(doc, sub, "float32").failed, 0);
});

test("a T5 bucket is named by its relative position", () => {
  const doc = load("t5_bucket");
  const c = doc.cases[0];
  const sub = cp.goldenSubmission(doc, { case: c.name, output: "bucket", index: 10, by: 1 });
  const r = cp.checkFamily(doc, sub, "float64", { bucket: "n" });
  const bad = r.cases.find((x) => x.name === c.name).outputs[0].bad[0];
  assert.equal(bad.at, `n = ${c.inputs.relative_position.data[10]}`);
});

test("missing cases, wrong shapes, ragged lists and nested lists", () => {
  const doc = load("rope");
  const sub = cp.goldenSubmission(doc);
  delete sub.outputs[doc.cases[1].name];                                  // not given
  const first = doc.cases[0];
  const e = first.expected.out;                                           // (7, 8): as a nested list
  const rows = [];
  for (let t = 0; t < e.shape[0]; t++) rows.push(e.data.slice(t * e.shape[1], (t + 1) * e.shape[1]));
  sub.outputs[first.name] = rows;                                         // a single output given directly
  sub.outputs[doc.cases[2].name] = { out: [[1, 2], [3]] };                // ragged
  sub.outputs[doc.cases[3].name] = { out: { shape: [8, 7], data: doc.cases[3].expected.out.data } };
  sub.outputs.no_such_case = { out: [1] };
  const r = cp.checkFamily(doc, sub, "float64");
  const by = Object.fromEntries(r.cases.map((c) => [c.name, c]));
  assert.equal(by[first.name].status, "passed");
  assert.equal(by[doc.cases[1].name].status, "missing");
  assert.match(by[doc.cases[2].name].outputs[0].error, /ragged/);
  assert.match(by[doc.cases[3].name].outputs[0].error, /shape \[8, 7\], expected \[7, 8\]/);
  assert.deepEqual(r.extra, ["no_such_case"]);
  assert.equal(r.missing, 1);
  assert.equal(r.failed, 2);
});

test("where masks: a value outside the mask is not compared", () => {
  const doc = load("rel_shift");
  const c = doc.cases.find((x) => x.where && x.where.out);
  assert.ok(c, "rel_shift has a case with a where mask");
  const outside = c.where.out.data.indexOf(false);
  const sub = cp.goldenSubmission(doc, { case: c.name, output: "out", index: outside, by: 123 });
  assert.equal(cp.checkFamily(doc, sub, "float64").failed, 0);
});
