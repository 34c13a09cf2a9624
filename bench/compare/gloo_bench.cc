// The Gloo side of the comparison (Gloo is PyTorch's CPU backend; its only transport here is
// TCP). Ranks come from RANK / WORLD_SIZE (tutti-run or torchrun); they meet through a
// FileStore in GLOO_STORE_DIR. -a picks the all-reduce: ring, halving_doubling or bcube.
//   GLOO_STORE_DIR=$(mktemp -d) tutti-run -n 2 tutti-bench-gloo all_reduce -a ring
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <memory>

#include "bench/compare/sweep.h"

int main(int argc, char** argv) {
  compare::Sweep s = compare::parseSweep(argc, argv);
  if (s.algo.empty()) s.algo = "ring";
  const char* r = getenv("RANK");
  const char* w = getenv("WORLD_SIZE");
  const char* dir = getenv("GLOO_STORE_DIR");
  if (!r || !w || !dir) {
    fprintf(stderr, "tutti-bench-gloo: needs RANK, WORLD_SIZE and GLOO_STORE_DIR\n");
    return 2;
  }
  int rank = atoi(r), n = atoi(w);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  gloo::rendezvous::PrefixStore prefix(s.coll + "-" + s.algo, store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->connectFullMesh(prefix, dev);
  gloo::BarrierAllToAll barrier(ctx);
  std::string lib = s.coll == "all_reduce" ? "gloo-" + s.algo : "gloo";
  for (size_t bytes : compare::sizes(s)) {
    size_t total = std::max<size_t>(bytes / sizeof(float), 1);
    size_t per = s.coll == "all_gather" ? std::max<size_t>(total / size_t(n), 1) : total;
    total = s.coll == "all_gather" ? per * size_t(n) : total;
    std::vector<float> send(per, 1.0f), recv(total, 0.0f);
    std::unique_ptr<gloo::Algorithm> algo;
    std::vector<float*> ptrs{recv.data()};
    if (s.coll == "all_reduce") {
      if (s.algo == "ring") algo.reset(new gloo::AllreduceRing<float>(ctx, ptrs, int(total)));
      if (s.algo == "halving_doubling")
        algo.reset(new gloo::AllreduceHalvingDoubling<float>(ctx, ptrs, int(total)));
      if (s.algo == "bcube") algo.reset(new gloo::AllreduceBcube<float>(ctx, ptrs, int(total)));
    } else if (s.coll == "all_gather") {
      std::vector<const float*> in{send.data()};
      algo.reset(new gloo::AllgatherRing<float>(ctx, in, recv.data(), int(per)));
    } else {
      algo.reset(new gloo::BroadcastOneToAll<float>(ctx, ptrs, total, 0));
    }
    if (!algo) {
      fprintf(stderr, "unknown -a %s\n", s.algo.c_str());
      return 2;
    }
    for (int i = 0; i < s.warmup; ++i) algo->run();
    barrier.run();
    double t0 = compare::nowSeconds();
    for (int i = 0; i < s.iters; ++i) algo->run();
    double t = (compare::nowSeconds() - t0) / s.iters;
    // The slowest rank's time, gathered with Gloo itself.
    std::vector<double*> tp{&t};
    gloo::AllreduceRing<double> maxTime(ctx, tp, 1, gloo::ReductionFunction<double>::max);
    maxTime.run();
    if (rank == 0) compare::report(lib.c_str(), s, total * sizeof(float), t, n);
  }
  return 0;
}
