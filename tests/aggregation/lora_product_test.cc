// LORA_PRODUCT's math (aggregation/lora_product.h). The expectations come from the definition by
// another route: the test forms the dense mean product M = sum_k w_k B_k A_k itself and takes its
// SVD directly (Eigen's JacobiSVD of M), where the aggregator never forms M and factors stacked QRs.
#include "aggregation/lora_product.h"

#include <Eigen/Dense>
#include <Eigen/SVD>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using Eigen::MatrixXd;
using ::testing::HasSubstr;

constexpr int64_t kRank = 2, kIn = 5, kOut = 4;

std::vector<TensorSpec> Spec() {
  return {{"head", {3}}, {"m.lora_A.weight", {kRank, kIn}}, {"m.lora_B.weight", {kOut, kRank}}};
}

struct Client {
  MatrixXd a, b;            // the factors the client ends the round with
  std::vector<float> head;  // its head delta
  int64_t weight = 1;
};

std::vector<float> Values(const MatrixXd& m) {  // row-major, as the adapter stores it
  std::vector<float> v;
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) v.push_back(static_cast<float>(m(i, j)));
  return v;
}

MatrixXd Matrix(const std::vector<float>& v, Eigen::Index rows, Eigen::Index cols) {
  MatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) m(i, j) = v[static_cast<size_t>(i * cols + j)];
  return m;
}

// fp32-representable random matrix (so that global + delta reproduces the client's factor).
MatrixXd Random(std::mt19937& g, Eigen::Index rows, Eigen::Index cols) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  MatrixXd m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) m(i, j) = static_cast<double>(n(g) / 4.0f * 4.0f);
  return m;
}

struct Result {
  MatrixXd a, b;
  std::vector<float> head;
};

// Runs the aggregator on global (ga, gb) and the clients, in `order`, and applies the deltas.
Result Aggregate(const MatrixXd& ga, const MatrixXd& gb, const std::vector<Client>& clients,
                 const std::vector<size_t>& order) {
  const std::vector<UpdateTensor> global = {{"head", {3}, {0.0f, 0.0f, 0.0f}},
                                            {"m.lora_A.weight", {kRank, kIn}, Values(ga)},
                                            {"m.lora_B.weight", {kOut, kRank}, Values(gb)}};
  auto a = LoraProductAggregator::Create(Spec(), global);
  EXPECT_TRUE(a.ok()) << a.status();
  for (size_t k : order) {
    const Client& c = clients[k];
    std::vector<float> da = Values(c.a), db = Values(c.b);
    const std::vector<float> a0 = Values(ga), b0 = Values(gb);
    for (size_t i = 0; i < da.size(); ++i) da[i] -= a0[i];
    for (size_t i = 0; i < db.size(); ++i) db[i] -= b0[i];
    std::vector<KeptTensor> u = {{"m.lora_B.weight", {kOut, kRank}, true, {}, db},
                                 {"head", {3}, true, {}, c.head},
                                 {"m.lora_A.weight", {kRank, kIn}, true, {}, da}};
    EXPECT_TRUE((*a)->Add(std::move(u), c.weight).ok());
  }
  absl::StatusOr<std::vector<UpdateTensor>> d = (*a)->Finish();
  EXPECT_TRUE(d.ok()) << d.status();
  Result r;
  r.head = (*d)[0].values;
  r.a = ga + Matrix((*d)[1].values, kRank, kIn);
  r.b = gb + Matrix((*d)[2].values, kOut, kRank);
  return r;
}

MatrixXd MeanProduct(const std::vector<Client>& clients) {
  MatrixXd m = MatrixXd::Zero(kOut, kIn);
  double total = 0;
  for (const Client& c : clients) total += static_cast<double>(c.weight);
  for (const Client& c : clients) m += static_cast<double>(c.weight) / total * (c.b * c.a);
  return m;
}

std::vector<Client> RandomClients(std::mt19937& g, int n, bool shared_a) {
  std::vector<Client> clients;
  const MatrixXd a = Random(g, kRank, kIn);
  for (int k = 0; k < n; ++k) {
    clients.push_back({shared_a ? a : Random(g, kRank, kIn),
                       Random(g, kOut, kRank),
                       {static_cast<float>(k), 1.0f, -2.0f * static_cast<float>(k)},
                       k + 1});
  }
  return clients;
}

TEST(LoraProduct, ExactWhenTheMeanProductHasRankR) {
  // With one A for all clients, sum_k w_k B_k A = (sum_k w_k B_k) A has rank <= r.
  std::mt19937 g(7);
  const std::vector<Client> clients = RandomClients(g, 3, /*shared_a=*/true);
  const Result r = Aggregate(Random(g, kRank, kIn), Random(g, kOut, kRank), clients, {0, 1, 2});
  const MatrixXd m = MeanProduct(clients);
  EXPECT_LT((r.b * r.a - m).norm(), 1e-5 * m.norm());
}

TEST(LoraProduct, OtherwiseTheBestRankRApproximation) {
  std::mt19937 g(11);
  const std::vector<Client> clients = RandomClients(g, 4, /*shared_a=*/false);
  const Result r = Aggregate(Random(g, kRank, kIn), Random(g, kOut, kRank), clients, {0, 1, 2, 3});
  const MatrixXd m = MeanProduct(clients);
  Eigen::JacobiSVD<MatrixXd> svd(m, Eigen::ComputeFullU | Eigen::ComputeFullV);
  const Eigen::VectorXd s = svd.singularValues();
  ASSERT_GT(s(kRank), 1e-3 * s(0));  // M's rank exceeds r: the case under test
  const MatrixXd best = svd.matrixU().leftCols(kRank) * s.head(kRank).asDiagonal() *
                        svd.matrixV().leftCols(kRank).transpose();
  EXPECT_LT((r.b * r.a - best).norm(), 1e-5 * m.norm());
  // Eckart-Young: what is lost is the discarded singular values.
  EXPECT_NEAR((m - r.b * r.a).norm(), s.tail(s.size() - kRank).norm(), 1e-5 * m.norm());
  // Naive FedAvg of the factors is further from M than the rank-r optimum.
  MatrixXd mean_a = MatrixXd::Zero(kRank, kIn), mean_b = MatrixXd::Zero(kOut, kRank);
  for (const Client& c : clients) {
    mean_a += c.a * (static_cast<double>(c.weight) / 10.0);  // weights 1 + 2 + 3 + 4 = 10
    mean_b += c.b * (static_cast<double>(c.weight) / 10.0);
  }
  EXPECT_GT((m - mean_b * mean_a).norm(), (m - r.b * r.a).norm());
}

TEST(LoraProduct, ANewAHasOrthonormalRowsAndTheHeadIsTheWeightedMean) {
  std::mt19937 g(3);
  const std::vector<Client> clients = RandomClients(g, 3, /*shared_a=*/false);
  const Result r = Aggregate(Random(g, kRank, kIn), Random(g, kOut, kRank), clients, {2, 0, 1});
  EXPECT_LT((r.a * r.a.transpose() - MatrixXd::Identity(kRank, kRank)).norm(), 1e-6);
  // Heads k = 0, 1, 2 with weights 1, 2, 3: (0, 1, 0), (1, 1, -2), (2, 1, -4).
  // Means: (0 + 2 + 6) / 6, 1, (0 - 4 - 12) / 6.
  EXPECT_THAT(r.head, testing::ElementsAre(testing::FloatEq(8.0f / 6), testing::FloatEq(1.0f),
                                           testing::FloatEq(-16.0f / 6)));
}

TEST(LoraProduct, TheSameUpdatesGiveTheSameBitsInAnyOrder) {
  std::mt19937 g(5);
  const std::vector<Client> clients = RandomClients(g, 4, /*shared_a=*/false);
  const MatrixXd ga = Random(g, kRank, kIn), gb = Random(g, kOut, kRank);
  const Result x = Aggregate(ga, gb, clients, {0, 1, 2, 3});
  const Result y = Aggregate(ga, gb, clients, {3, 1, 0, 2});
  EXPECT_EQ(Values(x.a), Values(y.a));
  EXPECT_EQ(Values(x.b), Values(y.b));
  EXPECT_EQ(x.head, y.head);
}

TEST(LoraProduct, ASparseUpdateIsItsKeptEntriesInZeros) {
  const std::vector<UpdateTensor> global = {{"m.lora_A.weight", {1, 2}, {1.0f, 0.0f}},
                                            {"m.lora_B.weight", {2, 1}, {0.0f, 0.0f}}};
  auto dense = LoraProductAggregator::Create(SpecFromUpdate(global), global).value();
  auto sparse = LoraProductAggregator::Create(SpecFromUpdate(global), global).value();
  ASSERT_TRUE(dense
                  ->Add({{"m.lora_A.weight", {1, 2}, true, {}, {0.0f, 0.0f}},
                         {"m.lora_B.weight", {2, 1}, true, {}, {2.0f, 0.0f}}},
                        1)
                  .ok());
  const absl::Status added = sparse->Add({{"m.lora_A.weight", {1, 2}, false, {1}, {0.0f}},
                                          {"m.lora_B.weight", {2, 1}, false, {0}, {2.0f}}},
                                         1);
  ASSERT_TRUE(added.ok()) << added;
  // One client: its own product B A = [2; 0] [1 0], already rank 1: A' = [1 0], B' = [2; 0].
  const std::vector<UpdateTensor> d = dense->Finish().value();
  EXPECT_EQ(sparse->Finish().value()[1].values, d[1].values);
  EXPECT_THAT(d[0].values, testing::ElementsAre(testing::FloatNear(0.0f, 1e-6f),
                                                testing::FloatNear(0.0f, 1e-6f)));
  EXPECT_THAT(d[1].values, testing::ElementsAre(testing::FloatNear(2.0f, 1e-6f),
                                                testing::FloatNear(0.0f, 1e-6f)));
}

TEST(LoraProduct, RefusesWhatItCannotFactor) {
  auto create = [](std::vector<UpdateTensor> g) {
    return LoraProductAggregator::Create(SpecFromUpdate(g), g).status();
  };
  EXPECT_THAT(create({{"m.lora_A.weight", {1, 2}, {0, 0}}}).message(), HasSubstr("has no"));
  EXPECT_THAT(
      create({{"m.lora_A.weight", {1, 2}, {0, 0}}, {"m.lora_B.weight", {2, 2}, {0, 0, 0, 0}}})
          .message(),
      HasSubstr("[r, in] and [out, r]"));
  EXPECT_THAT(create({{"head", {2}, {0, 0}}}).message(), HasSubstr("no lora_A / lora_B pair"));
  const std::vector<UpdateTensor> global = {{"m.lora_A.weight", {1, 2}, {1.0f, 0.0f}},
                                            {"m.lora_B.weight", {2, 1}, {0.0f, 0.0f}}};
  auto a = LoraProductAggregator::Create(SpecFromUpdate(global), global).value();
  EXPECT_EQ(a->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<KeptTensor> ok = {{"m.lora_A.weight", {1, 2}, true, {}, {0.0f, 0.0f}},
                                      {"m.lora_B.weight", {2, 1}, true, {}, {1.0f, 0.0f}}};
  EXPECT_THAT(a->Add(ok, 0).message(), HasSubstr("weight 0"));
  std::vector<KeptTensor> nan = ok;
  nan[1].values[0] = std::nanf("");
  EXPECT_THAT(a->Add(nan, 1).message(), HasSubstr("not finite"));
  std::vector<KeptTensor> huge = ok;
  huge[1].values[0] = 1e20f;  // beyond StreamingFedAvg's range
  EXPECT_FALSE(a->Add(huge, 1).ok());
  EXPECT_EQ(a->num_updates(), 0);  // refused updates are not held
  ASSERT_TRUE(a->Add(ok, 1).ok());
  EXPECT_EQ(a->num_updates(), 1);
  EXPECT_EQ(a->held_bytes(), 4 * 4);
}

}  // namespace
}  // namespace fedlora
