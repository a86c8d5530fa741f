// The server's gRPC health service: the names it answers for, and NOT_SERVING from the moment
// Shutdown begins (here while Shutdown still waits for the round driver, held in its clock).
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/lifecycle/health_client.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::CheckHealth;
using testing::HealthAnswer;
using testing::HealthWatch;
using testing::kHealthNotServing;
using testing::kHealthServiceUnknown;
using testing::kHealthServing;

const char* const kNames[] = {"", "fedlora.v1.Federation", "fedlora.v1.Admin"};

// A clock that, once armed, holds the next thread that reads it until Release(). With no client
// connected only the round driver reads the clock, so arming it stops the driver in its next tick.
class HoldingClock {
 public:
  Clock clock() {
    return [this] {
      if (armed_.exchange(false)) {
        held_.set_value();
        release_future_.wait();
      }
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  }
  void Arm() { armed_ = true; }
  bool WaitUntilHolding(int64_t timeout_ms) {
    return held_future_.wait_for(std::chrono::milliseconds(timeout_ms)) ==
           std::future_status::ready;
  }
  void Release() { release_.set_value(); }

 private:
  std::atomic<bool> armed_{false};
  std::promise<void> held_;
  std::future<void> held_future_ = held_.get_future();
  std::promise<void> release_;
  std::shared_future<void> release_future_ = release_.get_future().share();
};

// Polls Check(service) until it answers `status` (or 10 s pass); the last answer.
HealthAnswer AwaitHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                         int status) {
  HealthAnswer a;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    a = CheckHealth(channel, service);
    if (a.code == grpc::StatusCode::OK && a.status == status) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < until);
  return a;
}

TEST(ServerHealthTest, AnswersForTheServerAndEachServiceAndNotForOtherNames) {
  testing::TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()),
                               testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  for (const char* name : kNames) {
    const HealthAnswer a = CheckHealth(channel, name);
    EXPECT_EQ(a.code, grpc::StatusCode::OK) << "'" << name << "'";
    EXPECT_EQ(a.status, kHealthServing) << "'" << name << "'";
  }
  for (const char* name :
       {"fedlora.v1.Nope", "Federation", "fedlora.v1.federation", "grpc.health.v1.Health"}) {
    EXPECT_EQ(CheckHealth(channel, name).code, grpc::StatusCode::NOT_FOUND) << name;
  }
  HealthWatch unknown(channel, "fedlora.v1.Nope");
  EXPECT_TRUE(unknown.WaitFor(kHealthServiceUnknown, 10'000));
}

TEST(ServerHealthTest, NotServingAsSoonAsShutdownBeginsBeforeTheDriverStops) {
  testing::TempDir dir;
  HoldingClock clock;
  auto created =
      Server::Create(testing::TestServerOptions(dir.path()), testing::TestRunConfig(1, 1, 1),
                     testing::InitialAdapter(), /*evaluator=*/nullptr, clock.clock());
  ASSERT_TRUE(created.ok()) << created.status();
  Server& server = **created;
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  HealthWatch watch(channel, "fedlora.v1.Federation");
  ASSERT_TRUE(watch.WaitFor(kHealthServing, 10'000));

  clock.Arm();
  ASSERT_TRUE(clock.WaitUntilHolding(10'000)) << "the round driver never read the clock";
  for (const char* name : kNames)
    EXPECT_EQ(CheckHealth(channel, name).status, kHealthServing) << "'" << name << "'";
  std::atomic<bool> shut_down{false};
  std::thread stopper([&] {
    server.Shutdown();
    shut_down = true;
  });
  // Shutdown cannot get past the held driver, yet every name already says NOT_SERVING.
  for (const char* name : kNames) {
    const HealthAnswer a = AwaitHealth(channel, name, kHealthNotServing);
    EXPECT_EQ(a.code, grpc::StatusCode::OK) << "'" << name << "'";
    EXPECT_EQ(a.status, kHealthNotServing) << "'" << name << "'";
  }
  EXPECT_TRUE(watch.WaitFor(kHealthNotServing, 10'000));
  EXPECT_FALSE(shut_down.load());
  EXPECT_EQ(CheckHealth(channel, "fedlora.v1.Nope").code, grpc::StatusCode::NOT_FOUND);

  clock.Release();
  stopper.join();
  // The server ended the Watch stream as it shut down; nothing answers any more.
  EXPECT_TRUE(watch.WaitForEnd(10'000));
  EXPECT_NE(CheckHealth(channel, "", 2000).code, grpc::StatusCode::OK);
}

}  // namespace
}  // namespace fedlora
