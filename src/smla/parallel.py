"""Decode context parallelism (DCP) on top of a process group the caller already has.

With DCP each of `dcp_size` ranks holds a disjoint share of every request's KV cache: global position g
(request-local, as the indexer numbers tokens) lives on rank `(g // interleave) % dcp_size` at local
position `(g // (dcp_size*interleave)) * interleave + g % interleave`. A decode step then runs on every
rank over the selected tokens it owns and the partial results are combined with their lse:

    G   = log(sum_r exp(lse_r))                     (max-shifted; all ranks -inf -> G = -inf)
    out = sum_r exp(lse_r - G) * out_r              (a factor of 0, or NaN, contributes exactly 0)

The attention sink belongs to the whole softmax, so it is applied once, after the combine, with G.

Precision: the partial outputs are bf16 (the decode kernel's output type, as in vLLM), and the combine
runs in float32. Where the ranks' contributions cancel, the result can differ from a one-GPU decode by
the partials' rounding, up to 2**-8 * sum_r exp(lse_r - G) * |out_r| per element, which can exceed a
one-GPU decode's elementwise tolerance on elements much smaller than the partials.

smla ships no communication layer: `dcp_decode` uses torch.distributed on a group the caller made
(NCCL on GPUs; gloo works for CPU tensors). `dcp_combine` is the same combine over a list of per-rank
results in one process (NumPy or torch), for simulations and tests.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import ml_dtypes

from ._arrays import framework, host_ints
from .ops import _int, convert_topk_indices, filter_convert_dcp_indices, sparse_mla_decode

__all__ = [
    "dcp_owner", "dcp_local_position", "dcp_global_position", "dcp_local_seq_lens",
    "dcp_local_decode", "dcp_decode", "dcp_combine", "dcp_global_lse", "split_cache_by_owner",
]

_BF16 = np.dtype(ml_dtypes.bfloat16)

# NumPy arrays or torch tensors (the decode functions: any array sparse_mla_decode accepts).
Array = Any
# A position or count: a Python int, a NumPy integer array or a torch tensor (results are of the same kind).
Pos = Any


# =============================================================================================
# ownership (pure integer arithmetic: Python ints, NumPy arrays or torch tensors, g >= 0)
# =============================================================================================

def dcp_owner(g: Pos, dcp_size: int, interleave: int = 1) -> Pos:
    """Rank that stores global position g: tokens go round-robin in groups of `interleave`."""
    return (g // interleave) % dcp_size


def dcp_local_position(g: Pos, dcp_size: int, interleave: int = 1) -> Pos:
    """Position of global position g in its owner's local sequence."""
    return (g // (dcp_size * interleave)) * interleave + g % interleave


def dcp_global_position(local: Pos, dcp_rank: int, dcp_size: int, interleave: int = 1) -> Pos:
    """Inverse of dcp_local_position on rank dcp_rank."""
    return ((local // interleave) * dcp_size + dcp_rank) * interleave + local % interleave


def dcp_local_seq_lens(seq_lens: Pos, dcp_size: int, dcp_rank: int, interleave: int = 1) -> Pos:
    """Tokens of sequences of length seq_lens that rank dcp_rank stores (vLLM get_dcp_local_seq_lens):
    the full rounds every rank gets, plus this rank's part of the last, partial round."""
    base = (seq_lens // (dcp_size * interleave)) * interleave
    rest = seq_lens - base * dcp_size - dcp_rank * interleave
    if isinstance(rest, (int, np.integer)):
        return base + min(max(int(rest), 0), interleave)
    return base + rest.clip(0, interleave)


# =============================================================================================
# the lse-weighted combine
# =============================================================================================

def _is_torch(x):
    return framework(x) == "torch"


def _as_f32(x):
    if _is_torch(x):
        return x.float()
    x = np.asarray(x)
    if x.dtype == np.uint16:  # raw bf16 bits
        x = x.view(_BF16)
    return x.astype(np.float32)


def _like(x, ref):
    """f32 result x cast back to ref's dtype (bf16 bits stay bits)."""
    if _is_torch(ref):
        return x.to(ref.dtype)
    ref = np.asarray(ref)
    if ref.dtype == np.uint16:
        return x.astype(_BF16).view(np.uint16)
    return x.astype(ref.dtype)


def dcp_global_lse(lse_all: Array) -> tuple[Array, Array]:
    """lse_all [world, ...] f32 (NumPy or torch) -> (global lse [...], factors [world, ...]).

    As vLLM's _correct_attn_cp_out_kernel: NaN and +inf lse count as -inf (an empty shard); the max
    shift is 0 where every rank is -inf, so G = log(0) = -inf there; factor_r = exp(lse_r - G), and
    -inf - -inf = NaN gives factor 0."""
    if _is_torch(lse_all):
        import torch

        lse_all = torch.where(torch.isnan(lse_all) | (lse_all == float("inf")), float("-inf"), lse_all)
        m = lse_all.amax(dim=0)
        m = torch.where(m == float("-inf"), 0.0, m)
        g = torch.log(torch.exp(lse_all - m).sum(dim=0)) + m
        f = torch.exp(lse_all - g)
        return g, torch.where(torch.isnan(f), 0.0, f)
    with np.errstate(all="ignore"):
        lse_all = np.where(np.isnan(lse_all) | (lse_all == np.inf), -np.inf, lse_all).astype(np.float32)
        m = lse_all.max(axis=0)
        m = np.where(m == -np.inf, np.float32(0), m)
        g = np.log(np.exp(lse_all - m).sum(axis=0)) + m
        f = np.exp(lse_all - g)
        return g, np.where(np.isnan(f), np.float32(0), f).astype(np.float32)


def _scaled(out_f32, factor):
    """factor[...] * out[..., d]; exactly 0 where the factor is 0 (kills NaN/Inf of empty shards)."""
    f = factor[..., None]
    if _is_torch(out_f32):
        import torch

        return torch.where(f > 0, out_f32 * f, 0.0)
    with np.errstate(all="ignore"):
        return np.where(f > 0, out_f32 * f, np.float32(0))


def _apply_sink(out_f32, lse, attn_sink):
    """out *= 1 / (1 + exp(sink - lse)) over the last (head) axis of lse; rows with lse -inf stay 0."""
    if _is_torch(out_f32):
        import torch

        sink = torch.as_tensor(attn_sink, device=out_f32.device).float()
        w = torch.where(lse == float("-inf"), 0.0, 1.0 / (1.0 + torch.exp(sink - lse)))
    else:
        sink = _as_f32(attn_sink)
        with np.errstate(all="ignore"):
            w = np.where(lse == -np.inf, np.float32(0), 1.0 / (1.0 + np.exp(sink - lse)))
    return out_f32 * w[..., None]


def dcp_combine(outs: Sequence[Array], lses: Sequence[Array], *, attn_sink: Optional[Array] = None
                ) -> tuple[Array, Array]:
    """Combine the partial results of all DCP ranks in one process.

    outs: list of [..., d] (bf16 or f32; NumPy or torch), lses: list of [...] natural-log lse, one pair
    per rank, each from attention over that rank's tokens without sink (empty rows: lse -inf).
    attn_sink [h] (h = last axis of lse) is applied once to the combined result.
    Returns (out in outs[0]'s dtype, lse f32); rows where every rank is empty give out 0, lse -inf."""
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"dcp_combine: expected one lse per output, got {len(outs)} outputs, {len(lses)} lses")
    if _is_torch(lses[0]):
        import torch

        lse_all = torch.stack([l.float() for l in lses])
    else:
        lse_all = np.stack([_as_f32(l) for l in lses])
    g, factors = dcp_global_lse(lse_all)
    acc = None
    for r, o in enumerate(outs):
        part = _scaled(_as_f32(o), factors[r])
        acc = part if acc is None else acc + part
    if attn_sink is not None:
        acc = _apply_sink(acc, g, attn_sink)
    return _like(acc, outs[0]), g


# =============================================================================================
# one rank's share, and the distributed step
# =============================================================================================

def dcp_local_decode(q: Array, local_kv_cache: Array, topk_indices: Array, req_id: Array,
                     local_block_table: Array, *, block_size: int, softmax_scale: float, kv_cache_dtype: str,
                     dcp_size: int, dcp_rank: int, interleave: int = 1, out: Optional[Array] = None,
                     lse: Optional[Array] = None) -> tuple[Array, Array]:
    """This rank's partial decode: keep the selected tokens it owns, map them to local slots and run
    sparse_mla_decode (no sink). q [b, s_q, h, 576]; topk_indices [b*s_q, topk] or [b, s_q, topk]
    request-local positions (-1: none); req_id [b*s_q]. Returns (out [b, s_q, h, 512] bf16,
    lse [b, s_q, h] f32); rows where this rank owns nothing give out 0, lse -inf."""
    return _local_decode(q, local_kv_cache, topk_indices, req_id, local_block_table, block_size,
                         softmax_scale, kv_cache_dtype, dcp_size, dcp_rank, interleave, None, out, lse)


def _local_decode(q, cache, topk_indices, req_id, block_table, block_size, softmax_scale, kv_cache_dtype,
                  dcp_size, dcp_rank, interleave, attn_sink, out, lse):
    b, s_q = int(q.shape[0]), int(q.shape[1])
    topk = int(topk_indices.shape[-1])
    idx, counts = filter_convert_dcp_indices(
        req_id, block_table, topk_indices.reshape(b * s_q, topk), block_size=block_size,
        dcp_size=dcp_size, dcp_rank=dcp_rank, interleave=interleave, compact=True,
        num_blocks=int(cache.shape[0]))
    # Compaction puts the owned tokens first, so the count doubles as topk_length: kernels skip the tail.
    return sparse_mla_decode(q, cache, idx.reshape(b, s_q, topk), softmax_scale=softmax_scale,
                             kv_cache_dtype=kv_cache_dtype, topk_length=counts.reshape(b, s_q),
                             attn_sink=attn_sink, out=out, lse=lse)


def dcp_decode(q: Array, local_kv_cache: Array, topk_indices: Array, req_id: Array, local_block_table: Array,
               *, block_size: int, softmax_scale: float, kv_cache_dtype: str, dcp_size: int, dcp_rank: int,
               interleave: int = 1, group: Any = None, attn_sink: Optional[Array] = None,
               comm_dtype: Any = None, out: Optional[Array] = None) -> tuple[Array, Array]:
    """Sparse MLA decode with the KV cache split over the ranks of a torch.distributed group.

    Arguments as dcp_local_decode (torch tensors on this rank's device); group: the DCP process group
    (default: the world), whose size and this process's rank must be dcp_size and dcp_rank.
    Every rank runs its share, all-gathers the lse [world, b, s_q, h], scales its output by
    exp(lse_rank - lse_global) and the scaled outputs are all-reduced (summed), so every rank gets the
    full [b, s_q, h, 512] result. When heads are sharded after attention (vLLM's AG+RS layout), a
    reduce-scatter over heads of the same scaled outputs replaces the all-reduce and moves 1/world of
    the bytes to each rank. comm_dtype: dtype of the summed outputs, torch.float32 (default: the sum
    rounds to bf16 once) or torch.bfloat16 (half the traffic, one more rounding per hop).
    attn_sink [h] is applied once, after the combine. Returns (out bf16 [b, s_q, h, 512], lse f32
    [b, s_q, h]: the global lse, identical on every rank)."""
    if dcp_size == 1:  # the whole softmax is local: the kernel applies the sink itself
        return _local_decode(q, local_kv_cache, topk_indices, req_id, local_block_table, block_size,
                             softmax_scale, kv_cache_dtype, 1, dcp_rank, interleave, attn_sink, out, None)
    part_out, part_lse = dcp_local_decode(
        q, local_kv_cache, topk_indices, req_id, local_block_table, block_size=block_size,
        softmax_scale=softmax_scale, kv_cache_dtype=kv_cache_dtype, dcp_size=dcp_size, dcp_rank=dcp_rank,
        interleave=interleave)

    import torch
    import torch.distributed as dist

    if not _is_torch(part_lse):
        raise TypeError("dcp_decode: dcp_size > 1 communicates through torch.distributed; pass torch tensors")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if (world, rank) != (dcp_size, dcp_rank):
        raise ValueError(f"dcp_decode: dcp_size={dcp_size}, dcp_rank={dcp_rank} but the group has size "
                         f"{world} and this process is its rank {rank}")
    lse_all = torch.empty((world,) + tuple(part_lse.shape), dtype=torch.float32, device=part_lse.device)
    if dist.get_backend(group) == "nccl":
        dist.all_gather_into_tensor(lse_all, part_lse.contiguous(), group=group)
    else:  # gloo and others: the list form is the portable one
        dist.all_gather(list(lse_all.unbind(0)), part_lse.contiguous(), group=group)
    g, factors = dcp_global_lse(lse_all)
    acc = _scaled(part_out.float(), factors[rank]).to(comm_dtype or torch.float32)
    dist.all_reduce(acc, op=dist.ReduceOp.SUM, group=group)
    if attn_sink is not None:
        acc = _apply_sink(acc.float(), g, attn_sink)
    if out is None:
        return acc.to(part_out.dtype), g
    out.copy_(acc)
    return out, g


# =============================================================================================
# building shards (tests, benchmarks)
# =============================================================================================

def split_cache_by_owner(kv_cache: Array, block_table: Array, seq_lens: Array, *, dcp_size: int,
                         interleave: int = 1, ranks: Optional[Sequence[int]] = None,
                         num_blocks: Optional[int] = None, seed: Optional[int] = None
                         ) -> list[tuple[Array, Array, Array]]:
    """Each rank's share of a full paged cache, for tests and benchmarks.

    kv_cache [num_blocks, block_size, entry] (either layout: entries are copied byte for byte),
    block_table [R, M] and seq_lens [R]: request r's token at position p is in block
    block_table[r, p // block_size]. For each rank in `ranks` (default all) returns
    (local_cache, local_block_table [R, M_local] int32 (-1 past the end), local_seq_lens [R]) where
    request r's local position dcp_local_position(p) holds global position p of the tokens that rank
    owns. Local caches have num_blocks blocks (default: just enough), in the full cache's framework,
    dtype and device; blocks are handed out in request order, shuffled when seed is given."""
    bs = int(kv_cache.shape[1])
    size = _int(dcp_size, "dcp_size", 1)
    il = _int(interleave, "interleave", 1)
    bt = host_ints(block_table, "block_table", np.int32)
    lens = host_ints(seq_lens, "seq_lens").reshape(-1)
    if bt.ndim != 2 or bt.shape[0] != lens.shape[0]:
        raise ValueError(f"block_table: {list(bt.shape)} and seq_lens {list(lens.shape)} disagree on the "
                         "number of requests")
    torch_cache = _is_torch(kv_cache)
    if torch_cache:
        import torch
    result = []
    for rank in range(size) if ranks is None else (_int(r, "ranks[i]", 0, size - 1) for r in ranks):
        llens = dcp_local_seq_lens(lens, size, rank, il)
        nblk = -(-llens // bs)
        total = int(nblk.sum())
        n = total if num_blocks is None else _int(num_blocks, "num_blocks", 0)
        if n < total:
            raise ValueError(f"num_blocks: rank {rank} needs {total} blocks, got {n}")
        ids = np.arange(n)
        if seed is not None:
            ids = np.random.default_rng([seed, rank]).permutation(n)
        lbt = np.full((lens.shape[0], max(1, int(nblk.max(initial=0)))), -1, np.int32)
        firsts = np.cumsum(nblk) - nblk  # request r's blocks are ids[firsts[r]:firsts[r] + nblk[r]]
        for r in range(lens.shape[0]):
            lbt[r, :nblk[r]] = ids[firsts[r]:firsts[r] + nblk[r]]
        # every local token: its request, local position and global position, as cache slots
        req = np.repeat(np.arange(lens.shape[0], dtype=np.int32), llens)
        lp = np.arange(req.shape[0]) - np.repeat(np.cumsum(llens) - llens, llens)
        g = dcp_global_position(lp, rank, size, il)
        src = convert_topk_indices(req, bt, g.astype(np.int32)[:, None], block_size=bs)[:, 0]
        dst = convert_topk_indices(req, lbt, lp.astype(np.int32)[:, None], block_size=bs)[:, 0]
        if (src < 0).any():
            raise ValueError("block_table: too narrow for seq_lens (a position past its last column)")
        (sb, so), (db, do) = divmod(src, bs), divmod(dst, bs)
        shape = (n,) + tuple(int(s) for s in kv_cache.shape[1:])
        if torch_cache:
            dev = kv_cache.device
            local = torch.zeros(shape, dtype=kv_cache.dtype, device=dev)
            t = lambda a: torch.as_tensor(a, device=dev)  # noqa: E731
            local[t(db), t(do)] = kv_cache[t(sb), t(so)]
            lbt_out = torch.as_tensor(lbt, device=block_table.device if _is_torch(block_table) else dev)
            llens_out = torch.as_tensor(llens.astype(np.int32), device=lbt_out.device)
        else:
            cache = np.asarray(kv_cache)
            local = np.zeros(shape, cache.dtype)
            local[db, do] = cache[sb, so]
            lbt_out, llens_out = lbt, llens.astype(np.int32)
        result.append((local, lbt_out, llens_out))
    return result
