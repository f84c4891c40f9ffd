// The compact-mode AdamW step, avx512 flavour (adamw_compact_avx512.inc; the weight copy rounds to
// bf16 with integers).
#define OFFLOADD_AVX512_NS avx512
#define OFFLOADD_AVX512_HAS_BF16 0
#include "workers/adamw_compact_avx512.inc"
