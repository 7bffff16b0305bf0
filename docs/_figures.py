"""The pictures of the teaching pages that are drawn rather than plotted: the seams, the layer's data
flow, the flow of gradients, masks, M-RoPE's sections, MLA's head, and a few more.

Each function draws with matplotlib when the site is built and returns an inline SVG
(``proofs.markdown.svg``); whatever a picture shows that the code defines (which scheme uses which
seam, a mask, the streams of M-RoPE, the sizes of a DeepSeek head, the layer types of a config) is
read from minipos when it is drawn, so the picture follows the code. Used from markdown-exec blocks::

    ```python exec="on" html="1"
    from docs._figures import layer_flow
    print(layer_flow())
    ```
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch  # noqa: E402

from proofs.markdown import svg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEAM_COLORS = {"input": "#4c72b0", "rotate": "#dd8452", "content-position": "#55a868", "bias": "#c44e52",
               "value": "#8172b3", "mask": "#937860", "temperature": "#da8bc3"}

__all__ = ["seams_overview", "layer_flow", "gradient_flow", "mask_patterns", "mrope_sections", "mla_head",
           "shaw_buckets", "layouts", "porting_flow", "mistakes_picture", "adding_scheme", "conformance_grid",
           "proof_families", "blockwise_tiles", "irope_stack", "comparison_map", "permutation_picture",
           "model_stacks"]


# --------------------------------------------------------------------------- drawing helpers

def _box(ax, x, y, w, h, text, color="#dddddd", *, fontsize=9, text_color="black", alpha=1.0, weight="normal"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="0.3",
                                lw=0.8, alpha=alpha))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color, weight=weight,
            wrap=True)


def _arrow(ax, x0, y0, x1, y1, *, color="0.25", style="-|>", lw=1.2, ls="-"):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=11, color=color, lw=lw,
                                 linestyle=ls, shrinkA=0, shrinkB=0))


def _canvas(w, h, xlim, ylim):
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def _schemes_by_seam() -> dict:
    from minipos.schemes import ENTRIES
    by: dict = {}
    for name, entry in ENTRIES.items():
        for seam in entry.cls.seams or ("none",):
            by.setdefault(seam, []).append(name)
    return by


# --------------------------------------------------------------------------- home: the seams

def seams_overview() -> str:
    """The attention pipeline with every scheme of the registry placed at the seam it uses."""
    by = _schemes_by_seam()
    fig, ax = _canvas(11, 3.0, (0, 11.2), (-1.2, 2.0))
    steps = [("x + p", "input", "input"), ("x W_q, x W_k,\nx W_v", None, None),
             ("R(i) q,\nR(j) k", "rotate", "rotate"), ("q·k + terms\nwith R_{i−j}", "content-position", "content-\nposition"),
             ("+ b_h(i, j)", "bias", "bias"), ("mask,\nsoftmax", None, None), ("Σ p v\n(+ a_ij)", "value", "value"),
             ("· W_o", None, None)]
    xs = np.linspace(0.1, 9.9, len(steps))
    for k, ((text, seam, label), x) in enumerate(zip(steps, xs)):
        color = SEAM_COLORS.get(seam, "#e8e8e8")
        _box(ax, x, 0.85, 1.15, 0.8, text, color, fontsize=8, text_color="white" if seam else "black")
        if k:
            _arrow(ax, xs[k - 1] + 1.15, 1.25, x, 1.25)
        if seam:
            ax.text(x + 0.575, 0.72, label, ha="center", va="top", fontsize=7.5, color=color, weight="bold")
            ax.text(x + 0.575, 0.72 - (0.55 if "\n" in label else 0.3), "\n".join(by.get(seam, [])), ha="center",
                    va="top", fontsize=7.5)
    ax.text(xs[5] + 0.575, 0.72, "the mask leaks\nposition (NoPE)", ha="center", va="top", fontsize=7.5,
            color=SEAM_COLORS["mask"])
    ax.text(5.6, 1.9, "where each scheme of minipos.schemes enters attention (read from the registry): its seams",
            ha="center", fontsize=9)
    return svg(fig)


# --------------------------------------------------------------------------- the layer's data flow

def _step_grid(ax, steps, *, height, row_step, color="0.25", fontsize=8.5) -> None:
    """Eight steps ``(name, what, seam, note)`` as two rows of four boxes joined by arrows, a note
    under each box, and a dashed arrow from the end of the first row to the start of the second."""
    for k, (name, what, seam, note) in enumerate(steps):
        row, col = divmod(k, 4)
        x, y = 0.2 + col * 2.6, 2.0 - row * row_step
        fill = SEAM_COLORS.get(seam, "#eeeeee")
        _box(ax, x, y, 2.1, height, f"{name}\n{what}", fill, fontsize=fontsize, text_color="white" if seam else "black")
        if note:
            ax.text(x + 1.05, y - 0.1, note, ha="center", va="top", fontsize=7, family="monospace", color="0.35")
        if col:
            _arrow(ax, x - 0.5, y + height / 2, x, y + height / 2, color=color)
    _arrow(ax, 0.2 + 3 * 2.6 + 1.05, 2.0 - 0.4, 0.2 + 1.05, 2.0 - row_step + height + 0.05, ls="--", color=color)


def layer_flow() -> str:
    """The eight steps of ``MultiHeadAttention.__call__`` with their shapes, seams coloured."""
    steps = [("1 input seam", "x + p", "input", "(B, T, d_model)"),
             ("2 projections", "x W_q, x W_k, x W_v", None, "(B, H, T, D)"),
             ("3 rotate seam", "R(i) q, R(j) k", "rotate", "(B, H, T, D)"),
             ("4 cache", "keys, values of earlier calls", None, "(B, H, S, D)"),
             ("5 content-position", "q + u; extra logits", "content-position", "(B, H, T, S)"),
             ("6 bias seam", "+ b_h(i, j)", "bias", "(H, T, S)"),
             ("7 attention", "softmax(c q·k + b, mask) v", None, "(B, H, T, D)"),
             ("8 output", "merge heads, · W_o", None, "(B, T, d_model)")]
    fig, ax = _canvas(10, 3.6, (0, 10.4), (-0.3, 3.4))
    _step_grid(ax, steps, height=1.0, row_step=1.75)
    ax.text(5.2, 3.25, "MultiHeadAttention(x): the numbered steps of its code; coloured boxes are seams a scheme fills",
            ha="center", fontsize=9)
    return svg(fig)


# --------------------------------------------------------------------------- gradients

def gradient_flow() -> str:
    """The backward: dy through the steps in reverse, each handing the parameters' gradients out."""
    stages = [("dy", "(B, T, d_model)", None, ""),
              ("8 output projection", "dy W_o^T", None, "grads: wo, bo"),
              ("7 attention_backward", "dq, dk, dv, dbias", None, "grads: scheme.table, .slopes"),
              ("5 content-position", "extra_backward", "content-position", "grads: scheme.u, .v, .w_r, …"),
              ("3 rotate seam", "R(m)^T dq, R(m)^T dk", "rotate", ""),
              ("2 projections", "x^T dq, x^T dk, x^T dv", None, "grads: wq, wk, wv (+ bq, bk, bv)"),
              ("1 input seam", "embed_backward", "input", "grads: scheme.table (learned)"),
              ("dx", "(B, T, d_model)", None, "")]
    fig, ax = _canvas(10, 3.9, (0, 10.4), (-0.6, 3.5))
    _step_grid(ax, stages, height=0.9, row_step=1.9, color="#c44e52", fontsize=8)
    ax.text(5.2, 3.3, "layer.backward(ctx, dy): the forward's steps in reverse (red); each hands out its parameters' "
            "gradients", ha="center", fontsize=9)
    return svg(fig)


# --------------------------------------------------------------------------- masks

def mask_patterns(n: int = 12) -> str:
    """Causal, sliding-window, chunked, Gemma 3's local/global stack and a sink, from minipos's masks."""
    from minipos.attention import causal_mask
    from minipos.local_global import gemma3_layer_types
    from minipos.masks import chunk_mask, sliding_window_mask

    pos = np.arange(n)
    masks = [("causal\ncausal_mask", causal_mask(n, n)),
             ("sliding window W = 4\nsliding_window_mask", sliding_window_mask(pos, pos, 4)),
             ("chunks C = 4 (and causal)\nchunk_mask & causal", chunk_mask(pos, pos, 4) & causal_mask(n, n))]
    fig, axes = plt.subplots(1, 5, figsize=(11, 2.9), gridspec_kw={"width_ratios": [1, 1, 1, 0.55, 1.1]})
    cmap = ListedColormap(["#f2f2f2", "#4c72b0"])
    for ax, (title, m) in zip(axes, masks):
        ax.imshow(m, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(title, fontsize=8.5)
        ax.set_xlabel("key j", fontsize=8)
        ax.set_xticks([]), ax.set_yticks([])
    axes[0].set_ylabel("query i", fontsize=8)
    types = gemma3_layer_types({"num_hidden_layers": 12, "sliding_window_pattern": 6})
    col = np.array([[1 if t == "sliding_attention" else 2] for t in types])
    axes[3].imshow(col, cmap=ListedColormap(["#4c72b0", "#dd8452"]), vmin=1, vmax=2, aspect=0.35)
    axes[3].set_yticks(range(len(types)), [f"{i}" for i in range(len(types))], fontsize=6.5)
    axes[3].set_xticks([])
    axes[3].set_title("Gemma 3 layers\nlocal / global", fontsize=8.5)
    axes[3].set_ylabel("layer", fontsize=8)
    # a sink: one more column of every row, its weight dropped
    logits = np.where(causal_mask(6, 6), np.linspace(-1, 1, 6)[None, :], -np.inf)
    with_sink = np.concatenate([logits, np.zeros((6, 1))], axis=1)
    e = np.exp(with_sink - with_sink.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    axes[4].imshow(p, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    axes[4].axvline(5.5, color="#c44e52", lw=1.5)
    axes[4].set_title("a sink (gpt-oss): one more\ncolumn, its weight dropped", fontsize=8.5)
    axes[4].set_xticks([5.5 + 0.5], ["sink"], fontsize=7)
    axes[4].set_yticks([])
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- M-RoPE

def mrope_sections() -> str:
    """Which stream owns each pair (Qwen2-VL split, Qwen3-VL interleaved), and the three positions of
    a short text + image sequence (``mrope_positions``)."""
    from minipos.mrope import mrope_positions, mrope_streams

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 3.6), gridspec_kw={"height_ratios": [1, 1.25]})
    cmap = ListedColormap(["#4c72b0", "#dd8452", "#55a868"])
    rows = [("Qwen2-VL [16, 24, 24]", mrope_streams([16, 24, 24])),
            ("Qwen3-VL [24, 20, 20], interleaved", mrope_streams([24, 20, 20], interleaved=True))]
    a1.imshow(np.stack([r for _, r in rows]), cmap=cmap, vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    a1.set_yticks([0, 1], [n for n, _ in rows], fontsize=8)
    a1.set_xticks([0, 16, 32, 48, 63])
    a1.set_xlabel("pair i (frequency θ_i, fastest first) of a D = 128 head", fontsize=8)
    a1.set_title("which position rotates each pair: temporal (blue), height (orange), width (green)", fontsize=9)
    types = np.array([0, 0, 1, 1, 1, 1, 1, 1, 0, 0])              # text, a 2 x 3 grid after merging, text
    pos, _ = mrope_positions(types, image_grid_thw=[[1, 4, 6]], spatial_merge_size=2)   # (3, T)
    a2.imshow(np.where(types[None, :] == 1, 1, 0).repeat(3, 0), cmap=ListedColormap(["#f2f2f2", "#fde8cf"]),
              aspect="auto", vmin=0, vmax=1)
    for s in range(3):
        for t in range(pos.shape[1]):
            a2.text(t, s, str(pos[s, t]), ha="center", va="center", fontsize=8)
    a2.set_yticks([0, 1, 2], ["t", "h", "w"], fontsize=8)
    a2.set_xticks(range(pos.shape[1]), ["text" if k == 0 else "patch" for k in types], fontsize=7)
    a2.set_title("mrope_positions: text tokens t = h = w; the image's patches share t and take row and column",
                 fontsize=9)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- MLA

def mla_head(H: int = 128, D_N: int = 128, D_R: int = 64, D_V: int = 128, r_kv: int = 512) -> str:
    """The split of a DeepSeek-V3 head (config sizes), and what the cache holds per token."""
    fig, ax = _canvas(10, 3.4, (0, 11), (-0.2, 4.3))
    u = 4.0 / D_N
    y = 3.3
    rows = (("query head h", [(f"q^C  ({D_N})", D_N, "#4c72b0"), (f"q^R, rotated ({D_R})", D_R, "#dd8452")]),
            ("key head h", [(f"k^C = c^KV W^UK_h  ({D_N})", D_N, "#4c72b0"),
                            (f"k^R, rotated ({D_R}): one for all heads", D_R, "#dd8452")]),
            ("value head h", [(f"v = c^KV W^UV_h  ({D_V})", D_V, "#55a868")]))
    for label, parts in rows:
        ax.text(1.9, y + 0.22, label, ha="right", va="center", fontsize=8.5)
        x = 2.0
        for k, (text, n, color) in enumerate(parts):
            inside = n * u > 2.5
            _box(ax, x, y, n * u, 0.45, text if inside else "", color, fontsize=7.5, text_color="white")
            if not inside:
                ax.text(x + n * u + 0.1, y + 0.22, text, va="center", fontsize=7.5, color=color)
            x += n * u + 0.05
        y -= 0.75
    ax.text(1.9, 0.85, "cached per token", ha="right", va="center", fontsize=8.5)
    w_lat, w_r = r_kv * u * 0.25, D_R * u * 0.25
    _box(ax, 2.0, 0.62, w_lat, 0.45, f"latent c^KV ({r_kv})", "#8172b3", fontsize=7.5, text_color="white")
    _box(ax, 2.05 + w_lat, 0.62, w_r, 0.45, "", "#dd8452")
    ax.text(2.2 + w_lat + w_r, 0.85, f"k^R ({D_R}): {r_kv + D_R} numbers a token (drawn at quarter scale), against "
            f"{H * (D_N + D_R + D_V):,} for {H} heads' keys and values", va="center", fontsize=7.5)
    ax.text(5.5, 4.15, "a DeepSeek-V3 head (config.json sizes): RoPE acts only on the narrow orange slice",
            ha="center", fontsize=9)
    return svg(fig)


# --------------------------------------------------------------------------- Shaw

def shaw_buckets(n: int = 10, k: int = 3) -> str:
    """The clipped relative distance of every pair, ``relative_buckets`` (the row of the tables a^K, a^V)."""
    from minipos.shaw import relative_buckets

    b = relative_buckets(np.arange(n), np.arange(n), k)
    fig, ax = plt.subplots(figsize=(4.6, 3.6))
    im = ax.imshow(b, cmap="coolwarm", interpolation="nearest")
    for i in range(n):
        for j in range(n):
            ax.text(j, i, str(b[i, j] - k), ha="center", va="center", fontsize=6.5)
    ax.set_xlabel("key j"), ax.set_ylabel("query i")
    ax.set_title(f"clip(j − i, −{k}, {k}): row of a^K and a^V (k = {k})", fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8, label="table row")
    return svg(fig)


# --------------------------------------------------------------------------- conventions

def layouts(D: int = 8) -> str:
    """RoPE's two pair layouts (which features rotate together) and the relative-distance signs."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.0), gridspec_kw={"width_ratios": [1.2, 1]})
    a1.set_xlim(-0.5, D - 0.5), a1.set_ylim(-1.6, 2.2), a1.axis("off")
    for row, (name, pairs) in enumerate((("interleaved: (2c, 2c + 1)", [(2 * c, 2 * c + 1) for c in range(D // 2)]),
                                         ("half: (c, c + D/2)", [(c, c + D // 2) for c in range(D // 2)]))):
        y = 1.2 - 2.2 * row
        for f in range(D):
            a1.add_patch(plt.Rectangle((f - 0.4, y - 0.3), 0.8, 0.6, fc="#eeeeee", ec="0.4"))
            a1.text(f, y, str(f), ha="center", va="center", fontsize=8)
        for c, (a, b) in enumerate(pairs):
            a1.add_patch(FancyArrowPatch((a, y + 0.32), (b, y + 0.32), connectionstyle=f"arc3,rad=-{0.25 + 0.05 * (b - a)}",
                                         arrowstyle="-", color=plt.cm.tab10(c), lw=1.6))
        a1.text(-0.5, y - 0.55, name, fontsize=8.5, va="top")
    a1.set_title(f"RoPE: which features of a D = {D} head turn together (pair c, colour)", fontsize=9)
    n = 5
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    a2.imshow(j - i, cmap="coolwarm", vmin=-n, vmax=n)
    for r in range(n):
        for c in range(n):
            a2.text(c, r, str(c - r), ha="center", va="center", fontsize=8)
    a2.set_xlabel("key j"), a2.set_ylabel("query i")
    a2.set_title("j − i: T5's n (ALiBi's −(i − j)); DeBERTa uses i − j", fontsize=9)
    a2.set_xticks(range(n)), a2.set_yticks(range(n))
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- porting

def porting_flow() -> str:
    """How a port is checked: a family file, the port, the comparison, the report (counts read from spec/)."""
    files = sorted((ROOT / "spec" / "vectors").glob("*.json"))
    cases = sum(len(json.loads(f.read_text(encoding="utf-8"))["cases"]) for f in files)
    fig, ax = _canvas(10, 2.2, (0, 10.4), (0, 2.1))
    items = [(f"spec/vectors/\n{len(files)} families, {cases} cases", "#eeeeee"),
             ("inputs + params\n→ your function", "#4c72b0"),
             ("|got − expected| ≤\natol + rtol |expected|", "#dd8452"),
             ("each mismatch:\ncase, index, values", "#55a868")]
    for k, (text, color) in enumerate(items):
        x = 0.2 + k * 2.6
        _box(ax, x, 0.5, 2.0, 1.0, text, color, fontsize=8.5, text_color="black" if k == 0 else "white")
        if k:
            _arrow(ax, x - 0.6, 1.0, x, 1.0)
    ax.text(5.2, 1.85, "spec/check_port.py (Python) and the site's Check my port page (browser) run the same rule",
            ha="center", fontsize=9)
    return svg(fig)


# --------------------------------------------------------------------------- mistakes

def mistakes_picture() -> str:
    """Two facts the popular explanation gets wrong, drawn from minipos: T5's last bucket starts at
    |n| = 91 (bucket 16 unused), and bfloat16 rounds neighbouring positions together."""
    from minipos.rope import to_bfloat16
    from minipos.t5 import relative_position_bucket

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.1))
    n = np.arange(-140, 141)
    a1.step(n, relative_position_bucket(n), where="mid", lw=1.4)
    first = int(np.argmax(relative_position_bucket(-np.arange(141)) == 15))
    a1.axvline(-first, color="#c44e52", ls="--", lw=1)
    a1.axhline(16, color="0.6", ls=":", lw=1)
    a1.text(-first + 3, 3, f"last bucket from |n| = {first}", color="#c44e52", fontsize=8)
    a1.text(-135, 17, "bucket 16: never used", fontsize=8, color="0.4")
    a1.set_xlabel("n = key − query"), a1.set_ylabel("bucket")
    a1.set_title("T5, 32 buckets, max_distance 128 (bidirectional)", fontsize=9)
    p = np.arange(4090, 4111)
    a2.plot(p, p, "o", ms=3, label="position")
    a2.plot(p, to_bfloat16(p.astype(np.float64)), "s", ms=3, label="in bfloat16")
    a2.set_xticks(p[::5], [str(v) for v in p[::5]])
    a2.set_xlabel("position"), a2.set_title("RoPE angles need float32: bfloat16 rounds positions to 4096", fontsize=9)
    a2.legend(fontsize=8)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- adding a scheme

def adding_scheme() -> str:
    """What adding a scheme touches: its module, one registry line, and what reads the registry."""
    from minipos.schemes import ENTRIES

    fig, ax = _canvas(10, 3.0, (0, 10.4), (0, 3.0))
    _box(ax, 0.2, 1.6, 2.4, 0.9, "minipos/<scheme>.py\nits math + a Scheme class", "#4c72b0", fontsize=8.5,
         text_color="white")
    _box(ax, 3.3, 1.6, 2.2, 0.9, f"minipos/schemes.py\none line ({len(ENTRIES)} now)", "#dd8452", fontsize=8.5,
         text_color="white")
    _arrow(ax, 2.6, 2.05, 3.3, 2.05)
    readers = ["layer exports", "minipos tour", "the lab", "golden vectors", "spec/catalogue.md"]
    for k, name in enumerate(readers):
        y = 2.55 - k * 0.55
        _box(ax, 6.4, y, 1.9, 0.42, name, "#eeeeee", fontsize=8)
        _arrow(ax, 5.5, 2.05, 6.4, y + 0.21, lw=0.9)
    for k, name in enumerate(["its proof\nproofs/<scheme>.py", "its page\ndocs/schemes/", "its tests\ntests/"]):
        _box(ax, 0.2 + k * 1.75, 0.25, 1.65, 0.7, name, "#55a868", fontsize=7.5, text_color="white")
    ax.text(8.7, 0.6, "read from the registry:\nnothing to edit there", fontsize=8, color="0.35", ha="left")
    return svg(fig)


# --------------------------------------------------------------------------- conformance

def conformance_grid() -> str:
    """Passed, failed and not-expressible cases per library and family, from the committed results."""
    import sys
    sys.path.insert(0, str(ROOT / "spec" / "conformance"))
    import report                                                   # spec/conformance/report.py

    results = report.load_results()
    libs = list(dict.fromkeys(d["label"] for _, d in results))
    fams = sorted({d["family"] for _, d in results})
    share = np.full((len(libs), len(fams)), np.nan)
    failed = np.zeros((len(libs), len(fams)), bool)
    for _, d in results:
        i, j = libs.index(d["label"]), fams.index(d["family"])
        s = d["summary"]
        runs = s["passed"] + s["failed"] + s["not_expressible"]
        prev = 0 if np.isnan(share[i, j]) else share[i, j]
        share[i, j] = prev + (s["passed"] / runs if runs else 0)
        failed[i, j] |= s["failed"] > 0
    counts = np.zeros_like(share)
    for _, d in results:
        counts[libs.index(d["label"]), fams.index(d["family"])] += 1
    share = share / np.where(counts > 0, counts, 1)
    share[counts == 0] = np.nan
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(libs) + 1.8))
    im = ax.imshow(share, cmap="YlGn", vmin=0, vmax=1, aspect="auto")
    for i in range(len(libs)):
        for j in range(len(fams)):
            if failed[i, j]:
                ax.text(j, i, "✗", ha="center", va="center", color="#c44e52", fontsize=10, weight="bold")
    ax.set_yticks(range(len(libs)), libs, fontsize=8)
    ax.set_xticks(range(len(fams)), fams, rotation=60, ha="right", fontsize=7)
    ax.set_title("share of each family's cases a library passes (blank: no such function; ✗: some failed)",
                 fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- proofs

def proof_families() -> str:
    """Theorems per family and the minipos functions they tie to (read from the registry, not run)."""
    from proofs.core import REGISTRY

    fams: dict = {}
    for t in REGISTRY.values():
        f = fams.setdefault(t.family, [0, set()])
        f[0] += 1
        f[1].update(t.checks)
    names = sorted(fams, key=lambda k: -fams[k][0])
    fig, ax = plt.subplots(figsize=(9, 3.0))
    x = np.arange(len(names))
    ax.bar(x - 0.2, [fams[n][0] for n in names], width=0.4, color="#4c72b0", label="theorems")
    ax.bar(x + 0.2, [len(fams[n][1]) for n in names], width=0.4, color="#dd8452", label="minipos functions tied")
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
    ax.legend(fontsize=8)
    ax.set_title(f"{len(REGISTRY)} theorems in proofs/, by family", fontsize=9)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- benchmarks

def blockwise_tiles(T: int = 12, N: int = 4, W: int | None = 5) -> str:
    """What blockwise attention scores: N x N blocks of the (T, T) logits, skipped where the causal
    mask (and a window) rules them out: the efficient form the benchmarks time."""
    from minipos.attention import causal_mask
    from minipos.masks import sliding_window_mask

    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.4))
    pos = np.arange(T)
    for ax, (title, m) in zip(axes, (("causal", causal_mask(T, T)),
                                     (f"causal, window W = {W}", sliding_window_mask(pos, pos, W)))):
        ax.imshow(m, cmap=ListedColormap(["#f2f2f2", "#4c72b0"]), vmin=0, vmax=1)
        scored = 0
        for bi in range(0, T, N):
            for bj in range(0, T, N):
                used = m[bi:bi + N, bj:bj + N].any()
                scored += used
                ax.add_patch(plt.Rectangle((bj - 0.5, bi - 0.5), N, N, fill=False,
                                           ec="#c44e52" if used else "0.75", lw=1.6 if used else 0.8,
                                           ls="-" if used else ":"))
        ax.set_title(f"{title}: {scored} of {(T // N) ** 2} blocks scored", fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_xlabel("key j"), ax.set_ylabel("query i")
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- iRoPE

def irope_stack(layers: int = 12) -> str:
    """Which layer of a Llama 4 stack is RoPE (chunked) or NoPE (tempered), read by ``llama4_layer``,
    and Llama 4's temperature tau(i)."""
    from minipos.irope import attn_temperature, llama4_layer

    config = {"num_hidden_layers": layers, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(layers)],
              "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
              "rope_theta": 500000.0, "rope_scaling": None, "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 16}
    kinds = [type(llama4_layer(config, i)[0]).__name__ for i in range(layers)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 2.9), gridspec_kw={"width_ratios": [1.3, 1]})
    for i, kind in enumerate(kinds):
        rope = kind == "Rotary"
        a1.add_patch(plt.Rectangle((i, 0), 0.9, 1, fc="#dd8452" if rope else "#8172b3"))
        a1.text(i + 0.45, 0.5, "RoPE\nchunks" if rope else "NoPE\nτ(i)", ha="center", va="center", fontsize=7,
                color="white")
    a1.set_xlim(-0.2, layers + 0.1), a1.set_ylim(-0.4, 1.3), a1.axis("off")
    a1.set_title("a Llama 4 stack, layer by layer (llama4_layer)", fontsize=9)
    i = np.arange(0, 8 * 8192, 64)
    a2.plot(i, attn_temperature(i), lw=1.5)
    a2.set_xlabel("query position i"), a2.set_ylabel("τ(i)")
    a2.set_title("the NoPE layers' temperature on the queries", fontsize=9)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- comparison

def comparison_map() -> str:
    """Each scheme of the registry placed by seam and by the terms of the four-term expansion it keeps."""
    from minipos.schemes import ENTRIES

    terms = ["content-content", "content-position", "position-content", "position-position"]
    names = list(ENTRIES)
    grid = np.array([[t in ENTRIES[n].cls.terms for t in terms] for n in names], float)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1, 1.1]})
    a1.imshow(grid, cmap=ListedColormap(["#f2f2f2", "#4c72b0"]), aspect="auto")
    a1.set_yticks(range(len(names)), names, fontsize=8)
    a1.set_xticks(range(4), ["cc", "cp", "pc", "pp"], fontsize=8)
    a1.set_title("terms of (x_i + p_i) W_q W_k^T (x_j + p_j)^T the logits keep", fontsize=9)
    seams = ["input", "rotate", "bias", "content-position", "value"]
    g2 = np.array([[s in ENTRIES[n].cls.seams for s in seams] for n in names], float)
    a2.imshow(g2, cmap=ListedColormap(["#f2f2f2", "#dd8452"]), aspect="auto")
    a2.set_yticks(range(len(names)), names, fontsize=8)
    a2.set_xticks(range(len(seams)), seams, fontsize=8, rotation=20)
    a2.set_title("seams each scheme uses", fontsize=9)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- why position

def permutation_picture(T: int = 6) -> str:
    """A NoPE layer's weights for x and for x with its tokens permuted: the same matrix, rows and
    columns permuted (``MultiHeadAttention`` run when the page is built)."""
    from minipos.layer import MultiHeadAttention

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, T, 16))
    perm = np.array([3, 0, 5, 1, 4, 2])[:T] if T == 6 else rng.permutation(T)
    layer = MultiHeadAttention(16, 2, seed=0)
    w = layer(x, return_weights=True)[1][0, 0]
    wp = layer(x[:, perm], return_weights=True)[1][0, 0]
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.0))
    for ax, m, title in zip(axes, (w, wp, w[np.ix_(perm, perm)]),
                            ("weights for x", "weights for x[perm]", "weights for x, rows and\ncolumns permuted")):
        ax.imshow(m, cmap="Blues", vmin=0, vmax=m.max())
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(T)), ax.set_yticks(range(T))
        ax.set_xlabel("key"), ax.set_ylabel("query")
    fig.suptitle(f"no position scheme (NoPE), no mask: permuting the tokens {perm.tolist()} only permutes the "
                 f"weights (largest difference {np.abs(wp - w[np.ix_(perm, perm)]).max():.1e})", fontsize=9)
    fig.tight_layout()
    return svg(fig)


# --------------------------------------------------------------------------- models read from their configs

STACK_COLORS = {"RoPE": "#dd8452", "RoPE + window": "#4c72b0", "RoPE + chunks": "#c44e52", "NoPE": "#8172b3",
                "M-RoPE": "#55a868", "MLA": "#937860", "relative bias": "#da8bc3", "relative bias + window": "#8c8c8c"}


def _stack_kind(spec) -> str:
    if spec.cls.__name__ == "InklingAttention":                                 # no RoPE: minipos.inkling
        return "relative bias + window" if spec.kwargs.get("sliding_window") else "relative bias"
    if spec.position.startswith("MLA"):
        return "MLA"
    if spec.position.startswith("M-RoPE"):
        return "M-RoPE"
    if spec.position.startswith("NoPE"):
        return "NoPE"
    if spec.kwargs.get("attention_chunk"):
        return "RoPE + chunks"
    return "RoPE + window" if spec.kwargs.get("sliding_window") else "RoPE"


def model_stacks(names, layers: int = 24) -> str:
    """The first ``layers`` decoder layers of each model of docs/configs/ (``names``), one row a model,
    each layer coloured by what ``minipos.config.read`` built for it."""
    from minipos import config

    fig, ax = plt.subplots(figsize=(10, 0.42 * len(names) + 1.0))
    for row, name in enumerate(names):
        model = config.read(ROOT / "docs" / "configs" / f"{name}.json")
        for spec in model.specs[:layers]:
            ax.add_patch(plt.Rectangle((spec.index, -row - 0.4), 0.9, 0.8, fc=STACK_COLORS[_stack_kind(spec)]))
        ax.text(-0.5, -row, name, ha="right", va="center", fontsize=8)
    ax.set_xlim(-9, layers), ax.set_ylim(-len(names) + 0.4, 0.6)
    ax.axis("off")
    ax.legend(handles=[Patch(fc=color, label=kind) for kind, color in STACK_COLORS.items()], loc="lower center",
              bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=7.5, frameon=False)
    ax.set_title(f"layers 0 to {layers - 1} of each model, as minipos.config.read builds them", fontsize=9, pad=40)
    fig.tight_layout()
    return svg(fig)
