// DecodeUpdateKept against DecodeUpdate on one encoded update: the same status, and on success the
// same tensors once the kept entries are expanded (bit for bit), with strictly ascending indices.
#pragma once

#include <bit>
#include <cstdint>
#include <string_view>
#include <vector>

#include "compression/codec.h"
#include "gtest/gtest.h"

namespace fedlora::testing {

inline void ExpectKeptMatchesDecode(std::string_view wire, const DecodeLimits& limits = {}) {
  const absl::StatusOr<std::vector<UpdateTensor>> dense = DecodeUpdate(wire, limits);
  const absl::StatusOr<std::vector<KeptTensor>> kept = DecodeUpdateKept(wire, limits);
  ASSERT_EQ(kept.status(), dense.status());
  if (!dense.ok()) return;
  ASSERT_EQ(kept->size(), dense->size());
  for (size_t t = 0; t < dense->size(); ++t) {
    const KeptTensor& k = (*kept)[t];
    const UpdateTensor& d = (*dense)[t];
    EXPECT_EQ(k.name, d.name);
    EXPECT_EQ(k.shape, d.shape);
    std::vector<float> expanded = k.values;
    if (!k.dense) {
      ASSERT_EQ(k.indices.size(), k.values.size()) << k.name;
      expanded.assign(d.values.size(), 0.0f);
      for (size_t j = 0; j < k.indices.size(); ++j) {
        if (j > 0) {
          ASSERT_LT(k.indices[j - 1], k.indices[j]) << k.name;
        }
        ASSERT_GE(k.indices[j], 0);
        ASSERT_LT(k.indices[j], static_cast<int64_t>(expanded.size())) << k.name;
        expanded[static_cast<size_t>(k.indices[j])] = k.values[j];
      }
    }
    ASSERT_EQ(expanded.size(), d.values.size()) << k.name;
    for (size_t i = 0; i < expanded.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(expanded[i]), std::bit_cast<uint32_t>(d.values[i]))
          << k.name << " " << i;
    }
  }
}

}  // namespace fedlora::testing
