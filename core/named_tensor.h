// One named fp32 tensor, row-major: a LoRA adapter's parameter or its change. The one adapter tensor
// type from the SDK's public header (fedlora/client_trainer.h) through the codecs
// (compression/codec.h's UpdateTensor) to the server, so nothing is copied field by field between
// them. Plain standard types only: the SDK's public headers include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fedlora {

struct NamedTensor {
  std::string name;  // PEFT-style name, e.g. "...layer.0.attention.self.query.lora_A.weight"
  std::vector<int64_t> shape;
  std::vector<float> values;  // product(shape) values
};

}  // namespace fedlora
