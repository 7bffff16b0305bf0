"""The StreamingLLM cases of ``local_global``, run by ``spec/check_port.py`` against a port written
from spec/README.md (``local_global`` note): a step sees the kept tokens and all of its own, as a fresh
causal pass over the kept tokens followed by the step, at positions 0, 1, ...; only after the step does
the cache evict, keeping the first ``num_sinks`` tokens of the stream and its last ``window - 1``.

The port does not call minipos. A port that applies the window inside a step (each query of a long step
sees the sinks and the last ``window`` tokens only, a sliding window) passes the case of one-token
steps and fails the case whose step of 4 is longer than its window of 2. Hand-worked (num_sinks 1,
window 2, chunks [2, 4, 1]): after [0, 1] the cache holds tokens 0, 1; the step [2, 3, 4, 5] sees
them at positions 0 ... 5; then it keeps token 0 and token 5 (at position 1); token 6 sits at
position 2 and sees tokens 0, 5, 6.
"""

import importlib.util
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_port", ROOT / "spec" / "check_port.py")
check_port = importlib.util.module_from_spec(_spec)
sys.modules["check_port"] = check_port  # its dataclasses look the module up there
_spec.loader.exec_module(check_port)

LONG_STEP = "streaming_sinks1_window2_long_step_rope_half"


def _kept(stream, num_sinks, window):
    """The tokens a StreamingLLM cache keeps after a step: the sinks and the last window - 1."""
    if len(stream) <= num_sinks + window - 1:
        return list(stream)
    return stream[:num_sinks] + (stream[len(stream) - (window - 1):] if window > 1 else [])


def _rope_half(a, positions, base=10000.0):
    D = a.shape[-1]
    ang = np.asarray(positions, float)[:, None] * base ** (-np.arange(0, D, 2) / D)    # (T, D/2)
    ang = np.concatenate([ang, ang], -1)
    return a * np.cos(ang) + np.concatenate([-a[..., D // 2:], a[..., :D // 2]], -1) * np.sin(ang)


def streaming_port(x, wq, wk, wv, wo, *, d_model, num_heads, num_kv_heads, scheme, scheme_config, chunks,
                   streaming=None, bias, sinks, sliding_window, scale, mem_len, causal, window_in_step=False, **rest):
    """The streaming cases of ``local_global`` (RoPE, half layout, no bias); ``window_in_step``: the wrong
    reading, a sliding window of ``window`` (plus the sinks) inside each step."""
    if (streaming is None or scheme != "rope" or scheme_config != {"layout": "half"} or bias or sinks is not False
            or num_kv_heads != num_heads or rest):
        raise NotImplementedError("a streaming case only")
    ns, window = streaming["num_sinks"], streaming["window"]
    B, _, _ = x.shape
    H, D = num_heads, d_model // num_heads
    kept, start, outs = [], 0, []
    for n in chunks:
        tokens = kept + list(range(start, start + n))               # a fresh pass: kept tokens, then the step
        S = len(tokens)
        heads = lambda w: (x[:, tokens] @ w).reshape(B, S, H, D).transpose(0, 2, 1, 3)
        pos = np.arange(S)                                          # positions within the cache
        q, k, v = _rope_half(heads(wq), pos), _rope_half(heads(wk), pos), heads(wv)
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
        allowed = pos[None, :] <= pos[:, None]
        if window_in_step:
            stream = np.array(tokens)
            allowed &= (stream[None, :] < ns) | (stream[None, :] > stream[:, None] - window)
        s = np.where(allowed, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out = (p / p.sum(-1, keepdims=True)) @ v
        outs.append((out.transpose(0, 2, 1, 3).reshape(B, S, H * D) @ wo)[:, len(kept):])
        kept, start = _kept(tokens, ns, window), start + n
    return np.concatenate(outs, axis=1)


def test_the_hand_worked_eviction():
    assert _kept([0, 1], 1, 2) == [0, 1]
    assert _kept([0, 1, 2, 3, 4, 5], 1, 2) == [0, 5]                 # token 6 then sits at position 2
    assert _kept([0, 1, 2, 3], 1, 3) == [0, 2, 3]
    case = {c["name"]: c for c in check_port.load_family("local_global")["cases"]}[LONG_STEP]
    assert case["params"]["chunks"] == [2, 4, 1] and case["params"]["streaming"] == {"num_sinks": 1, "window": 2}
    assert max(case["params"]["chunks"]) > case["params"]["streaming"]["window"]


def test_the_spec_port_passes_both_streaming_cases():
    report = check_port.run_family("local_global", streaming_port)
    assert set(report.passed) == {"streaming_sinks1_window3_rope_half", LONG_STEP} and not report.failed, str(report)


def test_a_window_inside_the_step_fails_only_the_long_step():
    report = check_port.run_family("local_global", lambda **kw: streaming_port(**kw, window_in_step=True))
    assert report.failed == [LONG_STEP] and report.passed == ["streaming_sinks1_window3_rope_half"], str(report)
