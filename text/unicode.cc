#include "text/unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <array>

namespace offloadd::text {

size_t Utf8SeqLen(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

uint32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  size_t len = Utf8SeqLen(p[0]);
  if (*pos + len > s.size()) len = 1;
  uint32_t cp;
  switch (len) {
    case 2:
      cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      break;
    case 3:
      cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
      break;
    case 4:
      cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
      break;
    default:
      cp = p[0];
      break;
  }
  *pos += len;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Number of continuation bytes and the allowed range of the first one (Unicode Table 3-7).
struct LeadInfo {
  int continuation;
  unsigned char first_lo, first_hi;
};

bool Lead(unsigned char b, LeadInfo* info) {
  if (b >= 0xC2 && b <= 0xDF)
    *info = {1, 0x80, 0xBF};
  else if (b == 0xE0)
    *info = {2, 0xA0, 0xBF};
  else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
    *info = {2, 0x80, 0xBF};
  else if (b == 0xED)
    *info = {2, 0x80, 0x9F};
  else if (b == 0xF0)
    *info = {3, 0x90, 0xBF};
  else if (b >= 0xF1 && b <= 0xF3)
    *info = {3, 0x80, 0xBF};
  else if (b == 0xF4)
    *info = {3, 0x80, 0x8F};
  else
    return false;
  return true;
}

// Length of the valid sequence at s[i], or 0 with *consumed = the maximal invalid subpart.
size_t ValidSeqAt(std::string_view s, size_t i, size_t* consumed) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  LeadInfo info;
  if (!Lead(b, &info)) {
    *consumed = 1;
    return 0;
  }
  size_t j = i + 1;
  for (int k = 0; k < info.continuation; ++k, ++j) {
    const unsigned char lo = k == 0 ? info.first_lo : 0x80;
    const unsigned char hi = k == 0 ? info.first_hi : 0xBF;
    if (j >= s.size() || static_cast<unsigned char>(s[j]) < lo ||
        static_cast<unsigned char>(s[j]) > hi) {
      *consumed = j - i;
      return 0;
    }
  }
  return j - i;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t consumed = 0;
    const size_t n = ValidSeqAt(s, i, &consumed);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t consumed = 0;
    const size_t n = ValidSeqAt(s, i, &consumed);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += consumed;
    }
  }
  return out;
}

bool IsUnicodeWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<int, 512> from_cp{};
  ByteTables() {
    from_cp.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      AppendUtf8(to_cp[b], &to_utf8[b]);
      from_cp[to_cp[b]] = b;
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

uint32_t ByteToCodePoint(uint8_t b) { return Tables().to_cp[b]; }

int CodePointToByte(uint32_t cp) { return cp < 512 ? Tables().from_cp[cp] : -1; }

std::string ByteLevelEncode(std::string_view s) {
  const auto& t = Tables();
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char b : s) out += t.to_utf8[b];
  return out;
}

namespace {

const icu::Normalizer2* GetNormalizer(NormalForm form, UErrorCode& err) {
  switch (form) {
    case NormalForm::kNfc:
      return icu::Normalizer2::getNFCInstance(err);
    case NormalForm::kNfd:
      return icu::Normalizer2::getNFDInstance(err);
    case NormalForm::kNfkc:
      return icu::Normalizer2::getNFKCInstance(err);
    case NormalForm::kNfkd:
      return icu::Normalizer2::getNFKDInstance(err);
  }
  return nullptr;
}

}  // namespace

bool HasBoundaryBefore(uint32_t cp, NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = GetNormalizer(form, err);
  return U_SUCCESS(err) && n != nullptr && n->hasBoundaryBefore(static_cast<UChar32>(cp));
}

StatusOr<std::string> Normalize(std::string_view s, NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = GetNormalizer(form, err);
  if (U_FAILURE(err) || n == nullptr) {
    return InternalError(std::string("ICU normalizer unavailable: ") + u_errorName(err));
  }
  const icu::UnicodeString in =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (n->isNormalized(in, err) && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  const icu::UnicodeString out = n->normalize(in, err);
  if (U_FAILURE(err)) return InternalError(std::string("ICU normalize: ") + u_errorName(err));
  std::string result;
  out.toUTF8String(result);
  return result;
}

StatusOr<std::string> Lowercase(std::string_view s) {
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  u.toLower(icu::Locale::getRoot());
  std::string result;
  u.toUTF8String(result);
  return result;
}

}  // namespace offloadd::text

namespace offloadd::text {

StatusOr<std::string> Uppercase(std::string_view s) {
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  u.toUpper(icu::Locale::getRoot());
  std::string result;
  u.toUTF8String(result);
  return result;
}

}  // namespace offloadd::text
