#include "collectives/program.h"

#include <memory>
#include <random>
#include <sstream>

#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti::test {

std::vector<ProgramStep> randomProgram(int nranks, size_t fifoBytes, uint32_t seed, int length,
                                       bool hostSteps) {
  std::mt19937 rng(seed);  // its sequence is fixed by the standard: the same on every rank
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  // 0; one element; LL's lines and the gathered all-reduce (up to 4 KiB); several LL slots;
  // past the whole FIFO, so Simple takes many steps and channels.
  const size_t counts[] = {0, 1, 37, 250, 1001, 3000, fifoBytes + 1003};
  const int ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, kPreMulHost, kPreMulDevice};
  std::vector<ProgramStep> program;
  int group = -1, left = 0, groups = 0;
  for (int i = 0; i < length; ++i) {
    ProgramStep s{};
    s.c.coll = static_cast<TestColl>(pick(kNumTestColls));
    s.c.dtype = int(pick(ncclNumTypes));
    s.c.op = ops[pick(sizeof(ops) / sizeof(ops[0]))];
    s.c.count = counts[pick(sizeof(counts) / sizeof(counts[0]))];
    s.c.inPlace = pick(2) == 1;
    s.c.root = int(pick(size_t(nranks)));
    s.c.salt = seed * 1000u + uint32_t(i) + 1;
    if (left == 0 && pick(4) == 0) {  // a group of the next 2 to 4 steps
      group = groups++;
      left = 2 + int(pick(3));
    }
    s.group = left > 0 ? group : -1;
    if (left > 0) --left;
    s.stream = int(pick(2));
    s.host = hostSteps && pick(5) == 0;
    program.push_back(s);
  }
  return program;
}

std::string describeProgram(const std::vector<ProgramStep>& program) {
  std::ostringstream os;
  for (size_t i = 0; i < program.size(); ++i) {
    const ProgramStep& s = program[i];
    os << "#" << i << ": " << s.c.name() << ", stream " << s.stream;
    if (s.group >= 0) os << ", group " << s.group;
    if (s.host) os << ", host";
    os << "\n";
  }
  return os.str();
}

#ifdef TUTTI_HAVE_CUDA
namespace {

std::string cudaFailed(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// One graph of every stream: the first is captured, every other forked from it and joined back.
struct Capture {
  std::vector<cudaStream_t> streams;  // distinct; the first is the capture's origin
  std::vector<cudaEvent_t> events;    // the fork, then one join per other stream
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Capture() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  std::string begin() {
    for (size_t i = 0; i < streams.size(); ++i) {
      cudaEvent_t ev = nullptr;
      if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
        return cudaFailed("cudaEventCreate", e);
      events.push_back(ev);
    }
    cudaError_t e = cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cudaFailed("cudaStreamBeginCapture", e);
    if (streams.size() > 1 && (e = cudaEventRecord(events[0], streams[0])) != cudaSuccess)
      return cudaFailed("cudaEventRecord", e);
    for (size_t i = 1; i < streams.size(); ++i) {
      if ((e = cudaStreamWaitEvent(streams[i], events[0], 0)) != cudaSuccess)
        return cudaFailed("cudaStreamWaitEvent (fork)", e);
    }
    return "";
  }
  // Ends the capture (after a failure too, so the streams are usable again) and launches the
  // graph once where `launch`.
  std::string endAndLaunch(bool launch) {
    cudaError_t e = cudaSuccess;
    for (size_t i = 1; i < streams.size() && e == cudaSuccess; ++i) {
      e = cudaEventRecord(events[i], streams[i]);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(streams[0], events[i], 0);
    }
    cudaError_t end = cudaStreamEndCapture(streams[0], &graph);
    if (e != cudaSuccess) return cudaFailed("joining the forked streams", e);
    if (end != cudaSuccess) return cudaFailed("cudaStreamEndCapture", end);
    if (!launch) return "";
    if ((e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess)
      return cudaFailed("cudaGraphInstantiate", e);
    if ((e = cudaGraphLaunch(exec, streams[0])) != cudaSuccess)
      return cudaFailed("cudaGraphLaunch", e);
    return "";
  }
};

}  // namespace

std::vector<std::string> runProgram(const ProgramRun& run, const std::vector<ProgramStep>& program,
                                    size_t maxReport) {
  std::vector<std::string> bad;
  auto report = [&](const std::string& what) {
    if (bad.size() < maxReport) bad.push_back(what);
  };
  auto stepName = [&](size_t i) {
    const ProgramStep& s = program[i];
    return "step " + std::to_string(i) + " (stream " + std::to_string(s.stream) +
           (s.group >= 0 ? ", group " + std::to_string(s.group) : std::string()) +
           (s.host ? ", host" : "") + ")";
  };
  auto rankName = [](const ProgramRank& r) { return "rank " + std::to_string(r.rank); };
  auto stream = [&](const ProgramRank& r, const ProgramStep& s) {
    return static_cast<cudaStream_t>(r.streams[s.stream == 0 ? 0 : 1]);
  };
  auto firstStream = [](const ProgramRank& r) { return static_cast<cudaStream_t>(r.streams[0]); };
  const size_t nr = run.ranks.size(), ns = program.size();

  // Every step of every rank in a part of the arena of its own, copied in its rank's first
  // stream's order.
  size_t total = 0;
  std::vector<size_t> offsets;
  for (size_t r = 0; r < nr; ++r) {
    for (const ProgramStep& s : program) {
      offsets.push_back(total);
      total += caseDeviceBytes(s.c, run.nranks);
    }
  }
  std::string err = reserveDeviceMemory(total);
  std::vector<std::unique_ptr<CaseRun>> runs;  // rank-major
  for (size_t r = 0; r < nr && err.empty(); ++r) {
    const ProgramRank& pr = run.ranks[r];
    for (size_t i = 0; i < ns && err.empty(); ++i) {
      runs.emplace_back(new CaseRun(pr.rank, run.nranks, program[i].c));
      err = runs.back()->prepare(pr.comm, program[i].host ? Memory::kHost : Memory::kDevice,
                                 firstStream(pr), offsets[r * ns + i]);
      if (!err.empty()) err = rankName(pr) + ": " + err;
    }
    if (err.empty()) {
      if (cudaError_t e = cudaStreamSynchronize(firstStream(pr)); e != cudaSuccess)
        err = rankName(pr) + ": " + cudaFailed("cudaStreamSynchronize", e);
    }
  }
  if (run.ready) run.ready();
  if (!err.empty()) return {err};

  Capture capture;
  if (run.graph) {
    for (const ProgramRank& pr : run.ranks) {
      for (void* st : pr.streams) {
        auto cs = static_cast<cudaStream_t>(st);
        bool known = false;
        for (cudaStream_t k : capture.streams) known = known || k == cs;
        if (!known) capture.streams.push_back(cs);
      }
    }
    if (err = capture.begin(); !err.empty()) {
      capture.endAndLaunch(false);
      return {rankName(run.ranks[0]) + ": " + err};
    }
  }
  // A group per run of steps the program groups, or per step; across the ranks where a thread
  // drives several.
  bool issued = true;
  for (size_t i = 0; i < ns;) {
    const int g = program[i].group;
    size_t end = i + 1;
    while (g >= 0 && end < ns && program[end].group == g) ++end;
    const bool grouped = g >= 0 || nr > 1;
    if (grouped) ncclGroupStart();
    for (size_t r = 0; r < nr; ++r) {
      const ProgramRank& pr = run.ranks[r];
      for (size_t k = i; k < end; ++k) {
        if (ncclResult_t rc = runs[r * ns + k]->issue(pr.comm, stream(pr, program[k]));
            rc != ncclSuccess) {
          report(stepName(k) + ": " + rankName(pr) + ": " + program[k].c.name() + ": returned " +
                 ncclGetErrorString(rc) + ": " + ncclGetLastError(pr.comm));
          issued = false;
        }
      }
    }
    if (grouped) {
      if (ncclResult_t rc = ncclGroupEnd(); rc != ncclSuccess) {
        report(
            "the group of steps " + std::to_string(i) + " to " + std::to_string(end - 1) + " of " +
            (nr > 1 ? "ranks " + std::to_string(run.ranks[0].rank) + " to " +
                          std::to_string(run.ranks[nr - 1].rank)
                    : rankName(run.ranks[0])) +
            ": ncclGroupEnd returned " + ncclGetErrorString(rc) + ": " + ncclGetLastError(nullptr));
        issued = false;
      }
    }
    i = end;
  }
  if (run.graph) {
    if (err = capture.endAndLaunch(issued); !err.empty())
      report(rankName(run.ranks[0]) + ": " + err);
    if (!err.empty() || !issued) return bad;
  }
  for (size_t r = 0; r < nr; ++r) {
    const ProgramRank& pr = run.ranks[r];
    for (size_t i = 0; i < ns; ++i) {
      std::string why =
          runs[r * ns + i]->check(run.graph ? capture.streams[0] : stream(pr, program[i]));
      if (!why.empty()) report(stepName(i) + ": " + why);
    }
  }
  return bad;
}
#else
std::vector<std::string> runProgram(const ProgramRun& run, const std::vector<ProgramStep>&,
                                    size_t) {
  if (run.ready) run.ready();
  return {"this build has no CUDA"};
}
#endif

}  // namespace tutti::test
