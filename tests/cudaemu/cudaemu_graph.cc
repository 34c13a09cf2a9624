// The emulated CUDA runtime (cudaemu.h): stream capture into graphs, and their replays.
//
// A capture is a list of nodes, each with the nodes it depends on. Work queued on a capturing
// stream becomes a node after the stream's current dependencies; an event recorded there
// carries them, and a stream that waits for it joins the capture (or, capturing already, takes
// them on). External records and waits (cudaEventRecordExternal, cudaEventWaitExternal) are
// nodes of their own that touch the event at each replay. cudaStreamEndCapture on the origin
// stream fails where a joined stream's work was not joined back into it; waiting, in a capture,
// for an event of another capture or of none is refused and invalidates it. A replay runs
// every node on a thread of its own once its dependencies have run, so branches run at once,
// as on a GPU; the launches of one instantiated graph run one at a time, in launch order. The
// legacy stream is never captured: work on it, or a query of it, while a blocking stream of its
// device captures is refused (cudaErrorStreamCaptureImplicit) and invalidates that capture. The
// capture modes' rule on unsafe calls (cudaStreamSynchronize, cudaEventQuery, cudaMalloc ...) is
// CUDA's: refused, and the capture invalidated, for a thread that has a capture of its own not
// begun in relaxed mode, or, in global mode, where any thread has one begun in global mode.
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
  std::atomic<bool> ended{false};  // read under an event's lock (openCaptureOf)
};

namespace {

struct Graph {
  std::vector<Node> nodes;
};
// An instantiated graph: its launches run one at a time, in the order they were made (an
// internal event orders each after the one before).
struct Exec {
  std::shared_ptr<const Graph> graph;
  EventPtr order = std::make_shared<Event>();
};

// Every open capture, and the capture fields of streams and events. Never destroyed: a
// communicator destroyed at exit may still ask.
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Capture>> active;
  unsigned long long nextId = 1;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}
thread_local cudaStreamCaptureMode tMode = cudaStreamCaptureModeGlobal;

void release(Capture& c) {
  for (const StreamPtr& s : c.joined) {
    s->capture.reset();
    s->deps.clear();
  }
  c.joined.clear();
  c.origin.reset();
  c.ended = true;
  for (auto it = registry().active.begin(); it != registry().active.end(); ++it) {
    if (it->get() == &c) {
      registry().active.erase(it);
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

// Whether a blocking stream of the device captures; those captures are invalidated. With the
// registry's lock held.
bool invalidateBlockingCaptures(int device) {
  bool any = false;
  for (auto& c : registry().active) {
    for (const StreamPtr& j : c->joined) {
      if (j->device == device && j->blocking) {
        c->invalidated = true;
        any = true;
      }
    }
  }
  return any;
}

cudaError_t captureWork(const StreamPtr& s, const Work& w, bool* captured) {
  std::lock_guard<std::mutex> lock(registry().mu);
  *captured = s->capture != nullptr;
  if (!s->capture) {
    // Work on the legacy stream would wait for the blocking streams, a capturing one too.
    if (s->legacy && invalidateBlockingCaptures(s->device))
      return fail(cudaErrorStreamCaptureImplicit);
    return cudaSuccess;
  }
  Capture& c = *s->capture;
  if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  s->deps = {addNode(c, w, s->deps)};
  return cudaSuccess;
}

cudaError_t captureRecord(const EventPtr& e, const StreamPtr& s, bool external, bool* handled) {
  std::lock_guard<std::mutex> lock(registry().mu);
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

std::shared_ptr<Capture> openCaptureOf(const EventPtr& e) {
  std::lock_guard<std::mutex> lock(e->mu);
  return e->capture && !e->capture->ended ? e->capture : nullptr;
}

bool refuseCapturedEvent(const EventPtr& e) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Capture> c = openCaptureOf(e);
  if (c) c->invalidated = true;
  return c != nullptr;
}

cudaError_t captureWait(const StreamPtr& s, const EventPtr& e, bool external, bool* handled) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::shared_ptr<Capture> ec = openCaptureOf(e);
  std::vector<int> edeps;
  if (ec) {
    std::lock_guard<std::mutex> elock(e->mu);
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
      return fail(ec ? cudaErrorStreamCaptureMerge : cudaErrorStreamCaptureIsolation);
    }
    std::set<int> all(s->deps.begin(), s->deps.end());
    all.insert(edeps.begin(), edeps.end());
    s->deps.assign(all.begin(), all.end());
    return cudaSuccess;
  }
  if (!ec) return cudaSuccess;
  if (ec->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (s->legacy) {  // the legacy stream is never captured
    ec->invalidated = true;
    return fail(cudaErrorStreamCaptureImplicit);
  }
  // A stream that waits for a captured event joins its capture.
  s->capture = ec;
  s->deps = edeps;
  ec->joined.push_back(s);
  return cudaSuccess;
}

bool capturing(const StreamPtr& s) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return s->capture != nullptr;
}

bool refuseCapturing(const StreamPtr& s) {
  std::lock_guard<std::mutex> lock(registry().mu);
  if (s->capture) s->capture->invalidated = true;
  return s->capture != nullptr;
}

bool legacyBlockedByCapture(int device) {
  std::lock_guard<std::mutex> lock(registry().mu);
  return invalidateBlockingCaptures(device);
}

bool deviceCapturing(int device) {
  std::lock_guard<std::mutex> lock(registry().mu);
  for (auto& c : registry().active)
    for (const StreamPtr& j : c->joined)
      if (j->device == device) return true;
  return false;
}

bool captureAllowsUnsafeCall() {
  if (tMode == cudaStreamCaptureModeRelaxed) return true;
  std::lock_guard<std::mutex> lock(registry().mu);
  bool allowed = true;
  for (auto& c : registry().active) {
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
  CUDAEMU_CALL;
  if (!mode) return fail(cudaErrorInvalidValue);
  std::swap(*mode, tMode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t h, cudaStreamCaptureMode mode) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (s->legacy) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(registry().mu);
  if (s->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->id = registry().nextId++;
  c->thread = std::this_thread::get_id();
  c->mode = mode;
  c->origin = s;
  c->joined.push_back(s);
  s->capture = c;
  s->deps.clear();
  registry().active.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t* out) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!out) return fail(cudaErrorInvalidValue);
  *out = nullptr;
  std::lock_guard<std::mutex> lock(registry().mu);
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
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!status) return fail(cudaErrorInvalidValue);
  if (graph || deps || edges || ndeps) return fail(cudaErrorNotSupported);  // not emulated
  if (s->legacy && legacyBlockedByCapture(s->device)) return fail(cudaErrorStreamCaptureImplicit);
  std::lock_guard<std::mutex> lock(registry().mu);
  if (!s->capture) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status =
      s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  if (id) *id = s->capture->id;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t h, cudaStreamCaptureStatus* status) {
  CUDAEMU_CALL;
  return cudaStreamGetCaptureInfo(h, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  CUDAEMU_CALL;
  if (!exec || !graph) return fail(cudaErrorInvalidValue);
  auto* x = new Exec;
  x->graph = std::make_shared<const Graph>(*reinterpret_cast<Graph*>(graph));
  *exec = reinterpret_cast<cudaGraphExec_t>(x);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!exec) return fail(cudaErrorInvalidValue);
  if (capturing(s)) return fail(cudaErrorNotSupported);  // a graph in a capture: not emulated
  Exec* x = reinterpret_cast<Exec*>(exec);
  std::shared_ptr<const Graph> g = x->graph;
  EventPtr order = x->order;
  uint64_t before, mine;
  {
    std::lock_guard<std::mutex> lock(order->mu);
    before = order->recorded;
    mine = ++order->recorded;
  }
  std::vector<uint64_t> gens(g->nodes.size(), 0);
  for (size_t i = 0; i < gens.size(); ++i) {
    const Node& node = g->nodes[i];
    if (node.kind == Node::kWork) continue;
    std::lock_guard<std::mutex> lock(node.event->mu);
    gens[i] = node.kind == Node::kRecord ? ++node.event->recorded : node.event->recorded;
  }
  const cudaError_t r = enqueue(s, [g, gens, order, before, mine] {
    if (before > 0) waitWork(order, before)();
    runGraph(g, gens);
    completeRecord(order, mine);
  });
  if (r != cudaSuccess) {  // it never runs: nothing may wait for its records
    completeRecord(order, mine);
    for (size_t i = 0; i < gens.size(); ++i)
      if (g->nodes[i].kind == Node::kRecord) completeRecord(g->nodes[i].event, gens[i]);
  }
  return r;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  CUDAEMU_CALL;
  delete reinterpret_cast<Exec*>(exec);  // a replay holds what it needs
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  CUDAEMU_CALL;
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}

}  // extern "C"
