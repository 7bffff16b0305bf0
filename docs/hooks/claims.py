"""The claims of the ledger (``docs.hooks.ledger``), one place for all of them.

``LAB``: the orderings and thresholds the pages draw from the lab's records, tested and
Holm-adjusted together. ``SEED``: every statement of the article minipos grew from that the site
answers (both of its tables cell by cell, and its sentences), with a verdict and what it rests on.
``CITE``: what a paper says, with its section. ``THEOREMS``: the theorems the other entries use,
each run when the ledger is built.

A seed entry's verdict is stated here; when it rests on lab entries that are not all confirmed it
becomes *not resolved* (the lab could not settle it at this budget), and a theorem it rests on
that fails stops the build.
"""

from __future__ import annotations

from .ledger import Above, Below, Entry, Fact, LedgerError, Less, Value

L = 64
FAR = 1017                       # the farthest retrieval offset at 16L = 1024 tokens
CHANCE = 1 / 8                   # retrieval: 8 values

EXTRA = "extrapolation.md"
TABLE = "article-table.md"


def mk(task, row, factor, offset=None):
    return Value(task, row, factor * L, offset)


# ----------------------------------------------------------------------------- lab

LAB = [
    # Markov (loss above the floor): the absolute schemes and plain RoPE lose the floor past L ...
    Less("M1", EXTRA, "sinusoidal: the loss above the floor at 2L is above that at L",
         mk("markov", "sinusoidal", 1), mk("markov", "sinusoidal", 2), asserted=True),
    Above("M2", EXTRA, "sinusoidal: more than 0.3 nats above the floor at 2L", mk("markov", "sinusoidal", 2), 0.3, asserted=True),
    Less("M3", EXTRA, "RoPE: the loss above the floor at 2L is above that at L",
         mk("markov", "rope", 1), mk("markov", "rope", 2), asserted=True),
    Above("M4", EXTRA, "RoPE: more than 0.3 nats above the floor at 4L", mk("markov", "rope", 4), 0.3, asserted=True),
    # ... while the relative biases hold
    Below("M5", EXTRA, "ALiBi: within 0.1 nats of the floor at 16L", mk("markov", "alibi", 16), 0.1, asserted=True),
    Below("M6", EXTRA, "Transformer-XL: within 0.1 nats of the floor at 16L", mk("markov", "transformer-xl", 16), 0.1),
    Below("M7", EXTRA, "DeBERTa: within 0.1 nats of the floor at 16L", mk("markov", "deberta", 16), 0.1),
    Below("M8", EXTRA, "T5: within 0.1 nats of the floor at 16L", mk("markov", "t5", 16), 0.1),
    Below("M9", EXTRA, "FIRE: within 0.1 nats of the floor at 16L", mk("markov", "fire", 16), 0.1),
    Less("M10", EXTRA, "ALiBi is closer to the floor than RoPE at 4L", mk("markov", "alibi", 4), mk("markov", "rope", 4), asserted=True),
    Less("M11", EXTRA, "ALiBi is closer to the floor than sinusoidal at 4L",
         mk("markov", "alibi", 4), mk("markov", "sinusoidal", 4), asserted=True),
    Less("M12", EXTRA, "xPos (scale_base scaled to L) is closer to the floor than RoPE at 4L",
         mk("markov", "xpos", 4), mk("markov", "rope", 4)),
    Less("M13", EXTRA, "xPos with the source's scale_base is further from the floor at 16L than scaled to L",
         mk("markov", "xpos", 16), mk("markov", "xpos@source", 16)),
    Less("M14", EXTRA, "NoPE: the loss above the floor at 2L is above that at L",
         mk("markov", "nope", 1), mk("markov", "nope", 2), asserted=True),
    Less("M15", EXTRA, "RoPE with YaRN is closer to the floor than plain RoPE at 4L",
         mk("markov", "rope +yarn", 4), mk("markov", "rope", 4)),
    Less("M16", EXTRA, "RoPE with dynamic NTK is closer to the floor than plain RoPE at 4L",
         mk("markov", "rope +dynamic", 4), mk("markov", "rope", 4)),
    # retrieval (accuracy): a flat loss is not reach
    Below("R1", EXTRA, "ALiBi reads a value written 1017 tokens back at 16L below 0.5",
          mk("retrieval", "alibi", 16, FAR), 0.5),
    Above("R2", EXTRA, "ALiBi reads a value written 1017 tokens back at 16L above chance (1/8)",
          mk("retrieval", "alibi", 16, FAR), CHANCE),
    Above("R3", EXTRA, "DeBERTa reads a value written 1017 tokens back at 16L above 0.9",
          mk("retrieval", "deberta", 16, FAR), 0.9),
    Above("R4", EXTRA, "T5 reads a value written 1017 tokens back at 16L above 0.5",
          mk("retrieval", "t5", 16, FAR), 0.5),
    Above("R5", EXTRA, "Transformer-XL reads a value written 1017 tokens back at 16L above 0.5",
          mk("retrieval", "transformer-xl", 16, FAR), 0.5),
    Below("R6", EXTRA, "RoPE reads a value written 1017 tokens back at 16L below 0.5",
          mk("retrieval", "rope", 16, FAR), 0.5),
    Less("R7", EXTRA, "ALiBi reads far values less often than DeBERTa at 16L",
         mk("retrieval", "alibi", 16, FAR), mk("retrieval", "deberta", 16, FAR)),
    # text (code) and prose: the same split on real text
    Less("T1", EXTRA, "code: sinusoidal's loss at 2L is above that at L", mk("text", "sinusoidal", 1),
         mk("text", "sinusoidal", 2)),
    Less("T2", EXTRA, "code: RoPE's loss at 2L is above that at L", mk("text", "rope", 1), mk("text", "rope", 2)),
    Less("T3", EXTRA, "code: ALiBi's loss at 16L is below RoPE's", mk("text", "alibi", 16), mk("text", "rope", 16)),
    Less("T4", EXTRA, "code: ALiBi's loss at 16L is below sinusoidal's", mk("text", "alibi", 16),
         mk("text", "sinusoidal", 16)),
    Less("T5", EXTRA, "code: T5's loss at 16L is above that at 2L", mk("text", "t5", 2), mk("text", "t5", 16)),
    Less("T6", EXTRA, "code: ALiBi's loss at 16L is below T5's", mk("text", "alibi", 16), mk("text", "t5", 16)),
    Less("P1", EXTRA, "prose: sinusoidal's loss at 2L is above that at L", mk("prose", "sinusoidal", 1),
         mk("prose", "sinusoidal", 2)),
    Less("P2", EXTRA, "prose: RoPE's loss at 2L is above that at L", mk("prose", "rope", 1), mk("prose", "rope", 2)),
    Less("P3", EXTRA, "prose: ALiBi's loss at 16L is below RoPE's", mk("prose", "alibi", 16), mk("prose", "rope", 16)),
    Less("P4", EXTRA, "prose: ALiBi's loss at 16L is below sinusoidal's", mk("prose", "alibi", 16),
         mk("prose", "sinusoidal", 16)),
    Less("P5", EXTRA, "prose: T5's loss at 16L is above that at 2L", mk("prose", "t5", 2), mk("prose", "t5", 16)),
    Less("P6", EXTRA, "prose: ALiBi's loss at 16L is below T5's", mk("prose", "alibi", 16), mk("prose", "t5", 16)),
    # the orderings the other pages draw beyond the ones above (each costs the family power: few, none asserted)
    Less("D2", "schemes/rope.md", "RoPE with linear interpolation by 2 is closer to the floor at 2L after its short "
         "fine-tune than without it", mk("markov", "rope +pi-finetune", 2), mk("markov", "rope +linear", 2)),
    Less("D3", "rope-frequencies.md", "without fine-tuning, NTK-aware scaling is closer to the floor at 2L than linear "
         "interpolation", mk("markov", "rope +ntk", 2), mk("markov", "rope +linear", 2)),
    Less("D4", "schemes/alibi.md", "at 16L ALiBi reads a value written 1017 tokens back less often than one written "
         "L = 64 back", mk("retrieval", "alibi", 16, FAR), mk("retrieval", "alibi", 16, L)),
    # facts read from the records (outside the Holm family)
    Fact("F1", "schemes/sinusoidal.md", "a learned table of L rows cannot run at 2L",
         (mk("markov", "learned", 2),), lambda got: all(v is not None and all(x is None for x in v)
                                                         for v in got.values())),
]
"""The lab claims. ``asserted`` claims are stated as facts by their page, which fails to build unless
they are confirmed; the others are shown with their numbers whatever their verdict."""


# ----------------------------------------------------------------------------- citations and theorems

CITE = {
    "C1": ("Vaswani et al. 2017, §3.5: the positional encodings are added to the input embeddings at the bottoms "
           "of the encoder and decoder stacks (arXiv:1706.03762)"),
    "C2": ("Dai et al. 2019, §3.3: R is a sinusoid encoding matrix without learnable parameters; u and v are "
           "trainable vectors (arXiv:1901.02860)"),
    "C3": ("Raffel et al. 2020, §2.1: \u201ca simplified form of position embeddings where each \u2018embedding\u2019 "
           "is simply a scalar that is added to the corresponding logit used for computing the attention weights\u201d, "
           "shared across layers, each head its own (arXiv:1910.10683)"),
    "C4": ("He et al. 2021, §3.2: the enhanced mask decoder adds absolute positions before the softmax layer that "
           "decodes masked words, in pre-training; every Transformer layer attends with relative positions "
           "(arXiv:2006.03654)"),
    "C5": ("Press, Smith, Lewis 2022, Fig. 1 and §2: on WikiText-103, sinusoidal and rotary models' perplexity "
           "worsens shortly past the training length; ALiBi's does not (arXiv:2108.12409)"),
    "C6": ("Press, Smith, Lewis 2022, §4.1: the T5 bias improves perplexity until inputs about twice the training "
           "length, then degrades (arXiv:2108.12409)"),
    "C7": ("Chen et al. 2023, §2.2 and Table 1: LLaMA's perplexity past its 2048 training positions \u201cmay "
           "shoot up\u201d (above 10^3 at 4096); Fig. 2 illustrates why with a score function of RoPE's form "
           "fitted to random values, not with LLaMA's scores; position interpolation (§2.3) instead "
           "(arXiv:2306.15595)"),
    "C8": ("Barbero et al. 2024: RoPE's decay \u201cis unlikely to be the core reason\u201d why it helps "
           "(arXiv:2410.06205)"),
    "C9": ("Touvron et al. 2023 (LLaMA 1, §2.2; Llama 2 and Llama 3 keep it): rotary embeddings "
           "(arXiv:2302.13971)"),
    "C10": ("Baichuan-13B's model card: \u201c使用 ALiBi 位置编码\u201d (ALiBi positions, a 4096-token window); "
            "Baichuan-7B applies rotary embeddings (huggingface.co/baichuan-inc)"),
    "C11": ("GLM-130B (Zeng et al. 2022, §2.1), ChatGLM, InternLM, Qwen (Bai et al. 2023, §2.2) and Phi "
            "(the HF Phi/Phi-3 modules) all apply rotary embeddings"),
    "C12": ("Su et al. 2021 (RoFormer), §3.4.3: the rotation applied elementwise, "
            "x cos + rotate_half(x) sin, in O(D) a position (arXiv:2104.09864)"),
}

THEOREMS = ("attention.four_terms", "sinusoidal.frequencies", "sinusoidal.projected.not_relative",
            "sinusoidal.dot.relative", "sinusoidal.rope_inv_freq", "alibi.bias.shift", "alibi.slopes.power_of_two",
            "transformer_xl.four_terms", "t5.score.terms", "t5.bucket.last_starts_at_91", "deberta.terms.index",
            "deberta.scale.variance", "rope.relative.headline", "rope.orthogonal", "rope.rotate_half",
            "rope.score.expectation")


# ----------------------------------------------------------------------------- the article

def S(id, claim, verdict, evidence, rests=()):
    return (id, claim, verdict, evidence, tuple(rests))


SEED = [
    # The summary table (总结对比表), cell by cell: one row per scheme, six columns.
    S("A1", "ALiBi, core idea: a linear distance bias added to the attention scores", "confirmed",
      "the bias is -m (i - j) on the logits, a function of i - j", ["alibi.bias.shift"]),
    S("A2", "ALiBi, position type: relative", "confirmed", "the bias depends on i - j only", ["alibi.bias.shift"]),
    S("A3", "ALiBi, adds parameters: no", "confirmed",
      "the slopes 2^(-8h/H) are fixed by the head count; nothing is learned", ["alibi.slopes.power_of_two"]),
    S("A4", "ALiBi, can extrapolate: yes", "partly",
      "its loss stays near the floor far past L, but it reads far values back less than half of the time",
      ["M5", "R1"]),
    S("A5", "ALiBi, modifies the attention formula: yes", "confirmed",
      "a bias on the logits (the bias seam) changes the scores before the softmax", ["alibi.bias.shift"]),
    S("A6", "ALiBi, summary: minimal, efficient, generalises well", "partly",
      "no parameters and one addition; its loss generalises in length, its reach does not", ["M5", "R1"]),
    S("A7", "XLENT, core idea: trigonometric relative vectors and learned direction vectors", "partly",
      "the scheme is Transformer-XL: R is the fixed sinusoid table (not learned), u and v are learned, and the "
      "score has four terms", ["transformer_xl.four_terms", "C2"]),
    S("A8", "XLENT, position type: relative", "confirmed", "every position term depends on i - j",
      ["transformer_xl.four_terms"]),
    S("A9", "XLENT, adds parameters: yes", "confirmed", "u, v (H, D) and W_R (d_model, H D) are learned", ["C2"]),
    S("A10", "XLENT, can extrapolate: partly", "confirmed",
      "its loss holds far past L; whether it reads more than half of the far values back is R5's test",
      ["M6", "R5"]),
    S("A11", "XLENT, modifies the attention formula: yes", "confirmed",
      "three terms join content-content in the logits", ["transformer_xl.four_terms"]),
    S("A12", "XLENT, summary: fine-grained modelling, compatible with complex dependencies", "untestable",
      "no measurable statement"),
    S("A13", "T5, core idea: drop the position-input and input-position terms, map distances to buckets",
      "confirmed", "the logits are content-content plus a learned scalar per bucket and head",
      ["t5.score.terms", "C3"]),
    S("A14", "T5, position type: relative", "confirmed", "the bucket is a function of key - query", ["t5.score.terms"]),
    S("A15", "T5, adds parameters: yes", "confirmed",
      "one table of num_buckets x H scalars, computed in the first layer and shared by all", ["C3"]),
    S("A16", "T5, can extrapolate: yes (limited buckets)", "partly",
      "with every distance past max_distance in one bucket, its loss holds far past L; whether it reads more than "
      "half of the far values back is R4's test", ["M8", "R4"]),
    S("A17", "T5, modifies the attention formula: yes", "confirmed",
      "a bias on the logits, and no 1/sqrt(D) scale", ["t5.score.terms"]),
    S("A18", "T5, summary: engineering-friendly, few parameters", "partly",
      "few parameters, yes (32 x H per model); engineering-friendliness is not a measurable statement", ["C3"]),
    S("A19", "DeBERTa, core idea: disentangle content and position, delete the position-position term",
      "confirmed", "content-content, content-to-position and position-to-content, no position-position",
      ["deberta.terms.index"]),
    S("A20", "DeBERTa, position type: relative + absolute", "partly",
      "relative in every layer; absolute positions only in the enhanced mask decoder of pre-training", ["C4"]),
    S("A21", "DeBERTa, adds parameters: yes", "confirmed",
      "the relative embeddings and their own query and key projections are learned", ["deberta.terms.index"]),
    S("A22", "DeBERTa, can extrapolate: yes", "confirmed",
      "its loss holds far past L; whether it reads far values back more than 90 % of the time is R3's test",
      ["M7", "R3"]),
    S("A23", "DeBERTa, modifies the attention formula: yes", "confirmed",
      "two position terms in the logits and the scale sqrt(3 D)", ["deberta.scale.variance"]),
    S("A24", "DeBERTa, summary: fine-grained, position types used layer by layer", "refuted",
      "every layer is relative; there is no layered use of absolute and relative positions", ["C4"]),
    # Absolute against relative (绝对位置编码和相对位置编码对比总结), cell by cell.
    S("B1", "absolute, focus: the word's own position in the sequence", "confirmed",
      "p_i depends on i alone, added to the input", ["C1"]),
    S("B2", "relative, focus: the distance between words", "confirmed",
      "the scores depend on i - j (shift invariance)", ["alibi.bias.shift", "rope.relative.headline"]),
    S("B3", "absolute, representation: one fixed vector per position", "partly",
      "the sinusoids are fixed; a learned table has a learned vector per position", ["C1"]),
    S("B4", "relative, representation: one vector per relative distance", "partly",
      "Transformer-XL, Shaw and DeBERTa have vectors per distance; T5 has a scalar per bucket and head, ALiBi "
      "a fixed scalar, RoPE a rotation", ["t5.score.terms", "alibi.slopes.power_of_two", "rope.relative.headline"]),
    S("B5", "absolute, complexity: simpler (sin/cos)", "confirmed",
      "one addition at the input, nothing in attention", ["C1"]),
    S("B6", "relative, complexity: more complex, needs a modified attention", "partly",
      "biases and content-position terms change the logits; RoPE only rotates q and k and leaves the "
      "attention formula as it is, yet its scores are relative", ["rope.relative.headline", "rope.rotate_half"]),
    S("B7", "absolute, generalisation: can extrapolate to long sequences", "refuted",
      "the sinusoidal model leaves the floor by 2L, its loss on code rises by 2L, and a learned table cannot "
      "run past its rows", ["M1", "M2", "T1", "C5"]),
    S("B8", "relative, generalisation: more flexible, suits long text and generation", "partly",
      "ALiBi, T5, Transformer-XL and DeBERTa hold their loss past L; RoPE, relative too, does not, and on code "
      "and on prose its loss at 16L is far above ALiBi's",
      ["M5", "M8", "M6", "M7", "M3", "M4", "T2", "T3", "P2", "P3"]),
    S("B9", "absolute, example: the original Transformer", "confirmed", "sinusoids added to the input", ["C1"]),
    S("B10", "relative, examples: Transformer-XL, T5, DeBERTa", "confirmed", "each is relative",
      ["C2", "C3", "C4"]),
    # The sentences.
    S("S1", "the original Transformer computes Q = X W_Q + p_i and K = X W_K + p_j", "refuted",
      "it adds p to the input: Q = (X + P) W_Q, which expands into four terms", ["C1", "attention.four_terms"]),
    S("S2", "sinusoidal: the index i runs from 0 to d_model - 1", "refuted",
      "one frequency per sin/cos pair: i = 0 ... D/2 - 1", ["sinusoidal.frequencies"]),
    S("S3", "sinusoidal: needs no training and generalises to sentences longer than in training", "partly",
      "no training, yes; past L its loss leaves the floor", ["M1", "M2", "C5"]),
    S("S4", "sinusoidal: the relative information is destroyed in self-attention", "confirmed",
      "PE(m) . PE(n) depends on m - n only, but PE(m) W_q W_k^T PE(n)^T does not for general weights",
      ["sinusoidal.dot.relative", "sinusoidal.projected.not_relative"]),
    S("S5", "absolute encodings are sensitive to the input length and must be readjusted when it changes",
      "partly", "a learned table cannot run past its rows; the sinusoids run at any length but degrade",
      ["M1"]),
    S("S6", "ALiBi: near tokens come first, but far ones are not ignored entirely", "partly",
      "far values are read back less than half of the time; whether above chance is R2's test", ["R1", "R2"]),
    S("S7", "ALiBi: strong length extrapolation, the linear bias naturally supports any length", "partly",
      "its loss holds past L; its reach does not", ["M5", "R1"]),
    S("S8", "ALiBi: no extra parameter matrices", "confirmed", "nothing is learned", ["alibi.slopes.power_of_two"]),
    S("S9", "XLENT: supports symmetric attention (i to j and j to i in one)", "refuted",
      "R_{i-j} differs from R_{j-i}: the sine half of the table is odd", ["transformer_xl.four_terms"]),
    S("S10", "XLENT: R_{i-j} is a trainable relative embedding", "refuted", "R is the fixed sinusoid table", ["C2"]),
    S("S11", "XLENT: A = Q_i^T K_j + u^T R_{i-j} + v^T R_{i-j}", "refuted",
      "four terms: q.k, q.W_R R, u.k, v.W_R R", ["transformer_xl.four_terms"]),
    S("S12", "T5 judged three position terms redundant and cut two of them", "refuted",
      "the paper describes a scalar added to each logit and gives no such argument", ["C3"]),
    S("S13", "T5: the bucket b(i - j) lies in [0, 31]", "confirmed",
      "with 32 buckets; bidirectional, each side's last bucket starts at 91, not 128",
      ["t5.bucket.last_starts_at_91"]),
    S("S14", "T5: one offset vector r per bucket", "refuted", "one scalar per bucket and head", ["t5.score.terms", "C3"]),
    S("S15", "DeBERTa: the clipped distance delta(i, j) lies in [-k, k]", "refuted",
      "delta = clip(i - j + k, 0, 2k - 1) indexes 2k rows", ["deberta.terms.index"]),
    S("S16", "DeBERTa: the scores are scaled by sqrt(3d)", "confirmed",
      "sqrt(D (1 + 2)) for two position terms", ["deberta.scale.variance"]),
    S("S17", "DeBERTa: the first 11 layers are relative (encoder), the last 2 absolute (decoder)", "refuted",
      "every encoder layer is relative; the enhanced mask decoder reuses the last layer's weights with absolute "
      "positions in pre-training only", ["C4"]),
    S("S18", "RoPE unifies relative and absolute encodings: absolute rotations, relative scores", "confirmed",
      "R(m) R(n)^T = R(m - n)", ["rope.relative.headline"]),
    S("S19", "RoPE supports any length: strong extrapolation past the training length", "refuted",
      "plain RoPE's loss rises by 2L, on Markov, on code and on prose; that is why the scalings exist",
      ["M3", "M4", "T2", "P2", "C5", "C7"]),
    S("S20", "RoPE is simple and efficient: a rotation per pair, computed in parallel", "confirmed",
      "x cos + rotate_half(x) sin, elementwise", ["rope.rotate_half", "C12"]),
    S("S21", "RoPE has a natural decay: the larger the distance, the weaker the score", "refuted",
      "the decay is an upper bound; for independent zero-mean q and k the mean score is 0 at every distance",
      ["rope.score.expectation", "C8"]),
    S("S22", "RoPE: R(m) R(n)^T = R(m - n), where R(n - m) is the relative rotation", "partly",
      "the identity holds; the relative rotation it gives is R(m - n)", ["rope.relative.headline"]),
    S("S23", "RoPE: R(n)^T = R(-n)", "confirmed", "a rotation's transpose is its inverse", ["rope.orthogonal"]),
    S("S24", "RoPE: omega_k = 10000^(-2k/d), the sinusoidal frequencies", "confirmed",
      "rope_inv_freq(D) equals the sinusoidal w_i", ["sinusoidal.rope_inv_freq"]),
    S("S25", "LLaMA, LLaMA 2 and LLaMA 3 use RoPE", "confirmed", "rotary embeddings in every layer", ["C9"]),
    S("S26", "GLM and ChatGLM use RoPE", "confirmed", "rotary embeddings", ["C11"]),
    S("S27", "Baichuan and InternLM use RoPE", "partly", "InternLM and Baichuan-7B do; Baichuan-13B uses ALiBi",
      ["C10", "C11"]),
    S("S28", "Phi and Qwen use RoPE", "confirmed", "rotary embeddings", ["C11"]),
]


def other_entries(lab: dict) -> list[Entry]:
    """The article's, the citations' and the theorems' entries (``lab``: the lab entries by id)."""
    from proofs.core import REGISTRY
    out, verdicts = [], {}
    for tid in THEOREMS:
        if tid not in REGISTRY:
            raise LedgerError(f"the ledger names theorem {tid!r}, which python -m proofs does not have")
        ok = REGISTRY[tid].run().ok
        if not ok:
            raise LedgerError(f"theorem {tid} fails: every entry resting on it is unsupported")
        verdicts[tid] = "confirmed"
        out.append(Entry(tid, "proofs.md", REGISTRY[tid].statement,
                         "proof", "confirmed", "python -m proofs " + tid.split(".")[0], test="symbolic proof"))
    for cid, text in CITE.items():
        verdicts[cid] = "confirmed"
        out.append(Entry(cid, TABLE, text, "cite", "confirmed", text.split(":")[0]))
    for sid, claim, verdict, evidence, rests in SEED:
        missing = [r for r in rests if r not in lab and r not in verdicts]
        if missing:
            raise LedgerError(f"{sid} rests on {missing}, which the ledger does not have")
        open_lab = [r for r in rests if r in lab and lab[r].verdict != "confirmed"]
        e = Entry(sid, TABLE, claim, "seed", verdict, evidence, records=sorted({x for r in rests if r in lab
                                                                                 for x in lab[r].records}))
        e.numbers = {"rests_on": list(rests)}
        if open_lab:
            e.verdict = "not resolved"
            e.evidence += " (the lab has not settled " + ", ".join(f"{r}: {lab[r].verdict}" for r in open_lab) + ")"
        out.append(e)
    return out
