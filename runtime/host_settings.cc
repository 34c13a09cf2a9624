#include "runtime/host_settings.h"

#include <cstdio>
#include <cstring>
#include <optional>

#include "runtime/env.h"
#include "runtime/peer_info.h"

namespace tutti {

const char* const kHostSettingNames[HostSettings::kCount] = {
    // The links: slot sizes, which transport, sockets per connection.
    "NCCL_BUFFSIZE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_NSOCKS_PERTHREAD",
    // The CPU engine: channels, and the sizes at which each algorithm takes over.
    "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "TUTTI_PAIR_MAX_BYTES", "TUTTI_PAIR_TUNE",
    "TUTTI_FLAT_MAX_BYTES", "TUTTI_RD_MAX_BYTES", "TUTTI_TREE_MAX_BYTES", "TUTTI_HALVING_MIN_BYTES",
    "TUTTI_HALVING_MAX_BYTES", "TUTTI_EXCHANGE_MIN_BYTES", "TUTTI_FLAT_ALLGATHER_MAX_BYTES",
    "TUTTI_TREE_ALLGATHER_MAX_BYTES", "TUTTI_RD_ALLGATHER_MAX_BYTES",
    "TUTTI_ALLGATHER_TUNE_MIN_BYTES", "TUTTI_FLAT_BROADCAST_MIN_BYTES",
    "TUTTI_STATE_BROADCAST_MIN_BYTES", "TUTTI_STATE_BROADCAST_MAX_BYTES",
    "TUTTI_AREA_BROADCAST_MIN_BYTES", "TUTTI_AREA_BROADCAST_MAX_BYTES",
    "TUTTI_AREA_ALLGATHER_MIN_BYTES", "TUTTI_AREA_ALLGATHER_MAX_BYTES", "TUTTI_SHM_AREA_SLOTS",
    "TUTTI_SHM_AREA_CHUNK"};

HostSettings hostSettingsFromEnv() {
  HostSettings h{};
  for (int i = 0; i < HostSettings::kCount; ++i) {
    // Empty counts as unset, as env::getInt and getBool take it.
    const std::optional<std::string> v = env::getString(kHostSettingNames[i]);
    if (!v || v->empty()) continue;
    h.hash[i] = fnv1a(v->data(), v->size());
    if (h.hash[i] == 0) h.hash[i] = 1;  // 0 means unset
    // A value too long to show whole says so: the hash tells it apart all the same.
    const int room = static_cast<int>(HostSettings::kShown) - 1;
    if (static_cast<int>(v->size()) <= room) {
      snprintf(h.shown[i], HostSettings::kShown, "%s", v->c_str());
    } else {
      snprintf(h.shown[i], HostSettings::kShown, "%.*s...", room - 3, v->c_str());
    }
  }
  return h;
}

Status checkHostSettingsAgree(const PeerInfo* peers, size_t n) {
  auto shown = [](const HostSettings& h, int i) {
    return h.hash[i] ? std::string(h.shown[i], strnlen(h.shown[i], HostSettings::kShown))
                     : std::string("unset");
  };
  std::string differ;
  int count = 0;
  for (int i = 0; i < HostSettings::kCount && n > 1; ++i) {
    const PeerInfo& first = peers[0];
    for (size_t r = 1; r < n; ++r) {
      const PeerInfo& p = peers[r];
      if (p.host.hash[i] == first.host.hash[i]) continue;
      differ += std::string(count++ ? "; " : "") + kHostSettingNames[i] + ": rank " +
                std::to_string(first.rank) + " reads " + shown(first.host, i) + ", rank " +
                std::to_string(p.rank) + " reads " + shown(p.host, i);
      break;
    }
  }
  if (!count) return Status::Ok();
  return invalidUsage(
      std::string(count == 1 ? "a setting differs" : std::to_string(count) + " settings differ") +
      " between ranks (" + differ +
      "). Every rank picks its algorithms and links for host buffers from them, and picks that "
      "differ would not meet: set them alike on every rank (unset on one rank and written out "
      "on another counts as different)");
}

}  // namespace tutti
