// Calls on which the ranks disagree, run on every rank's thread at once: each must fail,
// not wait.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/harness.h"

namespace tutti::test {

// Each rank's result and ncclGetLastError from one call on every rank's thread at once, where
// the ranks disagree on something: it must fail, not wait (under 15 s with TUTTI_TIMEOUT=20).
struct Outcome {
  std::vector<ncclResult_t> rc;
  std::vector<std::string> msg;
};
template <class Call>
Outcome runMismatched(const std::vector<ncclComm_t>& comms, Call call) {
  const size_t n = comms.size();
  Outcome o{std::vector<ncclResult_t>(n, ncclSuccess), std::vector<std::string>(n)};
  const double start = now();
  onThreads(int(n), [&](int r) {
    o.rc[size_t(r)] = call(r, comms[size_t(r)]);
    o.msg[size_t(r)] = ncclGetLastError(comms[size_t(r)]);
  });
  EXPECT_LT(secondsSince(start), 15.0);
  return o;
}

}  // namespace tutti::test
