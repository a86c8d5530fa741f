// Fuzzes what decides a decoder's architecture (model/decoder_config.h, model/decoder.h): a
// checkpoint directory's config.json (LLaMA / Qwen2, ParseDecoderConfig) and a GGUF file's
// metadata mapped to a DecoderConfig, both through ReadDecoderCheckpointConfig, the loader every
// decoder path starts with. Checkpoints are downloaded; the config decides every size the model
// allocates. fuzz_gguf fuzzes the GGUF container; here the container is well formed and the
// metadata keys and values are fuzzed (mode 1), or the raw file is (mode 2).
//
// Input: byte 0 picks the mode (mod 3), the rest is:
//   0  config.json text, written to a checkpoint directory;
//   1  GGUF metadata as records, each: a key byte (an index into kKeys below, prefixed with the
//      architecture's name where the key starts with "."; 255: a key string follows as a length
//      byte and bytes), a GGUF type byte (mod 13), and the value: 1, 2, 4 or 8 little-endian
//      bytes for scalars, a length byte and bytes for a string, an element type byte, a count
//      byte and the elements for an array. Bit 0 of byte 1 adds a tensor "output.weight" (an
//      untied head), the rest of byte 1 is ignored; records follow. The harness writes the .gguf;
//   2  a whole .gguf file.
//
// Checks beyond "no crash, no sanitizer report", as the headers promise:
// - a refusal is InvalidArgument or NotFound (a required GGUF key is missing), or OutOfRange (a
//   GGUF integer beyond int64), or DataLoss (mode 2: a truncated file), or Unimplemented (mode 2: a
//   tensor of a ggml type fedlora does not read), naming the file;
// - an accepted config passes Validate and keeps Validate's bounds (positive sizes, dimensions
//   under the caps, heads a multiple of the key-value heads, an even head_dim, token ids inside
//   the vocabulary);
// - mode 1: it holds what the metadata says (each key the mapping reads, as written; the token
//   count as vocab_size without a vocab_size key; a separate head exactly when output.weight exists);
// - it round-trips: written back as a config.json with every field, and as GGUF metadata with the
//   keys llama.cpp's converter writes, it reads back equal (GGUF carries no attention_dropout and
//   one eos id: those are compared where it can carry them).
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/decoder.h"
#include "model/decoder_config.h"

namespace {

using namespace fedlora;

// The scratch directory, with the ckpt/ a checkpoint directory is written to.
const std::string& Dir() {
  static const std::string* dir = [] {
    const std::string* d = &fuzz::ScratchDir("decoder_config");
    std::filesystem::create_directories(*d + "/ckpt");
    return d;
  }();
  return *dir;
}

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = Dir() + "/" + name;
  FUZZ_CHECK(fuzz::WriteFile(path, bytes), "cannot write " + path);
  return path;
}

// ---- a GGUF writer (version 3, alignment 32) ------------------------------------------------------

enum : uint32_t {
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kF32,
  kBool,
  kString,
  kArray,
  kU64,
  kI64,
  kF64
};

size_t Width(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    default:
      return 8;
  }
}

void Put(std::string* out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutString(std::string* out, std::string_view s) {
  Put(out, s.size(), 8);
  out->append(s);
}

struct Kv {
  std::string key;
  uint32_t type;
  std::string value;  // encoded as in the file
};

std::string Gguf(const std::vector<Kv>& kvs, bool output_weight) {
  std::string out = "GGUF";
  Put(&out, 3, 4);
  Put(&out, output_weight ? 1 : 0, 8);
  Put(&out, kvs.size(), 8);
  for (const Kv& kv : kvs) {
    PutString(&out, kv.key);
    Put(&out, kv.type, 4);
    out += kv.value;
  }
  if (output_weight) {  // F32 [1], the only tensor: ConfigFromGguf only asks whether it exists
    PutString(&out, "output.weight");
    Put(&out, 1, 4);
    Put(&out, 1, 8);
    Put(&out, 0, 4);
    Put(&out, 0, 8);
  }
  out.resize((out.size() + 31) / 32 * 32, '\0');
  if (output_weight) out.append(32, '\0');
  return out;
}

// ---- mode 1: metadata records --------------------------------------------------------------------

constexpr const char* kKeys[] = {"general.architecture",
                                 ".block_count",
                                 ".embedding_length",
                                 ".feed_forward_length",
                                 ".attention.head_count",
                                 ".attention.head_count_kv",
                                 ".context_length",
                                 ".attention.layer_norm_rms_epsilon",
                                 ".rope.freq_base",
                                 ".attention.key_length",
                                 ".attention.value_length",
                                 ".rope.dimension_count",
                                 ".rope.scaling.type",
                                 ".rope.scaling.factor",
                                 ".vocab_size",
                                 "tokenizer.ggml.tokens",
                                 "tokenizer.ggml.bos_token_id",
                                 "tokenizer.ggml.eos_token_id",
                                 "tokenizer.ggml.padding_token_id",
                                 "general.alignment",
                                 "general.name"};

struct Reader {
  const uint8_t* p;
  size_t n;
  bool Byte(uint8_t* b) {
    if (n == 0) return false;
    *b = *p++;
    --n;
    return true;
  }
  bool Bytes(size_t k, std::string* out) {
    if (n < k) return false;
    out->append(reinterpret_cast<const char*>(p), k);
    p += k;
    n -= k;
    return true;
  }
};

bool ReadValue(Reader* r, uint32_t type, std::string* value, int depth) {
  uint8_t len = 0;
  if (type == kString) {
    if (!r->Byte(&len)) return false;
    Put(value, len, 8);
    return r->Bytes(len, value);
  }
  if (type == kArray) {
    uint8_t elem = 0, count = 0;
    if (!r->Byte(&elem) || !r->Byte(&count)) return false;
    elem %= 13;
    if (elem == kArray && depth > 0) elem = kU8;  // one level of nesting is enough
    Put(value, elem, 4);
    Put(value, count, 8);
    for (int i = 0; i < count; ++i) {
      if (!ReadValue(r, elem, value, depth + 1)) return false;
    }
    return true;
  }
  return r->Bytes(Width(type), value);
}

std::string ArchOf(const std::vector<Kv>& kvs) {
  for (const Kv& kv : kvs) {
    if (kv.key == "general.architecture" && kv.type == kString) return kv.value.substr(8);
  }
  return "";
}

// The records as GGUF metadata; keys given twice keep their first value (a GGUF with a key twice
// is fuzz_gguf's business).
struct Metadata {
  std::vector<Kv> kvs;
  bool output_weight = false;
};

Metadata MetadataOf(const uint8_t* data, size_t size) {
  Reader r{data, size};
  uint8_t flags = 0;
  r.Byte(&flags);
  std::vector<Kv> kvs;
  std::vector<std::pair<std::string, Kv>> pending;  // keys relative to the architecture
  std::set<std::string> seen;
  uint8_t key_byte = 0, type_byte = 0;
  while (r.Byte(&key_byte) && r.Byte(&type_byte)) {
    Kv kv;
    if (key_byte == 255) {
      uint8_t len = 0;
      if (!r.Byte(&len) || !r.Bytes(len, &kv.key)) break;
    } else {
      kv.key = kKeys[key_byte % std::size(kKeys)];
    }
    kv.type = type_byte % 13;
    if (!ReadValue(&r, kv.type, &kv.value, 0)) break;
    if (kv.key.starts_with(".")) {
      pending.emplace_back(kv.key, std::move(kv));
    } else if (seen.insert(kv.key).second) {
      kvs.push_back(std::move(kv));
    }
  }
  const std::string arch = ArchOf(kvs);
  for (auto& [suffix, kv] : pending) {
    kv.key = arch + suffix;
    if (seen.insert(kv.key).second) kvs.push_back(std::move(kv));
  }
  return {std::move(kvs), (flags & 1) != 0};
}

// A scalar record's value as a number (NaN for strings, arrays and booleans).
double Number(const Kv& kv) {
  uint64_t bits = 0;
  if (kv.type == kString || kv.type == kArray || kv.type == kBool) return std::nan("");
  for (size_t i = 0; i < Width(kv.type); ++i)
    bits |= uint64_t{static_cast<uint8_t>(kv.value[i])} << (8 * i);
  switch (kv.type) {
    case kI8:
      return static_cast<int8_t>(bits);
    case kI16:
      return static_cast<int16_t>(bits);
    case kI32:
      return static_cast<int32_t>(bits);
    case kI64:
      return static_cast<double>(static_cast<int64_t>(bits));
    case kF32:
      return std::bit_cast<float>(static_cast<uint32_t>(bits));
    case kF64:
      return std::bit_cast<double>(bits);
    default:
      return static_cast<double>(bits);
  }
}

// An accepted config holds what the metadata says: each key the mapping reads, as written.
void CheckMapping(const Metadata& m, const DecoderConfig& c) {
  const std::string a = c.model_type;
  const std::pair<std::string, double> fields[] = {
      {a + ".block_count", c.num_hidden_layers},
      {a + ".embedding_length", c.hidden_size},
      {a + ".feed_forward_length", c.intermediate_size},
      {a + ".attention.head_count", c.num_attention_heads},
      {a + ".attention.head_count_kv", c.num_key_value_heads},
      {a + ".context_length", c.max_position_embeddings},
      {a + ".attention.key_length", c.head_dim},
      {a + ".vocab_size", c.vocab_size},
      {a + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps},
      {a + ".rope.freq_base", c.rope_theta},
      {"tokenizer.ggml.bos_token_id", c.bos_token_id},
      {"tokenizer.ggml.padding_token_id", c.pad_token_id}};
  bool has_vocab_size = false;
  for (const Kv& kv : m.kvs) {
    for (const auto& [key, value] : fields) {
      if (kv.key == key) FUZZ_CHECK(Number(kv) == value, kv.key + " is not what the config holds");
    }
    has_vocab_size |= kv.key == a + ".vocab_size";
    if (kv.key == "general.architecture")
      FUZZ_CHECK(kv.value.substr(8) == c.model_type, "model_type");
    if (kv.key == "tokenizer.ggml.eos_token_id") {
      FUZZ_CHECK(
          c.eos_token_ids.size() == 1 && Number(kv) == static_cast<double>(c.eos_token_ids[0]),
          "eos");
    }
  }
  for (const Kv& kv : m.kvs) {
    if (kv.key == "tokenizer.ggml.tokens" && kv.type == kArray &&
        !has_vocab_size) {  // the token list (count < 256)
      FUZZ_CHECK(static_cast<uint8_t>(kv.value[4]) == c.vocab_size,
                 "vocab_size is not the token count");
    }
  }
  FUZZ_CHECK(c.tie_word_embeddings == !m.output_weight,
             "tie_word_embeddings does not follow output.weight");
}

// ---- checks --------------------------------------------------------------------------------------

void CheckRefusal(const absl::Status& s, const std::string& path) {
  FUZZ_CHECK(
      s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound ||
          s.code() == absl::StatusCode::kOutOfRange || s.code() == absl::StatusCode::kDataLoss ||
          s.code() == absl::StatusCode::kUnimplemented,
      s);
  FUZZ_CHECK(s.message().find(path) != std::string::npos,
             "the error does not name the file: " + s.ToString());
}

void CheckBounds(const DecoderConfig& c) {
  const absl::Status valid = c.Validate();
  FUZZ_CHECK(valid.ok(), valid);
  FUZZ_CHECK(c.model_type == "llama" || c.model_type == "qwen2", "model_type " + c.model_type);
  FUZZ_CHECK(c.qkv_bias == (c.model_type == "qwen2"), "qkv_bias does not follow model_type");
  for (int64_t v :
       {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
        c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.max_position_embeddings}) {
    FUZZ_CHECK(v > 0, "a size is not positive");
  }
  FUZZ_CHECK(c.hidden_size <= (1 << 20) && c.intermediate_size <= (1 << 20) &&
                 c.vocab_size <= (1 << 24) && c.max_position_embeddings <= (1 << 24) &&
                 c.num_hidden_layers <= 1024 && c.head_dim <= 4096 && c.num_attention_heads <= 4096,
             "a dimension over its cap");
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0 && c.head_dim % 2 == 0,
             "heads or head_dim");
  FUZZ_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 1 && c.rope_theta <= 1e12, "eps or rope_theta");
  FUZZ_CHECK(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size && c.pad_token_id >= -1 &&
                 c.pad_token_id < c.vocab_size,
             "bos or pad outside the vocabulary");
  for (int64_t e : c.eos_token_ids)
    FUZZ_CHECK(e >= 0 && e < c.vocab_size, "eos outside the vocabulary");
}

bool Same(const DecoderConfig& a, const DecoderConfig& b, bool via_gguf) {
  const bool eos_same =
      via_gguf && a.eos_token_ids.size() > 1 ? true : a.eos_token_ids == b.eos_token_ids;
  return a.model_type == b.model_type && a.vocab_size == b.vocab_size &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.qkv_bias == b.qkv_bias &&
         (via_gguf || a.attention_dropout == b.attention_dropout) &&
         a.bos_token_id == b.bos_token_id && a.pad_token_id == b.pad_token_id && eos_same;
}

void CheckJsonRoundTrip(const DecoderConfig& c) {
  nlohmann::json j = {{"model_type", c.model_type},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads},
                      {"head_dim", c.head_dim},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"rms_norm_eps", c.rms_norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"attention_dropout", c.attention_dropout},
                      {"bos_token_id", c.bos_token_id},
                      {"pad_token_id", c.pad_token_id},
                      {"eos_token_id", c.eos_token_ids}};
  auto back = ParseDecoderConfig(j, "round trip");
  FUZZ_CHECK(back.ok(), back.status());
  FUZZ_CHECK(Same(c, *back, false),
             "the config written as config.json reads back differently: " + j.dump());
}

void CheckGgufRoundTrip(const DecoderConfig& c) {
  std::vector<Kv> kvs;
  auto add = [&](std::string key, uint32_t type, uint64_t bits) {
    Kv kv{std::move(key), type, ""};
    Put(&kv.value, bits, Width(type));
    kvs.push_back(std::move(kv));
  };
  Kv arch{"general.architecture", kString, ""};
  PutString(&arch.value, c.model_type);
  kvs.push_back(arch);
  const std::string a = c.model_type + ".";
  add(a + "block_count", kU32, c.num_hidden_layers);
  add(a + "embedding_length", kU32, c.hidden_size);
  add(a + "feed_forward_length", kU32, c.intermediate_size);
  add(a + "attention.head_count", kU32, c.num_attention_heads);
  add(a + "attention.head_count_kv", kU32, c.num_key_value_heads);
  add(a + "context_length", kU32, c.max_position_embeddings);
  add(a + "attention.layer_norm_rms_epsilon", kF64, std::bit_cast<uint64_t>(c.rms_norm_eps));
  add(a + "rope.freq_base", kF64, std::bit_cast<uint64_t>(c.rope_theta));
  add(a + "attention.key_length", kU32, c.head_dim);
  add(a + "attention.value_length", kU32, c.head_dim);
  add(a + "rope.dimension_count", kU32, c.head_dim);
  add(a + "vocab_size", kU32, c.vocab_size);
  if (c.bos_token_id >= 0) add("tokenizer.ggml.bos_token_id", kU32, c.bos_token_id);
  if (c.pad_token_id >= 0) add("tokenizer.ggml.padding_token_id", kU32, c.pad_token_id);
  if (!c.eos_token_ids.empty()) add("tokenizer.ggml.eos_token_id", kU32, c.eos_token_ids[0]);
  const std::string path = Write("again.gguf", Gguf(kvs, !c.tie_word_embeddings));
  auto back = ReadDecoderCheckpointConfig(path);
  FUZZ_CHECK(back.ok(), back.status());
  FUZZ_CHECK(Same(c, *back, true), "the config written as GGUF metadata reads back differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  std::string path;
  Metadata metadata;
  if (mode == 0) {
    Write("ckpt/config.json", std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
    path = Dir() + "/ckpt";
  } else if (mode == 1) {
    metadata = MetadataOf(data + 1, size - 1);
    path = Write("model.gguf", Gguf(metadata.kvs, metadata.output_weight));
  } else {
    path = Write("model.gguf", std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  }
  auto config = ReadDecoderCheckpointConfig(path);
  FUZZ_TRACE("mode %d: %s\n", mode, config.status().ToString().c_str());
  if (!config.ok()) {
    CheckRefusal(config.status(), path);
    return 0;
  }
  CheckBounds(*config);
  if (mode == 1) CheckMapping(metadata, *config);
  CheckJsonRoundTrip(*config);
  CheckGgufRoundTrip(*config);
  return 0;
}
