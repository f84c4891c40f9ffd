#pragma once
// CRC-32C now lives in common/ (checkpoints use it too); the store's names stay.

#include "common/crc32c.h"

namespace offloadd::storage {

using ::offloadd::Crc32c;
using ::offloadd::Crc32cHardware;
using ::offloadd::Crc32cHardwareAvailable;
using ::offloadd::Crc32cPortable;

}  // namespace offloadd::storage
