// A trainable parameter: the unit that optimizers update, adapters export and federated updates
// carry. Only LoRA matrices and the task head are trainable; frozen base weights never appear here.
// A LoRA A frozen by LoraOptions::freeze_a (FFA-LoRA) stays among them, as part of the adapter,
// with `frozen` set: no gradient, no optimizer step, not in a federated update.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fedlora {

struct Param {
  // PEFT-style name, e.g. "base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight"
  // or "base_model.model.classifier.weight".
  std::string name;
  std::vector<int64_t> shape;  // row-major, PyTorch convention ([out, in] for linear weights)
  std::vector<float> value;    // fp32 master copy, size = product(shape)
  std::vector<float> grad;     // same size as value; accumulated by backward, cleared by ZeroGrad
  bool is_lora = false;        // true for lora_A / lora_B, false for the task head
  bool frozen = false;         // kept at its value: the backward and the optimizers skip it

  int64_t numel() const { return static_cast<int64_t>(value.size()); }
};

}  // namespace fedlora
