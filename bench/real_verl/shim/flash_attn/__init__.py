"""Stand-in for flash-attn, which cannot be had for the GPU image's torch.

verl 0.5 imports ``flash_attn.bert_padding`` at module level in its actor and critic whenever
CUDA is present; only the padding helpers are used with ``use_remove_padding=False``. No
dist-info is shipped, so transformers still sees no flash attention.
"""
__version__ = "0.0.0-shim"
