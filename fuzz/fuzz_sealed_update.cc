// Fuzzes the opening of sealed updates (crypto/sealed_update.h): the bytes a client uploads, which
// the server opens with the run's aggregation key before it decodes them.
//
// Two kinds of input, chosen by the first byte:
// - raw: the rest is a blob as a client would send it. Nothing the fuzzer writes can authenticate,
//   so opening must fail (and must not crash, leak or read out of bounds);
// - seal and tamper: the input gives a plaintext and a place (run, round, client, upload, weight), which
//   are sealed honestly; then some bytes are flipped, the blob is cut or extended, and the place
//   may change. Opening must give back the plaintext exactly when nothing changed, and
//   PermissionDenied or InvalidArgument otherwise.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "crypto/envelope.h"
#include "crypto/sealed_update.h"
#include "fuzz/fuzz_util.h"

namespace {

const fedlora::crypto::X25519KeyPair& ServerKey() {
  static const fedlora::crypto::X25519KeyPair* key = [] {
    auto k = fedlora::crypto::GenerateX25519KeyPair();
    FUZZ_CHECK(k.ok(), k.status());
    return new fedlora::crypto::X25519KeyPair(*k);
  }();
  return *key;
}

bool Refused(const absl::Status& s) {
  return s.code() == absl::StatusCode::kPermissionDenied ||
         s.code() == absl::StatusCode::kInvalidArgument;
}

void Raw(std::string_view blob) {
  using namespace fedlora::crypto;
  const UpdatePlace place{"fuzz-run", 1, "site-0", "upload-0"};
  (void)SealedBlobEphemeralKey(blob);
  auto size = SealedBlobPlaintextSize(blob);
  auto opened = OpenUpdateBlob(ServerKey().private_key, place, blob);
  FUZZ_CHECK(!opened.ok(), "a blob the fuzzer wrote authenticated");
  FUZZ_CHECK(Refused(opened.status()), opened.status());
  if (size.ok() && *size <= (size_t{1} << 20)) {
    std::string out(*size, 'x');
    absl::Status s =
        OpenUpdateBlobInto(ServerKey().private_key, place, blob, out.data(), out.size());
    FUZZ_CHECK(!s.ok() && Refused(s), s);
    // A wrong output size is refused, never written past.
    std::string small(*size / 2, 'x');
    s = OpenUpdateBlobInto(ServerKey().private_key, place, blob, small.data(), small.size());
    FUZZ_CHECK(!s.ok(), "");
  }
}

void SealAndTamper(FuzzedDataProvider& in) {
  using namespace fedlora::crypto;
  const std::string run = in.ConsumeRandomLengthString(16);
  const uint64_t round = in.ConsumeIntegral<uint64_t>();
  const std::string client = in.ConsumeRandomLengthString(16);
  const std::string upload = in.ConsumeRandomLengthString(16);
  const std::string plain = in.ConsumeRandomLengthString(4096);
  const uint64_t examples = in.ConsumeIntegral<uint64_t>();
  auto sealed =
      SealUpdateBlob(ServerKey().public_key, {run, round, client, upload, examples}, plain);
  FUZZ_CHECK(sealed.ok(), sealed.status());
  std::string blob = sealed->blob;
  FUZZ_CHECK(blob.size() == plain.size() + SealedBlobOverheadBytes(), "");

  const int ops = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < ops; ++i) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        if (!blob.empty()) {
          const size_t at = in.ConsumeIntegralInRange<size_t>(0, blob.size() - 1);
          blob[at] = static_cast<char>(blob[at] ^ in.ConsumeIntegralInRange<char>(1, 127));
        }
        break;
      case 1:
        blob.resize(in.ConsumeIntegralInRange<size_t>(0, blob.size()));
        break;
      default:
        blob.push_back(in.ConsumeIntegral<char>());
        break;
    }
  }
  std::string run2 = run, client2 = client, upload2 = upload;
  uint64_t round2 = round, examples2 = examples;
  if (in.ConsumeBool()) run2 = in.ConsumeRandomLengthString(16);
  if (in.ConsumeBool()) round2 = in.ConsumeIntegral<uint64_t>();
  if (in.ConsumeBool()) client2 = in.ConsumeRandomLengthString(16);
  if (in.ConsumeBool()) upload2 = in.ConsumeRandomLengthString(16);
  if (in.ConsumeBool()) examples2 = in.ConsumeIntegral<uint64_t>();
  const bool same = blob == sealed->blob && run2 == run && round2 == round && client2 == client &&
                    upload2 == upload && examples2 == examples;

  auto opened =
      OpenUpdateBlob(ServerKey().private_key, {run2, round2, client2, upload2, examples2}, blob);
  FUZZ_TRACE("seal %zu bytes, %d ops, unchanged %d: %s\n", plain.size(), ops, same ? 1 : 0,
             opened.status().ToString().c_str());
  if (same) {
    FUZZ_CHECK(opened.ok(), opened.status());
    FUZZ_CHECK(*opened == plain, "opened to other bytes");
  } else {
    FUZZ_CHECK(!opened.ok(), "a tampered blob or a moved place authenticated");
    FUZZ_CHECK(Refused(opened.status()), opened.status());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    Raw(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  } else {
    FuzzedDataProvider in(data + 1, size - 1);
    SealAndTamper(in);
  }
  return 0;
}
