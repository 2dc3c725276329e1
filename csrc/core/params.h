/* POD parameter structs, one per op family, filled by the bindings (csrc/python/ops/) and read by the CPU
 * kernels (csrc/cpu/) and the CUDA launchers (cuda/). Shapes are in the comment beside each pointer.
 * Strides are int64 in elements of the pointed-to type, except the KV cache, whose strides are in
 * bytes (its fp8_ds_mla entry mixes e4m3, fp32 and bf16, so bytes are its only common unit).
 * The last dimension of every array is contiguous (the bindings check this). */
#ifndef SMLA_PARAMS_H
#define SMLA_PARAMS_H

#include "smla.h"
#include "fp8_ds_mla.h"

#ifdef __cplusplus
extern "C" {
#endif

/* smla_run.attn_persistent: the values of SMLA_ATTN_PERSISTENT=auto|off|on, in that order (settings.c) */
enum { SMLA_PERSISTENT_AUTO = 0, SMLA_PERSISTENT_OFF = 1, SMLA_PERSISTENT_ON = 2 };

/* Run-time settings of one call: the binding reads the environment switches (SMLA_NUM_THREADS,
 * SMLA_CPU_ISA, SMLA_ATTN_KERNEL, SMLA_ATTN_COMBINE, SMLA_ATTN_PERSISTENT, SMLA_ATTN_ABLATE, SMLA_ATTN_TRACE,
 * SMLA_ATTN_STAGGER_NS, SMLA_ATTN_JITTER_NS) under the GIL, parses them strictly and passes them
 * in every params struct; kernels never read the environment (another thread may be writing it). */
typedef struct {
    int num_threads;   /* CPU threads for this call, >= 1; 0 = OpenMP's default */
    int cpu_isa;       /* SMLA_ISA_* level to run (csrc/cpu/cpu_features.h), within what the CPU has */
    int emulated_bf16; /* test hook SMLA_CPU_ISA=avx2-emulated-bf16 (cpu_isa is then AVX2 or lower) */
    int attn_kernel;   /* CUDA attention family: 0 auto, 1 portable (mma.sync), 2 sm90 (wgmma), 3 sm90n (narrow wgmma), 4 sm90p (pair wgmma, bf16 K), 5 sm90r (register wgmma, fp8, h <= 32), 6 sm90d (dims kernel: mma.sync, fp8, h <= 16), 7 sm90t (three-buffer wgmma, bf16 K, "fast") */
    int fused_combine; /* split decode: 1 (SMLA_ATTN_COMBINE=auto, default) the main kernel merges its own
                          partials where it can (cuda/attention/combine.cuh), 0 (=kernel) the combine kernel */
    int attn_persistent; /* the bf16 pair kernel's persistent form (cuda/attention/sm90/pair_kernel.cuh,
                            persistent_here), SMLA_ATTN_PERSISTENT's index: SMLA_PERSISTENT_AUTO (default) where
                            it measured faster, _OFF never, _ON wherever it can run */
    int attn_ablate;   /* profiling builds: ablation variant bits; 0 = the full kernel */
    uint64_t attn_trace; /* profiling builds: device address of the sm90 kernels' stage-timestamp buffer
                            (SMLA_ATTN_TRACE, cuda/attention/sm90/trace.cuh, tools/trace_attn.py); 0 = none */
    uint64_t attn_stagger_ns; /* profiling builds: the first wave's start spread of the bf16 wide and pair kernels in
                                 ns (SMLA_ATTN_STAGGER_NS, cuda/attention/sm90/plan.cuh, stagger_start); 0 = none */
    uint64_t attn_jitter_ns;  /* profiling builds: each CTA's pseudo-random start delay below this many ns, the same
                                 kernels (SMLA_ATTN_JITTER_NS, stagger_start); 0 = none */
} smla_run;

/* A paged KV cache [num_blocks, block_size, entry]; slot = block * block_size + offset. */
typedef struct {
    void *data;           /* [num_blocks, block_size, entry] bytes (entry: 656 B fp8_ds_mla, 1152 B bf16) */
    int dtype;            /* smla_cache_dtype */
    int64_t num_blocks;
    int64_t block_size;
    int64_t block_stride; /* bytes between blocks, >= block_size * entry_stride */
    int64_t entry_stride; /* bytes between tokens of one block */
} smla_cache;

/* pack_kv: write T tokens into the cache; slot < 0 is skipped (padding). slot >= num_blocks*block_size:
 * the CPU fails before writing anything; the GPU skips it (checking would need a sync). */
typedef struct {
    const uint16_t *kv_c;     /* [T, 512] bf16 bits */
    int64_t kv_c_stride;
    const uint16_t *k_pe;     /* [T, 64] bf16 bits */
    int64_t k_pe_stride;
    const void *slot_mapping; /* [T] int32 or int64 */
    int slot_is_i64;
    int64_t num_tokens;       /* T */
    smla_cache cache;
    int scale_rule;           /* smla_scale_rule */
    void *stream;             /* cudaStream_t for CUDA launches */
    smla_run run;             /* settings of this call */
} smla_pack_kv_params;

/* unpack_kv: out[i] = dequantised row of slot slots[i]; an invalid slot gives a zero row. */
typedef struct {
    smla_cache cache;
    const void *slots;    /* [n] int32 or int64 */
    int slots_is_i64;
    int64_t n;
    uint16_t *out;        /* [n, 576] bf16 bits */
    int64_t out_stride;
    void *stream;
    smla_run run;             /* settings of this call */
} smla_unpack_kv_params;

/* gather_upconvert: for request r and 0 <= i < seq_lens[r]:
 *   workspace[workspace_starts[r] + i] = dequant(token seq_starts[r] + i of request r).
 * The CPU fails before writing anything when a request has a negative seq_lens / workspace_starts /
 * seq_starts, rows past ws_rows, positions past max_blocks * block_size, or a block id outside
 * [0, num_blocks) for a position it reads. The GPU cannot check without a sync: there rows outside
 * [0, ws_rows) are skipped and a token whose position is negative or past max_blocks, or whose
 * block id is outside [0, num_blocks), gives a zero row. */
typedef struct {
    smla_cache cache;
    uint16_t *workspace;              /* [ws_rows, 576] bf16 bits */
    int64_t ws_stride;
    int64_t ws_rows;
    const int32_t *block_table;       /* [num_reqs, max_blocks] */
    int64_t bt_stride;
    int64_t num_reqs;
    int64_t max_blocks;
    const int32_t *seq_lens;          /* [num_reqs] */
    const int32_t *workspace_starts;  /* [num_reqs] */
    const int32_t *seq_starts;        /* [num_reqs] or NULL (all 0) */
    void *stream;
    smla_run run;             /* settings of this call */
} smla_gather_upconvert_params;

/* convert_topk_indices and filter_convert_dcp_indices (dcp_size >= 1 enables the DCP filter).
 * tok < 0 -> -1. Paged row n: block_table[req_id[n], tok / block_size] * block_size + tok % block_size,
 * -1 when tok / block_size >= max_blocks, req_id[n] outside [0, num_reqs), the block id is negative
 * or the slot does not fit int32. A block id >= num_blocks (when num_blocks > 0) fails on the CPU
 * and gives -1 on the GPU (never read past the cache; reporting it would need a sync). Prefill rows
 * (prefill_request_ids[n] = p >= 0): prefill_workspace_starts[p] + tok (-1 when p >= num_prefills or
 * it overflows int32).
 * DCP: owner of g is (g / interleave) % dcp_size; other ranks' tokens -> -1; owned ones use the local
 * position (g / (dcp_size*interleave)) * interleave + g % interleave; compact moves the valid ones
 * to the front in order. valid_counts[n] = number of entries != -1. */
typedef struct {
    const int32_t *req_id;                   /* [N] */
    int64_t num_tokens;                      /* N */
    const int32_t *block_table;              /* [num_reqs, max_blocks] */
    int64_t bt_stride;
    int64_t num_reqs;
    int64_t max_blocks;
    const int32_t *topk_indices;             /* [N, topk] request-local positions */
    int64_t in_stride;
    int64_t topk;
    int64_t block_size;
    int64_t num_blocks;                      /* > 0: block ids >= it are invalid */
    const int32_t *prefill_request_ids;      /* [N] or NULL */
    const int32_t *prefill_workspace_starts; /* [num_prefills] or NULL */
    int64_t num_prefills;
    int32_t *out;                            /* [N, topk] global slots / workspace rows */
    int64_t out_stride;
    int32_t *valid_counts;                   /* [N] or NULL */
    int dcp_size;                            /* 0: no DCP filtering */
    int dcp_rank;
    int dcp_interleave;
    int compact;
    void *stream;
    smla_run run;             /* settings of this call */
} smla_convert_indices_params;

/* merge_attn_states (docs/design.md section 4): lse-weighted merge of two partial attention outputs. */
typedef struct {
    int dtype;                     /* smla_dtype of the outputs: BF16, F16 or F32 */
    int64_t n, h, d;
    const void *out_a;             /* [n, h, d] */
    int64_t oa_stride_n, oa_stride_h;
    const void *out_b;             /* [n, h, d] */
    int64_t ob_stride_n, ob_stride_h;
    void *out;                     /* [n, h, d] */
    int64_t o_stride_n, o_stride_h;
    const float *lse_a;            /* [n, h] */
    int64_t la_stride_n, la_stride_h;
    const float *lse_b;            /* [n, h] */
    int64_t lb_stride_n, lb_stride_h;
    float *out_lse;                /* [n, h] or NULL */
    int64_t lo_stride_n, lo_stride_h;
    void *stream;
    smla_run run;             /* settings of this call */
} smla_merge_attn_states_params;

/* Sparse MLA attention, shared by decode (paged cache, b requests) and prefill (bf16 kv[s_kv, 576]
 * seen as one block of s_kv rows, b = 1). Index idx of row (bi, si) is valid iff
 * 0 <= idx < num_blocks * block_size and its position < topk_length[bi, si] (when given). */
typedef struct {
    const uint16_t *q;         /* [b, s_q, h, 576] bf16 bits; [b, s_q, h, 512] when q_pe is set */
    int64_t q_stride_b, q_stride_s, q_stride_h;
    const uint16_t *q_pe;      /* NULL, or [b, s_q, h, 64]: the RoPE part of q, read from here (smla_q_at) */
    int64_t q_pe_stride_b, q_pe_stride_s, q_pe_stride_h;
    smla_cache kv;             /* paged cache, fp8_ds_mla or bf16 */
    const int32_t *indices;    /* [b, s_q, topk] */
    int64_t idx_stride_b, idx_stride_s;
    const int32_t *topk_length;/* [b, s_q] or NULL */
    int64_t tl_stride_b, tl_stride_s;
    const float *attn_sink;    /* [h] or NULL */
    int64_t sink_stride;
    uint16_t *out;             /* [b, s_q, h, 512] bf16 bits */
    int64_t out_stride_b, out_stride_s, out_stride_h;
    float *lse;                /* [b, s_q, h] natural log */
    int64_t lse_stride_b, lse_stride_s, lse_stride_h;
    float *max_logits;         /* [b, s_q, h] or NULL (prefill only) */
    int64_t ml_stride_b, ml_stride_s, ml_stride_h;
    int64_t b, s_q, h, topk;
    float softmax_scale;
    int precision;             /* smla_precision: SMLA_PRECISION_HIGH (default) or _FAST */
    void *workspace;           /* CUDA decode split-top-k scratch or NULL (see workspace_size) */
    int64_t workspace_bytes;
    void *stream;
    smla_run run;             /* settings of this call */
} smla_attn_params;

/* Where values d .. of query row (bi, si) head hi start: q's row, or q_pe's for the RoPE dims (d >= 512)
 * when the pair is given. d and the run read from it stay on one side of 512 (the kernels read 8- or
 * 2-value runs at even offsets). The one rule for both backends' q loads. */
SMLA_HD const uint16_t *smla_q_at(const smla_attn_params *p, int64_t bi, int64_t si, int64_t hi, int d)
{
    if (p->q_pe && d >= SMLA_D_V)
        return p->q_pe + bi * p->q_pe_stride_b + si * p->q_pe_stride_s + hi * p->q_pe_stride_h + (d - SMLA_D_V);
    return p->q + bi * p->q_stride_b + si * p->q_stride_s + hi * p->q_stride_h + d;
}

/* ---- CPU kernels (csrc/cpu/) ---- */
int smla_cpu_pack_kv(const smla_pack_kv_params *p, smla_status *st);
int smla_cpu_unpack_kv(const smla_unpack_kv_params *p, smla_status *st);
int smla_cpu_gather_upconvert(const smla_gather_upconvert_params *p, smla_status *st);
int smla_cpu_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st);
int smla_cpu_merge_attn_states(const smla_merge_attn_states_params *p, smla_status *st);
int smla_cpu_sparse_mla_decode(const smla_attn_params *p, smla_status *st);
int smla_cpu_sparse_mla_prefill(const smla_attn_params *p, smla_status *st);

/* ---- CUDA launchers (cuda/), present when built with SMLA_WITH_CUDA ---- */
int smla_cuda_pack_kv(const smla_pack_kv_params *p, smla_status *st);
int smla_cuda_unpack_kv(const smla_unpack_kv_params *p, smla_status *st);
int smla_cuda_gather_upconvert(const smla_gather_upconvert_params *p, smla_status *st);
int smla_cuda_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st);
int smla_cuda_merge_attn_states(const smla_merge_attn_states_params *p, smla_status *st);
int smla_cuda_sparse_mla_decode(const smla_attn_params *p, smla_status *st);
int smla_cuda_sparse_mla_prefill(const smla_attn_params *p, smla_status *st);
/* Bytes of scratch sparse_mla_decode wants for this shape on the current device (0 if none). */
int64_t smla_cuda_sparse_mla_decode_workspace_size(int64_t b, int64_t s_q, int64_t h, int64_t topk,
                                                   int cache_dtype, int attn_kernel);

/* ---- CUDA runtime helpers (cuda/runtime.cu) ---- */
int smla_cuda_device_count(void);                 /* 0 when no driver / GPU */
int smla_cuda_set_device(int device, int *prev, smla_status *st);
int smla_cuda_restore_device(int prev);
/* waiter waits for the work queued on `on` so far (an event); SMLA_OK or a CUDA status */
int smla_cuda_stream_wait(void *waiter, void *on, smla_status *st);
const char *smla_cuda_runtime_version(void);

#ifdef __cplusplus
}
#endif

#endif /* SMLA_PARAMS_H */
