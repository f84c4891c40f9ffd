// The compact-mode AdamW step, avx512bf16 flavour (adamw_compact.inc).
#define OFFLOADD_COMPACT_NS avx512bf16
#include "workers/adamw_compact.inc"
