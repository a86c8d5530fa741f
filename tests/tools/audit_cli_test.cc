// `fedlora certs audit-key` and `fedlora audit open` as an operator runs them: the key pair made
// offline by the CLI, a store holding audit copies sealed to its public half (as the server seals
// them, server/audit_trail.h), then the trail opened to the exact update bytes, decoded to
// safetensors, filtered by round, and refused with another key.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/update_io.h"
#include "core/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/audit_trail.h"
#include "server/blob_store.h"
#include "server/store.h"
#include "tests/tools/cli_test_util.h"

namespace fedlora {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using Result = testing::CliResult;

class AuditCli : public testing::CliTest {
 protected:
  void SetUp() override {
    testing::CliTest::SetUp();
    if (HasFatalFailure()) return;
  }
  std::map<std::string, std::string> encoded_;  // upload id -> the encoded update sealed for it
};

// The update client `c` sends in round `r`: one tensor of known values.
std::vector<UpdateTensor> UpdateOf(int c, int r) {
  return {{"w", {4}, {static_cast<float>(c), static_cast<float>(r), 0.5f, -1.0f}}};
}

TEST_F(AuditCli, AKeyPairMadeOfflineOpensTheTrailEndToEnd) {
  Result r = Run({"certs", "audit-key", "--out", dir_ + "/keys"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/keys/audit.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  r = Run({"certs", "audit-key", "--out", dir_ + "/keys"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("already exists; pass --force"));
  auto pub = LoadAuditPublicKey(dir_ + "/keys/audit.pub");
  ASSERT_TRUE(pub.ok()) << pub.status();

  // A store with two rounds of two clients' copies, sealed to the CLI's public key.
  const std::string data = dir_ + "/data";
  fs::create_directories(data);
  {
    auto store = Store::Open(data + "/fedlora.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto blobs = BlobStore::Open(data);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    ASSERT_TRUE((*store)->CreateRun("r", "{}").ok());
    std::vector<AuditCopyRecord> copies;
    for (int round = 1; round <= 2; ++round) {
      for (int c = 0; c < 2; ++c) {
        const std::string client = "site-" + std::to_string(c),
                          upload = client + "-r" + std::to_string(round);
        auto encoded = EncodeUpdate(UpdateOf(c, round), CodecOptions{});
        ASSERT_TRUE(encoded.ok()) << encoded.status();
        const crypto::UpdatePlace place{"r", static_cast<uint64_t>(round), client, upload,
                                        static_cast<uint64_t>(10 + c)};
        auto copy = SealAuditCopy(*pub, place, *encoded, **blobs);
        ASSERT_TRUE(copy.ok()) << copy.status();
        copies.push_back(*copy);
        encoded_[upload] = *encoded;
      }
    }
    ASSERT_TRUE((*store)->RecordAuditCopies(copies).ok());
  }

  r = Run({"audit", "open", "--store", data, "--key", dir_ + "/keys/audit.key", "--out",
           dir_ + "/all", "--safetensors"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("opened run r round 2 client site-1 upload site-1-r2 (11 examples)"));
  EXPECT_THAT(r.out, HasSubstr("4 of 4 audit copies opened"));
  std::ifstream manifest(dir_ + "/all/manifest.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(manifest, line)) {
    ++lines;
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string upload = j["upload_id"];
    SCOPED_TRACE(upload);
    const int c = j["client_id"] == "site-0" ? 0 : 1;
    EXPECT_EQ(upload, std::string(j["client_id"]) + "-r" + std::to_string(int64_t{j["round"]}));
    EXPECT_EQ(int64_t{j["num_examples"]}, 10 + c);
    auto bytes = ReadFileToString(j["update_file"]);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_TRUE(*bytes == encoded_[upload]) << "not the bytes that were sealed";
    auto st_bytes = ReadFileToString(j["safetensors_file"]);
    ASSERT_TRUE(st_bytes.ok()) << st_bytes.status();
    auto tensors = AdapterFromSafetensors(*st_bytes);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ASSERT_EQ(tensors->size(), 1u);
    EXPECT_EQ((*tensors)[0].values, UpdateOf(c, static_cast<int>(int64_t{j["round"]}))[0].values);
  }
  EXPECT_EQ(lines, 4);

  r = Run({"audit", "open", "--store", data, "--key", dir_ + "/keys/audit.key", "--round", "1",
           "--out", dir_ + "/one"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 of 2 audit copies opened"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("round 2")));

  // Another key pair: nothing opens, and the exit code says so.
  ASSERT_EQ(Run({"certs", "audit-key", "--out", dir_ + "/other"}).exit_code, 0);
  r = Run({"audit", "open", "--store", data, "--key", dir_ + "/other/audit.key", "--out",
           dir_ + "/wrong"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(r.out, HasSubstr("0 of 4 audit copies opened"));
  // The public key where the private one belongs is refused naming the file.
  r = Run(
      {"audit", "open", "--store", data, "--key", dir_ + "/keys/audit.pub", "--out", dir_ + "/x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(dir_ + "/keys/audit.pub"));
}

}  // namespace
}  // namespace fedlora
