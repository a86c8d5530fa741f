// Helper for decoder_reference_test.py: runs fedlora's decoder and writes what it computed to a
// safetensors file, for comparison with transformers' LlamaForCausalLM / Qwen2ForCausalLM + PEFT.
//
//   decoder_reference_dump MODEL IN.safetensors OUT.safetensors [--recompute] [--generate N]
//                          [--save-adapter DIR]
//
// MODEL: a checkpoint directory or a .gguf file (weights kept as stored). IN holds the batch
// (input_ids, attention_mask, labels: I32 [B, S]), the LoRA options (lora_rank, lora_alpha: F32
// [1]) and "value/NAME" for the trainable params to overwrite (LoRA on all seven projections;
// the others keep their initialisation).
// OUT: logits [B, S, V], loss [1], "grad/NAME" for every param; with --generate N, also greedy
// continuations of row 0's unpadded tokens with and without the KV cache (generated_cached,
// generated_uncached: I32). --save-adapter writes the adapter (as set from IN) in PEFT's layout.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "model/adapter_dir.h"
#include "model/decoder.h"

namespace fedlora {
namespace {

template <class T>
absl::StatusOr<std::vector<T>> Read(const SafetensorsFile& f, const std::string& name, DType dt) {
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, f.Get(name));
  if (t.dtype != dt) return absl::InvalidArgumentError(name + ": unexpected dtype");
  std::vector<T> v(t.size / sizeof(T));
  std::memcpy(v.data(), t.data, t.size);
  return v;
}

absl::Status Run(const std::string& model, const std::string& in_path, const std::string& out_path,
                 bool recompute, int generate, const std::string& adapter_dir) {
  FEDLORA_ASSIGN_OR_RETURN(auto in, SafetensorsFile::Open(in_path));
  FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor ids_t, in->Get("input_ids"));
  const int B = static_cast<int>(ids_t.shape[0]), S = static_cast<int>(ids_t.shape[1]);
  CausalLm::Batch batch;
  batch.batch_size = B;
  batch.seq_len = S;
  FEDLORA_ASSIGN_OR_RETURN(batch.input_ids, Read<int32_t>(*in, "input_ids", DType::kI32));
  FEDLORA_ASSIGN_OR_RETURN(batch.attention_mask, Read<int32_t>(*in, "attention_mask", DType::kI32));
  FEDLORA_ASSIGN_OR_RETURN(batch.labels, Read<int32_t>(*in, "labels", DType::kI32));
  FEDLORA_ASSIGN_OR_RETURN(auto rank, Read<float>(*in, "lora_rank", DType::kF32));
  FEDLORA_ASSIGN_OR_RETURN(auto alpha, Read<float>(*in, "lora_alpha", DType::kF32));

  DecoderOptions o;
  o.lora.rank = static_cast<int>(rank[0]);
  o.lora.alpha = alpha[0];
  o.max_batch = B;
  o.max_seq = S + generate;
  o.recompute_activations = recompute;
  FEDLORA_ASSIGN_OR_RETURN(auto lm, CausalLm::Load(model, o));
  for (Param& p : lm->trainable_params()) {
    if (!in->Contains("value/" + p.name)) continue;  // keeps PEFT's initialisation (B = 0)
    FEDLORA_ASSIGN_OR_RETURN(auto v, Read<float>(*in, "value/" + p.name, DType::kF32));
    if (v.size() != p.value.size()) return absl::InvalidArgumentError(p.name + ": size mismatch");
    p.value = v;
  }
  // The reference test reads the PEFT files only; the template name is a placeholder it ignores.
  if (!adapter_dir.empty()) {
    FEDLORA_RETURN_IF_ERROR(SaveAdapterDirectory(*lm,
                                                 {.task = AdapterTask::kCausalLm,
                                                  .base_model = model,
                                                  .max_seq_len = o.max_seq,
                                                  .chat_template = "chatml"},
                                                 adapter_dir));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> logits, lm->Logits(batch));
  lm->ZeroGrad();
  FEDLORA_ASSIGN_OR_RETURN(float loss, lm->ForwardBackward(batch, /*dropout_seed=*/1));
  FEDLORA_ASSIGN_OR_RETURN(CausalLm::LossSum eval, lm->Evaluate(batch));

  std::vector<SafetensorsTensorToWrite> out;
  const int64_t V = lm->config().vocab_size;
  out.push_back({"logits", DType::kF32, {B, S, V}, logits.data(), logits.size() * sizeof(float)});
  std::vector<float> loss_v = {loss}, eval_v = {static_cast<float>(eval.nll / eval.tokens)};
  out.push_back({"loss", DType::kF32, {1}, loss_v.data(), sizeof(float)});
  out.push_back({"eval_loss", DType::kF32, {1}, eval_v.data(), sizeof(float)});
  std::vector<std::string> names;
  for (const Param& p : lm->trainable_params()) names.push_back("grad/" + p.name);
  for (size_t i = 0; i < names.size(); ++i) {
    const Param& p = lm->trainable_params()[i];
    out.push_back({names[i], DType::kF32, p.shape, p.grad.data(), p.grad.size() * sizeof(float)});
  }
  std::vector<int32_t> cached, uncached;
  if (generate > 0) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < S && batch.attention_mask[j] == 1; ++j)
      prompt.push_back(batch.input_ids[j]);
    CausalLm::GenerateOptions go;
    go.max_new_tokens = generate;
    FEDLORA_ASSIGN_OR_RETURN(cached, lm->Generate(prompt, go));
    go.use_cache = false;
    FEDLORA_ASSIGN_OR_RETURN(uncached, lm->Generate(prompt, go));
    out.push_back({"generated_cached",
                   DType::kI32,
                   {static_cast<int64_t>(cached.size())},
                   cached.data(),
                   cached.size() * sizeof(int32_t)});
    out.push_back({"generated_uncached",
                   DType::kI32,
                   {static_cast<int64_t>(uncached.size())},
                   uncached.data(),
                   uncached.size() * sizeof(int32_t)});
  }
  return WriteSafetensors(out_path, out, {});
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: decoder_reference_dump MODEL IN.safetensors OUT.safetensors [--recompute] "
                 "[--generate N] [--save-adapter DIR]\n");
    return 2;
  }
  bool recompute = false;
  int generate = 0;
  std::string adapter_dir;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--recompute") {
      recompute = true;
    } else if (a == "--save-adapter" && i + 1 < argc) {
      adapter_dir = argv[++i];
    } else if (a == "--generate" && i + 1 < argc && absl::SimpleAtoi(argv[i + 1], &generate) &&
               generate >= 0) {
      ++i;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const absl::Status st = fedlora::Run(argv[1], argv[2], argv[3], recompute, generate, adapter_dir);
  if (!st.ok()) {
    std::fprintf(stderr, "decoder_reference_dump: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
