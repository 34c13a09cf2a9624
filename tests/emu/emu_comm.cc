// The emulated GPU data path's harness: see emu_comm.h.
#include "emu/emu_comm.h"

#include "emu/emu_launch.h"
#include "runtime/dtype.h"

namespace tutti::test {

size_t envOr(const char* name, size_t v) {
  const char* s = getenv(name);
  return s && *s ? size_t(strtoull(s, nullptr, 10)) : v;
}

unsigned threadsPerBlock() {
  static const unsigned n = unsigned(envOr("TUTTI_EMU_THREADS", 2));
  return n;
}

std::string EmuComm::run(int r, const std::vector<CollArgs>& ops) {
  devplan::Config c = cfg;
  c.rank = r;
  RankState& st = *ranks[size_t(r)];
  auto link = [&](int peer, int ch, bool send) -> const transport::FifoView* {
    return send ? &fifo(r, peer, ch).send : &fifo(peer, r, ch).recv;
  };
  devplan::Plan plan;
  int p2pLaunches = 0;
  auto raise = [](std::atomic<int>& most, int v) {
    int m = most.load();
    while (v > m && !most.compare_exchange_weak(m, v)) {
    }
  };
  Status s = devplan::plan(
      c, ops.data(), ops.size(), link, [&] { return st.seq++; }, &plan);
  if (!s.ok()) return "plan: " + s.message();
  size_t next = 0;  // copies in plan order among the launches, as the engine runs them
  auto copiesBefore = [&](size_t i) {
    for (; next < plan.copies.size() && plan.copies[next].beforeLaunch <= i; ++next)
      memcpy(plan.copies[next].dst, plan.copies[next].src, plan.copies[next].bytes);
  };
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    copiesBefore(i);
    devplan::Launch& l = plan.launches[i];
    l.work.abortFlag = &st.abort;
    l.work.err = &st.err;
    l.work.errClaim = &st.claim;
    l.work.timeoutNs = timeoutNs;
    if (l.work.nops > 0 && (l.work.ops[0].kind == dev::kSend || l.work.ops[0].kind == dev::kRecv)) {
      ++p2pLaunches;
      raise(mostP2pBlocks, l.blocks);
    }
    if (l.more.empty()) {
      emuLaunch(l.dtype, l.fn, l.proto, unsigned(l.blocks), threadsPerBlock(), &l.work);
    } else {
      // As DeviceEngine::launchAll passes it.
      emuLaunchP2pMany(unsigned(l.blocks), threadsPerBlock(), devplan::p2pWork(l).get());
    }
  }
  copiesBefore(plan.launches.size());
  raise(mostP2pLaunches, p2pLaunches);
  const uint32_t code = __atomic_load_n(&st.err.code, __ATOMIC_ACQUIRE);
  if (code != dev::kErrNone) {
    return "kernel error " + std::to_string(code) + " waiting for rank " +
           std::to_string(st.err.peer) + " on channel " + std::to_string(st.err.channel);
  }
  return "";
}

CollArgs args(CollKind kind, const void* send, void* recv, size_t count, int dtype, int root,
              const RedOpSpec& red) {
  return CollArgs{kind, "emu", send, recv, count, dtype, 0, red, root, nullptr, true};
}

std::vector<CollArgs> opsFor(const Case& c, int r, int n, const void* send, void* recv,
                             const uint8_t* scalar) {
  RedOpSpec red;
  if (c.op == ncclAvg) {
    red = tutti::averageSpec(c.dtype, n);
  } else if (isPreMul(c.op)) {
    red.fn = 0;
    red.pre = true;
    memcpy(red.scalar, scalar, 8);
    if (c.op == kPreMulDevice) red.scalarPtr = scalar;
  } else {
    red.fn = c.op;
  }
  const size_t block = c.count * dtypeSize(c.dtype);
  auto at = [&](const void* base, int q) {
    return static_cast<char*>(const_cast<void*>(base)) + block * size_t(q);
  };
  std::vector<CollArgs> ops;
  switch (c.coll) {
    case TestColl::kAllReduce:
      ops.push_back(args(CollKind::kAllReduce, send, recv, c.count, c.dtype, 0, red));
      break;
    case TestColl::kAllGather:
      ops.push_back(args(CollKind::kAllGather, send, recv, c.count, c.dtype, 0));
      break;
    case TestColl::kReduceScatter:
      ops.push_back(args(CollKind::kReduceScatter, send, recv, c.count, c.dtype, 0, red));
      break;
    case TestColl::kBroadcast:
      ops.push_back(args(CollKind::kBroadcast, send, recv, c.count, c.dtype, c.root));
      break;
    case TestColl::kReduce:
      ops.push_back(args(CollKind::kReduce, send, recv, c.count, c.dtype, c.root, red));
      break;
    case TestColl::kSendRecv:
      ops.push_back(args(CollKind::kSend, send, nullptr, c.count, c.dtype, (r + 1) % n));
      ops.push_back(args(CollKind::kRecv, nullptr, recv, c.count, c.dtype, (r + n - 1) % n));
      break;
    case TestColl::kAlltoAll:
      for (int q = 0; q < n; ++q) {
        ops.push_back(args(CollKind::kSend, at(send, q), nullptr, c.count, c.dtype, q));
        ops.push_back(args(CollKind::kRecv, nullptr, at(recv, q), c.count, c.dtype, q));
      }
      break;
    case TestColl::kGather:
      ops.push_back(args(CollKind::kSend, send, nullptr, c.count, c.dtype, c.root));
      for (int q = 0; q < n && r == c.root; ++q)
        ops.push_back(args(CollKind::kRecv, nullptr, at(recv, q), c.count, c.dtype, q));
      break;
    case TestColl::kScatter:
      for (int q = 0; q < n && r == c.root; ++q)
        ops.push_back(args(CollKind::kSend, at(send, q), nullptr, c.count, c.dtype, q));
      ops.push_back(args(CollKind::kRecv, nullptr, recv, c.count, c.dtype, c.root));
      break;
  }
  return ops;
}

}  // namespace tutti::test
