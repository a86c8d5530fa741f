// A tiny encoder and a task it learns in well under a second, for the trainer's tests.
#pragma once

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "model/bert.h"
#include "train/trainer.h"

namespace fedlora {

// A 2-layer encoder small enough that a whole training run takes well under a second.
inline BertConfig TinyConfig() {
  BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 64;
  c.max_position_embeddings = 32;
  return c;
}

inline std::unique_ptr<BertClassifier> TinyModel(uint64_t seed, float dropout,
                                                 Device device = Device::kCpu,
                                                 bool freeze_a = false) {
  ModelOptions o;
  o.num_labels = 2;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  o.lora.freeze_a = freeze_a;
  o.seed = seed;
  o.max_batch = 16;
  o.max_seq = 24;
  o.hidden_dropout = dropout;
  o.attention_dropout = dropout;
  o.device = device;
  auto model = BertClassifier::FromRandom(TinyConfig(), o);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Class k's sequences contain marker token 5 + k three times among filler tokens 10..39, with
// lengths 6..20: separable by the presence of one token, but only through attention.
inline TokenizedDataset MarkerTask(int n, uint64_t seed) {
  TokenizedDataset d;
  d.num_labels = 2;
  d.label_names = {"five", "six"};
  uint64_t s = seed;
  auto next = [&s](uint64_t bound) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;  // Knuth's MMIX LCG
    return static_cast<int32_t>((s >> 33) % bound);
  };
  for (int i = 0; i < n; ++i) {
    TokenizedExample ex;
    ex.label = i % 2;
    const int len = 6 + next(15);
    ex.input_ids.push_back(1);  // [CLS]-like
    for (int t = 1; t < len - 1; ++t) ex.input_ids.push_back(10 + next(30));
    ex.input_ids.push_back(2);  // [SEP]-like
    for (int k = 0; k < 3; ++k) ex.input_ids[1 + next(len - 2)] = 5 + ex.label;
    ex.token_type_ids.assign(ex.input_ids.size(), 0);
    d.examples.push_back(std::move(ex));
  }
  return d;
}

}  // namespace fedlora
