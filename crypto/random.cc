#include "crypto/random.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status.h"
#include "crypto/openssl_errors.h"

namespace fedlora::crypto {
namespace {}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  unsigned char* p = reinterpret_cast<unsigned char*>(out.data());
  // RAND_bytes takes an int length: draw big requests in pieces.
  for (size_t done = 0; done < n;) {
    const size_t piece = std::min<size_t>(n - done, size_t{1} << 30);
    if (RAND_bytes(p + done, static_cast<int>(piece)) != 1) {
      OPENSSL_cleanse(out.data(), out.size());
      return absl::InternalError(absl::StrCat("RAND_bytes could not deliver ", n,
                                              " random bytes: ", DrainOpenSslErrors()));
    }
    done += piece;
  }
  return out;
}

absl::StatusOr<std::string> RandomHex(size_t n) {
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, RandomBytes(n));
  std::string hex = ToHex(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  OPENSSL_cleanse(bytes.data(), bytes.size());
  return hex;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace fedlora::crypto
