// PEFT-compatible LoRA adapter files (Hugging Face peft), so that an adapter trained here loads
// with `PeftModel.from_pretrained(base, dir)` and one trained with PEFT loads here.
//
//   FEDLORA_RETURN_IF_ERROR(LoadPeftAdapter("out/adapter", model.get()));
//
// Writing goes through model/adapter_dir.h (SaveAdapterDirectory), which adds what fedlora
// records beside PEFT's two files (label names, max_seq_len, prompt settings).
//
// A directory holds adapter_config.json (peft_type LORA, task_type SEQ_CLS, r, lora_alpha,
// lora_dropout, target_modules, modules_to_save ["classifier"], base_model_name_or_path, bias
// "none", fan_in_fan_out false, inference_mode true) and adapter_model.safetensors with PEFT's
// saved names, i.e. the module path with the adapter name ("default") removed:
//   base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight   [r, in]
//   base_model.model.bert.encoder.layer.0.attention.self.query.lora_B.weight   [out, r]
//   base_model.model.classifier.weight / .bias                                 (modules_to_save)
// (RoBERTa: base_model.model.roberta.encoder..., and classifier.dense.* / classifier.out_proj.*).
// These are the Param::name of BertClassifier::trainable_params(). The values are written as F32.
//
// Decoders (CausalLm): task_type CAUSAL_LM, target_modules the projection names ("q_proj", ...,
// "down_proj"), no modules_to_save; tensors as transformers' LlamaForCausalLM wrapped by PEFT saves
// them: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight [r, in], ...
//
// Loading refuses the PEFT settings fedlora does not implement (use_rslora, use_dora,
// alpha_pattern, rank_pattern, layers_to_transform, layers_pattern, layer_replication, loftq,
// megatron, fan_in_fan_out, bias other than "none") instead of loading them with a wrong scale.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/bert.h"
#include "model/decoder.h"

namespace fedlora {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

// The adapter_config.json object for `model` (exposed for tests and for the export tool).
// target_modules is a list of module-name suffixes, as PEFT matches them; when the FFN
// "output.dense" is targeted without "attention.output.dense" (a suffix match cannot tell them
// apart), it is a regular expression that PEFT full-matches instead.
nlohmann::json PeftAdapterConfig(const BertClassifier& model);

// The same object from the LoRA settings alone (no model loaded: `fedlora export`), equal to
// PeftAdapterConfig of a model built with them. InvalidArgument for an unknown target module.
absl::StatusOr<nlohmann::json> PeftEncoderAdapterConfig(const LoraOptions& lora,
                                                        const std::string& base_model);
absl::StatusOr<nlohmann::json> PeftDecoderAdapterConfig(const LoraOptions& lora,
                                                        const std::string& base_model);

// Reads both files and replaces the values of every trainable param. The adapter must match the
// model exactly: InvalidArgument naming the difference for another peft_type or task_type, r,
// lora_alpha, target_modules, a missing or extra tensor, or a wrong shape; NotFound for a missing
// file. F32, F16 and BF16 tensors are accepted. On error the model is unchanged.
absl::Status LoadPeftAdapter(const std::string& dir, BertClassifier* model);

// The LoRA options an adapter directory was trained with (r, lora_alpha, lora_dropout and a list
// of target_modules), after the same refusals as LoadPeftAdapter; for building the model to load
// it into. InvalidArgument for a regular-expression target_modules.
absl::StatusOr<LoraOptions> ReadPeftLoraOptions(const std::string& dir);

// The same for decoders.
nlohmann::json PeftAdapterConfig(const CausalLm& model);
absl::Status LoadPeftAdapter(const std::string& dir, CausalLm* model);

}  // namespace fedlora
