// Entries that ranks of one process sharing a GPU leave each other (runtime/
// device_engine.cc, enterStream): the first sibling to enter a group on a stream records an
// event there; a sibling that passes the same stream for the same group waits for that event
// instead of the stream. Every call of every sibling joins one, so the lookup is a hash.
//
// Thread-safe, and nothing is queued on a stream under its lock (only events are made and
// destroyed there). The first sibling records its event after join() returns (a record can
// block while the stream's queue is full, and that queue drains only once the other siblings
// launch), then says so (recorded); a follower waits for that before it waits for the event.
// When the first launches on the shared stream itself, a follower's join back to that stream
// must come after the first's kernels (else the stream holds the follower's join, which waits
// for the follower's kernel, which waits for the first's kernel queued behind the join): the
// follower waits for launched() first. Unclaimed entries (siblings with a stream each never
// claim) go once every sibling on the GPU has reached a later collective group. Plain C++
// over any event type, so that CI tests it without a GPU.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tutti {

// Where a group stands in a communicator's sequence, alike on the siblings that take part.
// Groups with a collective (every rank calls every collective) count up `coll`. A group of
// sends and receives alone belongs to the ranks it joins: `set` names them (this rank and the
// siblings it sends to or receives from), and `sub` counts that set's groups since the
// collective before. So exchanges among some ranks never shift the others' numbers, and two
// exchanges match only if the same ranks make them (r0 -> r1, then r1 -> r2: r1's second
// group matches r2's first).
struct GroupPos {
  uint64_t coll = 0;
  uint64_t sub = 0;
  uint64_t set = 0;  // 0 for a collective group
  bool operator==(const GroupPos& o) const {
    return coll == o.coll && sub == o.sub && set == o.set;
  }
  bool operator<(const GroupPos& o) const {
    if (coll != o.coll) return coll < o.coll;
    return sub != o.sub ? sub < o.sub : set < o.set;
  }
};

// Numbers one rank's groups (GroupPos).
class GroupCounter {
 public:
  GroupPos collective() {
    p2p_.clear();
    return GroupPos{++coll_, 0, 0};
  }
  // Sends and receives among `ranks` (this rank and its sibling peers in the group, any order,
  // repeats allowed).
  GroupPos exchange(std::vector<int> ranks) {
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    uint64_t h = 0xcbf29ce484222325ull;
    for (int r : ranks) h = (h ^ uint64_t(uint32_t(r))) * 0x100000001b3ull;
    h |= 1;  // never 0, a collective's
    return GroupPos{coll_, ++p2p_[ranks], h};
  }

 private:
  uint64_t coll_ = 0;                         // collective groups so far
  std::map<std::vector<int>, uint64_t> p2p_;  // each set's exchanges since the collective
};

struct StreamEntryKey {
  uint64_t commHash;
  int place;  // the GPU: siblings' progress is counted per GPU
  const void* stream;
  GroupPos group;
  bool operator==(const StreamEntryKey& o) const {
    return commHash == o.commHash && place == o.place && stream == o.stream && group == o.group;
  }
};

template <typename Event>
class StreamEntries {
 public:
  struct Entry {
    Event event{};
    int firstRank = -1;
    bool onStream = false;  // the first launches on the shared stream itself
    bool recorded = false;  // the first recorded the event (or failed to: failed)
    bool failed = false;
    bool launched = false;  // the first queued its kernels (or gave up)
  };
  using Ref = std::shared_ptr<Entry>;
  enum class Wait { kReady, kFailed, kTimedOut, kStopped };

  // release: takes back the event of an entry nobody holds any more; it may run on any thread,
  // with this table's lock held, so it must not call back into the table. bound: the most
  // entries kept where siblings' progress cannot tell (a sibling that never entered a group).
  StreamEntries(size_t bound, std::function<void(Event)> release)
      : bound_(bound), release_(std::move(release)) {}

  // The entry of `key`. A sibling that finds one is its follower (*first = false) and uses
  // it up; one that does not makes it for `siblings` followers with make(&event) (false: no
  // event could be made, nullptr comes back) and is its first: it must then call
  // recorded(), and launched() once its kernels are queued when onStream.
  template <class Make>
  Ref join(const StreamEntryKey& key, int siblings, int rank, bool onStream, Make&& make,
           bool* first) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      *first = false;
      Ref e = it->second.entry;
      if (--it->second.left == 0) map_.erase(it);
      return e;
    }
    *first = true;
    Event ev{};
    if (!make(&ev)) return nullptr;
    Release rel{this};
    Ref e(new Entry{}, rel);
    e->event = ev;
    e->firstRank = rank;
    e->onStream = onStream;
    map_[key] = Slot{e, siblings};
    progress_[{key.commHash, key.place}].byGroup.emplace(key.group, key.stream);
    order_.push_back(key);
    while (order_.size() > bound_) {
      drop(order_.front());
      order_.pop_front();
    }
    return e;
  }

  void recorded(const Ref& e, bool ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      e->recorded = true;
      e->failed = !ok;
    }
    cv_.notify_all();
  }
  void launched(const Ref& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      e->launched = true;
    }
    cv_.notify_all();
  }
  // A follower waits for its first: until the event is recorded, or its kernels launched.
  // stop() (polled) ends the wait early; timeoutS <= 0 waits without a deadline.
  Wait waitRecorded(const Ref& e, double timeoutS, const std::function<bool()>& stop) {
    return waitFor(e, timeoutS, stop, [&] { return e->recorded; });
  }
  Wait waitLaunched(const Ref& e, double timeoutS, const std::function<bool()>& stop) {
    return waitFor(e, timeoutS, stop, [&] { return e->launched; });
  }

  // Rank `rank`, one of the `ranksHere` ranks of a communicator on GPU `place`, enters group
  // `group` (collective groups come in the same order on every rank). A sibling looks for an
  // entry of a group only when it enters that group, so once all of them entered a later
  // collective group, the entries before it are never claimed: they go. Siblings with a stream each
  // leave such entries at every operation; this, not the bound, keeps them few, however far one
  // rank's thread runs ahead of another's (the bound alone could push out an entry a late sibling
  // still needs, which would then wait for the other's kernel behind its own).
  void entered(uint64_t commHash, int place, int rank, int ranksHere, GroupPos group) {
    std::lock_guard<std::mutex> lock(mu_);
    Progress& p = progress_[{commHash, place}];
    p.at[rank] = group.coll;
    if (int(p.at.size()) < ranksHere) return;
    uint64_t low = group.coll;
    for (const auto& [r, c] : p.at) low = c < low ? c : low;
    while (!p.byGroup.empty() && p.byGroup.begin()->first.coll < low) {
      map_.erase({commHash, place, p.byGroup.begin()->second, p.byGroup.begin()->first});
      p.byGroup.erase(p.byGroup.begin());
    }
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

 private:
  struct Slot {
    Ref entry;
    int left;  // siblings yet to claim it
  };
  struct Hash {
    size_t operator()(const StreamEntryKey& k) const {
      uint64_t h = k.commHash * 0x9e3779b97f4a7c15ull;
      h ^= reinterpret_cast<uintptr_t>(k.stream) + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
      h ^= k.group.coll + 0x94d049bb133111ebull + (h << 6) + (h >> 2);
      h ^= k.group.sub + uint64_t(k.place) * 0xbf58476d1ce4e5b9ull + (h << 6) + (h >> 2);
      h ^= k.group.set + (h << 6) + (h >> 2);
      return size_t(h);
    }
  };
  // Gives the event back once the last holder (the table, the first, a follower) lets go.
  struct Release {
    StreamEntries* table;
    void operator()(Entry* e) const {
      table->release_(e->event);
      delete e;
    }
  };
  struct Progress {
    std::unordered_map<int, uint64_t> at;          // each sibling's latest collective group
    std::multimap<GroupPos, const void*> byGroup;  // entries left (or gone since)
  };
  template <class Ready>
  Wait waitFor(const Ref& e, double timeoutS, const std::function<bool()>& stop, Ready ready) {
    using Clock = std::chrono::steady_clock;
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeoutS > 0 ? timeoutS : 1e9));
    std::unique_lock<std::mutex> lock(mu_);
    while (!ready() && !e->failed) {
      if (stop && stop()) return Wait::kStopped;
      if (Clock::now() >= deadline) return Wait::kTimedOut;
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    return e->failed ? Wait::kFailed : Wait::kReady;
  }
  // Pushed out by the bound: the entry, if still there, and its place by group.
  void drop(const StreamEntryKey& key) {
    map_.erase(key);
    auto p = progress_.find({key.commHash, key.place});
    if (p == progress_.end()) return;
    auto [from, to] = p->second.byGroup.equal_range(key.group);
    for (auto g = from; g != to; ++g) {
      if (g->second == key.stream) {
        p->second.byGroup.erase(g);
        break;
      }
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t bound_;
  std::function<void(Event)> release_;
  std::unordered_map<StreamEntryKey, Slot, Hash> map_;
  std::deque<StreamEntryKey> order_;  // oldest first; keys of gone entries too (once each)
  std::map<std::pair<uint64_t, int>, Progress> progress_;  // per communicator and GPU
};

}  // namespace tutti
