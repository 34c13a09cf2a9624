// The CPU engine's choices that follow the machine as it is now: by timing (TwoWayTuner's
// records of each way's runs) and by state (the ring link's verdict on its copies).
#include <chrono>

#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/links.h"
#include "runtime/log.h"
#include "transports/transport.h"

namespace tutti {

void Engine::recordAlgoRun(int bucket, int way, Clock::time_point start) {
  recordRun(algoTuner_, bucket, way, start, "all-gathers", "by recursive doubling", "by the ring");
}

void Engine::recordRun(TwoWayTuner& t, int bucket, int way, Clock::time_point start,
                       const char* what, const char* way0, const char* way1) {
  t.record(bucket, way, std::chrono::duration<double, std::nano>(Clock::now() - start).count());
  way = t.newLeaning(bucket);
  if (way < 0) return;
  TUTTI_INFO(log::kTuning,
             "rank %d: %s of %llu-%llu bytes now go %s: fastest recent runs %s %.1f us, %s "
             "%.1f us",
             comm_.rank(), what, 1ull << bucket, bucket < 63 ? (2ull << bucket) - 1 : ~0ull,
             way ? way1 : way0, way0, t.fastest(bucket, 0) / 1e3, way1, t.fastest(bucket, 1) / 1e3);
}

bool Engine::ringVerdict(bool* told, uint32_t* since, uint32_t recheck, size_t minBytes,
                         const char* what, const char* slowWay, const char* fastWay) {
  transport::Connection* c = ringSend_[0] ? ringSend_[0]->conn : nullptr;
  const bool slow = c && c->copiesRunSlow();
  if (slow != *told) {
    TUTTI_INFO(log::kColl, "rank %d: copies into the ring's slots run %s: %s from %zu bytes go %s",
               comm_.rank(), slow ? "slow" : "fast", what, minBytes, slow ? slowWay : fastWay);
    *told = slow;
  }
  if (!slow) *since = 0;
  if (slow && ++*since >= recheck) {
    c->forgetSlowCopies();  // the ring's next copies into the slots time the machine again
    *since = 0;
  }
  return slow;
}

int Engine::exchangeNow() {
  if (exchangeForced_ >= 0) return exchangeForced_;
  return ringVerdict(&exchangeByState_, &exchangeSinceVerdict_, exchangeRecheck_, exchangeMinBytes_,
                     "two-rank all-reduces", "by exchange", "by the ring")
             ? 1
             : 0;
}

bool Engine::flatBroadcastNow() {
  return ringVerdict(&flatByState_, &flatSinceVerdict_, stateRecheck_, stateBcastMinBytes_,
                     "broadcasts", "flat", "by the ring chain");
}

}  // namespace tutti
