#include "model/gguf_lora.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/decoder.h"
#include "model/decoder_weights.h"
#include "model/peft.h"

namespace fedlora {
namespace {

constexpr char kPrefix[] = "base_model.model.model.layers.";
constexpr const char* kGgufNames[kNumDecoderTargets] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

// Where a PEFT tensor name points: layer, projection, and A (true) or B.
struct LoraSlot {
  int64_t layer = 0;
  DecoderTarget target = DecoderTarget::kQProj;
  bool is_a = true;
};

absl::StatusOr<LoraSlot> ParseName(const std::string& name) {
  const absl::Status refuse = absl::InvalidArgumentError(absl::StrCat(
      "adapter tensor '", name,
      "' is not LoRA on a decoder projection (model.layers.N.self_attn.{q,k,v,o}_proj or "
      "model.layers.N.mlp.{gate,up,down}_proj): llama.cpp's GGUF LoRA has no name for it"));
  if (name.rfind(kPrefix, 0) != 0) return refuse;
  const std::string rest = name.substr(sizeof(kPrefix) - 1);
  const size_t dot = rest.find('.');
  LoraSlot slot;
  if (dot == std::string::npos || !absl::SimpleAtoi(rest.substr(0, dot), &slot.layer) ||
      slot.layer < 0)
    return refuse;
  const std::string module = rest.substr(dot + 1);
  for (int i = 0; i < kNumDecoderTargets; ++i) {
    const std::string path = DecoderTargetPath(static_cast<DecoderTarget>(i));
    for (bool a : {true, false}) {
      if (module == path + (a ? ".lora_A.weight" : ".lora_B.weight")) {
        slot.target = static_cast<DecoderTarget>(i);
        slot.is_a = a;
        return slot;
      }
    }
  }
  return refuse;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// B's rows in llama.cpp's order for LLaMA's q_proj / k_proj (HfRowOfGgufRow).
std::vector<float> PermuteRows(const std::vector<float>& b, int64_t rows, int64_t cols,
                               int64_t head_dim) {
  std::vector<float> out(b.size());
  for (int64_t g = 0; g < rows; ++g) {
    std::memcpy(out.data() + g * cols, b.data() + HfRowOfGgufRow(g, head_dim) * cols,
                cols * sizeof(float));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<AdapterTensor>> ReadAdapterTensors(const std::string& dir) {
  FEDLORA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(dir + "/" + kPeftWeightsFile));
  std::vector<AdapterTensor> out;
  for (const std::string& name : file->names()) {
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get(name));
    AdapterTensor a{name, t.shape, std::vector<float>(static_cast<size_t>(t.numel()))};
    if (absl::Status copied = t.CopyToF32(a.values.data()); !copied.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": ", copied.message()));
    }
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<GgufWriter> GgufLoraFromPeft(const std::vector<AdapterTensor>& tensors,
                                            GgufLoraScale scale, const DecoderConfig& base) {
  if (scale.rank < 1 || !std::isfinite(scale.alpha) || scale.alpha <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank ", scale.rank, " and alpha ", scale.alpha, ": both must be > 0"));
  }
  // (layer, target) -> {A, B}, in llama.cpp's tensor order.
  std::map<std::pair<int64_t, int>, std::pair<const AdapterTensor*, const AdapterTensor*>> pairs;
  for (const AdapterTensor& t : tensors) {
    FEDLORA_ASSIGN_OR_RETURN(LoraSlot slot, ParseName(t.name));
    if (slot.layer >= base.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", t.name, "': layer ",
                                                     slot.layer, ", the base model has ",
                                                     base.num_hidden_layers, " layers"));
    }
    int64_t out = 0, in = 0;
    DecoderBase::Weights::Shape(base, slot.target, &out, &in);
    const std::vector<int64_t> want =
        slot.is_a ? std::vector<int64_t>{scale.rank, in} : std::vector<int64_t>{out, scale.rank};
    if (t.shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter tensor '", t.name, "' has shape ", ShapeText(t.shape),
                       ", expected ", ShapeText(want), " (rank ", scale.rank,
                       ") for the base model: an adapter of another base or rank"));
    }
    for (float v : t.values) {
      if (!std::isfinite(v))
        return absl::InvalidArgumentError(
            absl::StrCat("adapter tensor '", t.name, "' has a non-finite value"));
    }
    auto& pair = pairs[{slot.layer, static_cast<int>(slot.target)}];
    (slot.is_a ? pair.first : pair.second) = &t;
  }
  if (pairs.empty()) return absl::InvalidArgumentError("the adapter holds no LoRA tensor");
  GgufWriter w;
  w.AddString("general.architecture", base.model_type);
  w.AddString("general.type", "adapter");
  w.AddUint32("general.file_type", 0);  // all F32
  w.AddString("adapter.type", "lora");
  w.AddFloat32("adapter.lora.alpha", scale.alpha);
  const bool llama = base.model_type == "llama";  // only the LLaMA converter reorders Q and K rows
  for (const auto& [key, pair] : pairs) {
    const auto& [a, b] = pair;
    const DecoderTarget target = static_cast<DecoderTarget>(key.second);
    if (a == nullptr || b == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor '", (a ? a : b)->name,
                                                     "' has no ", a ? "lora_B" : "lora_A",
                                                     " beside it"));
    }
    const std::string name =
        absl::StrCat("blk.", key.first, ".", kGgufNames[key.second], ".weight");
    FEDLORA_RETURN_IF_ERROR(w.AddTensorF32(name + ".lora_a", a->shape, a->values));
    const bool permute =
        llama && (target == DecoderTarget::kQProj || target == DecoderTarget::kKProj);
    FEDLORA_RETURN_IF_ERROR(w.AddTensorF32(
        name + ".lora_b", b->shape,
        permute ? PermuteRows(b->values, b->shape[0], b->shape[1], base.head_dim) : b->values));
  }
  return w;
}

absl::Status WriteGgufLora(const std::vector<AdapterTensor>& tensors, GgufLoraScale scale,
                           const std::string& base_model, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(base_model, ec)) {
    return absl::NotFoundError(absl::StrCat("base model ", base_model, " not found"));
  }
  if (!IsDecoderCheckpoint(base_model)) {
    return absl::InvalidArgumentError(
        absl::StrCat("base model ", base_model,
                     " is not a decoder (LLaMA or Qwen2; an encoder's adapter does not convert): "
                     "llama.cpp's --lora applies "
                     "LoRA to decoders"));
  }
  FEDLORA_ASSIGN_OR_RETURN(DecoderConfig config, ReadDecoderCheckpointConfig(base_model));
  absl::StatusOr<GgufWriter> w = GgufLoraFromPeft(tensors, scale, config);
  if (!w.ok())
    return absl::Status(w.status().code(), absl::StrCat(path, ": ", w.status().message()));
  const std::filesystem::path parent = std::filesystem::absolute(path, ec).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", parent.string(), ": ", ec.message()));
  return w->WriteFile(path);
}

}  // namespace fedlora
