// tutti-perf's command line: the collectives it knows, the nccl-tests flags, their parsing.
#pragma once

#include <cstddef>
#include <cstdio>
#include <vector>

#include "nccl.h"

namespace tutti::perf {

enum class Coll {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv
};

struct CollInfo {
  const char* name;
  Coll coll;
  bool reduces, rooted, perRankBlocks;
};
inline const CollInfo kColls[] = {
    {"all_reduce", Coll::kAllReduce, true, false, false},
    {"all_gather", Coll::kAllGather, false, false, true},
    {"reduce_scatter", Coll::kReduceScatter, true, false, true},
    {"broadcast", Coll::kBroadcast, false, true, false},
    {"reduce", Coll::kReduce, true, true, false},
    {"alltoall", Coll::kAlltoAll, false, false, true},
    {"gather", Coll::kGather, false, true, true},
    {"scatter", Coll::kScatter, false, true, true},
    {"sendrecv", Coll::kSendRecv, false, false, false},
};

inline const char* const kTypeNames[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                                         "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
inline const char* const kOpNames[] = {"sum", "prod", "max", "min", "avg"};

inline size_t typeSize(int t) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return kSizes[t];
}

struct Options {
  const CollInfo* coll = nullptr;
  size_t minBytes = 32 << 20, maxBytes = 32 << 20, stepBytes = 1 << 20;
  double factor = 0;
  int iters = 20, warmup = 5, check = 1, root = 0, threads = 1, average = 1, agg = 1;
  std::vector<int> dtypes{ncclFloat};  // -d (all: every type)
  std::vector<int> ops{ncclSum};
  bool deviceMem = false;
  bool blocking = false;  // -z 1
  int graphLaunches = 0;  // -G (device buffers only; host calls complete before they return)
};

// Prints why and the usage, exits 2.
[[noreturn]] void usage(const char* why);
void printUsage(FILE* to);
Options parse(int argc, char** argv);

}  // namespace tutti::perf
