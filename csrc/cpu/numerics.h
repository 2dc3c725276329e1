/* Number formats for the CPU kernels: the scalar conversions are core/number_formats.h's (shared with the
 * GPU); this adds their CPU-only table form. */
#ifndef SMLA_CPU_NUMERICS_H
#define SMLA_CPU_NUMERICS_H

#include "core/number_formats.h"

/* The fp32 bits of every e4m3 byte, from the same expression as smla_e4m3_to_f32: a load replaces its
 * branches on the portable paths. */
#define SMLA_E4M3_R4(b) SMLA_E4M3_BITS(b), SMLA_E4M3_BITS(b + 1u), SMLA_E4M3_BITS(b + 2u), SMLA_E4M3_BITS(b + 3u)
#define SMLA_E4M3_R16(b) SMLA_E4M3_R4(b), SMLA_E4M3_R4(b + 4u), SMLA_E4M3_R4(b + 8u), SMLA_E4M3_R4(b + 12u)
#define SMLA_E4M3_R64(b) SMLA_E4M3_R16(b), SMLA_E4M3_R16(b + 16u), SMLA_E4M3_R16(b + 32u), SMLA_E4M3_R16(b + 48u)
static const uint32_t smla_e4m3_table[256] = {SMLA_E4M3_R64(0u), SMLA_E4M3_R64(64u), SMLA_E4M3_R64(128u),
                                              SMLA_E4M3_R64(192u)};

#endif /* SMLA_CPU_NUMERICS_H */
