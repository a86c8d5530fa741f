// The low-rank stage of the update wire format (compression/codec.h): a matrix delta M (rows x cols)
// travels as two factors, P (rows x r) and Q (cols x r), and decodes as P Q^T. The factors come
// from one PowerSGD power iteration (Vogels et al., 2019): P = M Q0 with its columns made
// orthonormal, then Q = M^T P, so P Q^T is M projected onto the column space found from Q0. Q0 is
// the previous round's Q for the same tensor (warm start: the iteration continues across rounds)
// or, the first time, Gaussian from a seed. The projection is biased; the client's error feedback
// keeps what it dropped.
//
// A tensor is viewed as rows = shape[0] by cols = the product of the other dimensions. It is
// factored at rank min(r, rows, cols) only when the factors are fewer values than the tensor;
// vectors, scalars and small matrices travel dense. A LoRA factor (lora_A: rank x in, lora_B:
// out x rank) is a matrix like any other here, its rank capped by the LoRA rank: the product B A
// is never formed, the A and B deltas travel as the factors they are.
//
// Thread-safety: pure functions; a LowRankWarmStart belongs to one encoder.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fedlora {

struct LowRankLayout {
  int64_t rows = 0, cols = 0;
  int64_t rank = 0;    // of the factors; 0 when the tensor travels dense
  int64_t values = 0;  // values on the wire: rank * (rows + cols), or the element count
  bool factored() const { return rank > 0; }
};

// How a tensor of `shape` travels at the configured `rank` (>= 1).
LowRankLayout LowRankLayoutFor(const std::vector<int64_t>& shape, int64_t rank);

// Each tensor's last Q (cols x rank, row-major), by tensor name: the next round's Q0.
using LowRankWarmStart = std::map<std::string, std::vector<float>>;

// Writes P (rows x rank) then Q (cols x rank), row-major, into `factors` (layout.values floats)
// for the row-major matrix `m`, each column pair rescaled so that P's and Q's entries have the same
// RMS (their product unchanged). `q` is Q0 when it has cols * rank values, else Q0 is drawn from
// `seed`; it is replaced by the new Q. Arithmetic in double; a zero matrix gives zero factors.
void PowerIteration(const float* m, const LowRankLayout& layout, uint64_t seed,
                    std::vector<float>& q, std::vector<float>& factors);

// out (rows x cols, row-major) = P Q^T from `factors` as PowerIteration writes them.
void ExpandFactors(const float* factors, const LowRankLayout& layout, float* out);

}  // namespace fedlora
