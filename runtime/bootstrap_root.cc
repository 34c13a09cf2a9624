#include "runtime/bootstrap_root.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/acceptor.h"
#include "runtime/env.h"
#include "runtime/log.h"

namespace tutti {
namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) out += " and " + std::to_string(ranks.size() - shown) + " more";
  return out;
}

class Root {
 public:
  static constexpr int kMaxRanks = 1 << 20;
  static constexpr double kIdleSeconds = 3600;
  // After refusing the job, how long the root waits for the ranks still to come before it
  // answers this process's own ranks (see run()); TUTTI_BOOTSTRAP_TIMEOUT when that is less.
  static constexpr double kRefusalGraceS = 10;

  Root(net::Socket listener, uint64_t secret, double timeoutS, const std::atomic<bool>* stop)
      : listener_(std::move(listener)),
        secret_(secret),
        timeoutS_(timeoutS),
        stop_(stop),
        acceptor_(&listener_, secret, "bootstrap root") {}

  void run() {
    std::string where =
        listener_.localAddr().ok() ? listener_.localAddr().value().toString() : std::string("?");
    // Until the first check-in the root only idles (an id may be made long before it is used);
    // the job's deadline starts with that first check-in.
    net::Deadline deadline = net::deadlineAfter(std::max(timeoutS_, kIdleSeconds));
    bool first = true;
    bool oursTold = false;  // after a refusal: this process's ranks were answered
    while (nranks_ < 0 || arrived_ < nranks_) {
      // After a refusal, this process's ranks wait at most until graceEnd_ (see below).
      const bool grace = !refused_.empty() && !oursTold;
      Result<Acceptor::Accepted> a =
          acceptor_.next(grace ? std::min(deadline, graceEnd_) : deadline, stop_);
      if (!a.ok()) {
        if (stop_ && stop_->load()) {
          TUTTI_INFO(log::kBootstrap, "bootstrap root %s: stopped", where.c_str());
          if (!refused_.empty()) answerAll(Code::kInvalidUsage, refused_);
          return;
        }
        if (grace && net::Clock::now() < deadline) {
          // The grace ended: this process's ranks hear why now, naming the ranks still to
          // come, which are told as they come until the job's deadline, while this thread
          // lives.
          answerAll(Code::kInvalidUsage, refusedLate(), /*ours_too=*/true);
          oursTold = true;
          continue;
        }
        fail(where);
        return;
      }
      Acceptor::Accepted acc = a.take();
      const wire::Hello& h = acc.hello;
      if (h.kind != static_cast<uint32_t>(wire::HelloKind::kCheckIn)) {
        TUTTI_WARN("bootstrap root %s: dropped a connection of kind %u (expected a check-in)",
                   where.c_str(), h.kind);
        continue;
      }
      if (first && (h.nranks < 1 || h.nranks > kMaxRanks)) {
        std::string problem =
            "nranks=" + std::to_string(h.nranks) + " is outside 1.." + std::to_string(kMaxRanks);
        TUTTI_WARN("bootstrap root %s: %s", where.c_str(), problem.c_str());
        reply(acc.socket, Code::kInvalidArgument, problem, wire::Addr{});
        continue;
      }
      if (first) {
        // The deadline runs from the first check-in: an id may be made well before use.
        first = false;
        deadline = net::deadlineAfter(timeoutS_);
        nranks_ = h.nranks;
        slots_.resize(static_cast<size_t>(std::max(nranks_, 0)));
        fingerprint_ = h.tag;
        firstRank_ = h.rank;
      }
      std::string problem;
      if (h.nranks != nranks_) {
        problem = "rank " + std::to_string(h.rank) + " says nranks=" + std::to_string(h.nranks) +
                  " but the first rank to check in said nranks=" + std::to_string(nranks_);
      } else if (h.rank < 0 || h.rank >= nranks_) {
        problem = "rank " + std::to_string(h.rank) +
                  " is out of range for nranks=" + std::to_string(nranks_);
      } else if (slots_[static_cast<size_t>(h.rank)]) {
        problem = "rank " + std::to_string(h.rank) +
                  " checked in twice (two processes were given the same rank?)";
      }
      if (!problem.empty()) {
        TUTTI_WARN("bootstrap root %s: %s", where.c_str(), problem.c_str());
        reply(acc.socket, Code::kInvalidUsage, problem, wire::Addr{});
        continue;
      }
      TUTTI_TRACE(log::kBootstrap, "bootstrap root %s: rank %d checked in from %s", where.c_str(),
                  h.rank, acc.socket.peerAddr().toString().c_str());
      slots_[static_cast<size_t>(h.rank)] = Slot{std::move(acc.socket), h.addr, h.size};
      ++arrived_;
      if (h.tag != fingerprint_ && refused_.empty()) {
        char prints[64];
        snprintf(prints, sizeof prints, "%08x against %08x", h.tag, fingerprint_);
        refused_ = "rank " + std::to_string(h.rank) + " runs another tutti build than rank " +
                   std::to_string(firstRank_) + " (build fingerprints " + prints +
                   "; 00000000: a build from before this check): their peer info would not "
                   "match, so the job is refused; run the same tutti build on every rank";
        TUTTI_WARN("bootstrap root %s: %s", where.c_str(), refused_.c_str());
        refusedAt_ = net::Clock::now();
        graceEnd_ = net::deadlineAfter(std::min(timeoutS_, kRefusalGraceS));
      }
      // Every rank hears a refusal of the whole job at once: those that checked in, and the
      // rest as they come, rather than at the deadline. Except this process's ranks: told, one
      // may return and the process exit, taking this thread with it, and the ranks still to
      // come would wait for a root that is gone until their own deadline, not knowing why. So
      // they are told last, once every rank has checked in or kRefusalGraceS have passed.
      if (!refused_.empty()) answerAll(Code::kInvalidUsage, refused_, /*ours_too=*/oursTold);
    }
    if (!refused_.empty()) {
      answerAll(Code::kInvalidUsage, refused_);
      return;
    }
    if (std::string unreachable = loopbackAcrossHosts(); !unreachable.empty()) {
      TUTTI_WARN("bootstrap root %s: %s", where.c_str(), unreachable.c_str());
      answerAll(Code::kInvalidUsage, unreachable);
      return;
    }
    for (int r = 0; r < nranks_; ++r) {
      auto& next = slots_[static_cast<size_t>((r + 1) % nranks_)];
      reply(slots_[static_cast<size_t>(r)]->socket, Code::kOk, "", next->addr);
    }
    TUTTI_INFO(log::kBootstrap, "bootstrap root %s: all %d ranks checked in", where.c_str(),
               nranks_);
  }

 private:
  // A rank that listens on a loopback address cannot be reached by one on another host: the
  // ring would fail at its deadline, naming a loopback address. Said at once instead, for the
  // whole job ("" where all is well). A rank is on another host where the address it listens
  // on is not one of this host's (not the address it connected from, which NAT may change).
  std::string loopbackAcrossHosts() {
    auto listens = [&](int r) { return wire::toSockAddr(slots_[static_cast<size_t>(r)]->addr); };
    int onLoopback = -1, elsewhere = -1;
    for (int r = 0; r < nranks_ && onLoopback < 0; ++r) {
      if (listens(r).isLoopback()) onLoopback = r;
    }
    if (onLoopback < 0) return "";
    for (int r = 0; r < nranks_ && elsewhere < 0; ++r) {
      if (!listens(r).isWildcard() && !net::isLocalAddress(listens(r))) elsewhere = r;
    }
    if (elsewhere < 0) return "";
    return "rank " + std::to_string(onLoopback) + " listens on a loopback address (" +
           listens(onLoopback).toString() + "), out of reach of rank " +
           std::to_string(elsewhere) + ", which listens on another host (" +
           listens(elsewhere).toString() +
           "): set NCCL_SOCKET_IFNAME to an interface the other hosts reach (tutti leaves "
           "loopback by itself where the launcher says the ranks are on several hosts)";
  }

  struct Slot {
    net::Socket socket;
    wire::Addr addr;
    uint64_t token;         // its process's processToken()
    bool answered = false;  // told of a failure already
  };

  // Tells every rank that checked in and was not told yet; ranks of this process last (or not
  // at all where !ours): once one of them has its answer it may return and the process exit,
  // taking this thread with it before the other ranks heard why.
  void answerAll(Code code, const std::string& why, bool ours_too = true) {
    for (bool ours : {false, true}) {
      if (ours && !ours_too) break;
      for (auto& slot : slots_) {
        if (slot && !slot->answered && (slot->token == processToken()) == ours) {
          reply(slot->socket, code, why, wire::Addr{});
          slot->answered = true;
        }
      }
    }
  }

  // The ranks that have not checked in.
  std::vector<int> missingRanks() const {
    std::vector<int> missing;
    for (int r = 0; r < nranks_; ++r) {
      if (!slots_[static_cast<size_t>(r)]) missing.push_back(r);
    }
    return missing;
  }

  // The refusal, naming the ranks that had not checked in since.
  std::string refusedLate() const {
    const double waited = std::chrono::duration<double>(net::Clock::now() - refusedAt_).count();
    char after[32];
    snprintf(after, sizeof after, "%.0f", waited);
    return refused_ + " (rank(s) " + rankList(missingRanks()) + " had not checked in " + after +
           " s after that)";
  }

  void reply(net::Socket& s, Code code, const std::string& message, const wire::Addr& next) {
    wire::RootReply r{};
    r.magic = wire::kReplyMagic;
    r.code = static_cast<int32_t>(code);
    r.next = next;
    snprintf(r.message, sizeof(r.message), "%s", message.c_str());
    Status st = s.sendAll(&r, sizeof(r), net::deadlineAfter(10), nullptr);
    if (!st.ok()) {
      TUTTI_WARN("bootstrap root: could not answer a rank: %s", st.message().c_str());
    }
  }

  void fail(const std::string& where) {
    if (nranks_ < 0) {
      TUTTI_WARN("bootstrap root %s: no rank checked in within %.0f s; closing", where.c_str(),
                 std::max(timeoutS_, kIdleSeconds));
      return;
    }
    if (!refused_.empty()) {  // the job's deadline after a refusal: its reason comes first
      const std::string msg = refusedLate();
      TUTTI_WARN("bootstrap root: %s", msg.c_str());
      answerAll(Code::kInvalidUsage, msg);
      return;
    }
    std::string msg = "rank(s) " + rankList(missingRanks()) + " of " + std::to_string(nranks_) +
                      " did not check in with the bootstrap root at " + where + " within " +
                      std::to_string(static_cast<int>(timeoutS_)) + " s (TUTTI_BOOTSTRAP_TIMEOUT)";
    // A root on a loopback address that is not the usual one (127.0.0.1, ::1) is most likely a
    // host's name that /etc/hosts maps to 127.0.1.1, out of reach of other hosts' ranks; the
    // launcher did not say the job spans hosts (else it would listen on every address).
    const Result<net::SockAddr> bound = listener_.localAddr();
    if (bound.ok() && bound.value().isLoopback() && !bound.value().isUsualLoopback()) {
      msg += ". It listens on a loopback address, which ranks on other hosts cannot reach: if "
             "the job spans hosts, name rank 0's host by an address they reach (a name that "
             "/etc/hosts maps to 127.0.1.1 is a loopback one there)";
    }
    TUTTI_WARN("bootstrap root: %s", msg.c_str());
    answerAll(Code::kTimeout, msg);
  }

  net::Socket listener_;
  uint64_t secret_;
  double timeoutS_;
  const std::atomic<bool>* stop_;
  Acceptor acceptor_;
  int nranks_ = -1;
  int arrived_ = 0;
  uint32_t fingerprint_ = 0;  // the first rank's build (wire::buildFingerprint)
  int firstRank_ = -1;
  std::string refused_;        // why the whole job is refused (every rank is told at once)
  net::Deadline refusedAt_{};  // when it was
  net::Deadline graceEnd_{};   // when this process's ranks are told at the latest
  std::vector<std::optional<Slot>> slots_;
};

void launch(net::Socket listener, uint64_t secret, std::shared_ptr<RootControl> control) {
  double timeout = env::bootstrapTimeoutSeconds();
  std::thread([l = std::move(listener), secret, timeout, control]() mutable {
    {
      Root root(std::move(l), secret, timeout, control ? &control->stop : nullptr);
      root.run();
    }  // the listener is closed here
    if (control) control->done.store(true);
  }).detach();
}

}  // namespace

void RootControl::stopAndWait() {
  stop.store(true);
  for (int i = 0; i < 100 && !done.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

uint64_t randomSecret() {
  uint64_t s = 0;
  while (s == 0) {
    if (getrandom(&s, sizeof(s), 0) != sizeof(s)) {
      // getrandom cannot fail for 8 bytes once the pool is ready; fall back defensively.
      s = static_cast<uint64_t>(net::Clock::now().time_since_epoch().count()) ^
          (static_cast<uint64_t>(getpid()) << 32);
    }
  }
  return s;
}

uint64_t processToken() {
  // The pid mixed in: a child forked after the first call has a token of its own.
  static const uint64_t base = randomSecret();
  return base ^ (static_cast<uint64_t>(getpid()) * 0x9e3779b97f4a7c15ull);
}

Result<wire::UniqueId> startRootWithNewId(const net::SockAddr& bindAddr) {
  TUTTI_ASSIGN(listener, net::Socket::listen(bindAddr));
  TUTTI_ASSIGN(bound, listener.localAddr());
  // A wildcard bind (see Socket::listen) is reached through the address that was asked for.
  net::SockAddr local = bound.isWildcard() ? bindAddr : bound;
  local.setPort(bound.port());
  wire::UniqueId id{};
  id.magic = wire::kIdMagic;
  id.secret = randomSecret();
  id.root = wire::fromSockAddr(local);
  TUTTI_INFO(log::kBootstrap, "bootstrap root listening on %s", local.toString().c_str());
  launch(std::move(listener), id.secret, nullptr);
  return id;
}

Result<std::shared_ptr<RootControl>> startRootForId(const wire::UniqueId& id) {
  net::SockAddr addr = wire::toSockAddr(id.root);
  if ((id.flags & wire::kJobSpansHosts) && addr.isLoopback()) {
    // The other hosts reach this one by another address (wire.h): every address, one port.
    TUTTI_INFO(log::kBootstrap,
               "bootstrap root: the rendezvous %s is a loopback address here, but the ranks are on "
               "several hosts: listening on every address, port %u",
               addr.toString().c_str(), addr.port());
    addr = net::wildcardAddress(addr.family(), addr.port());
  }
  Result<net::Socket> listener = net::Socket::listen(addr);
  if (!listener.ok()) {
    return listener.status().withContext("rank 0 cannot host the bootstrap root at " +
                                         addr.toString() + " (is the port in use?)");
  }
  TUTTI_INFO(log::kBootstrap, "bootstrap root (hosted by rank 0) listening on %s",
             addr.toString().c_str());
  auto control = std::make_shared<RootControl>();
  launch(listener.take(), id.secret, control);
  return control;
}

}  // namespace tutti
