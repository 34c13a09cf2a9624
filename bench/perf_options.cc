#include "bench/perf_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tutti::perf {
namespace {

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s || v < 0) usage((std::string("bad size ") + s).c_str());
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    case 0:
      break;
    default:
      usage((std::string("bad size ") + s).c_str());
  }
  return size_t(v);
}

}  // namespace

[[noreturn]] void usage(const char* why) {
  fprintf(stderr,
          "tutti-perf: %s\n"
          "usage: tutti-perf <all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|"
          "gather|scatter|sendrecv> [-b minbytes] [-e maxbytes] [-f factor | -i stepbytes]\n"
          "       [-n iters] [-w warmup] [-c check] [-o sum|prod|max|min|avg|all] [-d type] "
          "[-r root]\n"
          "       [-t threads] [-g gpus] [-a 0|1|2|3] [-m agg] [-z blocking] [-G graph] "
          "[--mem host|device]\n",
          why);
  exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) usage("which collective?");
  std::string name = argv[1];
  if (name.size() > 5 && name.substr(name.size() - 5) == "_perf") name.resize(name.size() - 5);
  for (const CollInfo& c : kColls) {
    if (name == c.name) o.coll = &c;
  }
  if (!o.coll) usage(("unknown collective " + name).c_str());
  for (int i = 2; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--mem") {
      if (i + 1 >= argc) usage("--mem needs host or device");
      std::string m = argv[++i];
      if (m != "host" && m != "device") usage("--mem is host or device");
      o.deviceMem = m == "device";
      continue;
    }
    if (f.size() != 2 || f[0] != '-' || i + 1 >= argc) usage(("bad flag " + f).c_str());
    const char* v = argv[++i];
    switch (f[1]) {
      case 'b':
        o.minBytes = parseSize(v);
        break;
      case 'e':
        o.maxBytes = parseSize(v);
        break;
      case 'f':
        o.factor = atof(v);
        break;
      case 'i':
        o.stepBytes = parseSize(v);
        o.factor = 0;
        break;
      case 'n':
        o.iters = atoi(v);
        break;
      case 'w':
        o.warmup = atoi(v);
        break;
      case 'c':
        o.check = atoi(v);
        break;
      case 'r':
        o.root = atoi(v);
        break;
      case 't':
        o.threads = atoi(v);
        break;
      case 'a':
        o.average = atoi(v);
        break;
      case 'm':
        o.agg = std::max(1, atoi(v));
        break;
      case 'g':
        if (atoi(v) != 1) usage("-g: one device per thread (host buffers here)");
        break;
      case 'z':
        break;
      case 'G':  // device buffers: capture the timed iterations in a CUDA graph, launch it N times
        o.graphLaunches = std::max(0, atoi(v));
        break;
      case 'o': {
        std::string op = v;
        o.ops.clear();
        for (int k = 0; k < ncclNumOps; ++k) {
          if (op == kOpNames[k] || op == "all") o.ops.push_back(k);
        }
        if (o.ops.empty()) usage(("unknown op " + op).c_str());
        break;
      }
      case 'd': {
        std::string t = v;
        if (t == "bf16") t = "bfloat16";
        if (t == "fp8e4m3") t = "f8e4m3";
        if (t == "fp8e5m2") t = "f8e5m2";
        o.dtype = -1;
        for (int k = 0; k < ncclNumTypes; ++k) {
          if (t == kTypeNames[k]) o.dtype = k;
        }
        if (o.dtype < 0) usage(("unknown datatype " + t).c_str());
        break;
      }
      default:
        usage(("unknown flag " + f).c_str());
    }
  }
  if (o.minBytes > o.maxBytes) usage("-b is larger than -e");
  if (o.iters < 1 || o.threads < 1) usage("-n and -t must be at least 1");
  return o;
}

}  // namespace tutti::perf
