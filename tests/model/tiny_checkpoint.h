// Test helper: writes a tiny random BERT checkpoint (config.json + model.safetensors) in the
// Hugging Face layout, optionally damaged, so that loading tests need neither Python nor a
// download. Header-only; used by several test binaries.
#pragma once

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/bert_config.h"

namespace fedlora::testing_util {

// 2 layers, hidden 32, 4 heads, intermediate 64, vocab 100, 64 positions.
inline BertConfig TinyConfig() {
  BertConfig c;
  c.vocab_size = 100;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 64;
  c.type_vocab_size = 2;
  return c;
}

// The same sizes as a RoBERTa: pad_token_id 1, one token type, 64 positions after the pad offset.
inline BertConfig TinyRobertaConfig() {
  BertConfig c = TinyConfig();
  c.model_type = "roberta";
  c.pad_token_id = 1;
  c.type_vocab_size = 1;
  c.max_position_embeddings = 66;
  c.layer_norm_eps = 1e-5;
  return c;
}

inline nlohmann::json ConfigJson(const BertConfig& c) {
  return nlohmann::json{{"model_type", c.model_type},
                        {"architectures", {"BertModel"}},
                        {"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"intermediate_size", c.intermediate_size},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"type_vocab_size", c.type_vocab_size},
                        {"pad_token_id", c.pad_token_id},
                        {"layer_norm_eps", c.layer_norm_eps},
                        {"hidden_dropout_prob", c.hidden_dropout_prob},
                        {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
                        {"hidden_act", c.hidden_act}};
}

struct TinyCheckpointOptions {
  std::string prefix = "bert.";  // "" for sentence-transformers style names
  bool pooler = true;
  DType dtype = DType::kF32;  // F32, F16 or BF16 for every float tensor
  std::string drop;           // name (without prefix) of a tensor to leave out
  std::string transpose;      // name of a 2-D tensor to store with its dimensions swapped
  std::string as_int32;       // name of a tensor to store as I32
  uint64_t seed = 1;
};

// Every tensor name (without prefix) and shape that the config implies.
inline std::map<std::string, std::vector<int64_t>> ExpectedTensors(const BertConfig& c,
                                                                   bool pooler) {
  const int64_t h = c.hidden_size, in = c.intermediate_size;
  std::map<std::string, std::vector<int64_t>> t;
  t["embeddings.word_embeddings.weight"] = {c.vocab_size, h};
  t["embeddings.position_embeddings.weight"] = {c.max_position_embeddings, h};
  t["embeddings.token_type_embeddings.weight"] = {c.type_vocab_size, h};
  t["embeddings.LayerNorm.weight"] = {h};
  t["embeddings.LayerNorm.bias"] = {h};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("encoder.layer.", l, ".");
    for (const char* m : {"attention.self.query", "attention.self.key", "attention.self.value",
                          "attention.output.dense"}) {
      t[absl::StrCat(p, m, ".weight")] = {h, h};
      t[absl::StrCat(p, m, ".bias")] = {h};
    }
    t[p + "intermediate.dense.weight"] = {in, h};
    t[p + "intermediate.dense.bias"] = {in};
    t[p + "output.dense.weight"] = {h, in};
    t[p + "output.dense.bias"] = {h};
    for (const char* m : {"attention.output.LayerNorm", "output.LayerNorm"}) {
      t[absl::StrCat(p, m, ".weight")] = {h};
      t[absl::StrCat(p, m, ".bias")] = {h};
    }
  }
  if (pooler) {
    t["pooler.dense.weight"] = {h, h};
    t["pooler.dense.bias"] = {h};
  }
  return t;
}

// Values: matrices U(-1, 1) / sqrt(cols), vectors 0.1 * U(-1, 1), LayerNorm gains 1 + that.
inline absl::Status WriteTinyCheckpoint(const std::string& dir, const BertConfig& c,
                                        const TinyCheckpointOptions& o = {}) {
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", ConfigJson(c).dump(2)));
  uint64_t state = o.seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&state]() {  // xorshift64*, in [-1, 1)
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<float>(((state * 2685821657736338717ull) >> 40) * (1.0 / (1 << 24))) * 2.0f -
           1.0f;
  };
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DType> dtypes;
  std::vector<std::string> blobs;
  for (auto [name, shape] : ExpectedTensors(c, o.pooler)) {
    if (name == o.drop) continue;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    const bool gain = name.find("LayerNorm.weight") != std::string::npos;
    for (auto& x : v) {
      x = shape.size() == 2 ? uniform() / std::sqrt(static_cast<float>(shape[1]))
                            : 0.1f * uniform();
      if (gain) x += 1.0f;
    }
    if (name == o.transpose && shape.size() == 2) std::swap(shape[0], shape[1]);
    std::string blob;
    DType dt = o.dtype;
    if (name == o.as_int32) {
      dt = DType::kI32;
      blob.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    } else if (dt == DType::kF32) {
      blob.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    } else {
      std::vector<uint16_t> bits(n);
      if (dt == DType::kBF16) {
        ConvertF32ToBF16(v.data(), bits.data(), n);
      } else {
        ConvertF32ToF16(v.data(), bits.data(), n);
      }
      blob.assign(reinterpret_cast<const char*>(bits.data()), bits.size() * 2);
    }
    names.push_back(o.prefix + name);
    shapes.push_back(shape);
    dtypes.push_back(dt);
    blobs.push_back(std::move(blob));
  }
  std::vector<SafetensorsTensorToWrite> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.push_back({names[i], dtypes[i], shapes[i], blobs[i].data(), blobs[i].size()});
  }
  return WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

// A fresh directory under $TEST_TMPDIR or /tmp; the caller may leave it (tests are hermetic by
// name).
inline std::string MakeTempDir(const std::string& tag) {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp", "/fedlora_", tag, "_XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* made = mkdtemp(buf.data());
  return made != nullptr ? std::string(made) : std::string();
}

}  // namespace fedlora::testing_util
