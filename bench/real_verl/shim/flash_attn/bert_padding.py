"""Plain-torch ``pad_input``, ``unpad_input`` and ``index_first_axis`` (flash-attn's API)."""

import torch
import torch.nn.functional as F


def index_first_axis(x, indices):
    """Rows ``indices`` of ``x`` along its first axis."""
    return x.reshape(x.shape[0], *x.shape[1:])[indices]


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Drop padded tokens: (batch, seq, ...) -> (total, ...), indices, cu_seqlens, max_seqlen,
    seqused (flash-attn >= 2.6 returns five values)."""
    all_masks = (attention_mask + unused_mask) if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item())
    cu = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of :func:`unpad_input`: (total, ...) -> (batch, seq, ...), zeros elsewhere."""
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], device=hidden_states.device,
                      dtype=hidden_states.dtype)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def rearrange(tensor, pattern, **axes):
    """Only what verl's SFT trainer asks of einops' rearrange via this module."""
    import einops

    return einops.rearrange(tensor, pattern, **axes)
