"""Benchmarks of minipos: every figure is a RATIO measured in one run, never an absolute time.

``python -m benchmarks`` prints one table (name, minipos time, reference time, ratio, target,
result); ``--quick`` runs the same rows at small sizes. A missed target is printed, never fatal.
Each time is the median of several repetitions, the two sides of a row interleaved so that a
change in the machine's load hits both. PyTorch rows need ``torch`` and are skipped without it.

Rows (full sizes):

- attention: causal ALiBi, B=1, H=8, T=S=2048, D=64, float32, by ``blockwise_attention`` and by
  the layer's blockwise path, against the two dense matrix products ``(q k^T) v`` (the floor) and
  PyTorch's ``scaled_dot_product_attention`` with the same float mask. The torch target is
  the layer's row: its bias blocks are kept from pass to pass, as torch's mask is built before
  the call; ``blockwise_attention`` with a bias built per block and the layer on one thread
  are shown beside it;
- ``apply_rope`` (H=32, T=4096, D=128, both layouts) against the HF expression in PyTorch and
  against ``x.copy()``;
- efficient forms against definitional ones: T5 Toeplitz buckets, DeBERTa c2p/p2c, the
  Transformer-XL relative shift, RoPE without matrices, ALiBi bias per block;
- peak memory (``ru_maxrss`` of a fresh subprocess) of the layer at T = 32768, and of blockwise
  against dense attention at T = 4096; the decode cost per token against the cache length.
"""
