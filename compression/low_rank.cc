#include "compression/low_rank.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"

namespace fedlora {

LowRankLayout LowRankLayoutFor(const std::vector<int64_t>& shape, int64_t rank) {
  LowRankLayout l;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  l.values = n;
  if (shape.size() < 2 || n == 0 || rank < 1) return l;
  l.rows = shape[0];
  l.cols = n / l.rows;
  const int64_t r = std::min({rank, l.rows, l.cols});
  if (r * (l.rows + l.cols) < n) {
    l.rank = r;
    l.values = r * (l.rows + l.cols);
  }
  return l;
}

void PowerIteration(const float* m, const LowRankLayout& l, uint64_t seed, std::vector<float>& q,
                    std::vector<float>& factors) {
  const int64_t rows = l.rows, cols = l.cols, r = l.rank;
  std::vector<double> q0(static_cast<size_t>(cols * r));
  if (q.size() == q0.size()) {
    for (size_t i = 0; i < q0.size(); ++i) q0[i] = q[i];
  } else {
    Rng rng(seed);
    for (double& v : q0) v = rng.Normal();
  }
  // P = M Q0.
  std::vector<double> p(static_cast<size_t>(rows * r), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double* pi = &p[i * r];
    for (int64_t j = 0; j < cols; ++j) {
      const double mij = m[i * cols + j];
      if (mij == 0.0) continue;
      const double* qj = &q0[j * r];
      for (int64_t c = 0; c < r; ++c) pi[c] += mij * qj[c];
    }
  }
  // Orthonormal columns (modified Gram-Schmidt); a column with nothing left becomes 0.
  for (int64_t c = 0; c < r; ++c) {
    for (int64_t prev = 0; prev < c; ++prev) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += p[i * r + c] * p[i * r + prev];
      for (int64_t i = 0; i < rows; ++i) p[i * r + c] -= dot * p[i * r + prev];
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += p[i * r + c] * p[i * r + c];
    norm = std::sqrt(norm);
    const double scale = norm > 1e-30 ? 1.0 / norm : 0.0;
    for (int64_t i = 0; i < rows; ++i) p[i * r + c] *= scale;
  }
  // Q = M^T P.
  std::vector<double> qn(static_cast<size_t>(cols * r), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double* pi = &p[i * r];
    for (int64_t j = 0; j < cols; ++j) {
      const double mij = m[i * cols + j];
      if (mij == 0.0) continue;
      double* qj = &qn[j * r];
      for (int64_t c = 0; c < r; ++c) qj[c] += mij * pi[c];
    }
  }
  q.resize(qn.size());
  for (size_t i = 0; i < qn.size(); ++i) q[i] = static_cast<float>(qn[i]);
  // On the wire each column pair is rescaled (P_c * a, Q_c / a) so that P's and Q's entries have the
  // same RMS: a quantizer block that holds both then serves both. The product is unchanged.
  std::vector<double> a(static_cast<size_t>(r), 1.0);
  for (int64_t c = 0; c < r; ++c) {
    double qq = 0;
    for (int64_t j = 0; j < cols; ++j) qq += qn[j * r + c] * qn[j * r + c];
    const double b = std::sqrt(qq);  // ||P_c|| is 1 (or 0)
    if (b > 1e-30)
      a[c] = std::sqrt(b * std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)));
  }
  factors.resize(static_cast<size_t>(l.values));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < r; ++c) factors[i * r + c] = static_cast<float>(p[i * r + c] * a[c]);
  }
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t c = 0; c < r; ++c)
      factors[rows * r + j * r + c] = static_cast<float>(qn[j * r + c] / a[c]);
  }
}

void ExpandFactors(const float* factors, const LowRankLayout& l, float* out) {
  const int64_t rows = l.rows, cols = l.cols, r = l.rank;
  const float* p = factors;
  const float* q = factors + rows * r;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (int64_t c = 0; c < r; ++c) s += static_cast<double>(p[i * r + c]) * q[j * r + c];
      out[i * cols + j] = static_cast<float>(s);
    }
  }
}

}  // namespace fedlora
