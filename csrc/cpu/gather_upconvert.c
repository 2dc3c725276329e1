/* gather_upconvert on the CPU: for request r and 0 <= i < seq_lens[r],
 *   workspace[workspace_starts[r] + i] = dequant(token p = seq_starts[r] + i of request r),
 * token p living in block block_table[r, p / block_size] at offset p % block_size (core/index_rules.h's
 * smla_cache_entry_of, shared with the GPU). Dequant is cache_rows.h's (bit-identical to unpack_kv) at
 * the instruction-set level cpu_features.h picks.
 * Overlapping requests: the later request wins here (unspecified on the GPU).
 *
 * Every request is checked before anything is written (check_requests): negative seq_lens /
 * workspace_starts / seq_starts, rows past the workspace, positions past the block table's
 * max_blocks * block_size and block ids outside [0, num_blocks) for the positions a request reads are
 * errors here. The GPU cannot check without a sync: there such rows are skipped (outside the
 * workspace) or zero (position or block out of range), as cuda/memory/gather_upconvert.cu says.
 *
 * Threads split the range of workspace rows that some request writes; each thread walks every request
 * in order over its own rows, so a row written twice is still written last by the later request. */
#include <string.h>

#include "core/params.h"
#include "cache_rows.h"
#include "cpu_features.h"
#include "threads.h"

typedef void (*dequant_fn)(const smla_cache *c, const uint8_t *entry, uint16_t *bf16, float *f32);

static void dequant_portable(const smla_cache *c, const uint8_t *entry, uint16_t *bf16, float *f32)
{
    smla_dequant_row_table(c, entry, bf16, f32);
}

#if SMLA_X86
__attribute__((target(SMLA_TARGET_AVX2))) static void dequant_avx2(const smla_cache *c, const uint8_t *entry,
                                                                   uint16_t *bf16, float *f32)
{
    smla_dequant_row_avx2(c, entry, bf16, f32);
}

__attribute__((target(SMLA_TARGET_AVX512))) static void dequant_avx512(const smla_cache *c, const uint8_t *entry,
                                                                       uint16_t *bf16, float *f32)
{
    smla_dequant_row_avx512(c, entry, bf16, f32);
}

/* the avx512bf16 level has AVX-512BW: power-of-two tiles in 16-bit lanes */
__attribute__((target(SMLA_TARGET_AVX512BF16))) static void dequant_avx512bw(const smla_cache *c,
                                                                             const uint8_t *entry, uint16_t *bf16,
                                                                             float *f32)
{
    smla_dequant_row_avx512bw(c, entry, bf16, f32);
}
#endif

/* Rows [lo, hi) of request r (check_requests has seen every row, position and block). */
static void gather_rows(const smla_gather_upconvert_params *p, int64_t r, int64_t lo, int64_t hi, dequant_fn dq)
{
    const smla_cache *c = &p->cache;
    const int64_t ws0 = p->workspace_starts[r];
    const int64_t start = p->seq_starts ? p->seq_starts[r] : 0;
    const int32_t *bt = p->block_table + r * p->bt_stride;
    for (int64_t i = lo; i < hi; i++)
        dq(c, smla_cache_entry_of(c, bt, p->max_blocks, start + i), p->workspace + (ws0 + i) * p->ws_stride, NULL);
}

/* The first bad request, as an error naming the argument; SMLA_OK when every request is in range.
 * Values are int32 and the products saturate, so nothing overflows. */
static int check_requests(const smla_gather_upconvert_params *p, smla_status *st)
{
    const smla_cache *c = &p->cache;
    const int64_t bs = c->block_size;
    const int64_t positions = p->max_blocks > INT64_MAX / bs ? INT64_MAX : p->max_blocks * bs;
    for (int64_t r = 0; r < p->num_reqs; r++) {
        const int64_t len = p->seq_lens[r], ws0 = p->workspace_starts[r];
        const int64_t start = p->seq_starts ? p->seq_starts[r] : 0;
        if (len < 0)
            return smla_fail(st, SMLA_ERR_VALUE, "seq_lens: request %lld has %lld tokens, expected >= 0",
                             (long long)r, (long long)len);
        if (ws0 < 0)
            return smla_fail(st, SMLA_ERR_VALUE, "workspace_starts: request %lld starts at row %lld, expected >= 0",
                             (long long)r, (long long)ws0);
        if (start < 0)
            return smla_fail(st, SMLA_ERR_VALUE, "seq_starts: request %lld starts at position %lld, expected >= 0",
                             (long long)r, (long long)start);
        if (len == 0) continue; /* needs no row, position or block */
        if (ws0 + len > p->ws_rows)
            return smla_fail(st, SMLA_ERR_VALUE,
                             "workspace: request %lld writes rows %lld..%lld (workspace_starts %lld + seq_lens %lld) "
                             "but the workspace has %lld rows", (long long)r, (long long)ws0,
                             (long long)(ws0 + len - 1), (long long)ws0, (long long)len, (long long)p->ws_rows);
        if (start + len > positions)
            return smla_fail(st, SMLA_ERR_VALUE,
                             "seq_lens: request %lld reads positions %lld..%lld (seq_starts %lld + seq_lens %lld) "
                             "but the block table holds %lld (%lld blocks of %lld)", (long long)r,
                             (long long)start, (long long)(start + len - 1), (long long)start, (long long)len,
                             (long long)positions, (long long)p->max_blocks, (long long)bs);
        const int32_t *bt = p->block_table + r * p->bt_stride;
        for (int64_t b = start / bs; b <= (start + len - 1) / bs; b++)
            if (bt[b] < 0 || bt[b] >= c->num_blocks)
                return smla_fail(st, SMLA_ERR_VALUE, "block_table: block %d (request %lld, column %lld) is outside "
                                 "the cache of %lld blocks", (int)bt[b], (long long)r, (long long)b,
                                 (long long)c->num_blocks);
    }
    return SMLA_OK;
}

/* p passed smla_check_gather_upconvert (core/checks.c); the values of its requests are checked here */
int smla_cpu_gather_upconvert(const smla_gather_upconvert_params *p, smla_status *st)
{
    if (check_requests(p, st) != SMLA_OK) return st->code;

    /* the workspace rows some request writes: [row_lo, row_hi), and how many writes there are */
    int64_t row_lo = p->ws_rows, row_hi = 0, writes = 0;
    for (int64_t r = 0; r < p->num_reqs; r++) {
        const int64_t len = p->seq_lens[r], ws0 = p->workspace_starts[r];
        if (len == 0) continue;
        if (ws0 < row_lo) row_lo = ws0;
        if (ws0 + len > row_hi) row_hi = ws0 + len;
        writes += len;
    }
    if (writes == 0) return SMLA_OK;
    const int isa = p->run.cpu_isa;
    dequant_fn dq = dequant_portable;
#if SMLA_X86
    if (isa >= SMLA_ISA_AVX512BF16) dq = dequant_avx512bw;
    else if (isa >= SMLA_ISA_AVX512) dq = dequant_avx512;
    else if (isa >= SMLA_ISA_AVX2) dq = dequant_avx2;
#endif
    (void)isa;
    const int nt = smla_num_threads(p->run.num_threads, writes / 256); /* >= 256 rows (~0.3 MB) per thread */

#pragma omp parallel num_threads(nt)
    {
        const int t = smla_thread_id(), n = smla_team_size();
        const int64_t span = row_hi - row_lo;
        const int64_t my_lo = row_lo + span * t / n, my_hi = row_lo + span * (t + 1) / n;
        for (int64_t r = 0; r < p->num_reqs; r++) {
            const int64_t ws0 = p->workspace_starts[r];
            const int64_t lo = ws0 < my_lo ? my_lo - ws0 : 0;
            const int64_t hi = ws0 + p->seq_lens[r] > my_hi ? my_hi - ws0 : p->seq_lens[r];
            if (hi > lo) gather_rows(p, r, lo, hi, dq);
        }
    }
    return SMLA_OK;
}
