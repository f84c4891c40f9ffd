// The compact-mode AdamW step, avx512 flavour (adamw_compact.inc).
#define OFFLOADD_COMPACT_NS avx512
#include "workers/adamw_compact.inc"
