#include "core/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "core/file.h"
#include "core/status.h"

namespace fedlora {
namespace {

// EVP failures here are allocation failures or a broken OpenSSL build, never bad input:
// SHA-256 accepts any byte string. They are our invariant, hence FEDLORA_CHECK.
void Init(EVP_MD_CTX* ctx) { FEDLORA_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1); }

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  FEDLORA_CHECK(ctx_ != nullptr);
  Init(ctx_);
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Update(const void* data, size_t size) {
  if (size == 0) return;
  FEDLORA_CHECK(EVP_DigestUpdate(ctx_, data, size) == 1);
}

Sha256DigestBytes Sha256::Final() {
  Sha256DigestBytes out{};
  unsigned int len = 0;
  FEDLORA_CHECK(EVP_DigestFinal_ex(ctx_, out.data(), &len) == 1);
  FEDLORA_CHECK(len == kSha256DigestSize);
  Init(ctx_);
  return out;
}

Sha256DigestBytes Sha256Digest(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.Final();
}

std::string Sha256Hex(std::string_view bytes) {
  const Sha256DigestBytes d = Sha256Digest(bytes);
  return ToHex(d.data(), d.size());
}

absl::StatusOr<std::string> Sha256FileHex(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  // 1 MiB chunks: large enough that syscall overhead is negligible next to hashing
  // (~1.5 GB/s with SHA-NI), small enough to keep memory flat for multi-GB checkpoints.
  constexpr size_t kChunk = 1 << 20;
  std::vector<char> buf(kChunk);
  Sha256 h;
  absl::Status status;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      status = ErrnoToStatus(errno, "read", path);
      break;
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  if (!status.ok()) return status;
  const Sha256DigestBytes d = h.Final();
  return ToHex(d.data(), d.size());
}

std::string ToHex(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

}  // namespace fedlora
