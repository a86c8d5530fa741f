// A decoder's PEFT LoRA adapter as a GGUF LoRA file that llama.cpp loads with `--lora`, in the
// format of llama.cpp's convert_lora_to_gguf.py and its loader (src/llama-adapter.cpp):
//
//   metadata   general.type "adapter", adapter.type "lora", adapter.lora.alpha (FLOAT32, PEFT's
//              lora_alpha), general.architecture the base's ("llama" or "qwen2"; llama.cpp
//              refuses an adapter of another architecture than its model), general.file_type 0.
//   tensors    blk.N.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight.lora_a
//              and .lora_b, F32: lora_a is PEFT's lora_A [r, in] and lora_b its lora_B [out, r]
//              as they are (ggml ne [in, r] and [r, out]).
//   scaling    llama.cpp adds scale * alpha / r * lora_b @ lora_a (r: lora_b's ne[0]; scale:
//              --lora's 1, --lora-scaled's S), which is PEFT's lora_alpha / r at scale 1.
//   LLaMA Q/K  llama.cpp's converter reorders the rows of LLaMA's q_proj and k_proj per head
//              (model/decoder_load.cc reads them back); lora_b of attn_q and attn_k gets the same
//              row order, so the delta lands on the rows llama.cpp holds. Qwen2 keeps HF's order.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto tensors, ReadAdapterTensors("runs/sft/adapter"));
//   FEDLORA_RETURN_IF_ERROR(WriteGgufLora(tensors, {.rank = 8, .alpha = 16}, "models/smollm2.gguf",
//                                         "sft-lora.gguf"));
//   // llama-cli -m models/smollm2.gguf --lora sft-lora.gguf
//
// Only LoRA on the seven decoder projections converts: an encoder's adapter, a classifier head,
// modules_to_save or any other tensor is refused, naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/named_tensor.h"
#include "model/decoder_config.h"
#include "model/gguf_writer.h"

namespace fedlora {

// One tensor of an adapter, as fp32, shape outermost first.
using AdapterTensor = NamedTensor;

// The rank and alpha every LoRA pair of the adapter has (adapter_config.json's r and lora_alpha).
struct GgufLoraScale {
  int rank = 0;
  float alpha = 0.0f;
};

// An adapter directory's adapter_model.safetensors, every tensor as fp32 (F32, F16 and BF16
// accepted). NotFound for a missing file; InvalidArgument naming a tensor of another dtype.
absl::StatusOr<std::vector<AdapterTensor>> ReadAdapterTensors(const std::string& dir);

// The GGUF image's contents for a base of architecture `base`. InvalidArgument, naming the tensor,
// for a tensor that is not LoRA on a decoder projection, a layer the base does not have, a
// shape other than [rank, in] / [out, rank] for the base, a lora_A without its lora_B (or the
// reverse), a non-finite value, or no LoRA tensor at all.
absl::StatusOr<GgufWriter> GgufLoraFromPeft(const std::vector<AdapterTensor>& tensors,
                                            GgufLoraScale scale, const DecoderConfig& base);

// Reads the base model's architecture (a .gguf, or a safetensors directory with config.json) and
// writes `path` atomically (its directory created; a file there replaced). InvalidArgument for a base that is not a decoder (an encoder's adapter:
// llama.cpp's --lora is for decoders); GgufLoraFromPeft's errors, naming `path`.
absl::Status WriteGgufLora(const std::vector<AdapterTensor>& tensors, GgufLoraScale scale,
                           const std::string& base_model, const std::string& path);

}  // namespace fedlora
