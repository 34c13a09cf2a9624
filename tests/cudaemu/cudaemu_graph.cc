// The emulated CUDA runtime (cudaemu.h): stream capture into graphs, and their replays.
//
// A capture is a list of nodes, each with the nodes it depends on. Work queued on a capturing
// stream becomes a node after the stream's current dependencies; an event recorded there
// carries them, and a stream that waits for it joins the capture (or, capturing already, takes
// them on). External records and waits (cudaEventRecordExternal, cudaEventWaitExternal) are
// nodes of their own that touch the event at each replay. cudaStreamEndCapture on the origin
// stream fails where a joined stream's work was not joined back into it. A replay runs every
// node on a thread of its own once its dependencies have run, so branches run at once, as on a
// GPU. The capture modes' rule on unsafe calls (cudaStreamSynchronize, cudaEventQuery,
// cudaMalloc ...) is CUDA's: refused, and the capture invalidated, for a thread that has a
// capture of its own not begun in relaxed mode, or, in global mode, where any thread has one
// begun in global mode.
#include <atomic>
#include <set>
#include <thread>

#include "tests/cudaemu/cudaemu.h"

namespace cudaemu {

// A node: work, or an external record or wait of an event. Those two take the event's
// generation at each cudaGraphLaunch, in the host's order, as the stream calls do.
struct Node {
  enum Kind { kWork, kRecord, kWait };
  Kind kind = kWork;
  Work work;
  EventPtr event;
  std::vector<int> deps;
};

struct Capture {
  unsigned long long id = 0;
  std::thread::id thread;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  StreamPtr origin;
  std::vector<StreamPtr> joined;  // the origin included
  std::vector<Node> nodes;
  bool invalidated = false;
};

namespace {

struct Graph {
  std::vector<Node> nodes;
};

std::mutex gMu;  // every capture, and the capture fields of streams and events
std::vector<std::shared_ptr<Capture>> gActive;
unsigned long long gNextId = 1;
thread_local cudaStreamCaptureMode tMode = cudaStreamCaptureModeGlobal;

void release(Capture& c) {
  for (const StreamPtr& s : c.joined) {
    s->capture.reset();
    s->deps.clear();
  }
  c.joined.clear();
  for (auto it = gActive.begin(); it != gActive.end(); ++it) {
    if (it->get() == &c) {
      gActive.erase(it);
      break;
    }
  }
}

int addNode(Capture& c, Work w, std::vector<int> deps) {
  c.nodes.push_back(Node{Node::kWork, std::move(w), nullptr, std::move(deps)});
  return int(c.nodes.size()) - 1;
}
int addEventNode(Capture& c, Node::Kind kind, const EventPtr& e, std::vector<int> deps) {
  c.nodes.push_back(Node{kind, nullptr, e, std::move(deps)});
  return int(c.nodes.size()) - 1;
}

// One replay, its events' generations taken already (gens[i] for node i).
void runGraph(const std::shared_ptr<const Graph>& g, const std::vector<uint64_t>& gens) {
  const size_t n = g->nodes.size();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> done(n, false);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < n; ++i) {
    ts.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          for (int d : g->nodes[i].deps)
            if (!done[size_t(d)]) return false;
          return true;
        });
      }
      const Node& node = g->nodes[i];
      if (node.kind == Node::kWork) {
        node.work();
      } else if (node.kind == Node::kWait) {
        waitWork(node.event, gens[i])();
      } else {
        completeRecord(node.event, gens[i]);
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        done[i] = true;
      }
      cv.notify_all();
    });
  }
  for (auto& t : ts) t.join();
}

}  // namespace

cudaError_t captureWork(const StreamPtr& s, const Work& w, bool* captured) {
  std::lock_guard<std::mutex> lock(gMu);
  *captured = s->capture != nullptr;
  if (!s->capture) {
    if (!s->legacy) return cudaSuccess;
    // Work on the legacy stream would wait for the blocking streams, a capturing one too.
    for (auto& c : gActive) {
      for (const StreamPtr& j : c->joined) {
        if (j->device == s->device && j->blocking) {
          c->invalidated = true;
          return fail(cudaErrorStreamCaptureImplicit);
        }
      }
    }
    return cudaSuccess;
  }
  Capture& c = *s->capture;
  if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  s->deps = {addNode(c, w, s->deps)};
  return cudaSuccess;
}

cudaError_t captureRecord(const EventPtr& e, const StreamPtr& s, bool external, bool* handled) {
  std::lock_guard<std::mutex> lock(gMu);
  *handled = s->capture != nullptr;
  if (!s->capture) return cudaSuccess;
  Capture& c = *s->capture;
  if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (external) {
    s->deps = {addEventNode(c, Node::kRecord, e, s->deps)};
    return cudaSuccess;
  }
  std::lock_guard<std::mutex> elock(e->mu);
  e->capture = s->capture;
  e->captureDeps = s->deps;
  return cudaSuccess;
}

cudaError_t captureWait(const StreamPtr& s, const EventPtr& e, bool external, bool* handled) {
  std::lock_guard<std::mutex> lock(gMu);
  std::shared_ptr<Capture> ec;
  std::vector<int> edeps;
  {
    std::lock_guard<std::mutex> elock(e->mu);
    ec = e->capture;
    edeps = e->captureDeps;
  }
  *handled = s->capture != nullptr || ec != nullptr;
  if (s->capture) {
    Capture& c = *s->capture;
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    if (external) {
      s->deps = {addEventNode(c, Node::kWait, e, s->deps)};
      return cudaSuccess;
    }
    if (ec != s->capture) {  // an event of no capture, or of another one
      c.invalidated = true;
      if (ec) ec->invalidated = true;
      return fail(cudaErrorStreamCaptureIsolation);
    }
    std::set<int> all(s->deps.begin(), s->deps.end());
    all.insert(edeps.begin(), edeps.end());
    s->deps.assign(all.begin(), all.end());
    return cudaSuccess;
  }
  if (!ec) return cudaSuccess;
  if (ec->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  // A stream that waits for a captured event joins its capture.
  s->capture = ec;
  s->deps = edeps;
  ec->joined.push_back(s);
  return cudaSuccess;
}

bool capturing(const StreamPtr& s) {
  std::lock_guard<std::mutex> lock(gMu);
  return s->capture != nullptr;
}

bool refuseCapturing(const StreamPtr& s) {
  std::lock_guard<std::mutex> lock(gMu);
  if (s->capture) s->capture->invalidated = true;
  return s->capture != nullptr;
}

bool captureAllowsUnsafeCall() {
  if (tMode == cudaStreamCaptureModeRelaxed) return true;
  std::lock_guard<std::mutex> lock(gMu);
  bool allowed = true;
  for (auto& c : gActive) {
    const bool mine = c->thread == std::this_thread::get_id();
    if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && tMode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
      c->invalidated = true;
      allowed = false;
    }
  }
  return allowed;
}

}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode) return fail(cudaErrorInvalidValue);
  std::swap(*mode, tMode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, cudaStreamCaptureMode mode) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (s->legacy) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(gMu);
  if (s->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->id = gNextId++;
  c->thread = std::this_thread::get_id();
  c->mode = mode;
  c->origin = s;
  c->joined.push_back(s);
  s->capture = c;
  s->deps.clear();
  gActive.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t* out) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!out) return fail(cudaErrorInvalidValue);
  *out = nullptr;
  std::lock_guard<std::mutex> lock(gMu);
  std::shared_ptr<Capture> c = s->capture;
  if (!c) return fail(cudaErrorIllegalState);
  if (c->origin != s) return fail(cudaErrorStreamCaptureUnmatched);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  // Every joined stream's last work must be something the origin's last work depends on.
  std::vector<bool> reached(c->nodes.size(), false);
  std::vector<int> todo = s->deps;
  while (!todo.empty()) {
    const int n = todo.back();
    todo.pop_back();
    if (reached[size_t(n)]) continue;
    reached[size_t(n)] = true;
    for (int d : c->nodes[size_t(n)].deps) todo.push_back(d);
  }
  bool unjoined = false;
  for (const StreamPtr& j : c->joined)
    for (int d : j->deps) unjoined = unjoined || !reached[size_t(d)];
  const bool invalidated = c->invalidated;
  release(*c);
  if (invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (unjoined) return fail(cudaErrorStreamCaptureUnjoined);
  auto* g = new Graph;
  g->nodes = std::move(c->nodes);
  *out = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t h, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* ndeps) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!status) return fail(cudaErrorInvalidValue);
  if (graph || deps || edges || ndeps) return fail(cudaErrorNotSupported);  // not emulated
  std::lock_guard<std::mutex> lock(gMu);
  if (!s->capture) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
  if (id) *id = s->capture->id;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(h, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!exec || !graph) return fail(cudaErrorInvalidValue);
  auto* g = new std::shared_ptr<const Graph>(
      std::make_shared<const Graph>(*reinterpret_cast<Graph*>(graph)));
  *exec = reinterpret_cast<cudaGraphExec_t>(g);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t h) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!exec) return fail(cudaErrorInvalidValue);
  if (s->capture) return fail(cudaErrorNotSupported);  // a graph inside a capture: not emulated
  std::shared_ptr<const Graph> g = *reinterpret_cast<std::shared_ptr<const Graph>*>(exec);
  std::vector<uint64_t> gens(g->nodes.size(), 0);
  for (size_t i = 0; i < gens.size(); ++i) {
    const Node& node = g->nodes[i];
    if (node.kind == Node::kWork) continue;
    std::lock_guard<std::mutex> lock(node.event->mu);
    gens[i] = node.kind == Node::kRecord ? ++node.event->recorded : node.event->recorded;
  }
  return enqueue(s, [g, gens] { runGraph(g, gens); });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<std::shared_ptr<const Graph>*>(exec);  // a replay keeps its own
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}

}  // extern "C"
