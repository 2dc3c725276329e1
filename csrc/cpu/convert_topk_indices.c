/* convert_topk_indices / filter_convert_dcp_indices on the CPU (params.h, docs/design.md section 4). The
 * rule of one entry is core/index_rules.h's smla_convert_index, shared with the GPU, in int64 results so
 * that no int32 input can overflow; here a block id >= num_blocks (when num_blocks > 0), which the rule
 * reports, is an error (the GPU gives -1).
 * DCP with compact: the entries != -1 move to the front in their original order, the rest is -1.
 * valid_counts[n] = number of entries != -1. out may alias topk_indices (same strides): every entry is
 * read before any entry at or after its column is written. On an error (the first bad entry in row
 * order is reported) out and valid_counts are partly written.
 *
 * Paths (cpu_features.h): portable is the scalar rule; AVX2 and up convert 8 entries at a time for rows
 * without DCP (the rule's vector twin: integer division by block_size through a double reciprocal and a
 * one-step correction, a masked gather from the block table, overflow tests in int32); the op is
 * memory-bound, so the AVX-512 levels reuse that code; with num_blocks a second copy of it also stops at
 * the first 8 entries holding a block past the cache and leaves them to the scalar rule, which reports it
 * (the copy without the check stays as fast as before). Rows are spread over threads. */
#include "core/index_rules.h"
#include "cpu_features.h"
#include "threads.h"

#if SMLA_X86
#include <immintrin.h>

/* Per-call constants of the vector path. */
typedef struct {
    int32_t bs, bs_shift;  /* block size (<= INT32_MAX) and log2 of it, or -1 */
    uint32_t col_max;      /* largest block-table column a position can use: min(max_blocks, INT32_MAX / bs + 1) - 1 */
    uint32_t blk_max;      /* largest block id whose slot blk * bs + r can fit int32 (and < num_blocks when checked) */
    int32_t blk_always;    /* not a power of two: blocks up to here fit int32 for every r */
    int32_t num_blocks;    /* when checked: 0 < num_blocks <= INT32_MAX (a larger cache holds any int32 block) */
    int checked;
    double inv_bs;
} convert_consts;

/* Entries [0, *n8) of a paged row (*n8 a multiple of 8); returns the count of entries != -1. With
 * check, 8 entries holding a block >= num_blocks are not written: *n8 becomes their start.
 * The range tests are unsigned (min + compare), so that one test rejects a negative position or block
 * and one past the end; the gather skips the rejected lanes, which keep -1 and so fail the block test.
 * The lookups bound this loop (a gather costs about what 8 scalar loads do on Zen 4; measured), so
 * every other step is kept to one or two instructions. */
__attribute__((target(SMLA_TARGET_AVX2), always_inline)) static inline int64_t
convert_paged_body(const convert_consts *k, const int32_t *in, int32_t *out, int64_t *n8, const int32_t *bt_row,
                   int check, int pow2)
{
    const __m256i bs = _mm256_set1_epi32(k->bs), m1 = _mm256_set1_epi32(-1), zero = _mm256_setzero_si256();
    const __m256i col_max = _mm256_set1_epi32((int32_t)k->col_max), blk_max = _mm256_set1_epi32((int32_t)k->blk_max);
    const __m128i shift = _mm_cvtsi32_si128(pow2 ? k->bs_shift : 0);
    const __m256d inv = _mm256_set1_pd(k->inv_bs);
    __m256i valid = zero; /* minus the count of valid entries, per lane */
    for (int64_t i = 0; i < *n8; i += 8) {
        const __m256i tok = _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
        __m256i q, r;
        if (pow2) {
            q = _mm256_srl_epi32(tok, shift);
            r = _mm256_and_si256(tok, _mm256_sub_epi32(bs, _mm256_set1_epi32(1)));
        } else { /* q = trunc(tok * (1/bs)) is off by at most one: fix it from the remainder (floor division,
                  * so a negative tok gives a negative q) */
            const __m128i lo = _mm256_cvttpd_epi32(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(tok)), inv));
            const __m128i hi =
                _mm256_cvttpd_epi32(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(tok, 1)), inv));
            q = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
            r = _mm256_sub_epi32(tok, _mm256_mullo_epi32(q, bs));
            const __m256i under = _mm256_cmpgt_epi32(zero, r);
            const __m256i over = _mm256_cmpgt_epi32(r, _mm256_sub_epi32(bs, _mm256_set1_epi32(1)));
            q = _mm256_add_epi32(q, _mm256_sub_epi32(under, over)); /* the masks are -1 where true */
            r = _mm256_sub_epi32(_mm256_add_epi32(r, _mm256_and_si256(bs, under)), _mm256_and_si256(bs, over));
        }
        const __m256i col_ok = _mm256_cmpeq_epi32(_mm256_min_epu32(q, col_max), q);
        const __m256i blk = _mm256_mask_i32gather_epi32(m1, (const int *)bt_row, q, col_ok, 4);
        __m256i ok = _mm256_cmpeq_epi32(_mm256_min_epu32(blk, blk_max), blk);
        if (check && _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_andnot_si256(ok, col_ok))) &&
            _mm256_movemask_ps(_mm256_castsi256_ps(
                _mm256_and_si256(col_ok, _mm256_cmpgt_epi32(blk, _mm256_set1_epi32(k->num_blocks - 1)))))) {
            *n8 = i;
            break;
        }
        __m256i slot;
        if (pow2) {
            slot = _mm256_or_si256(_mm256_sll_epi32(blk, shift), r);
        } else { /* blk * bs fits int32 (blk <= blk_max); past blk_always, + r may not */
            const __m256i prod = _mm256_mullo_epi32(blk, bs);
            const __m256i ovf = _mm256_and_si256(_mm256_cmpgt_epi32(blk, _mm256_set1_epi32(k->blk_always)),
                                                 _mm256_cmpgt_epi32(r, _mm256_sub_epi32(_mm256_set1_epi32(INT32_MAX), prod)));
            ok = _mm256_andnot_si256(ovf, ok);
            slot = _mm256_add_epi32(prod, r);
        }
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_blendv_epi8(m1, slot, ok));
        valid = _mm256_add_epi32(valid, ok);
    }
    __m128i v = _mm_add_epi32(_mm256_castsi256_si128(valid), _mm256_extracti128_si256(valid, 1));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
    return -(int64_t)_mm_cvtsi128_si32(v);
}

/* The four variants, each compiled with its tests resolved. */
#define CONVERT_PAGED(name, check, pow2)                                                                    \
    __attribute__((target(SMLA_TARGET_AVX2))) static int64_t name(const convert_consts *k, const int32_t *in, \
                                                                  int32_t *out, int64_t *n8, const int32_t *bt_row) \
    {                                                                                                       \
        return convert_paged_body(k, in, out, n8, bt_row, check, pow2);                                     \
    }
CONVERT_PAGED(convert_paged_pow2_avx2, 0, 1)
CONVERT_PAGED(convert_paged_div_avx2, 0, 0)
CONVERT_PAGED(convert_paged_pow2_checked_avx2, 1, 1)
CONVERT_PAGED(convert_paged_div_checked_avx2, 1, 0)

/* Entries [0, n8) of a prefill row: ws_base + tok, -1 for tok < 0 or past INT32_MAX. */
__attribute__((target(SMLA_TARGET_AVX2))) static int64_t convert_prefill_avx2(const int32_t *in, int32_t *out,
                                                                              int64_t n8, int32_t ws_base)
{
    const __m256i zero = _mm256_setzero_si256(), base = _mm256_set1_epi32(ws_base);
    /* tok > INT32_MAX - ws_base overflows; with ws_base < 0 nothing does */
    const __m256i lim = _mm256_set1_epi32(ws_base < 0 ? INT32_MAX : INT32_MAX - ws_base);
    int64_t count = 0;
    for (int64_t i = 0; i < n8; i += 8) {
        const __m256i tok = _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
        const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(zero, tok), _mm256_cmpgt_epi32(tok, lim));
        const __m256i v = _mm256_or_si256(_mm256_add_epi32(tok, base), bad);
        _mm256_storeu_si256((__m256i *)(void *)(out + i), v);
        count += 8 - __builtin_popcount((unsigned)_mm256_movemask_ps(
                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_set1_epi32(-1)))));
    }
    return count;
}
#endif

/* p passed smla_check_convert_topk_indices (core/checks.c) */
int smla_cpu_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st)
{
    const int compact = p->dcp_size >= 1 && p->compact;
    const int isa = p->run.cpu_isa;
    (void)isa;
#if SMLA_X86
    convert_consts k;
    int64_t (*paged)(const convert_consts *, const int32_t *, int32_t *, int64_t *, const int32_t *) = NULL;
    const int vec = isa >= SMLA_ISA_AVX2 && p->dcp_size == 0 && p->block_size <= INT32_MAX;
    if (vec) {
        k.bs = (int32_t)p->block_size;
        k.bs_shift = -1;
        for (int b = 0; b < 31; b++)
            if (k.bs == (INT32_C(1) << b)) k.bs_shift = b;
        const int64_t cols = p->max_blocks < INT32_MAX / k.bs + 1 ? p->max_blocks : INT32_MAX / k.bs + 1;
        k.col_max = (uint32_t)(cols - 1);
        k.checked = p->num_blocks > 0 && p->num_blocks <= INT32_MAX;
        k.num_blocks = k.checked ? (int32_t)p->num_blocks : 0;
        k.blk_max = (uint32_t)(k.checked && k.num_blocks - 1 < INT32_MAX / k.bs ? k.num_blocks - 1 : INT32_MAX / k.bs);
        k.blk_always = (INT32_MAX - (k.bs - 1)) / k.bs;
        k.inv_bs = 1.0 / (double)k.bs;
        if (cols > 0) /* no columns: every paged entry is -1, the scalar rule's business */
            paged = k.bs_shift >= 0 ? (k.checked ? convert_paged_pow2_checked_avx2 : convert_paged_pow2_avx2)
                                    : (k.checked ? convert_paged_div_checked_avx2 : convert_paged_div_avx2);
    }
#endif
    /* the first entry, in row order, whose block is past the cache */
    int64_t bad_row = INT64_MAX, bad_req = 0, bad_col = 0, bad_blk = 0;
    const int nt = smla_num_threads(p->run.num_threads, p->num_tokens * p->topk / 16384); /* >= 16K entries per thread */
    /* Rows handed out in chunks of about 16K entries as threads ask: a thread that starts late (its core
     * busy with another process, or a sleeping vCPU to wake) then costs the call only its own delay,
     * not the delay plus a fixed share of the rows (schedule(static) measured up to 10x slower on the
     * shared 2-vCPU development machine). */
    const int chunk = p->topk >= 16384 ? 1 : (int)(16384 / (p->topk + 1)) + 1; /* topk may be 0 */

#pragma omp parallel for num_threads(nt) schedule(dynamic, chunk)
    for (int64_t n = 0; n < p->num_tokens; n++) {
        const int32_t *in = p->topk_indices + n * p->in_stride;
        int32_t *out = p->out + n * p->out_stride;
        const smla_index_row rc = smla_index_row_of(p, n);
        int64_t count = 0, k0 = 0;
#if SMLA_X86
        if (vec && !rc.dead) {
            k0 = p->topk / 8 * 8;
            if (rc.ws_base != SMLA_PAGED_ROW) count = convert_prefill_avx2(in, out, k0, (int32_t)rc.ws_base);
            else if (!rc.bt_row || !paged) k0 = 0; /* no such request or no columns: the scalar rule writes -1 */
            else count = paged(&k, in, out, &k0, rc.bt_row);
        }
#endif
        for (int64_t kk = k0; kk < p->topk; kk++) {
            int64_t col = -1;
            const int32_t v = smla_convert_index(p, &rc, in[kk], &col);
            if (col >= 0) {
#pragma omp critical(smla_convert_out_of_cache)
                if (n < bad_row) {
                    bad_row = n;
                    bad_req = p->req_id[n];
                    bad_col = col;
                    bad_blk = rc.bt_row[col];
                }
                break;
            }
            if (compact) {
                if (v != -1) out[count++] = v;
            } else {
                out[kk] = v;
                count += v != -1;
            }
        }
        if (compact)
            for (int64_t kk = count; kk < p->topk; kk++) out[kk] = -1;
        if (p->valid_counts) p->valid_counts[n] = (int32_t)count;
    }
    if (bad_row != INT64_MAX)
        return smla_fail(st, SMLA_ERR_VALUE,
                         "block_table: block %lld (request %lld, column %lld) is outside the cache of %lld blocks",
                         (long long)bad_blk, (long long)bad_req, (long long)bad_col,
                         (long long)p->num_blocks);
    return SMLA_OK;
}
