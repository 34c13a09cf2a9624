#include "runtime/lifecycle.h"

#include <algorithm>
#include <functional>
#include <future>
#include <memory>
#include <system_error>

#include "runtime/bootstrap_root.h"
#include "runtime/env.h"
#include "runtime/group.h"
#include "runtime/log.h"

namespace tutti {

Result<wire::UniqueId> idForAddress(const std::string& hostPort, const std::string& jobKey,
                                    bool spansHosts) {
  TUTTI_ASSIGN(addr, net::parseHostPort(hostPort));
  wire::UniqueId id{};
  id.magic = wire::kIdMagic;
  id.flags = wire::kRootStartedByRank0 | (spansHosts ? wire::kJobSpansHosts : 0u);
  id.root = wire::fromSockAddr(addr);
  std::string key = env::getString("TUTTI_SECRET").value_or(hostPort + "|" + jobKey);
  id.secret = fnv1a(key.data(), key.size()) | 1;  // never 0
  return id;
}

Result<wire::UniqueId> newUniqueId() {
  if (auto commId = env::getString("NCCL_COMM_ID")) {
    return idForAddress(*commId, "NCCL_COMM_ID");
  }
  std::string spec = env::getString("NCCL_SOCKET_IFNAME").value_or("");
  int family = AF_UNSPEC;
  if (auto f = env::getString("NCCL_SOCKET_FAMILY")) {
    if (*f == "AF_INET") family = AF_INET;
    if (*f == "AF_INET6") family = AF_INET6;
  }
  auto ifaces = net::findInterfaces(spec, family);
  if (ifaces.empty()) {
    return systemError("ncclGetUniqueId: no network interface is up" +
                       (spec.empty() ? std::string() : " that matches NCCL_SOCKET_IFNAME=" + spec));
  }
  TUTTI_INFO(log::kBootstrap, "bootstrap: using interface %s (%s)%s", ifaces[0].name.c_str(),
             ifaces[0].addr.toString().c_str(),
             spec.empty() ? "" : (" chosen by NCCL_SOCKET_IFNAME=" + spec).c_str());
  net::SockAddr bind = ifaces[0].addr;
  bind.setPort(0);
  return startRootWithNewId(bind);
}

namespace {

// Runs `work` as the config and the current group ask: now, or in the background.
Result<Started> launch(Comm* comm, std::function<Status()> work) {
  registry::add(comm);
  bool inGroup = group::active();
  if (!comm->config().blocking || inGroup) {
    std::shared_future<Status> done = comm->startAsync(std::move(work));
    if (inGroup) group::defer(done, comm->config().blocking);
    // Inside a group NCCL reports in-progress from ncclGroupEnd, not from the call.
    return Started{comm, !comm->config().blocking && !inGroup, done};
  }
  Status s = work();
  comm->finish(s);
  if (!s.ok()) {
    destroyComm(comm, true);
    return s;
  }
  return Started{comm, false, {}};
}

struct SplitPlan {
  int rank = -1, nranks = 0;
  wire::UniqueId id{};
};

// Runs `work` on a thread of its own, adopted by the parent (which waits for it when freed); a
// failure is the parent's asynchronous error (nobody else will hear of it). Throws
// std::system_error, having adopted nothing, where no thread can start.
std::shared_future<Status> runForParent(Comm* parent, std::function<Status()> work) {
  std::shared_future<Status> done =
      std::async(std::launch::async, [parent, work = std::move(work)] {
        Status s = work();
        parent->setAsyncError(s);
        return s;
      }).share();
  parent->adoptHelper(done);
  return done;
}

// *exchanged: whether both of the parent's all-gathers completed (then every rank of the
// parent got as far, whatever the plan says).
Result<SplitPlan> exchangeSplit(Comm* parent, int color, int key, bool* exchanged);

// Every rank of the parent takes part, NOCOLOR ranks included, in the order of the calls:
// the exchange, then `child` (the new communicator's creation; none for NOCOLOR), then, where
// ranks of the parent share a GPU as threads, a barrier of the parent -- all in the split's
// turn. Such a child makes its GPU links as it is created (DeviceEngine::connectAtCreation),
// which may wait for the whole GPU: no rank of the parent may queue a kernel that waits for
// another (a NOCOLOR rank's next collective on the parent, say) before every child's are made.
// (A non-blocking split returns first: the parent's next GPU operation waits for it to end,
// Comm::waitFamilyHelpersFor.)
// ringDone (where not null) is set once the split no longer uses the parent's bootstrap ring
// (Comm::adoptRingUser): after the exchange, or where ranks share a GPU as threads after the
// barrier; however this returns.
// A child aborted before the split's turn came ends this at once, but the parent's other ranks
// still run the exchange and wait for this rank in it: a thread of the parent's takes part in
// its place, as a rank of no colour (so theirs forms without it), and the parent waits for that
// thread as for any helper. So for the barrier, where a child is aborted after the exchange.
Status runSplit(Comm* parent, uint64_t ticket, int color, int key,
                const std::atomic<bool>* childAbort,
                const std::function<Status(const SplitPlan&)>& child,
                std::shared_ptr<std::promise<void>> ringDone = nullptr) {
  struct RingDone {
    std::shared_ptr<std::promise<void>> p;
    void set() {
      if (p) p->set_value();
      p.reset();
    }
    ~RingDone() { set(); }
  } ring{std::move(ringDone)};
  bool childAborted = false;
  if (Status t = parent->waitSplitTurn(ticket, childAbort, &childAborted); !t.ok()) {
    if (childAborted) {
      try {
        runForParent(parent, [parent, ticket, key, r = ring.p] {
          return runSplit(parent, ticket, -1, key, nullptr, nullptr, r);
        });
        ring.p.reset();                     // the stand-in's now
      } catch (const std::system_error&) {  // no thread: the turn is given up, as before
        parent->abandonSplitTurn(ticket);
      }
    }
    return t.withContext("split");
  }
  struct Turn {  // ended however this returns (an exception from the child's creation too)
    Comm* parent;
    bool own = true;  // false: handed to the barrier's stand-in, which ends it
    ~Turn() {
      if (own) parent->endSplitTurn();
    }
  } turn{parent};
  bool exchanged = false;
  Result<SplitPlan> plan = exchangeSplit(parent, color, key, &exchanged);
  if (!parent->threadsShareGpu()) ring.set();
  Status s = plan.status();
  if (s.ok() && child) s = child(plan.value());
  // Every rank that completed the exchange comes here, a child's failure or not (its peers
  // wait here too; its own error comes first). A rank whose new communicator is being aborted
  // must not wait here (ncclCommAbort would wait for the other ranks' creations, which may wait
  // for this one's until their bootstrap deadline), but the others wait for it here: a thread
  // of the parent's takes part in the barrier in its place, still in the split's turn (which it
  // ends), and the parent's next GPU operation waits for it (Comm::waitFamilyHelpersFor).
  const bool aborting = childAbort && childAbort->load(std::memory_order_acquire);
  if (exchanged && parent->threadsShareGpu()) {
    auto barrier = [parent] {
      return parent->bootstrap()->barrier().withContext(
          "split: waiting for the parent's ranks to make their new communicators' GPU links");
    };
    if (!aborting) {
      Status b = barrier();
      if (s.ok()) s = b;
    } else {
      try {
        runForParent(parent, [parent, barrier, r = ring.p] {
          Status b = barrier();
          parent->endSplitTurn();
          if (r) r->set_value();
          return b;
        });
        turn.own = false;  // the stand-in's now, with the ring's promise
        ring.p.reset();
      } catch (const std::system_error&) {  // no thread: the barrier is skipped, as before
      }
    }
  }
  return s;
}

Result<SplitPlan> exchangeSplit(Comm* parent, int color, int key, bool* exchanged) {
  Bootstrap* b = parent->bootstrap();
  int n = parent->nranks(), me = parent->rank();
  struct Entry {
    int32_t color, key;
  };
  std::vector<Entry> entries(static_cast<size_t>(n));
  entries[static_cast<size_t>(me)] = {color, key};
  TUTTI_TRY(b->allGather(entries.data(), sizeof(Entry)).withContext("split: colours"));

  SplitPlan plan;
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (color >= 0 && entries[static_cast<size_t>(r)].color == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b2) {
    return entries[static_cast<size_t>(a)].key < entries[static_cast<size_t>(b2)].key;
  });
  std::vector<wire::UniqueId> ids(static_cast<size_t>(n), wire::UniqueId{});
  Status rootStatus;
  if (!members.empty()) {
    plan.nranks = static_cast<int>(members.size());
    plan.rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    if (plan.rank == 0) {
      // The colour's first rank hosts its root, on the interface the parent already uses.
      net::SockAddr bind = b->listenAddr();
      bind.setPort(0);
      // On failure still take part in the exchange below (with an empty id), so that the
      // other ranks hear of it now instead of at their deadline.
      Result<wire::UniqueId> id = startRootWithNewId(bind);
      if (id.ok()) ids[static_cast<size_t>(me)] = id.value();
      rootStatus = id.status();
    }
  }
  TUTTI_TRY(b->allGather(ids.data(), sizeof(wire::UniqueId)).withContext("split: ids"));
  *exchanged = true;
  TUTTI_TRY(rootStatus.withContext("split: starting the new communicator's root"));
  if (!members.empty()) {
    plan.id = ids[static_cast<size_t>(members[0])];
    if (plan.id.magic != wire::kIdMagic) {
      return systemError("split: rank " + std::to_string(members[0]) + ", first of colour " +
                         std::to_string(color) + ", could not start the new communicator's root");
    }
  }
  return plan;
}

}  // namespace

Result<Started> initRank(int nranks, const wire::UniqueId& id, int rank, int cudaDev,
                         CommConfig config) {
  auto* comm = new Comm(rank, nranks, cudaDev, std::move(config));
  return launch(comm, [comm, id, rank]() -> Status {
    if (rank == 0 && (id.flags & wire::kRootStartedByRank0)) {
      TUTTI_ASSIGN(root, startRootForId(id));
      comm->setRoot(root);
    }
    return comm->init(id);
  });
}

Result<Started> splitComm(Comm* parent, int color, int key, CommConfig config) {
  uint64_t ticket = parent->takeSplitTicket();
  if (color == -1) {  // NCCL_SPLIT_NOCOLOR: take part in the exchange, get no communicator
    if (config.blocking && !group::active()) {
      TUTTI_TRY(runSplit(parent, ticket, color, key, nullptr, nullptr));
      return Started{nullptr, false, {}};
    }
    auto ring = std::make_shared<std::promise<void>>();
    parent->adoptRingUser(ring->get_future().share());
    std::shared_future<Status> done = runForParent(parent, [parent, ticket, color, key, ring] {
      return runSplit(parent, ticket, color, key, nullptr, nullptr, ring);
    });
    if (group::active()) group::defer(done, config.blocking);
    return Started{nullptr, false, done};
  }
  auto* comm = new Comm(-1, 0, parent->cudaDev(), std::move(config));
  comm->inheritFrom(*parent);
  auto ring = std::make_shared<std::promise<void>>();
  std::shared_future<void> ringDone = ring->get_future().share();
  Result<Started> started = launch(comm, [comm, parent, ticket, color, key, ring]() -> Status {
    return runSplit(
        parent, ticket, color, key, comm->abortFlag(),
        [comm](const SplitPlan& plan) {
          comm->setIdentity(plan.rank, plan.nranks);
          return comm->init(plan.id);
        },
        ring);
  });
  // The parent must outlive the exchange its child runs on it: it waits for it when freed; and
  // its first GPU collective waits for the exchange (Comm::adoptRingUser).
  if (started.ok() && started.value().done.valid()) {
    parent->adoptRingUser(ringDone);
    parent->adoptHelper(started.value().done);
  }
  return started;
}

void destroyComm(Comm* comm, bool abort) {
  if (!registry::remove(comm)) return;  // another thread is already destroying it
  if (abort) comm->noteAbort();         // before the abort word stops the kernels
  if (abort || comm->state() == Comm::State::kInitializing) comm->requestAbort();
  if (abort) comm->breakLinks();  // peers waiting on this rank fail now, not at their deadline
  group::discard(comm);           // queued in this thread's open group: never going to run now
  // A call on another thread (a collective a watchdog is aborting) must return first.
  comm->waitUnpinned();
  delete comm;
}

}  // namespace tutti
