#include "aggregation/lora_product.h"

#include <Eigen/Dense>
#include <Eigen/SVD>
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "aggregation/dense_rows.h"
#include "core/status.h"

namespace fedlora {
namespace {

constexpr char kWho[] = "LoraProductAggregator";
constexpr char kSuffixA[] = ".lora_A.weight";
constexpr char kSuffixB[] = ".lora_B.weight";

std::string ShapeOf(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

size_t Slot(const std::vector<TensorSpec>& spec, const std::string& name) {
  size_t i = 0;
  while (i < spec.size() && spec[i].name != name) ++i;
  return i;
}

// The global adapter as a row in spec order.
absl::StatusOr<std::vector<float>> GlobalRow(const std::vector<TensorSpec>& spec,
                                             const std::vector<int64_t>& offsets,
                                             const std::vector<UpdateTensor>& global) {
  if (global.size() != spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat(kWho, ": the global adapter has ", global.size(),
                                                   " tensors, the spec ", spec.size()));
  }
  std::vector<float> row(static_cast<size_t>(offsets.back()));
  for (const UpdateTensor& t : global) {
    const size_t slot = Slot(spec, t.name);
    if (slot == spec.size() || t.shape != spec[slot].shape ||
        static_cast<int64_t>(t.values.size()) != offsets[slot + 1] - offsets[slot]) {
      return absl::InvalidArgumentError(absl::StrCat(kWho, ": global tensor '", t.name, "' ",
                                                     ShapeOf(t.shape), " does not match the spec"));
    }
    std::copy(t.values.begin(), t.values.end(), row.begin() + offsets[slot]);
  }
  return row;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoraProductAggregator>> LoraProductAggregator::Create(
    std::vector<TensorSpec> spec, const std::vector<UpdateTensor>& global) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<int64_t> offsets, RowOffsets(spec, kWho));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> global_row, GlobalRow(spec, offsets, global));
  std::vector<Pair> pairs;
  for (size_t i = 0; i < spec.size(); ++i) {
    const std::string& name = spec[i].name;
    const bool is_a = absl::EndsWith(name, kSuffixA);
    if (!is_a && !absl::EndsWith(name, kSuffixB)) continue;
    const std::string module = name.substr(0, name.size() - (sizeof(kSuffixA) - 1));
    const std::string other = absl::StrCat(module, is_a ? kSuffixB : kSuffixA);
    const size_t j = Slot(spec, other);
    if (j == spec.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWho, ": '", name, "' has no '", other, "' beside it"));
    }
    if (!is_a) continue;  // each pair once, from its lora_A
    const std::vector<int64_t>& a = spec[i].shape;
    const std::vector<int64_t>& b = spec[j].shape;
    if (a.size() != 2 || b.size() != 2 || a[0] < 1 || b[1] != a[0] || a[1] < 1 || b[0] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(kWho, ": the pair '", module, "' has shapes ",
                                                     ShapeOf(a), " and ", ShapeOf(b),
                                                     "; LoRA's are [r, in] and [out, r]"));
    }
    pairs.push_back({i, j, a[0], a[1], b[0]});
  }
  if (pairs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kWho, ": the adapter has no lora_A / lora_B pair to aggregate"));
  }
  FEDLORA_ASSIGN_OR_RETURN(StreamingFedAvg sum, StreamingFedAvg::Create(spec));
  return std::unique_ptr<LoraProductAggregator>(
      new LoraProductAggregator(std::move(spec), std::move(offsets), std::move(pairs),
                                std::move(global_row), std::move(sum)));
}

LoraProductAggregator::LoraProductAggregator(std::vector<TensorSpec> spec,
                                             std::vector<int64_t> offsets, std::vector<Pair> pairs,
                                             std::vector<float> global, StreamingFedAvg sum)
    : spec_(std::move(spec)),
      offsets_(std::move(offsets)),
      pairs_(std::move(pairs)),
      global_(std::move(global)),
      sum_(std::move(sum)) {}

absl::Status LoraProductAggregator::Add(std::vector<KeptTensor> update, int64_t weight) {
  if (weight < 1 || weight > StreamingFedAvg::kMaxWeight) {
    return absl::InvalidArgumentError(absl::StrCat(kWho, ": weight ", weight, " is not in [1, ",
                                                   StreamingFedAvg::kMaxWeight, "]"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<float> row, DenseRow(update, spec_, offsets_, kWho));
  FEDLORA_RETURN_IF_ERROR(sum_.Add(update, weight));
  rows_.push_back({std::move(row), weight});
  return absl::OkStatus();
}

void LoraProductAggregator::FactorPair(const Pair& p, const std::vector<const Held*>& held,
                                       double total_weight, std::vector<float>& out) const {
  using Eigen::Index;
  using Eigen::MatrixXd;
  const Index r = p.rank, in = p.in, dout = p.out;
  const Index nr = static_cast<Index>(held.size()) * r;
  const int64_t a_at = offsets_[p.a], b_at = offsets_[p.b];
  MatrixXd bs(dout, nr), as_t(in, nr);  // the stacked, weighted factors (As transposed)
  for (size_t k = 0; k < held.size(); ++k) {
    const double sw = std::sqrt(static_cast<double>(held[k]->weight) / total_weight);
    const std::vector<float>& d = held[k]->row;
    for (Index j = 0; j < r; ++j) {
      const Index col = static_cast<Index>(k) * r + j;
      for (Index i = 0; i < dout; ++i) {
        const int64_t at = b_at + i * r + j;
        bs(i, col) = sw * (static_cast<double>(global_[at]) + d[at]);
      }
      for (Index c = 0; c < in; ++c) {
        const int64_t at = a_at + j * in + c;
        as_t(c, col) = sw * (static_cast<double>(global_[at]) + d[at]);
      }
    }
  }
  const Index mb = std::min(dout, nr), ma = std::min(in, nr);
  Eigen::HouseholderQR<MatrixXd> qrb(bs), qra(as_t);
  const MatrixXd rb = qrb.matrixQR().topRows(mb).triangularView<Eigen::Upper>();
  const MatrixXd ra = qra.matrixQR().topRows(ma).triangularView<Eigen::Upper>();
  Eigen::BDCSVD<MatrixXd> svd(rb * ra.transpose(), Eigen::ComputeThinU | Eigen::ComputeThinV);
  const Index keep = std::min<Index>(r, svd.singularValues().size());
  // Qb (U_r S_r) and Qa V_r, the reflectors applied to the small factors (Q is never formed).
  MatrixXd b_new = MatrixXd::Zero(dout, keep), a_new_t = MatrixXd::Zero(in, keep);
  b_new.topRows(mb) = svd.matrixU().leftCols(keep) * svd.singularValues().head(keep).asDiagonal();
  a_new_t.topRows(ma) = svd.matrixV().leftCols(keep);
  b_new.applyOnTheLeft(qrb.householderQ());
  a_new_t.applyOnTheLeft(qra.householderQ());
  MatrixXd a_new = a_new_t.transpose();  // keep x in
  for (Index j = 0; j < keep; ++j) {
    Index top = 0;
    a_new.row(j).cwiseAbs().maxCoeff(&top);
    if (a_new(j, top) < 0) {
      a_new.row(j) *= -1;
      b_new.col(j) *= -1;
    }
  }
  for (Index j = 0; j < r; ++j) {
    for (Index c = 0; c < in; ++c) {
      const int64_t at = a_at + j * in + c;
      out[static_cast<size_t>(at)] =
          static_cast<float>((j < keep ? a_new(j, c) : 0.0) - static_cast<double>(global_[at]));
    }
    for (Index i = 0; i < dout; ++i) {
      const int64_t at = b_at + i * r + j;
      out[static_cast<size_t>(at)] =
          static_cast<float>((j < keep ? b_new(i, j) : 0.0) - static_cast<double>(global_[at]));
    }
  }
}

absl::StatusOr<std::vector<UpdateTensor>> LoraProductAggregator::Finish() {
  if (rows_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(kWho, ": no update was added"));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> mean, sum_.Finish());
  std::vector<const Held*> held;
  double total = 0;
  for (const Held& h : rows_) {
    held.push_back(&h);
    total += static_cast<double>(h.weight);
  }
  std::sort(held.begin(), held.end(), [](const Held* x, const Held* y) {
    return x->row != y->row ? x->row < y->row : x->weight < y->weight;
  });
  std::vector<float> out(static_cast<size_t>(offsets_.back()));
  for (const Pair& p : pairs_) {
    FactorPair(p, held, total, out);
    for (size_t slot : {p.a, p.b}) {
      std::copy(out.begin() + offsets_[slot], out.begin() + offsets_[slot + 1],
                mean[slot].values.begin());
    }
  }
  return mean;
}

}  // namespace fedlora
