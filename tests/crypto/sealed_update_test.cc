// The sealed update blob: its ephemeral-key prefix, its size, and that it opens only at the place
// (run, round, client, upload) and under the server key it was sealed for.
#include "crypto/sealed_update.h"

#include "crypto/envelope.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

class SealedUpdateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = GenerateX25519KeyPair();
    ASSERT_TRUE(pair.ok()) << pair.status();
    server_ = *pair;
  }
  X25519KeyPair server_;
  const std::string plaintext_ = "an encoded update, header and tensors";
  const UpdatePlace place_{"run-1", 3, "site-a", "u-0001", 120};
};

TEST_F(SealedUpdateTest, OpensWhereItWasSealedAndStartsWithItsEphemeralKey) {
  auto sealed = SealUpdateBlob(server_.public_key, place_, plaintext_);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(sealed->blob.size(), plaintext_.size() + SealedBlobOverheadBytes());
  EXPECT_EQ(sealed->blob.substr(0, kX25519KeyBytes), sealed->ephemeral_public_key);
  EXPECT_EQ(*SealedBlobEphemeralKey(sealed->blob), sealed->ephemeral_public_key);
  EXPECT_EQ(*SealedBlobPlaintextSize(sealed->blob), plaintext_.size());
  EXPECT_EQ(sealed->blob.find(plaintext_), std::string::npos);  // not readable in the blob
  auto opened = OpenUpdateBlob(server_.private_key, place_, sealed->blob);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(*opened, plaintext_);
}

TEST_F(SealedUpdateTest, RefusesEveryOtherPlaceAndKey) {
  auto sealed = SealUpdateBlob(server_.public_key, place_, plaintext_);
  ASSERT_TRUE(sealed.ok());
  const std::vector<UpdatePlace> moved = {{"run-2", 3, "site-a", "u-0001", 120},
                                          {"run-1", 4, "site-a", "u-0001", 120},
                                          {"run-1", 3, "site-b", "u-0001", 120},
                                          {"run-1", 3, "site-a", "u-0002", 120},
                                          // A rewritten FedAvg weight does not open either.
                                          {"run-1", 3, "site-a", "u-0001", 1'000'000}};
  for (const UpdatePlace& p : moved) {
    auto opened = OpenUpdateBlob(server_.private_key, p, sealed->blob);
    EXPECT_TRUE(absl::IsPermissionDenied(opened.status()))
        << p.run_id << " " << p.round << " " << p.client_id << " " << p.upload_id << " "
        << p.num_examples << ": " << opened.status();
  }
  auto other = GenerateX25519KeyPair();
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(
      absl::IsPermissionDenied(OpenUpdateBlob(other->private_key, place_, sealed->blob).status()));
  // Another ephemeral key in front of the same envelope derives another key: refused.
  std::string swapped = sealed->blob;
  swapped.replace(0, kX25519KeyBytes, other->public_key);
  EXPECT_TRUE(
      absl::IsPermissionDenied(OpenUpdateBlob(server_.private_key, place_, swapped).status()));
  std::string flipped = sealed->blob;
  flipped[flipped.size() / 2] ^= 1;
  EXPECT_TRUE(
      absl::IsPermissionDenied(OpenUpdateBlob(server_.private_key, place_, flipped).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(OpenUpdateBlob(server_.private_key, place_,
                                             sealed->blob.substr(0, SealedBlobOverheadBytes() - 1))
                                  .status()));
}

TEST(AggregationKeyIdTest, NamesTheKeyByItsDigest) {
  const std::string a(32, 'a'), b(32, 'b');
  EXPECT_EQ(AggregationKeyId(a).substr(0, 7), "x25519-");
  EXPECT_EQ(AggregationKeyId(a).size(), 7u + 16u);
  EXPECT_EQ(AggregationKeyId(a), AggregationKeyId(a));
  EXPECT_NE(AggregationKeyId(a), AggregationKeyId(b));
}

}  // namespace
}  // namespace fedlora::crypto
