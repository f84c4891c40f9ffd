// The compact-mode AdamW step, portable flavour (adamw_compact.inc).
#define OFFLOADD_COMPACT_NS portable
#include "workers/adamw_compact.inc"
