// An adapter folded into its base: a Hugging Face model directory that transformers loads with no
// PEFT (`fedlora merge`).
//
//   FEDLORA_RETURN_IF_ERROR(MergeAdapter("runs/x/adapter", "", "runs/x/merged"));
//   // AutoModelForSequenceClassification.from_pretrained("runs/x/merged")  (or ForCausalLM)
//
// Every LoRA pair adds lora_alpha / r * B @ A to its base weight, computed in fp32 and stored in
// the base tensor's dtype (as PEFT's merge_and_unload and save_pretrained do); PEFT's
// modules_to_save (a classifier's head) replace or add their tensors; every other base tensor is
// copied as it is. The directory holds model.safetensors (one file), config.json and the base's
// tokenizer and generation files. A classifier's config.json gets its architecture
// (BertForSequenceClassification, RobertaForSequenceClassification, ...) and labels.json's
// id2label / label2id, and its tensors the "bert." / "roberta." prefix a BertModel checkpoint
// lacks. Written whole into a temporary sibling and renamed into place, as adapter directories
// are (model/adapter_dir.h); an existing merged model there is replaced, other directories never.
//
// A GGUF base is refused: its weights are quantized and it has no Hugging Face config or tokenizer
// files to write beside them; `fedlora export --gguf` gives llama.cpp the adapter instead.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace fedlora {

// Merges adapter directory `adapter_dir` into its base (`model_path` when given, else the base
// its fedlora_adapter.json or adapter_config.json records) and writes `out_dir`. NotFound for a
// missing file or base; InvalidArgument naming the problem for PEFT settings fedlora does not
// implement, an adapter tensor the base has no weight for or of another shape, a classifier
// without labels.json or with a label count other than its head's rows, a GGUF base;
// FailedPrecondition for an `out_dir` that holds other files.
absl::Status MergeAdapter(const std::string& adapter_dir, const std::string& model_path,
                          const std::string& out_dir);

}  // namespace fedlora
