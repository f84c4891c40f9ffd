// Fuzzes the NVMe store's on-disk and wire decoding (storage/format.h): what offloadd-store reads
// back from its directories after a crash, a bad disk or tampering.
//   mode 0: a raw MANIFEST image, replayed by ReplayManifest;
//   mode 1: the same, but the input is a list of frame payloads (u16 length + bytes each) that
//           the harness frames with the right magic, length and CRC-32C, so that mutations reach
//           the entry decoder instead of dying at the checksum;
//   mode 2: a STORE identity file, decoded by DecodeIdentity (raw, then with a fixed-up CRC).
// Input: one mode byte, then the bytes for that mode.
// Checked for every replayed commit: when TensorRecord::Validate accepts it for 1 to 4
// directories, its chunks cover `size` bytes and every chunk's slot lies inside its extent
// (what the store's reads rely on); a replayed entry re-encodes and replays to the same entry.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/crc32c.h"
#include "fuzz/fuzz_util.h"
#include "storage/format.h"

namespace storage = offloadd::storage;

namespace {

void Put32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void CheckRecord(const storage::TensorRecord& rec) {
  for (size_t n_dirs = 1; n_dirs <= 4; ++n_dirs) {
    if (!rec.Validate(n_dirs).ok()) continue;
    // Chunks cover the tensor: chunk_len() is what reads and checksums use.
    uint64_t covered = 0;
    for (size_t i = 0; i < rec.chunks.size(); ++i) {
      const uint64_t len = rec.chunk_len(i);
      FUZZ_CHECK(len <= rec.chunk_bytes);
      covered += len;
    }
    FUZZ_CHECK(covered == rec.size);
    const std::vector<uint64_t> offsets = rec.ChunkOffsets();
    FUZZ_CHECK(offsets.size() == rec.chunks.size());
    for (size_t i = 0; i < rec.chunks.size(); ++i) {
      const storage::DirExtent* ext = nullptr;
      for (const auto& x : rec.extents) {
        if (x.dir == rec.chunks[i].dir) ext = &x;
      }
      FUZZ_CHECK(ext != nullptr);
      FUZZ_CHECK(offsets[i] >= ext->offset);
      FUZZ_CHECK(offsets[i] - ext->offset + rec.chunk_bytes <= ext->length);
    }
    break;
  }
}

void Replay(std::span<const uint8_t> image) {
  auto replay = storage::ReplayManifest(image);
  if (!replay.ok()) return;
  FUZZ_CHECK(replay->valid_bytes <= image.size());
  FUZZ_CHECK(replay->torn_tail == (replay->valid_bytes < image.size()));
  for (const storage::ManifestEntry& e : replay->entries) {
    if (e.type == storage::RecordType::kCommit) CheckRecord(e.record);
    std::vector<uint8_t> again;
    storage::EncodeRecord(e, &again);
    auto back = storage::ReplayManifest(again);
    FUZZ_CHECK(back.ok() && back->entries.size() == 1 && !back->torn_tail);
    const storage::ManifestEntry& b = back->entries[0];
    FUZZ_CHECK(b.type == e.type && b.record.key == e.record.key &&
               b.record.version == e.record.version);
  }
}

void ReplayFramed(const uint8_t* data, size_t size) {
  std::vector<uint8_t> image;
  size_t pos = 0;
  while (pos + 2 <= size) {
    const size_t len = std::min<size_t>(data[pos] | (data[pos + 1] << 8), size - pos - 2);
    const uint8_t* payload = data + pos + 2;
    Put32(&image, storage::kRecordMagic);
    Put32(&image, static_cast<uint32_t>(len));
    Put32(&image, offloadd::Crc32c(0, payload, len));
    image.insert(image.end(), payload, payload + len);
    pos += 2 + len;
  }
  Replay(image);
}

void DecodeIdentity(const uint8_t* data, size_t size) {
  if (auto id = storage::DecodeIdentity({data, size}); id.ok()) {
    const std::vector<uint8_t> again = storage::EncodeIdentity(*id);
    FUZZ_CHECK(size >= again.size() && std::memcmp(again.data(), data, again.size()) == 0);
  }
  constexpr size_t kBody = 8 + 4 + 4 + 4 + 16;
  if (size < kBody) return;
  std::vector<uint8_t> fixed(data, data + kBody);
  Put32(&fixed, offloadd::Crc32c(0, fixed.data(), kBody));
  (void)storage::DecodeIdentity(fixed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 3) {
    case 0:
      Replay({data + 1, size - 1});
      break;
    case 1:
      ReplayFramed(data + 1, size - 1);
      break;
    case 2:
      DecodeIdentity(data + 1, size - 1);
      break;
  }
  return 0;
}
