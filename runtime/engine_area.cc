// The CPU engine's broadcasts and all-gathers through the host's shared area
// (transports/shm/area.h): the area's setup over the bootstrap, and the rounds of each call.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/ring_dispatch.h"
#include "runtime/comm.h"
#include "runtime/dtype.h"
#include "runtime/engine.h"
#include "runtime/log.h"
#include "runtime/waiter.h"

namespace tutti {

Status Engine::ensureArea(OpState& state) {
  if (area_) return Status::Ok();
  // Rank 0 names the segment to every rank (or says why it has none), collects each rank's
  // word that it mapped it (or why not), unlinks it, and tells every rank the verdict: every
  // rank uses the area or none does, and none waits on a rank that already gave up.
  constexpr uint32_t kNameTag = 0x4e000000u, kAckTag = 0x4e000001u, kVerdictTag = 0x4e000002u;
  const int n = comm_.nranks(), r = comm_.rank();
  Bootstrap* b = comm_.bootstrap();
  struct Word {
    char name[64];
    char error[512];
    int32_t code;  // the error's Code
  };
  auto wordOf = [](const Status& s) {
    Word w{};
    if (!s.ok()) {
      snprintf(w.error, sizeof(w.error), "%s", s.message().c_str());
      w.code = int32_t(s.code());
    }
    return w;
  };
  auto statusOf = [](Word& w, const std::string& who) {
    w.error[sizeof(w.error) - 1] = 0;
    return w.error[0] ? Status(Code(w.code), who + w.error) : Status::Ok();
  };
  auto fail = [&](const Status& s) {
    return s.withContext("rank " + std::to_string(r) + ": " + state.what() +
                         ": setting up the shared broadcast area");
  };
  if (r == 0) {
    static std::atomic<uint32_t> counter{0};
    char name[64];
    snprintf(name, sizeof(name), "/tutti-%d-%08x-area%u", static_cast<int>(getpid()),
             static_cast<unsigned>(comm_.commHash() & 0xffffffffu), counter.fetch_add(1));
    Result<std::unique_ptr<transport::ShmArea>> a =
        transport::ShmArea::create(name, n, areaSlots_, areaChunkBytes_);
    Word named = wordOf(a.status());
    snprintf(named.name, sizeof(named.name), "%s", name);
    Status verdict = a.status();
    std::vector<bool> told(size_t(n), false);
    for (int p = 1; p < n; ++p) {
      Status s = b->send(p, kNameTag, &named, sizeof(named));
      told[size_t(p)] = s.ok();
      if (!s.ok() && verdict.ok()) verdict = s;
    }
    for (int p = 1; p < n && a.ok(); ++p) {
      if (!told[size_t(p)]) continue;
      Word ack{};
      Status s = b->recv(p, kAckTag, &ack, sizeof(ack));
      told[size_t(p)] = s.ok();  // it waits for the verdict
      if (s.ok()) s = statusOf(ack, "rank " + std::to_string(p) + ": ");
      if (!s.ok() && verdict.ok()) verdict = s;
    }
    if (a.ok()) a.value()->unlink();
    if (a.ok()) {  // (a creation failure went out with the name: nobody waits for a verdict)
      Word v = wordOf(verdict);
      for (int p = 1; p < n; ++p) {
        if (told[size_t(p)]) (void)b->send(p, kVerdictTag, &v, sizeof(v));
      }
    }
    if (!verdict.ok()) return fail(verdict);
    area_ = a.take();
  } else {
    Word named{};
    Status s = b->recv(0, kNameTag, &named, sizeof(named));
    if (s.ok()) s = statusOf(named, "rank 0 could not make it: ");
    if (!s.ok()) return fail(s);
    named.name[sizeof(named.name) - 1] = 0;
    Result<std::unique_ptr<transport::ShmArea>> a =
        transport::ShmArea::open(named.name, n, areaSlots_, areaChunkBytes_);
    Word ack = wordOf(a.status());
    s = b->send(0, kAckTag, &ack, sizeof(ack));
    if (!s.ok()) return fail(a.ok() ? s : a.status());
    Word verdict{};
    Status v = b->recv(0, kVerdictTag, &verdict, sizeof(verdict));  // taken even after a failure
    if (!a.ok()) return fail(a.status());
    if (v.ok()) v = statusOf(verdict, "rank 0: ");
    if (!v.ok()) return fail(v);
    area_ = a.take();
  }
  TUTTI_INFO(log::kInit, "rank %d: shared broadcast area: %d slots of %zu bytes", r, areaSlots_,
             areaChunkBytes_);
  return Status::Ok();
}

Status Engine::runAreaBroadcast(const CollArgs& op, OpState& state) {
  Status s = ensureFlatLinks(state);  // the waits' peers (health, names in messages)
  if (s.ok()) s = ensureArea(state);
  if (!s.ok()) return s;
  const size_t bytes = op.count * dtypeSize(op.dtype);
  const uint64_t chunks = (bytes + areaChunkBytes_ - 1) / areaChunkBytes_;
  // A broadcast is one round; an all-gather one per rank, each rank's block broadcast in turn
  // (rank 0's first), the rounds pipelining through the slots like one long broadcast whose
  // root changes.
  const bool gather = op.kind == CollKind::kAllGather;
  Waiter w(&state);
  for (int k = 0; k < (gather ? comm_.nranks() : 1) && !state.failed(); ++k) {
    CollArgs round = op;
    if (gather) {
      round.kind = CollKind::kBroadcast;
      round.root = k;
      round.recv = static_cast<uint8_t*>(op.recv) + size_t(k) * bytes;
    }
    cpu::runAreaBroadcast(round, bytes, comm_.rank(), comm_.nranks(), *area_, areaNext_, areaOps_,
                          flatLinks_, &w);
    areaNext_ += chunks;
  }
  return state.status();
}

}  // namespace tutti
