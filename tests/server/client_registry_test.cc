// ClientRegistry alone: entries made once with their id, and the liveness rule (a session not
// left, not blocked, heard from within the heartbeat timeout).
#include "server/client_registry.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

constexpr int64_t kTimeoutMs = 30'000;

TEST(ClientRegistry, FindOrAddMakesOneEntryWithItsId) {
  ClientRegistry clients(kTimeoutMs);
  EXPECT_EQ(clients.Find("site-a"), nullptr);
  bool created = false;
  ClientEntry& a = clients.FindOrAdd("site-a", &created);
  EXPECT_TRUE(created);
  EXPECT_EQ(a.id, "site-a");
  a.rounds_participated = 3;
  ClientEntry& again = clients.FindOrAdd("site-a", &created);
  EXPECT_FALSE(created);
  EXPECT_EQ(&again, &a);
  EXPECT_EQ(again.rounds_participated, 3);
  EXPECT_EQ(clients.Find("site-a"), &a);
  clients.FindOrAdd("site-b");
  EXPECT_EQ(clients.size(), 2u);
  std::vector<std::string> ids;
  for (const auto& [id, entry] : clients) ids.push_back(entry->id);
  EXPECT_EQ(ids, (std::vector<std::string>{"site-a", "site-b"}));
}

TEST(ClientRegistry, LiveMeansASessionNotLeftNotBlockedAndHeardFromWithinTheTimeout) {
  ClientRegistry clients(kTimeoutMs);
  const int64_t now = 1'000'000;
  ClientEntry& c = clients.FindOrAdd("site-a");
  c.last_seen_ms = now;
  EXPECT_FALSE(clients.IsLive(c, now)) << "no session yet (restored, never joined)";
  c.session = "token";
  EXPECT_TRUE(clients.IsLive(c, now));
  EXPECT_TRUE(clients.IsLive(c, now + kTimeoutMs));
  EXPECT_FALSE(clients.IsLive(c, now + kTimeoutMs + 1));
  c.left = true;
  EXPECT_FALSE(clients.IsLive(c, now));
  c.left = false;
  c.blocked = true;
  EXPECT_FALSE(clients.IsLive(c, now));
  c.blocked = false;

  ClientEntry& b = clients.FindOrAdd("site-b");
  b.session = "other";
  b.last_seen_ms = now - kTimeoutMs - 1;
  clients.FindOrAdd("site-c");  // no session
  EXPECT_EQ(clients.CountLive(now), 1);
  b.last_seen_ms = now;
  EXPECT_EQ(clients.CountLive(now), 2);
}

}  // namespace
}  // namespace fedlora
