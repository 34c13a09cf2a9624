// Entries that ranks of one process sharing a GPU leave for each other (runtime/
// device_engine.cc, enterStream): the first sibling to enter a group on a stream records an
// event there; a sibling that passes the same stream for the same group waits for that event
// instead of the stream. Every call of every sibling adds or claims one, so the lookup is a
// hash, not a scan (siblings that each have a stream of their own never claim their entries:
// with 4 such ranks a scan of the 1024 entries kept then, under a mutex all of them take, came
// with every operation). Unclaimed entries go once every sibling has passed their group.
// Plain C++ over any event handle type, so that CI tests it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>

namespace tutti {

struct StreamEntryKey {
  uint64_t commHash;
  const void* stream;
  uint64_t group;  // the communicator's device group number, alike on all its ranks
  bool operator==(const StreamEntryKey& o) const {
    return commHash == o.commHash && stream == o.stream && group == o.group;
  }
};

template <typename Event>
class StreamEntries {
 public:
  // release: takes back the event of an entry that is used up or pushed out. bound: the most
  // entries kept where siblings' progress cannot tell (a sibling that never entered a group).
  StreamEntries(size_t bound, std::function<void(Event)> release)
      : bound_(bound), release_(std::move(release)) {}

  // Whether a sibling left an entry for key; if so use(event) runs, and only then does an
  // entry used by all the siblings it was left for go (release may destroy its event).
  template <class Use>
  bool claim(const StreamEntryKey& key, Use&& use) {
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    use(it->second.event);
    if (--it->second.left == 0) erase(it);
    return true;
  }

  // A new entry for `siblings` others.
  void add(const StreamEntryKey& key, Event e, int siblings) {
    map_[key] = Entry{e, siblings};
    progress_[key.commHash].byGroup.emplace(key.group, key.stream);
    order_.push_back(key);
    while (order_.size() > bound_) {
      drop(order_.front());
      order_.pop_front();
    }
  }

  // Rank `rank` of a communicator, one of the `ranksHere` ranks that share entries, enters
  // group `group` (groups come in the same order on every rank). A sibling looks for an
  // entry of group g only when it enters g, so once all of them entered a later group, the
  // entries of g are never claimed: they go. Siblings with a stream each leave such entries
  // at every operation; this, not the bound, keeps them few, however far one rank's thread
  // runs ahead of another's (the bound alone could push out an entry a late sibling still
  // needs, which would then wait for the other's kernel behind its own).
  void entered(uint64_t commHash, int rank, int ranksHere, uint64_t group) {
    Progress& p = progress_[commHash];
    p.at[rank] = group;
    if (int(p.at.size()) < ranksHere) return;
    uint64_t low = group;
    for (const auto& [r, g] : p.at) low = g < low ? g : low;
    while (!p.byGroup.empty() && p.byGroup.begin()->first < low) {
      erase(map_.find({commHash, p.byGroup.begin()->second, p.byGroup.begin()->first}));
      p.byGroup.erase(p.byGroup.begin());
    }
  }

  size_t size() const { return map_.size(); }

 private:
  struct Entry {
    Event event;
    int left;  // siblings yet to claim it
  };
  struct Hash {
    size_t operator()(const StreamEntryKey& k) const {
      uint64_t h = k.commHash * 0x9e3779b97f4a7c15ull;
      h ^= reinterpret_cast<uintptr_t>(k.stream) + 0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
      h ^= k.group + 0x94d049bb133111ebull + (h << 6) + (h >> 2);
      return size_t(h);
    }
  };
  // An entry (if there is one: it may be claimed by all and gone) and its event go.
  template <class It>
  void erase(It it) {
    if (it == map_.end()) return;
    release_(it->second.event);
    map_.erase(it);
  }
  struct Progress {
    std::unordered_map<int, uint64_t> at;          // each sibling's latest group
    std::multimap<uint64_t, const void*> byGroup;  // entries left (or gone since), by group
  };
  // Pushed out by the bound: the entry, if still there, and its place by group.
  void drop(const StreamEntryKey& key) {
    erase(map_.find(key));
    auto p = progress_.find(key.commHash);
    if (p == progress_.end()) return;
    auto [from, to] = p->second.byGroup.equal_range(key.group);
    for (auto g = from; g != to; ++g) {
      if (g->second == key.stream) {
        p->second.byGroup.erase(g);
        break;
      }
    }
  }
  size_t bound_;
  std::function<void(Event)> release_;
  std::unordered_map<StreamEntryKey, Entry, Hash> map_;
  std::deque<StreamEntryKey> order_;  // oldest first; keys of gone entries too (once each)
  std::unordered_map<uint64_t, Progress> progress_;  // per communicator
};

}  // namespace tutti
