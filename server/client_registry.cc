#include "server/client_registry.h"

namespace fedlora {

ClientEntry* ClientRegistry::Find(const std::string& client_id) {
  auto it = clients_.find(client_id);
  return it == clients_.end() ? nullptr : it->second.get();
}

const ClientEntry* ClientRegistry::Find(const std::string& client_id) const {
  auto it = clients_.find(client_id);
  return it == clients_.end() ? nullptr : it->second.get();
}

ClientEntry& ClientRegistry::FindOrAdd(const std::string& client_id, bool* created) {
  std::unique_ptr<ClientEntry>& slot = clients_[client_id];
  if (created != nullptr) *created = slot == nullptr;
  if (slot == nullptr) {
    slot = std::make_unique<ClientEntry>();
    slot->id = client_id;
  }
  return *slot;
}

bool ClientRegistry::IsLive(const ClientEntry& c, int64_t now) const {
  return !c.session.empty() && !c.left && !c.blocked &&
         now - c.last_seen_ms <= heartbeat_timeout_ms_;
}

int64_t ClientRegistry::CountLive(int64_t now) const {
  int64_t live = 0;
  for (const auto& [id, c] : clients_) live += IsLive(*c, now) ? 1 : 0;
  return live;
}

}  // namespace fedlora
