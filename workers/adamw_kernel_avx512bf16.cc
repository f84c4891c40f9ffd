// AVX-512 path using AVX512_BF16's vcvtneps2bf16 for the weight copy (round to nearest even; the
// instruction treats fp32 denormals as zero, so vectors holding one round with integers instead).
// See adamw_kernel_avx512.inc.
#define OFFLOADD_AVX512_NS avx512bf16
#define OFFLOADD_AVX512_HAS_BF16 1
#include "workers/adamw_kernel_avx512.inc"
