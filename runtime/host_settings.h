// The environment variables that shape what the ranks do together on host buffers: the CPU
// engine's choice of algorithm, chunk and channels (runtime/engine_config.cc) and the links'
// slots and transports (runtime/links.cc, transports/tcp). Each rank reads them alone, so ranks
// that read different values would run steps that do not meet: a wrong result, or a wait until
// TUTTI_TIMEOUT. Their text travels in PeerInfo; every rank compares the whole table alike
// (checkHostSettingsAgree) and refuses host-buffer operations where they differ.
//
// Variables that act on one rank alone are not here: TUTTI_TIMEOUT, TUTTI_SPIN_NS, rank 0's
// state verdicts (TUTTI_EXCHANGE and the rechecks: rank 0 tells the others by a marker), shm
// single copy (each link's receiver publishes its minimum), TUTTI_TCP_DIRECT,
// TUTTI_STREAM_COPY_MIN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace tutti {

struct PeerInfo;

struct HostSettings {
  static constexpr int kCount = 27;
  static constexpr size_t kShown = 16;
  uint64_t hash[kCount];       // fnv1a of the value as set; 0 where unset or empty
  char shown[kCount][kShown];  // the value as set; a longer one cut, ending in "..."
};

// The names, in HostSettings' order.
extern const char* const kHostSettingNames[HostSettings::kCount];

HostSettings hostSettingsFromEnv();

// Ok, or every variable that differs between ranks, each with two ranks and their values.
// Values are compared as written: "unset" differs from the default written out.
Status checkHostSettingsAgree(const PeerInfo* peers, size_t n);

}  // namespace tutti
