// Test helper: the architecture of a tiny LLaMA-family decoder (2 layers, hidden 32, 4 query and
// 2 KV heads of 8, SwiGLU 64, vocab 64, 32 positions, tied embeddings) for DecoderBase::FromRandom.
#pragma once

#include "model/decoder_config.h"

namespace fedlora::testing_util {

inline DecoderConfig TinyDecoderConfig() {
  DecoderConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = true;
  return c;
}

}  // namespace fedlora::testing_util
