#include "bench/perf_options.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tutti::perf {
namespace {

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0)) usage((std::string("bad size ") + s).c_str());
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      ++end;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      ++end;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      ++end;
      break;
    default:
      break;
  }
  if (*end != 0) usage((std::string("bad size ") + s).c_str());
  if (v > double(size_t(1) << 50)) usage((std::string("size ") + s + " is too large").c_str());
  return size_t(v);
}

// A whole number of at least `least` (strtol's syntax, nothing after it).
int parseInt(const std::string& flag, const char* s, int least) {
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != 0 || errno != 0 || v < least || v > 1000000000) {
    usage((flag + " " + s + ": a whole number of at least " + std::to_string(least) + " is needed")
              .c_str());
  }
  return int(v);
}

}  // namespace

void printUsage(FILE* to) {
  fprintf(to,
          "usage: tutti-perf <all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|"
          "gather|scatter|sendrecv> [-b minbytes] [-e maxbytes] [-f factor | -i stepbytes]\n"
          "       [-n iters] [-w warmup] [-c checks] [-o sum|prod|max|min|avg|all] [-d type] "
          "[-r root]\n"
          "       [-t threads] [-g 1] [-a 0|1|2|3] [-m agg] [-z 0|1] [-G launches] "
          "[--mem host|device]\n"
          "  -f F > 1 multiplies the size by F each step (whatever the order of -f and -i)\n"
          "  -c N checks the results N times after the timed iterations (0: none)\n"
          "  -a time shown: 0 rank 0's, 1 the ranks' mean, 2 their least, 3 their most\n"
          "  -m N calls per iteration, in one group where N > 1\n"
          "  -z 1 waits for the rank's stream and every rank after each call (timed)\n"
          "  -G N captures the timed iterations in a CUDA graph, launched N times "
          "(--mem device)\n");
}

[[noreturn]] void usage(const char* why) {
  fprintf(stderr, "tutti-perf: %s\n", why);
  printUsage(stderr);
  exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) usage("which collective?");
  std::string name = argv[1];
  if (name == "-h" || name == "--help") {
    printUsage(stdout);
    exit(0);
  }
  if (name.size() > 5 && name.substr(name.size() - 5) == "_perf") name.resize(name.size() - 5);
  for (const CollInfo& c : kColls) {
    if (name == c.name) o.coll = &c;
  }
  if (!o.coll) usage(("unknown collective " + name).c_str());
  for (int i = 2; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      printUsage(stdout);
      exit(0);
    }
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
      case 'f': {
        char* end = nullptr;
        o.factor = strtod(v, &end);
        if (end == v || *end != 0 || !(o.factor >= 0) || o.factor > 1e6)
          usage((std::string("-f ") + v + ": a factor is needed (1 or less: steps of -i)").c_str());
        break;
      }
      case 'i':
        o.stepBytes = parseSize(v);
        break;
      case 'n':
        o.iters = parseInt(f, v, 1);
        break;
      case 'w':
        o.warmup = parseInt(f, v, 0);
        break;
      case 'c':
        o.check = parseInt(f, v, 0);
        break;
      case 'r':
        o.root = parseInt(f, v, 0);
        break;
      case 't':
        o.threads = parseInt(f, v, 1);
        break;
      case 'a':
        o.average = parseInt(f, v, 0);
        if (o.average > 3) usage("-a is 0 (rank 0), 1 (mean), 2 (least) or 3 (most)");
        break;
      case 'm':
        o.agg = parseInt(f, v, 1);
        break;
      case 'g':
        if (parseInt(f, v, 1) != 1) usage("-g: one device per thread (use -t for more ranks)");
        break;
      case 'z':
        o.blocking = parseInt(f, v, 0) != 0;
        break;
      case 'G':  // device buffers: capture the timed iterations in a CUDA graph, launch it N times
        o.graphLaunches = parseInt(f, v, 0);
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
        o.dtypes.clear();
        for (int k = 0; k < ncclNumTypes; ++k) {
          if (t == kTypeNames[k] || t == "all") o.dtypes.push_back(k);
        }
        if (o.dtypes.empty()) usage(("unknown datatype " + t).c_str());
        break;
      }
      default:
        usage(("unknown flag " + f).c_str());
    }
  }
  if (o.minBytes > o.maxBytes) usage("-b is larger than -e");
  if (o.graphLaunches > 0 && !o.deviceMem)
    usage("-G: CUDA graphs capture GPU work (--mem device); host-buffer calls run on the CPU");
  if (o.graphLaunches > 0 && o.blocking)
    usage("-z 1 with -G: a captured graph cannot wait between its calls");
  return o;
}

}  // namespace tutti::perf
