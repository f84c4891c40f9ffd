// AVX-512 (F, BW, VL) path with bf16 rounding in integer arithmetic; see adamw_kernel_avx512.inc.
#define OFFLOADD_AVX512_NS avx512
#define OFFLOADD_AVX512_HAS_BF16 0
#include "workers/adamw_kernel_avx512.inc"
