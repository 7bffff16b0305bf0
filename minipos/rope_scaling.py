"""RoPE context-extension scalings, each a pure function returning ``(inv_freq, attention_factor)``.

RoPE rotates pair ``i`` of a head by the angle ``m * w_i`` at position ``m``, with
``w_i = base^(-2i/D)`` for ``i = 0 ... D/2 - 1`` (``D`` = rotary dim). A scaling changes the
``w_i`` (and sometimes multiplies cos and sin by an ``attention_factor``) so that a model trained
on ``L`` positions reads longer sequences. Every function here returns

    inv_freq:          float64, shape (D/2,)    the new w_i
    attention_factor:  float                     multiplies cos and sin (so the rotated features' share of the logits by its square)

and is a reference for the matching function of HF transformers' ``modeling_rope_utils``
(``ROPE_INIT_FUNCTIONS``), checked against transformers 5.24.0 in the tests.

The schemes
-----------
- ``linear``   position interpolation (Chen et al. 2023, "Extending Context Window of Large
  Language Models via Positional Interpolation", arXiv:2306.15595, Sec. 2.2; kaiokendev's
  SuperHOT): ``f'(x, m) = f(x, m L / L')``, i.e. ``w_i / factor``.
- ``ntk``      static NTK-aware scaling (bloc97, r/LocalLLaMA, June 2023): keep ``w_0 = 1`` and
  stretch the lowest frequency by ``factor`` via a new base ``base * factor^(D/(D-2))``.
  Not an HF ``rope_type``; HF's ``dynamic`` at ``factor = 1``, ``seq_len = factor' * L`` equals it.
- ``dynamic``  dynamic NTK (emozilla, r/LocalLLaMA, June 2023; HF ``_compute_dynamic_ntk_parameters``):
  the NTK base recomputed from the current length,
  ``base * (factor * max(seq_len, L) / L - (factor - 1))^(D/(D-2))``; ``seq_len <= L`` is plain RoPE.
- ``yarn``     YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models", arXiv:2309.00071): Sec. 3.2 "NTK-by-parts" (a linear ramp between extrapolated and
  interpolated frequencies, boundaries set by ``beta_fast``/``beta_slow`` rotations per ``L``) and
  Sec. 3.4 (the temperature ``sqrt(1/t) = 0.1 ln s + 1``, applied to cos and sin).
- ``llama3``   Llama 3.1's frequency-dependent interpolation (Meta, ``apply_scaling`` in the
  llama-models reference; HF ``_compute_llama3_parameters``).
- ``longrope`` LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million
  Tokens", arXiv:2402.13753), as shipped in Phi-3: searched per-frequency rescale factors.

Configuration keys
------------------
Keyword names are the keys of a checkpoint's ``rope_scaling`` (older) / ``rope_parameters``
(transformers >= 5) dict, except where the table says otherwise.

    config key                                   keyword                            used by
    rope_theta (top level in older configs)      base                               all
    int(head_dim * partial_rotary_factor)        dim                                all
    rope_type (older: type)                      key of REGISTRY                    all
    factor                                       factor                             all but longrope
    factor (optional)                            factor                             longrope
    max_position_embeddings (TOP LEVEL config)   original_max_position_embeddings   dynamic
    original_max_position_embeddings (*)         original_max_position_embeddings   yarn llama3 longrope
    beta_fast, beta_slow, mscale,
    mscale_all_dim, attention_factor, truncate   same names                         yarn
    low_freq_factor, high_freq_factor            same names                         llama3
    short_factor, long_factor, attention_factor  same names                         longrope
    max_position_embeddings (top level)          max_position_embeddings            longrope

(*) Phi-3 keeps it at the top level of the config, and HF gives that copy priority; when a
yarn/llama3/longrope config lacks it, HF falls back to ``max_position_embeddings``.

``seq_len`` (``dynamic``, ``longrope``) is the current length, ``max(position_ids) + 1`` in HF.

Conventions and differences from HF
-----------------------------------
- ``base`` defaults to 10000.0 in every function (RoFormer's value). Llama 3 uses 500000.0 and
  many checkpoints differ: always pass the checkpoint's ``rope_theta``.
- Everything is float64; HF computes ``inv_freq`` in float32 (relative differences ~1e-7).
- HF only warns about bad values; here they raise ``ValueError``: ``factor < 1``,
  ``beta_fast <= beta_slow``, ``high_freq_factor <= low_freq_factor``, factor lists that are not
  ``D/2`` positive numbers, ``base <= 1``, odd ``dim`` and non-finite numbers. HF's
  ``beta_fast or 32`` turns a 0 into the default; here 0 is rejected. Values that are finite but
  extreme raise too where they would make a frequency 0, inf or of infinite wavelength
  (``2 pi / inv_freq`` must be a finite float64), or an attention factor whose square (the
  logits' scale) is 0 or inf in float64: the error names the arguments that produced it.
  Lengths (``seq_len``, ``original_max_position_embeddings``, ``max_position_embeddings``) are at
  most ``2**53``. The errors say ``base``, the keyword; a checkpoint calls it ``rope_theta``.
- ``dynamic`` and ``longrope`` are evaluated at one ``seq_len``. HF's ``dynamic_rope_update``
  recomputes them only when the length grows past the cached length (and resets below ``L``), so
  within one generation the frequencies track the largest length seen so far.
- DeepSeek-V2/V3 (``mscale == mscale_all_dim``) get ``attention_factor = 1`` here, as in HF; their
  attention module separately multiplies the softmax scale by
  ``(0.1 * mscale_all_dim * ln(factor) + 1)^2``.

The scheme class the layer runs for RoPE, ``Rotary``, is at the bottom of this module: it reads
a checkpoint's scaling config into these functions (``minipos.rope`` has the rotation itself).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (
    as_float_array,
    check_alloc,
    check_bool,
    check_choice,
    check_even_int,
    check_float,
    check_int,
)
from . import rope
from .rope import rope_inv_freq
from .seams import Scheme

__all__ = ["linear", "ntk", "dynamic", "yarn", "llama3", "longrope", "REGISTRY", "Rotary"]


_WORK = 8  # the most float64 (D/2,) vectors a scaling holds at once (yarn's ramp and blend)
MAX_LENGTH = 2 ** 53
"""Largest length accepted: float64 holds every integer up to here, and no further."""


def _base_inv_freq(dim: int, base: float, names: str = "base") -> np.ndarray:
    """Plain RoPE frequencies ``w_i = base^(-2i/D)``, float64 ``(D/2,)``; checks ``dim`` and ``base``.

    ``names`` are the arguments that produced ``base`` (a scaled base names its scale too).
    """
    if check_float(base, "base") <= 1.0:
        raise ValueError(f"base must be > 1 (a checkpoint's rope_theta), got {base}")
    check_alloc((_WORK, check_even_int(dim, "dim") // 2), np.float64, f"dim (the {_WORK} vectors of D/2 at work)")
    return _checked_inv_freq(rope_inv_freq(dim, base=base), names)  # w_i = base^(-2i/D)


def _checked_inv_freq(inv_freq: np.ndarray, names: str) -> np.ndarray:
    """``inv_freq`` if every entry is > 0 with a finite wavelength ``2 pi / w``; else raise naming ``names``."""
    with np.errstate(divide="ignore", over="ignore"):
        wavelength = 2 * math.pi / inv_freq
    if inv_freq.size and not (np.all(inv_freq > 0) and np.all(np.isfinite(inv_freq))
                              and np.all(np.isfinite(wavelength))):
        raise ValueError(f"{names} give frequencies inv_freq from {inv_freq.min()} to {inv_freq.max()}; each must "
                         f"be finite and > 0 with a finite wavelength 2 pi / inv_freq in float64")
    return inv_freq


def _checked_attention_factor(attention_factor: float, names: str) -> float:
    """``attention_factor`` if it and its square (the logits' scale) are finite, normal and > 0."""
    square = attention_factor * attention_factor
    if not (attention_factor > 0 and math.isfinite(square) and square >= np.finfo(np.float64).tiny):
        raise ValueError(f"the attention factor {attention_factor} (from {names}) must have a finite, nonzero "
                         f"float64 square (the scale of the logits)")
    return float(attention_factor)


def _check_length(value, name: str, minimum: int = 1) -> int:
    """A length (positions, a context size) as an int in [minimum, 2**53]."""
    value = check_int(value, name, minimum=minimum)
    if value > MAX_LENGTH:
        raise ValueError(f"{name} must be <= 2**53 (float64 holds every integer only up to there), got {value}")
    return value


def _check_factor(factor, name: str = "factor") -> float:
    """A scaling factor: a finite real >= 1 (a factor below 1 would shrink the context)."""
    return check_float(factor, name, minimum=1.0)


def _ntk_exponent(dim: int) -> float:
    """``D / (D - 2)``, the NTK base exponent; ``D = 2`` has no such exponent."""
    if check_even_int(dim, "dim") < 4:
        raise ValueError(f"dim must be >= 4 for NTK scaling (exponent D/(D-2)), got {dim}")
    return dim / (dim - 2)


def _ntk_base(base: float, ratio: float, dim: int, names: str) -> float:
    """``base * ratio^(D/(D-2))``, or a ValueError naming ``names`` where it leaves float64."""
    exponent = _ntk_exponent(dim)
    if math.log(base) + exponent * math.log(ratio) >= math.log(np.finfo(np.float64).max):
        raise ValueError(f"{names} give an NTK base base * ({ratio})^(D/(D-2)) beyond float64 (base = {base})")
    return base * ratio ** exponent  # b' = b r^(D/(D-2))


def linear(dim: int, *, base: float = 10000.0, factor: float) -> tuple[np.ndarray, float]:
    """Position interpolation (PI, arXiv:2306.15595 Sec. 2.2): ``w_i / factor``, attention factor 1.

    Returns ``(inv_freq, 1.0)``, ``inv_freq`` float64 ``(D/2,)``.
    """
    inv_freq = _base_inv_freq(dim, base)
    factor = _check_factor(factor)
    return _checked_inv_freq(inv_freq / factor, "base and factor"), 1.0  # theta(m) = (m / s) w_i


def ntk(dim: int, *, base: float = 10000.0, factor: float) -> tuple[np.ndarray, float]:
    """Static NTK-aware scaling: RoPE with base ``base * factor^(D/(D-2))``, attention factor 1.

    The exponent keeps ``w_0 = 1`` and divides the lowest frequency ``w_{D/2-1}`` by exactly
    ``factor``. Returns ``(inv_freq, 1.0)``, ``inv_freq`` float64 ``(D/2,)``.
    """
    _base_inv_freq(dim, base)
    factor = _check_factor(factor)
    new_base = _ntk_base(base, factor, dim, "base and factor")  # b' = b s^(D/(D-2))
    return _base_inv_freq(dim, new_base, "base and factor"), 1.0


def dynamic(dim: int, *, base: float = 10000.0, factor: float, original_max_position_embeddings: int,
            seq_len: int) -> tuple[np.ndarray, float]:
    """Dynamic NTK scaling at the current length ``seq_len`` (HF ``_compute_dynamic_ntk_parameters``).

    With ``L = original_max_position_embeddings`` (HF reads the config's top-level
    ``max_position_embeddings``) and ``n = max(seq_len, L)``, the base becomes
    ``base * (factor * n / L - (factor - 1))^(D/(D-2))``; ``seq_len <= L`` gives plain RoPE.
    Returns ``(inv_freq, 1.0)``, ``inv_freq`` float64 ``(D/2,)``.
    """
    _base_inv_freq(dim, base)
    factor = _check_factor(factor)
    L = _check_length(original_max_position_embeddings, "original_max_position_embeddings")
    n = max(_check_length(seq_len, "seq_len"), L)
    names = "base, factor, seq_len and original_max_position_embeddings"
    new_base = _ntk_base(base, factor * n / L - (factor - 1.0), dim, names)  # b (s n/L - s + 1)^(D/(D-2))
    return _base_inv_freq(dim, new_base, names), 1.0


def _yarn_correction_dim(num_rotations: float, dim: int, base: float, L: int) -> float:
    """The (fractional) pair index whose wavelength fits ``num_rotations`` times into ``L``."""
    return dim * math.log(L / (num_rotations * 2 * math.pi)) / (2 * math.log(base))  # 2pi b^(2i/D) = L / r


def _yarn_ramp(dim: int, base: float, L: int, beta_fast: float, beta_slow: float,
               truncate: bool) -> np.ndarray:
    """YaRN's ramp, float64 ``(D/2,)``: 0 where pairs keep ``w`` (extrapolate), 1 where they get ``w/s``.

    The ramp runs from the pair that turns ``beta_fast`` times in ``L`` positions (``low``) to the
    one that turns ``beta_slow`` times (``high``), rounded outwards when ``truncate`` and clamped
    to ``[0, D - 1]``, exactly as HF's ``find_correction_range``/``linear_ramp_factor``. It is
    linear in the pair index ``i``, as in the YaRN reference code; the paper's ``gamma`` is
    linear in ``r = L / lambda_i`` instead, so the two differ inside the ramp.
    """
    low = _yarn_correction_dim(beta_fast, dim, base, L)
    high = _yarn_correction_dim(beta_slow, dim, base, L)
    for name, beta, edge in (("beta_fast", beta_fast, low), ("beta_slow", beta_slow, high)):
        if not math.isfinite(edge):  # L / (2 pi beta) overflows float64 for a tiny beta
            raise ValueError(f"{name} = {beta} puts an end of the YaRN ramp at pair index {edge}; it must be "
                             f"a finite index (a beta this small has no finite wavelength)")
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    return np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 * mscale * ln(s) + 1`` for ``s > 1``, else 1 (HF ``get_mscale``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _optional_float(value, name: str, **kw) -> float | None:
    return None if value is None else check_float(value, name, **kw)


def _yarn_attention_factor(factor: float, mscale, mscale_all_dim, attention_factor) -> float:
    """An explicit ``attention_factor``, else the mscale ratio (both nonzero), else ``0.1 ln s + 1``."""
    mscale = _optional_float(mscale, "mscale", minimum=0.0)                 # 0 means absent, as in HF
    mscale_all_dim = _optional_float(mscale_all_dim, "mscale_all_dim", minimum=0.0)
    attention_factor = _optional_float(attention_factor, "attention_factor", positive=True)
    if attention_factor is not None:
        return _checked_attention_factor(attention_factor, "attention_factor")
    if mscale and mscale_all_dim:  # HF tests truthiness: 0 counts as absent
        ratio = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        return _checked_attention_factor(ratio, "factor, mscale and mscale_all_dim")
    return _checked_attention_factor(yarn_mscale(factor), "factor")  # sqrt(1/t) = 0.1 ln(s) + 1


def _interpolation_args(dim, base, factor, original_max_position_embeddings):
    """The plain ``w_i``, the checked ``factor`` and ``L`` that yarn and llama3 both start from."""
    L = _check_length(original_max_position_embeddings, "original_max_position_embeddings")
    return _base_inv_freq(dim, base), _check_factor(factor), L


def yarn(dim: int, *, base: float = 10000.0, factor: float, original_max_position_embeddings: int,
         beta_fast: float = 32.0, beta_slow: float = 1.0, mscale: float | None = None,
         mscale_all_dim: float | None = None, attention_factor: float | None = None,
         truncate: bool = True) -> tuple[np.ndarray, float]:
    """YaRN (arXiv:2309.00071), exactly HF's ``_compute_yarn_parameters``.

    ``inv_freq = (1 - g_i) w_i / s + g_i w_i`` (Sec. 3.2) with ``g_i = 1 - ramp_i`` (HF's
    ``inv_freq_extrapolation_factor``; ``ramp`` from ``_yarn_ramp``). The attention factor is
    ``attention_factor`` if given, else ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` when
    both are given and nonzero (DeepSeek-V2/V3), else ``0.1 ln s + 1``.
    Returns ``(inv_freq, attention_factor)``, ``inv_freq`` float64 ``(D/2,)``.
    """
    inv_freq, factor, L = _interpolation_args(dim, base, factor, original_max_position_embeddings)
    beta_fast = check_float(beta_fast, "beta_fast", positive=True)
    beta_slow = check_float(beta_slow, "beta_slow", positive=True)
    if beta_fast <= beta_slow:
        raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={beta_fast}, beta_slow={beta_slow}")
    truncate = check_bool(truncate, "truncate")
    attention_factor = _yarn_attention_factor(factor, mscale, mscale_all_dim, attention_factor)
    ramp = _yarn_ramp(int(dim), float(base), L, beta_fast, beta_slow, truncate)
    g = 1.0 - ramp                                      # extrapolation weight
    inv_freq = (1.0 - g) * inv_freq / factor + g * inv_freq  # h(w) = (1-g) w/s + g w
    return _checked_inv_freq(inv_freq, "base and factor"), attention_factor


def llama3(dim: int, *, base: float = 10000.0, factor: float, original_max_position_embeddings: int,
           low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> tuple[np.ndarray, float]:
    """Llama 3.1 frequency-dependent interpolation (HF ``_compute_llama3_parameters``).

    With wavelength ``lam_i = 2 pi / w_i`` and ``L = original_max_position_embeddings``: pairs with
    ``lam < L / high_freq_factor`` keep ``w``; pairs with ``lam > L / low_freq_factor`` get
    ``w / factor``; between, ``(1 - a) w / factor + a w`` with
    ``a = (L / lam - low_freq_factor) / (high_freq_factor - low_freq_factor)``, which is
    continuous at both ends. ``high_freq_factor == low_freq_factor`` (Llama 4 Scout: 1.0, 1.0) leaves
    no ramp: ``lam >= L / low_freq_factor`` gets ``w / factor``. Returns ``(inv_freq, 1.0)``,
    ``inv_freq`` float64 ``(D/2,)``.
    """
    inv_freq, factor, L = _interpolation_args(dim, base, factor, original_max_position_embeddings)
    lo = check_float(low_freq_factor, "low_freq_factor", positive=True)
    hi = check_float(high_freq_factor, "high_freq_factor", positive=True)
    if hi < lo:
        raise ValueError(f"high_freq_factor must be >= low_freq_factor, got {hi} < {lo}")
    wavelen = 2 * math.pi / inv_freq                                   # lam_i = 2 pi / w_i
    a = (L / wavelen - lo) / (hi - lo) if hi > lo else 0.0             # smooth factor (no ramp if hi = lo)
    medium = (1 - a) * inv_freq / factor + a * inv_freq
    scaled = np.where(wavelen > L / lo, inv_freq / factor, medium)     # long wavelengths: w / s
    inv_freq = np.where(wavelen < L / hi, inv_freq, scaled)            # short wavelengths: w
    return _checked_inv_freq(inv_freq, "base and factor"), 1.0


def _check_factor_list(values, name: str, size: int) -> np.ndarray:
    """A LongRoPE rescale list: ``size`` = D/2 finite numbers > 0, as float64 ``(D/2,)``."""
    arr = as_float_array(values, name).astype(np.float64)
    if arr.ndim != 1 or arr.size != size:
        raise ValueError(f"{name} must be a list of D/2 = {size} numbers, got shape {arr.shape}")
    if np.any(arr <= 0):
        raise ValueError(f"{name} must hold numbers > 0, got minimum {arr.min()}")
    return arr


def longrope(dim: int, *, base: float = 10000.0, short_factor: ArrayLike, long_factor: ArrayLike,
             original_max_position_embeddings: int, max_position_embeddings: int, seq_len: int,
             factor: float | None = None, attention_factor: float | None = None) -> tuple[np.ndarray, float]:
    """LongRoPE (arXiv:2402.13753) as in Phi-3, exactly HF's ``_compute_longrope_parameters``.

    ``inv_freq = w_i / long_factor[i]`` when ``seq_len > original_max_position_embeddings``, else
    ``w_i / short_factor[i]``. ``factor`` defaults to ``max_position_embeddings / L`` (an explicit
    ``factor`` key wins, as in HF); the attention factor defaults to ``sqrt(1 + ln s / ln L)``
    (1 if ``s == 1``); an explicit ``attention_factor`` is returned as it is. A scale ``s < 1`` (an
    explicit ``factor`` below 1, or ``max_position_embeddings < L`` without one) raises ``ValueError``
    naming that key; HF would use the attention factor 1 there. Returns ``(inv_freq, attention_factor)``,
    ``inv_freq`` float64 ``(D/2,)``.
    """
    inv_freq = _base_inv_freq(dim, base)
    L = _check_length(original_max_position_embeddings, "original_max_position_embeddings", minimum=2)
    L_max = _check_length(max_position_embeddings, "max_position_embeddings")
    n = _check_length(seq_len, "seq_len")
    short = _check_factor_list(short_factor, "short_factor", inv_freq.size)
    long = _check_factor_list(long_factor, "long_factor", inv_freq.size)
    with np.errstate(over="ignore"):  # checked just below: both lists, whichever seq_len picks
        _checked_inv_freq(inv_freq / short, "base and short_factor")
        _checked_inv_freq(inv_freq / long, "base and long_factor")
    if factor is None and L_max < L:
        raise ValueError("max_position_embeddings must be >= original_max_position_embeddings, "
                         f"got {L_max} < {L}")
    factor = L_max / L if factor is None else _check_factor(factor)
    attention_factor = _optional_float(attention_factor, "attention_factor", positive=True)
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(L))
    attention_factor = _checked_attention_factor(attention_factor, "attention_factor")
    return inv_freq / (long if n > L else short), attention_factor  # w_i / lambda_i


REGISTRY = {"linear": linear, "ntk": ntk, "dynamic": dynamic, "yarn": yarn, "llama3": llama3,
            "longrope": longrope}


# --------------------------------------------------------------------------- the scheme the layer runs

class Rotary(Scheme):
    """Rotary position embedding (Su et al. 2021) applied to q and k of every head.

    ``layout="half"`` for HF LLaMA / GPT-NeoX checkpoints, ``"interleaved"`` for Meta LLaMA,
    RoFormer and GPT-J. ``rotary_dim`` rotates only the first features of each head (GPT-NeoX).

    ``scaling`` is a checkpoint's ``rope_scaling`` / ``rope_parameters`` dict, e.g.
    ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}`` (``"type"``
    is accepted for ``"rope_type"``; keys as in ``minipos.rope_scaling``). Every key is honoured or
    refused by name: ``rope_theta`` is the base, ``partial_rotary_factor`` sets ``rotary_dim =
    int(head_dim * factor)`` (GPT-NeoX's ``rotary_pct``, Phi), the rest must be parameters of the
    ``rope_type`` (LongRoPE's ``max_position_embeddings`` lives at the top of an HF config: add it
    to the dict). Its ``attention_factor`` multiplies cos and sin, so the rotated features' share of
    the logits scales by its square, as in HF.

    Length-dependent kinds (``dynamic``, ``longrope``) recompute the frequencies at every call
    for ``seq_len = max(key positions) + 1``. Keys rotated with one set of frequencies must never
    meet queries rotated with another (a known bug of caches in production code, where cached
    keys keep their old rotation after the frequencies change). So for these kinds the KV cache
    stores keys *unrotated* and every step rotates all keys with the step's frequencies: a cached
    step equals the full forward pass over the same prefix. For fixed frequencies the cache
    stores rotated keys together with the frequencies used, and a later step with different
    frequencies raises ``ValueError`` instead of mixing them.
    """

    name = "rope"
    seams = ("rotate",)
    sign_convention = (r"the score is $q^\top R(i)^\top R(j)\, k = q^\top R(j - i)\, k$ (the proofs write "
                       r"$m$ for the query position, $n$ for the key)",
                       r"Su et al. 2021; `rotation_matrix`, `apply_rope`")
    LENGTH_DEPENDENT = ("dynamic", "longrope")

    def __init__(self, *, base: float = 10000.0, layout: str = "interleaved", rotary_dim: int | None = None,
                 scaling: dict | None = None):
        self.layout = check_choice(layout, "layout", set(rope.LAYOUTS))
        self.rotary_dim = None if rotary_dim is None else check_even_int(rotary_dim, "rotary_dim")
        self.scaling_kind, self.scaling_args = self._parse_scaling(scaling)
        partial = self.scaling_args.pop("partial_rotary_factor", None)
        self.partial_rotary_factor = None if partial is None else check_float(
            partial, "scaling['partial_rotary_factor']", positive=True)
        if self.partial_rotary_factor is not None and self.partial_rotary_factor > 1:
            raise ValueError(f"scaling['partial_rotary_factor'] must be in (0, 1], got {partial}")
        theta = self.scaling_args.pop("rope_theta", None)  # transformers 5 keeps it in rope_parameters
        if theta is not None and base != 10000.0 and float(theta) != float(base):
            raise ValueError(f"scaling['rope_theta'] ({theta}) contradicts base ({base}); give one of them")
        self.base = (check_float(base, "base", positive=True) if theta is None else
                     check_float(theta, "scaling['rope_theta']", positive=True))
        self.rotates_cached_keys = self.scaling_kind in self.LENGTH_DEPENDENT

    @staticmethod
    def _parse_scaling(scaling):
        if scaling is None:
            return None, {}
        if not isinstance(scaling, dict):
            raise TypeError(f"scaling must be a dict like a checkpoint's rope_scaling, got {type(scaling).__name__}")
        args = dict(scaling)
        kind = args.pop("rope_type", None) or args.pop("type", None)
        args.pop("type", None)
        if kind != "default":
            check_choice(kind, "scaling['rope_type']", set(REGISTRY))
        own = {"rope_theta", "partial_rotary_factor"}                    # read by Rotary itself
        params = {} if kind == "default" else inspect.signature(REGISTRY[kind]).parameters
        accepted = {n for n in params if n not in ("dim", "base", "seq_len")}
        unknown = sorted(set(args) - accepted - own)
        if unknown:
            raise ValueError(f"scaling[{unknown[0]!r}] is not a parameter of rope_type {kind!r}; it accepts "
                             f"{sorted(accepted | own)}")
        missing = sorted(n for n in accepted if params[n].default is inspect.Parameter.empty and n not in args)
        if missing:
            raise ValueError(f"scaling[{missing[0]!r}] is required by rope_type {kind!r}")
        return (None if kind == "default" else kind), args

    def bind(self, layer, rng):
        super().bind(layer, rng)
        if self.partial_rotary_factor is not None:               # HF: int(head_dim * partial_rotary_factor)
            rd = int(self.head_dim * self.partial_rotary_factor)
            if self.rotary_dim is not None and self.rotary_dim != rd:
                raise ValueError(f"rotary_dim ({self.rotary_dim}) contradicts scaling['partial_rotary_factor'] "
                                 f"({self.partial_rotary_factor} of head_dim {self.head_dim} = {rd}); give one of them")
            self.rotary_dim = rd
        if self.rotary_dim is None and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got head_dim = {self.head_dim}")
        rd = self.head_dim if self.rotary_dim is None else self.rotary_dim
        if rd > self.head_dim or rd % 2 or rd < 2:
            raise ValueError(f"rotary_dim must be even, >= 2 and <= head_dim ({self.head_dim}), got {rd}")
        self._dim = rd
        self.inv_freq, self.attention_factor = self._frequencies(1)  # validates the scaling now
        self._made_from = self._frequency_settings()

    def _frequency_settings(self):  # what the fixed inv_freq is computed from: base and scaling
        return self.base, self.scaling_kind, repr(sorted(self.scaling_args.items()))

    def _frequencies(self, seq_len: int):
        if self.scaling_kind is None:
            return rope.rope_inv_freq(self._dim, base=self.base), 1.0
        extra = {"seq_len": seq_len} if self.rotates_cached_keys else {}
        return REGISTRY[self.scaling_kind](self._dim, base=self.base, **self.scaling_args, **extra)

    def frequencies(self, seq_len: int):
        """``(inv_freq (rotary_dim/2,), attention_factor)`` at ``seq_len`` (max key position + 1).

        Fixed kinds return ``inv_freq`` and ``attention_factor`` (attributes, computed once, and again
        after ``base`` or the scaling is set);
        ``dynamic`` and ``longrope`` compute them for this length, without storing them.
        """
        if self.rotates_cached_keys:
            return self._frequencies(seq_len)
        if self._frequency_settings() != self._made_from:               # base or scaling set since: recompute
            self.inv_freq, self.attention_factor = self._frequencies(1)
            self._made_from = self._frequency_settings()
        return self.inv_freq, self.attention_factor

    def cache_tag(self, seq_len):
        if self.rotates_cached_keys:
            return None
        inv_freq, factor = self.frequencies(seq_len)
        return np.asarray(inv_freq).tobytes(), factor, self.layout

    def _apply(self, x, positions, *, seq_len, ops=rope):
        """``ops``: the module with ``apply_rope`` and ``apply_rope_backward`` (``minipos.fast.rope``
        has the same names; the fast layer passes it)."""
        inv_freq, factor = self.frequencies(seq_len)
        return ops.apply_rope(x, positions, inv_freq=inv_freq, layout=self.layout, rotary_dim=self.rotary_dim,
                               attention_factor=factor)

    rotate_q = _apply
    rotate_k = _apply

    def _apply_backward(self, dx, positions, *, seq_len, ops=rope):  # R(m)^T
        inv_freq, factor = self.frequencies(seq_len)
        return ops.apply_rope_backward(dx, positions, inv_freq=inv_freq, layout=self.layout,
                                        rotary_dim=self.rotary_dim, attention_factor=factor)

    rotate_q_backward = _apply_backward
    rotate_k_backward = _apply_backward

    def settings(self):
        """Base, layout, rotated dims (``None``: all) and the scaling: its kind and its arguments, sorted
        (a list, LongRoPE's factors, as a tuple)."""
        args = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple, np.ndarray)) else v)
                            for k, v in self.scaling_args.items()))
        return (("base", self.base), ("layout", self.layout), ("rotary_dim", self.rotary_dim),
                ("scaling", self.scaling_kind), ("scaling_args", args))

    def __repr__(self) -> str:
        kind = f", scaling={self.scaling_kind!r}" if self.scaling_kind else ""
        return f"Rotary(layout={self.layout!r}, rotary_dim={self.rotary_dim}{kind})"
