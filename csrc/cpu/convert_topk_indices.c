/* convert_topk_indices / filter_convert_dcp_indices on the CPU (params.h, docs/design.md section 4). The
 * rule of one entry is core/index_rules.h's smla_convert_index, shared with the GPU, in int64 results so
 * that no int32 input can overflow; here a block id >= num_blocks (when num_blocks > 0), which the rule
 * reports, is an error (the GPU gives -1).
 * DCP with compact: the entries != -1 move to the front in their original order, the rest is -1.
 * valid_counts[n] = number of entries != -1. out may alias topk_indices (same strides): every entry is
 * read before any entry at or after its column is written. On an error (the first bad entry in row
 * order is reported) out and valid_counts are partly written.
 *
 * Paths (cpu_features.h): portable is the scalar rule; AVX2 and up convert 8 entries at a time, DCP
 * included (the rule's vector twin: divisions by block_size, the interleave and the world size as shifts
 * or through a double reciprocal with a one-step correction, a masked gather from the block table,
 * overflow tests in int32, compaction through a lane-permutation table). The lookups bound it, so the
 * AVX-512 levels reuse that code (a 16-lane gather measured no faster than two 8-lane ones on Zen 4). A
 * variant per (power-of-two block size, num_blocks check): with num_blocks it stops at the first 8
 * entries holding a block past the cache and leaves them to the scalar rule, which reports it. The tail
 * of a row (topk % 8 entries) and rows of no request take the scalar rule. */
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
    /* DCP (dcp_size >= 1): position t is rank (t / I) % D's, at (t / (D*I)) * I + t % I there */
    int dcp, compact;
    int32_t dcp_rank, dcp_d, dcp_i, d_shift, i_shift; /* D, I and their log2 (or -1) */
    double inv_d, inv_i;
} convert_consts;

/* The lane indices that move the lanes set in an 8-bit mask to the front, in order, 4 bits each
 * (entry m: the positions of m's set bits, lowest first, from the lowest nibble up). */
static const uint32_t left_pack8[256] = {
    0x00000000, 0x00000000, 0x00000001, 0x00000010, 0x00000002, 0x00000020, 0x00000021, 0x00000210,
    0x00000003, 0x00000030, 0x00000031, 0x00000310, 0x00000032, 0x00000320, 0x00000321, 0x00003210,
    0x00000004, 0x00000040, 0x00000041, 0x00000410, 0x00000042, 0x00000420, 0x00000421, 0x00004210,
    0x00000043, 0x00000430, 0x00000431, 0x00004310, 0x00000432, 0x00004320, 0x00004321, 0x00043210,
    0x00000005, 0x00000050, 0x00000051, 0x00000510, 0x00000052, 0x00000520, 0x00000521, 0x00005210,
    0x00000053, 0x00000530, 0x00000531, 0x00005310, 0x00000532, 0x00005320, 0x00005321, 0x00053210,
    0x00000054, 0x00000540, 0x00000541, 0x00005410, 0x00000542, 0x00005420, 0x00005421, 0x00054210,
    0x00000543, 0x00005430, 0x00005431, 0x00054310, 0x00005432, 0x00054320, 0x00054321, 0x00543210,
    0x00000006, 0x00000060, 0x00000061, 0x00000610, 0x00000062, 0x00000620, 0x00000621, 0x00006210,
    0x00000063, 0x00000630, 0x00000631, 0x00006310, 0x00000632, 0x00006320, 0x00006321, 0x00063210,
    0x00000064, 0x00000640, 0x00000641, 0x00006410, 0x00000642, 0x00006420, 0x00006421, 0x00064210,
    0x00000643, 0x00006430, 0x00006431, 0x00064310, 0x00006432, 0x00064320, 0x00064321, 0x00643210,
    0x00000065, 0x00000650, 0x00000651, 0x00006510, 0x00000652, 0x00006520, 0x00006521, 0x00065210,
    0x00000653, 0x00006530, 0x00006531, 0x00065310, 0x00006532, 0x00065320, 0x00065321, 0x00653210,
    0x00000654, 0x00006540, 0x00006541, 0x00065410, 0x00006542, 0x00065420, 0x00065421, 0x00654210,
    0x00006543, 0x00065430, 0x00065431, 0x00654310, 0x00065432, 0x00654320, 0x00654321, 0x06543210,
    0x00000007, 0x00000070, 0x00000071, 0x00000710, 0x00000072, 0x00000720, 0x00000721, 0x00007210,
    0x00000073, 0x00000730, 0x00000731, 0x00007310, 0x00000732, 0x00007320, 0x00007321, 0x00073210,
    0x00000074, 0x00000740, 0x00000741, 0x00007410, 0x00000742, 0x00007420, 0x00007421, 0x00074210,
    0x00000743, 0x00007430, 0x00007431, 0x00074310, 0x00007432, 0x00074320, 0x00074321, 0x00743210,
    0x00000075, 0x00000750, 0x00000751, 0x00007510, 0x00000752, 0x00007520, 0x00007521, 0x00075210,
    0x00000753, 0x00007530, 0x00007531, 0x00075310, 0x00007532, 0x00075320, 0x00075321, 0x00753210,
    0x00000754, 0x00007540, 0x00007541, 0x00075410, 0x00007542, 0x00075420, 0x00075421, 0x00754210,
    0x00007543, 0x00075430, 0x00075431, 0x00754310, 0x00075432, 0x00754320, 0x00754321, 0x07543210,
    0x00000076, 0x00000760, 0x00000761, 0x00007610, 0x00000762, 0x00007620, 0x00007621, 0x00076210,
    0x00000763, 0x00007630, 0x00007631, 0x00076310, 0x00007632, 0x00076320, 0x00076321, 0x00763210,
    0x00000764, 0x00007640, 0x00007641, 0x00076410, 0x00007642, 0x00076420, 0x00076421, 0x00764210,
    0x00007643, 0x00076430, 0x00076431, 0x00764310, 0x00076432, 0x00764320, 0x00764321, 0x07643210,
    0x00000765, 0x00007650, 0x00007651, 0x00076510, 0x00007652, 0x00076520, 0x00076521, 0x00765210,
    0x00007653, 0x00076530, 0x00076531, 0x00765310, 0x00076532, 0x00765320, 0x00765321, 0x07653210,
    0x00007654, 0x00076540, 0x00076541, 0x00765410, 0x00076542, 0x00765420, 0x00765421, 0x07654210,
    0x00076543, 0x00765430, 0x00765431, 0x07654310, 0x00765432, 0x07654320, 0x07654321, 0x76543210,
};

/* x / d for lanes x in [0, 2^31) (a negative lane gives a negative quotient): a shift for a power of two,
 * else trunc(x * (1/d)) in double, off by at most one, fixed from the remainder. *rem gets x - q * d. */
__attribute__((target(SMLA_TARGET_AVX2), always_inline)) static inline __m256i
udiv_avx2(__m256i x, int32_t d, int shift, double inv, __m256i *rem)
{
    if (shift >= 0) {
        *rem = _mm256_and_si256(x, _mm256_set1_epi32(d - 1));
        return _mm256_srl_epi32(x, _mm_cvtsi32_si128(shift));
    }
    const __m256i dv = _mm256_set1_epi32(d), zero = _mm256_setzero_si256();
    const __m256d iv = _mm256_set1_pd(inv);
    const __m128i lo = _mm256_cvttpd_epi32(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(x)), iv));
    const __m128i hi = _mm256_cvttpd_epi32(_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(x, 1)), iv));
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    __m256i r = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, dv));
    const __m256i under = _mm256_cmpgt_epi32(zero, r);
    const __m256i over = _mm256_cmpgt_epi32(r, _mm256_sub_epi32(dv, _mm256_set1_epi32(1)));
    q = _mm256_add_epi32(q, _mm256_sub_epi32(under, over)); /* the masks are -1 where true */
    *rem = _mm256_sub_epi32(_mm256_add_epi32(r, _mm256_and_si256(dv, under)), _mm256_and_si256(dv, over));
    return q;
}

/* -(sum of the 8 lanes): the count kept as minus the sum of all-ones masks */
__attribute__((target(SMLA_TARGET_AVX2), always_inline)) static inline int64_t minus_sum_avx2(__m256i valid)
{
    __m128i v = _mm_add_epi32(_mm256_castsi256_si128(valid), _mm256_extracti128_si256(valid, 1));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
    return -(int64_t)_mm_cvtsi128_si32(v);
}

/* 8 results (slot where ok, else -1) at out + i, or, compacting, the ok ones at out + *count. */
__attribute__((target(SMLA_TARGET_AVX2), always_inline)) static inline void
store8_avx2(int32_t *out, int64_t i, __m256i slot, __m256i ok, int compact, int64_t *count, __m256i *valid)
{
    if (compact) {
        const unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(ok));
        const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)left_pack8[m]),
                                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                             _mm256_set1_epi32(7));
        _mm256_storeu_si256((__m256i *)(void *)(out + *count), _mm256_permutevar8x32_epi32(slot, idx));
        *count += __builtin_popcount(m);
    } else {
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_blendv_epi8(_mm256_set1_epi32(-1), slot, ok));
        *valid = _mm256_add_epi32(*valid, ok);
    }
}

/* Entries [0, *n8) of a paged row (*n8 a multiple of 8); returns the count of entries != -1 (compacted
 * to the front of out with k->compact). With check, 8 entries holding a block >= num_blocks are not
 * written: *n8 becomes their start. A compacting store writes 8 lanes at out + count <= out + i, so in
 * place (out == in) it only overwrites entries already read.
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
    __m256i valid = zero; /* minus the count of valid entries, per lane */
    int64_t count = 0;
    for (int64_t i = 0; i < *n8; i += 8) {
        __m256i tok = _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
        __m256i mine = m1;
        if (k->dcp) { /* g = t / I, h = g / D: owner g - h * D, local h * I + t % I */
            __m256i t_mod_i = _mm256_setzero_si256(), owner;
            const __m256i g = k->dcp_i == 1 ? tok : udiv_avx2(tok, k->dcp_i, k->i_shift, k->inv_i, &t_mod_i);
            const __m256i h = udiv_avx2(g, k->dcp_d, k->d_shift, k->inv_d, &owner);
            mine = _mm256_andnot_si256(_mm256_cmpgt_epi32(zero, tok),
                                       _mm256_cmpeq_epi32(owner, _mm256_set1_epi32(k->dcp_rank)));
            tok = k->dcp_i == 1 ? h : _mm256_add_epi32(_mm256_mullo_epi32(h, _mm256_set1_epi32(k->dcp_i)), t_mod_i);
        }
        __m256i q, r;
        if (pow2) {
            q = _mm256_srl_epi32(tok, shift);
            r = _mm256_and_si256(tok, _mm256_sub_epi32(bs, _mm256_set1_epi32(1)));
        } else { /* floor division, so a negative tok gives a negative q */
            q = udiv_avx2(tok, k->bs, -1, k->inv_bs, &r);
        }
        const __m256i col_ok = _mm256_and_si256(mine, _mm256_cmpeq_epi32(_mm256_min_epu32(q, col_max), q));
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
            const __m256i room = _mm256_sub_epi32(_mm256_set1_epi32(INT32_MAX), prod);
            const __m256i ovf = _mm256_and_si256(_mm256_cmpgt_epi32(blk, _mm256_set1_epi32(k->blk_always)),
                                                 _mm256_cmpgt_epi32(r, room));
            ok = _mm256_andnot_si256(ovf, ok);
            slot = _mm256_add_epi32(prod, r);
        }
        store8_avx2(out, i, slot, ok, k->compact, &count, &valid);
    }
    return count + minus_sum_avx2(valid);
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

/* Entries [0, n8) of a prefill row: ws_base + tok, -1 for tok < 0 or past INT32_MAX (compacted with
 * compact: DCP does not filter prefill rows, but its compaction applies). */
__attribute__((target(SMLA_TARGET_AVX2))) static int64_t convert_prefill_avx2(const int32_t *in, int32_t *out,
                                                                              int64_t n8, int32_t ws_base,
                                                                              int compact)
{
    const __m256i zero = _mm256_setzero_si256(), base = _mm256_set1_epi32(ws_base), m1 = _mm256_set1_epi32(-1);
    /* tok > INT32_MAX - ws_base overflows; with ws_base < 0 nothing does */
    const __m256i lim = _mm256_set1_epi32(ws_base < 0 ? INT32_MAX : INT32_MAX - ws_base);
    __m256i valid = zero;
    int64_t count = 0;
    for (int64_t i = 0; i < n8; i += 8) {
        const __m256i tok = _mm256_loadu_si256((const __m256i *)(const void *)(in + i));
        const __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(zero, tok), _mm256_cmpgt_epi32(tok, lim));
        const __m256i v = _mm256_add_epi32(tok, base);
        /* a result of -1 (ws_base < 0) is not counted, as the scalar rule does */
        const __m256i ok = _mm256_andnot_si256(_mm256_or_si256(bad, _mm256_cmpeq_epi32(v, m1)), m1);
        store8_avx2(out, i, v, ok, compact, &count, &valid);
    }
    return count + minus_sum_avx2(valid);
}
#endif

/* p passed smla_check_convert_topk_indices (core/checks.c) */
int smla_cpu_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st)
{
    const int compact = p->dcp_size >= 1 && p->compact;
    const smla_convert_consts kc = smla_convert_consts_of(p);
    const int isa = p->run.cpu_isa;
    (void)isa;
#if SMLA_X86
    convert_consts k;
    int64_t (*paged)(const convert_consts *, const int32_t *, int32_t *, int64_t *, const int32_t *) = NULL;
    const int vec = isa >= SMLA_ISA_AVX2 && p->block_size <= INT32_MAX;
    if (vec) {
        k.dcp = p->dcp_size >= 1;
        k.compact = compact;
        if (k.dcp) {
            k.dcp_rank = p->dcp_rank;
            k.dcp_d = p->dcp_size;
            k.dcp_i = p->dcp_interleave;
            k.d_shift = k.i_shift = -1;
            for (int b = 0; b < 31; b++) {
                if (k.dcp_d == (INT32_C(1) << b)) k.d_shift = b;
                if (k.dcp_i == (INT32_C(1) << b)) k.i_shift = b;
            }
            k.inv_d = 1.0 / (double)k.dcp_d;
            k.inv_i = 1.0 / (double)k.dcp_i;
        }
        k.bs = (int32_t)p->block_size;
        k.bs_shift = kc.bs_shift; /* <= 30 here: block_size <= INT32_MAX */
        const int64_t cols = p->max_blocks < INT32_MAX / k.bs + 1 ? p->max_blocks : INT32_MAX / k.bs + 1;
        k.col_max = (uint32_t)(cols - 1);
        k.checked = p->num_blocks > 0 && p->num_blocks <= INT32_MAX;
        k.num_blocks = k.checked ? (int32_t)p->num_blocks : 0;
        k.blk_max = kc.blk_max; /* the scalar rule's bound, the same for every path */
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
    /* (Non-temporal stores for a large out measured 1.7x slower here, 4096 x 2048 on one thread: not used.) */

#pragma omp parallel for num_threads(nt) schedule(dynamic, chunk)
    for (int64_t n = 0; n < p->num_tokens; n++) {
        const int32_t *in = p->topk_indices + n * p->in_stride;
        int32_t *out = p->out + n * p->out_stride;
        const smla_index_row rc = smla_index_row_of(p, n);
        int64_t count = 0, k0 = 0;
#if SMLA_X86
        if (vec && !rc.dead) {
            k0 = p->topk / 8 * 8;
            if (rc.ws_base != SMLA_PAGED_ROW) count = convert_prefill_avx2(in, out, k0, (int32_t)rc.ws_base, compact);
            else if (!rc.bt_row || !paged) k0 = 0; /* no such request or no columns: the scalar rule writes -1 */
            else count = paged(&k, in, out, &k0, rc.bt_row);
        }
#endif
        for (int64_t kk = k0; kk < p->topk; kk++) {
            int64_t col = -1;
            const int32_t v = smla_convert_index(p, &kc, &rc, in[kk], &col);
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
