// The compact-mode AdamW step, avx512bf16 flavour (adamw_compact_avx512.inc; the weight copy of an
// fp32 master rounds with vcvtneps2bf16, as FusedAdamW's).
#define OFFLOADD_AVX512_NS avx512bf16
#define OFFLOADD_AVX512_HAS_BF16 1
#include "workers/adamw_compact_avx512.inc"
