// Decoder checkpoints: Hugging Face config.json + safetensors (one file or shards), and GGUF.
// Name mapping and layout fixes live here, apart from the compute graph (model/decoder_step.cc).
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/gguf.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "model/decoder_weights.h"

namespace fedlora {
namespace {

constexpr DecoderTarget kAllTargets[kNumDecoderTargets] = {
    DecoderTarget::kQProj,   DecoderTarget::kKProj,    DecoderTarget::kVProj,
    DecoderTarget::kOProj,   DecoderTarget::kGateProj, DecoderTarget::kUpProj,
    DecoderTarget::kDownProj};

bool HasBias(const DecoderConfig& c, DecoderTarget t) {
  return c.qkv_bias && static_cast<int>(t) <= static_cast<int>(DecoderTarget::kVProj);
}

// --- safetensors ---------------------------------------------------------------------------------

// name -> the shard holding it.
class Shards {
 public:
  absl::Status Open(const std::string& dir) {
    const std::string single = dir + "/model.safetensors",
                      index = dir + "/model.safetensors.index.json";
    if (std::filesystem::exists(single)) {
      FEDLORA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single));
      for (const std::string& n : f->names()) where_[n] = f.get();
      files_.push_back(std::move(f));
      return absl::OkStatus();
    }
    if (!std::filesystem::exists(index)) {
      return absl::NotFoundError(
          absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
    }
    FEDLORA_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(index));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": no weight_map object"));
    }
    std::map<std::string, SafetensorsFile*> opened;
    for (const auto& [name, shard] : j["weight_map"].items()) {
      if (!shard.is_string())
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": weight_map[\"", name, "\"] is not a string"));
      const std::string file = shard.get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": shard name \"", file, "\" is not a file in ", dir));
      }
      if (!opened.count(file)) {
        FEDLORA_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/" + file));
        opened[file] = f.get();
        files_.push_back(std::move(f));
      }
      if (!opened[file]->Contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(index, ": \"", name, "\" is not in its shard ", file));
      }
      where_[name] = opened[file];
    }
    return absl::OkStatus();
  }
  bool Contains(const std::string& name) const { return where_.count(name) > 0; }
  absl::StatusOr<SafetensorsTensor> Get(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end())
      return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing"));
    return it->second->Get(name);
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, SafetensorsFile*> where_;
};

absl::Status CheckShape(const SafetensorsTensor& t, std::vector<int64_t> want) {
  if (t.shape != want) {
    std::string got, exp;
    for (int64_t d : t.shape) absl::StrAppend(&got, got.empty() ? "" : ", ", d);
    for (int64_t d : want) absl::StrAppend(&exp, exp.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(absl::StrCat("'", t.name, "' has shape [", got,
                                                   "], expected [", exp, "] from config.json"));
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("'", t.name, "' has dtype ",
                                                   std::string(DTypeName(t.dtype)),
                                                   ", expected F32, F16 or BF16"));
  }
  return absl::OkStatus();
}

absl::Status FillMatrix(const Shards& s, const std::string& name, int64_t rows, int64_t cols,
                        WeightStorage storage, FrozenMatrix* m) {
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, s.Get(name));
  FEDLORA_RETURN_IF_ERROR(CheckShape(t, {rows, cols}));
  if (t.dtype == DType::kBF16 && storage != WeightStorage::kF32) {
    std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
    std::memcpy(bits.data(), t.data, bits.size() * sizeof(uint16_t));
    m->SetBF16(rows, cols, std::move(bits), storage);
  } else {
    FEDLORA_ASSIGN_OR_RETURN(std::vector<float> values, t.ToF32());
    m->SetF32(rows, cols, std::move(values), storage);
  }
  return absl::OkStatus();
}

absl::Status FillVector(const Shards& s, const std::string& name, int64_t n,
                        std::vector<float>* v) {
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, s.Get(name));
  FEDLORA_RETURN_IF_ERROR(CheckShape(t, {n}));
  FEDLORA_ASSIGN_OR_RETURN(*v, t.ToF32());
  return absl::OkStatus();
}

// --- GGUF ----------------------------------------------------------------------------------------

// GGUF metadata -> DecoderConfig (the keys llama.cpp's converter writes for llama and qwen2).
absl::StatusOr<DecoderConfig> ConfigFromGguf(const GgufFile& f) {
  FEDLORA_ASSIGN_OR_RETURN(std::string_view arch_view, f.GetString("general.architecture"));
  const std::string arch(arch_view);
  if (arch != "llama" && arch != "qwen2") {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": general.architecture \"", arch,
                     "\" is not a decoder fedlora reads (llama, qwen2)"));
  }
  DecoderConfig c;
  c.model_type = arch;
  c.qkv_bias = arch == "qwen2";
  auto u = [&](const std::string& key) -> absl::StatusOr<int64_t> {
    FEDLORA_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(arch + "." + key));
    if (v > (uint64_t{1} << 40))
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", arch, ".", key, " = ", v));
    return static_cast<int64_t>(v);
  };
  FEDLORA_ASSIGN_OR_RETURN(c.num_hidden_layers, u("block_count"));
  FEDLORA_ASSIGN_OR_RETURN(c.hidden_size, u("embedding_length"));
  FEDLORA_ASSIGN_OR_RETURN(c.intermediate_size, u("feed_forward_length"));
  FEDLORA_ASSIGN_OR_RETURN(c.num_attention_heads, u("attention.head_count"));
  c.num_key_value_heads = c.num_attention_heads;
  if (f.Has(arch + ".attention.head_count_kv")) {
    FEDLORA_ASSIGN_OR_RETURN(c.num_key_value_heads, u("attention.head_count_kv"));
  }
  FEDLORA_ASSIGN_OR_RETURN(c.max_position_embeddings, u("context_length"));
  FEDLORA_ASSIGN_OR_RETURN(c.rms_norm_eps, f.GetFloat(arch + ".attention.layer_norm_rms_epsilon"));
  c.rope_theta = 10000.0;
  if (f.Has(arch + ".rope.freq_base")) {
    FEDLORA_ASSIGN_OR_RETURN(c.rope_theta, f.GetFloat(arch + ".rope.freq_base"));
  }
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (f.Has(arch + ".attention.key_length")) {
    FEDLORA_ASSIGN_OR_RETURN(c.head_dim, u("attention.key_length"));
  }
  if (f.Has(arch + ".attention.value_length")) {
    FEDLORA_ASSIGN_OR_RETURN(int64_t vl, u("attention.value_length"));
    if (vl != c.head_dim)
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": value_length ", vl, " != key_length ", c.head_dim));
  }
  if (f.Has(arch + ".rope.dimension_count")) {
    FEDLORA_ASSIGN_OR_RETURN(int64_t rd, u("rope.dimension_count"));
    if (rd != c.head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": partial rotary embeddings (rope.dimension_count ", rd,
                       " of head_dim ", c.head_dim, ") are not supported"));
    }
  }
  for (const char* key : {".rope.scaling.type", ".rope.scaling.factor"}) {
    if (f.Has(arch + key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.path(), ": ", arch, key, ": rope scaling is not supported"));
    }
  }
  if (f.Has(arch + ".vocab_size")) {
    FEDLORA_ASSIGN_OR_RETURN(c.vocab_size, u("vocab_size"));
  } else {
    FEDLORA_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
    c.vocab_size = static_cast<int64_t>(tokens.size());
  }
  c.tie_word_embeddings = !f.Contains("output.weight");
  if (f.Has("tokenizer.ggml.bos_token_id")) {
    FEDLORA_ASSIGN_OR_RETURN(c.bos_token_id, f.GetInt("tokenizer.ggml.bos_token_id"));
  }
  if (f.Has("tokenizer.ggml.padding_token_id")) {
    FEDLORA_ASSIGN_OR_RETURN(c.pad_token_id, f.GetInt("tokenizer.ggml.padding_token_id"));
  }
  if (f.Has("tokenizer.ggml.eos_token_id")) {
    FEDLORA_ASSIGN_OR_RETURN(int64_t eos, f.GetInt("tokenizer.ggml.eos_token_id"));
    c.eos_token_ids = {eos};
  }
  FEDLORA_RETURN_IF_ERROR_CTX(c.Validate(), f.path());
  return c;
}

absl::Status FillMatrixGguf(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols,
                            WeightStorage storage, int64_t unpermute_head_dim, FrozenMatrix* m) {
  FEDLORA_ASSIGN_OR_RETURN(GgufTensor t, f.Get(name));
  if (t.ne.size() != 2 || t.ne[0] != cols || t.ne[1] != rows) {
    std::string ne;
    for (int64_t d : t.ne) absl::StrAppend(&ne, ne.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": '", name, "' has ne [", ne,
                                                   "], expected [", cols, ", ", rows,
                                                   "] (innermost first) from the metadata"));
  }
  const int64_t row_bytes = t.row_bytes();
  // from[r]: the GGUF row holding Hugging Face row r (quantized rows move whole: blocks run along a row).
  std::vector<int64_t> from(rows);
  for (int64_t g = 0; g < rows; ++g)
    from[unpermute_head_dim > 0 ? HfRowOfGgufRow(g, unpermute_head_dim) : g] = g;
  const bool keep_quant = (storage == WeightStorage::kAsStored && t.type != GgmlType::kF32 &&
                           t.type != GgmlType::kF16 && t.type != GgmlType::kBF16) ||
                          (storage == WeightStorage::kQ8_0 && t.type == GgmlType::kQ8_0);
  if (keep_quant) {
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(bytes.data() + r * row_bytes, t.data + from[r] * row_bytes, row_bytes);
    return m->SetQuantized(t.type, rows, cols, std::move(bytes));
  }
  if (t.type == GgmlType::kBF16 && storage != WeightStorage::kF32) {
    std::vector<uint16_t> bits(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(bits.data() + r * cols, t.data + from[r] * row_bytes, row_bytes);
    m->SetBF16(rows, cols, std::move(bits), storage);
    return absl::OkStatus();
  }
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    FEDLORA_RETURN_IF_ERROR(t.DequantizeRows(from[r], 1, v.data() + r * cols));
  m->SetF32(rows, cols, std::move(v), storage);
  return absl::OkStatus();
}

absl::Status FillVectorGguf(const GgufFile& f, const std::string& name, int64_t n,
                            int64_t unpermute_head_dim, std::vector<float>* v) {
  FEDLORA_ASSIGN_OR_RETURN(GgufTensor t, f.Get(name));
  if (t.ne.size() != 1 || t.ne[0] != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": '", name, "' is not a vector of ", n));
  }
  std::vector<float> raw(static_cast<size_t>(n));
  FEDLORA_RETURN_IF_ERROR(t.DequantizeRows(0, 1, raw.data()));
  v->assign(static_cast<size_t>(n), 0.0f);
  for (int64_t g = 0; g < n; ++g)
    (*v)[unpermute_head_dim > 0 ? HfRowOfGgufRow(g, unpermute_head_dim) : g] = raw[g];
  return absl::OkStatus();
}

const char* GgufName(DecoderTarget t) {
  static constexpr const char* kNames[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                           "ffn_gate", "ffn_up", "ffn_down"};
  return kNames[static_cast<int>(t)];
}

}  // namespace

int64_t HfRowOfGgufRow(int64_t row, int64_t head_dim) {
  const int64_t h = row / head_dim, within = row % head_dim;
  return h * head_dim + (within % 2) * (head_dim / 2) + within / 2;
}

absl::StatusOr<std::shared_ptr<const DecoderBase>> LoadDecoderSafetensors(
    const std::string& dir, const DecoderOptions& options) {
  const WeightStorage storage = options.weights;
  FEDLORA_ASSIGN_OR_RETURN(DecoderConfig c, ReadDecoderConfig(dir + "/config.json"));
  Shards s;
  FEDLORA_RETURN_IF_ERROR(s.Open(dir));
  auto w = std::make_unique<DecoderBase::Weights>();
  const int64_t h = c.hidden_size;
  FEDLORA_RETURN_IF_ERROR(
      FillMatrix(s, "model.embed_tokens.weight", c.vocab_size, h, storage, &w->embed));
  FEDLORA_RETURN_IF_ERROR(FillVector(s, "model.norm.weight", h, &w->final_norm));
  if (s.Contains("lm_head.weight") && !c.tie_word_embeddings) {
    FEDLORA_RETURN_IF_ERROR(FillMatrix(s, "lm_head.weight", c.vocab_size, h, storage, &w->lm_head));
  } else if (!c.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": lm_head.weight is missing and tie_word_embeddings is false"));
  }
  w->layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    DecoderLayerWeights& lw = w->layers[l];
    FEDLORA_RETURN_IF_ERROR(FillVector(s, p + "input_layernorm.weight", h, &lw.input_norm));
    FEDLORA_RETURN_IF_ERROR(
        FillVector(s, p + "post_attention_layernorm.weight", h, &lw.post_attention_norm));
    for (DecoderTarget t : kAllTargets) {
      int64_t out, in;
      DecoderBase::Weights::Shape(c, t, &out, &in);
      FrozenLinear& lin = lw.proj[static_cast<int>(t)];
      FEDLORA_RETURN_IF_ERROR(
          FillMatrix(s, p + DecoderTargetPath(t) + ".weight", out, in, storage, &lin.w));
      if (HasBias(c, t))
        FEDLORA_RETURN_IF_ERROR(FillVector(s, p + DecoderTargetPath(t) + ".bias", out, &lin.bias));
    }
  }
  return MakeDecoderBase(std::move(c), std::move(w), options.bf16_math, options.int8_math);
}

absl::StatusOr<std::shared_ptr<const DecoderBase>> LoadDecoderGguf(const std::string& path,
                                                                   const DecoderOptions& options) {
  const WeightStorage storage = options.weights;
  FEDLORA_ASSIGN_OR_RETURN(auto f, GgufFile::Open(path));
  FEDLORA_ASSIGN_OR_RETURN(DecoderConfig c, ConfigFromGguf(*f));
  auto w = std::make_unique<DecoderBase::Weights>();
  const int64_t h = c.hidden_size;
  const bool llama = c.model_type == "llama";  // only the LLaMA converter permutes Q and K
  FEDLORA_RETURN_IF_ERROR(
      FillMatrixGguf(*f, "token_embd.weight", c.vocab_size, h, storage, 0, &w->embed));
  FEDLORA_RETURN_IF_ERROR(FillVectorGguf(*f, "output_norm.weight", h, 0, &w->final_norm));
  if (!c.tie_word_embeddings) {
    FEDLORA_RETURN_IF_ERROR(
        FillMatrixGguf(*f, "output.weight", c.vocab_size, h, storage, 0, &w->lm_head));
  }
  w->layers.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    DecoderLayerWeights& lw = w->layers[l];
    FEDLORA_RETURN_IF_ERROR(FillVectorGguf(*f, p + "attn_norm.weight", h, 0, &lw.input_norm));
    FEDLORA_RETURN_IF_ERROR(
        FillVectorGguf(*f, p + "ffn_norm.weight", h, 0, &lw.post_attention_norm));
    for (DecoderTarget t : kAllTargets) {
      int64_t out, in;
      DecoderBase::Weights::Shape(c, t, &out, &in);
      const bool permuted = llama && (t == DecoderTarget::kQProj || t == DecoderTarget::kKProj);
      FrozenLinear& lin = lw.proj[static_cast<int>(t)];
      FEDLORA_RETURN_IF_ERROR(FillMatrixGguf(*f, p + GgufName(t) + ".weight", out, in, storage,
                                             permuted ? c.head_dim : 0, &lin.w));
      if (HasBias(c, t)) {
        FEDLORA_RETURN_IF_ERROR(FillVectorGguf(*f, p + GgufName(t) + ".bias", out,
                                               permuted ? c.head_dim : 0, &lin.bias));
      }
    }
  }
  return MakeDecoderBase(std::move(c), std::move(w), options.bf16_math, options.int8_math);
}

bool IsGgufPath(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

bool IsDecoderCheckpoint(const std::string& path) {
  if (IsGgufPath(path)) return true;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  absl::StatusOr<nlohmann::json> config = ReadJsonFile(path + "/config.json");
  return config.ok() && IsDecoderConfig(*config);
}

absl::StatusOr<DecoderConfig> ReadDecoderCheckpointConfig(const std::string& path) {
  if (!IsGgufPath(path)) return ReadDecoderConfig(path + "/config.json");
  FEDLORA_ASSIGN_OR_RETURN(auto f, GgufFile::Open(path));
  return ConfigFromGguf(*f);
}

std::string DecoderWeightsFile(const std::string& path) {
  return IsGgufPath(path) ? path : path + "/model.safetensors";
}

}  // namespace fedlora
