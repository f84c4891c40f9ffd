// The compact-mode AdamW step, avx2 flavour (adamw_compact.inc).
#define OFFLOADD_COMPACT_NS avx2
#include "workers/adamw_compact.inc"
