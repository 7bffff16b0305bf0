"""xPos, fast: ``minipos.xpos.apply_xpos`` and its backward with ``minipos.fast.rope``'s rotation (a
cache-sized chunk at a time, complex multiplication for the interleaved pairs). The scales, their
checks and the errors are the reference's; the results equal the reference's up to rounding.
"""

from __future__ import annotations

from .. import xpos as reference
from . import rope as fast_rope

__all__ = ["apply_xpos", "apply_xpos_backward"]


def apply_xpos(x, positions, *, base: float = 10000.0, scale_base: float = 512, downscale: bool = False,
               scale_offset: int = 0):
    """``minipos.xpos.apply_xpos`` (same arguments and result, up to rounding)."""
    return reference.apply_xpos_with(fast_rope.apply_rope, x, positions, base, scale_base, downscale, scale_offset)


def apply_xpos_backward(dy, positions, *, base: float = 10000.0, scale_base: float = 512,
                        downscale: bool = False, scale_offset: int = 0):
    """``minipos.xpos.apply_xpos_backward`` (same arguments and result, up to rounding)."""
    return reference.apply_xpos_backward_with(fast_rope.apply_rope_backward, dy, positions, base, scale_base, downscale,
                                    scale_offset)
