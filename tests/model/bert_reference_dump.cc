// Helper for bert_reference_test.py: runs the C++ model on a checkpoint and writes what it
// computed to a safetensors file, for comparison with the independent PyTorch implementation.
//
//   bert_reference_dump grad  CKPT_DIR OUT.safetensors [--bf16 | --bf16-math]
//       BERT or RoBERTa (from its config.json). LoRA on all six targets (r 4, alpha 8), dropout
//       off, B matrices set to nonzero values (PEFT's zero init would make every A gradient zero
//       and hide errors), one ForwardBackward on a fixed padded batch. Writes the batch (input_ids,
//       token_type_ids, attention_mask, labels, I32), logits, loss, mean_pooled, and "value/NAME"
//       and "grad/NAME" for every trainable param. --bf16 holds the base as bf16; --bf16-math also
//       multiplies in bf16, and writes bf16_math_active (1 where the CPU has bf16 dot products).
//   bert_reference_dump embed MODEL_DIR OUT.safetensors ID,ID,...
//       One unpadded sequence; writes mean_pooled and cls (the last hidden state's [CLS] row).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "kernels/gemm.h"
#include "model/bert.h"

namespace fedlora {
namespace {

struct Out {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DType> dtypes;
  std::vector<std::vector<char>> data;

  template <class T>
  void Add(const std::string& name, std::vector<int64_t> shape, const std::vector<T>& v, DType dt) {
    names.push_back(name);
    shapes.push_back(std::move(shape));
    dtypes.push_back(dt);
    data.emplace_back(reinterpret_cast<const char*>(v.data()),
                      reinterpret_cast<const char*>(v.data() + v.size()));
  }
  absl::Status Write(const std::string& path) const {
    std::vector<SafetensorsTensorToWrite> t;
    for (size_t i = 0; i < names.size(); ++i)
      t.push_back({names[i], dtypes[i], shapes[i], data[i].data(), data[i].size()});
    return WriteSafetensors(path, t, {});
  }
};

absl::Status Grad(const std::string& dir, const std::string& out_path, bool bf16, bool bf16_math) {
  ModelOptions o;
  o.num_labels = 3;
  o.lora.rank = 4;
  o.lora.alpha = 8.0f;
  o.lora.target_modules = {"query", "key", "value", "attn_out", "intermediate", "output"};
  o.hidden_dropout = 0.0f;
  o.attention_dropout = 0.0f;
  o.bf16_weights = bf16 || bf16_math;
  o.bf16_math = bf16_math;
  o.seed = 7;
  o.max_batch = 4;
  o.max_seq = 16;
  FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Load(dir, o));
  // Deterministic nonzero B: a smooth pattern of magnitude ~0.1, distinct per tensor.
  int tensor = 0;
  for (Param& p : model->trainable_params()) {
    ++tensor;
    if (p.name.find("lora_B") == std::string::npos) continue;
    for (size_t i = 0; i < p.value.size(); ++i)
      p.value[i] = 0.1f * std::sin(0.37f * i + 1.3f * tensor);
  }
  const int b = 3, s = 10;
  BertClassifier::Batch batch{b, s, {}, {}, {}, {0, 2, 1}};
  const int lens[3] = {10, 7, 4};  // rows 1 and 2 are padded
  for (int i = 0; i < b; ++i) {
    for (int j = 0; j < s; ++j) {
      const bool real = j < lens[i];
      // Real ids are >= 2, never the pad id (0 for BERT, 1 for RoBERTa, whose positions count
      // the non-pad ids); two segments where the model has token types.
      const int32_t pad = static_cast<int32_t>(model->config().pad_token_id);
      batch.input_ids.push_back(real ? (j == 0 ? 2 : 3 + (i * 31 + j * 17) % 95) : pad);
      const bool second = real && j >= lens[i] / 2 && model->config().type_vocab_size > 1;
      batch.token_type_ids.push_back(second ? 1 : 0);
      batch.attention_mask.push_back(real ? 1 : 0);
    }
  }
  model->ZeroGrad();
  FEDLORA_ASSIGN_OR_RETURN(float loss, model->ForwardBackward(batch, /*dropout_seed=*/0));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> logits, model->Logits(batch));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> pooled,
                           model->PooledEmbeddings(batch, Pooling::kMean));
  Out out;
  out.Add("input_ids", {b, s}, batch.input_ids, DType::kI32);
  out.Add("token_type_ids", {b, s}, batch.token_type_ids, DType::kI32);
  out.Add("attention_mask", {b, s}, batch.attention_mask, DType::kI32);
  out.Add("labels", {b}, batch.labels, DType::kI32);
  out.Add("logits", {b, o.num_labels}, logits, DType::kF32);
  out.Add("loss", {1}, std::vector<float>{loss}, DType::kF32);
  out.Add("mean_pooled", {b, model->config().hidden_size}, pooled, DType::kF32);
  out.Add("lora_scaling", {1}, std::vector<float>{o.lora.alpha / o.lora.rank}, DType::kF32);
  const int32_t active = bf16_math && kernels::Bf16MathAvailable() ? 1 : 0;
  out.Add("bf16_math_active", {1}, std::vector<int32_t>{active}, DType::kI32);
  for (const Param& p : model->trainable_params()) {
    out.Add("value/" + p.name, p.shape, p.value, DType::kF32);
    out.Add("grad/" + p.name, p.shape, p.grad, DType::kF32);
  }
  return out.Write(out_path);
}

absl::Status Embed(const std::string& dir, const std::string& out_path,
                   const std::string& ids_text) {
  BertClassifier::Batch batch;
  for (absl::string_view piece : absl::StrSplit(ids_text, ',')) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) return absl::InvalidArgumentError("bad token id list");
    batch.input_ids.push_back(id);
  }
  batch.batch_size = 1;
  batch.seq_len = static_cast<int>(batch.input_ids.size());
  ModelOptions o;
  o.max_batch = 1;
  o.max_seq = batch.seq_len;
  FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Load(dir, o));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> mean, model->PooledEmbeddings(batch, Pooling::kMean));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> cls, model->PooledEmbeddings(batch, Pooling::kCls));
  Out out;
  const int64_t h = model->config().hidden_size;
  out.Add("mean_pooled", {1, h}, mean, DType::kF32);
  out.Add("cls", {1, h}, cls, DType::kF32);
  return out.Write(out_path);
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  absl::Status status;
  const std::string flag = argc == 5 ? argv[4] : "";
  if (mode == "grad" && (argc == 4 || flag == "--bf16" || flag == "--bf16-math")) {
    status = fedlora::Grad(argv[2], argv[3], flag == "--bf16", flag == "--bf16-math");
  } else if (mode == "embed" && argc == 5) {
    status = fedlora::Embed(argv[2], argv[3], argv[4]);
  } else {
    std::fprintf(stderr, "usage: %s grad CKPT OUT [--bf16 | --bf16-math] | embed MODEL OUT IDS\n",
                 argv[0]);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
