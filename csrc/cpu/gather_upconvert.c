/* gather_upconvert on the CPU: for request r and 0 <= i < seq_lens[r],
 *   workspace[workspace_starts[r] + i] = dequant(token p = seq_starts[r] + i of request r),
 * token p living in block block_table[r, p / block_size] at offset p % block_size. Rows outside
 * [0, ws_rows) are skipped; a token with p < 0, p / block_size >= max_blocks or a block id outside
 * [0, num_blocks) gives a row of +0.0. Dequant is cache_rows.h's (bit-identical to unpack_kv) at the
 * instruction-set level cpu_features.h picks. Overlapping requests: the later request wins here
 * (unspecified on the GPU).
 *
 * Threads split the range of workspace rows that some request writes; each thread walks every request
 * in order over its own rows, so a row written twice is still written last by the later request. */
#include <string.h>

#include "../params.h"
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
#endif

/* Rows [lo, hi) of request r (already clipped to the workspace). */
static void gather_rows(const smla_gather_upconvert_params *p, int64_t r, int64_t lo, int64_t hi, dequant_fn dq)
{
    const smla_cache *c = &p->cache;
    const int64_t bs = c->block_size, ws0 = p->workspace_starts[r];
    const int64_t start = p->seq_starts ? p->seq_starts[r] : 0;
    const int32_t *bt = p->block_table + r * p->bt_stride;
    for (int64_t i = lo; i < hi; i++) {
        uint16_t *out = p->workspace + (ws0 + i) * p->ws_stride;
        const int64_t pos = start + i;
        const uint8_t *entry = NULL;
        if (pos >= 0 && pos / bs < p->max_blocks) entry = smla_cache_block_row(c, bt[pos / bs], pos % bs);
        if (entry)
            dq(c, entry, out, NULL);
        else
            memset(out, 0, 2 * SMLA_D_QK);
    }
}

/* Request r's rows i with 0 <= ws0 + i < ws_rows and i < seq_lens[r]: [*lo, *hi) (empty if hi <= lo).
 * All values are int32-sized, nothing overflows. */
static void clip(const smla_gather_upconvert_params *p, int64_t r, int64_t *lo, int64_t *hi)
{
    const int64_t len = p->seq_lens[r], ws0 = p->workspace_starts[r];
    *lo = ws0 < 0 ? -ws0 : 0;
    *hi = len < p->ws_rows - ws0 ? len : p->ws_rows - ws0;
}

int smla_cpu_gather_upconvert(const smla_gather_upconvert_params *p, smla_status *st)
{
    const smla_cache *c = &p->cache;
    if (smla_cache_entry_bytes(c->dtype) == 0)
        return smla_fail(st, SMLA_ERR_VALUE, "gather_upconvert: unknown kv_cache_dtype code %d", c->dtype);
    if (p->num_reqs < 0 || p->max_blocks < 0 || p->ws_rows < 0 || c->block_size <= 0 || c->num_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE,
                         "gather_upconvert: invalid sizes (num_reqs %lld, max_blocks %lld, ws_rows %lld, "
                         "block_size %lld)", (long long)p->num_reqs, (long long)p->max_blocks,
                         (long long)p->ws_rows, (long long)c->block_size);

    /* the workspace rows some request writes: [row_lo, row_hi), and how many writes there are */
    int64_t row_lo = p->ws_rows, row_hi = 0, writes = 0;
    for (int64_t r = 0; r < p->num_reqs; r++) {
        int64_t lo, hi;
        clip(p, r, &lo, &hi);
        if (hi <= lo) continue;
        const int64_t ws0 = p->workspace_starts[r];
        if (ws0 + lo < row_lo) row_lo = ws0 + lo;
        if (ws0 + hi > row_hi) row_hi = ws0 + hi;
        writes += hi - lo;
    }
    if (writes == 0) return SMLA_OK;
    const int isa = p->run.cpu_isa;
    dequant_fn dq = dequant_portable;
#if SMLA_X86
    if (isa >= SMLA_ISA_AVX512) dq = dequant_avx512;
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
            int64_t lo, hi;
            clip(p, r, &lo, &hi);
            const int64_t ws0 = p->workspace_starts[r];
            if (ws0 + lo < my_lo) lo = my_lo - ws0;
            if (ws0 + hi > my_hi) hi = my_hi - ws0;
            if (hi > lo) gather_rows(p, r, lo, hi, dq);
        }
    }
    return SMLA_OK;
}
