// Entries that ranks of one process sharing a GPU leave for each other (runtime/
// device_engine.cc, enterStream): the first sibling to enter a group on a stream records an
// event there; a sibling that passes the same stream for the same group waits for that event
// instead of the stream. Every call of every sibling adds or claims one, so the lookup is a
// hash, not a scan: siblings that each have a stream of their own never claim their entries,
// which then stay until the bound pushes them out (with 4 such ranks a scan of the 1024 kept
// entries, under a mutex all of them take, came with every operation).
// Plain C++ over any event handle type, so that CI tests it without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
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
  // release: takes back the event of an entry that is used up or pushed out.
  StreamEntries(size_t bound, std::function<void(Event)> release)
      : bound_(bound), release_(std::move(release)) {}

  // Whether a sibling left an entry for key; if so use(event) runs, and only then does an
  // entry used by all the siblings it was left for go (release may destroy its event).
  template <class Use>
  bool claim(const StreamEntryKey& key, Use&& use) {
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    use(it->second.event);
    if (--it->second.left == 0) {
      release_(it->second.event);
      map_.erase(it);
    }
    return true;
  }

  // A new entry for `siblings` others. The oldest entries beyond the bound go.
  void add(const StreamEntryKey& key, Event e, int siblings) {
    map_[key] = Entry{e, siblings};
    order_.push_back(key);
    while (order_.size() > bound_) {
      auto it = map_.find(order_.front());
      if (it != map_.end()) {  // else claimed by all and gone already
        release_(it->second.event);
        map_.erase(it);
      }
      order_.pop_front();
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
  size_t bound_;
  std::function<void(Event)> release_;
  std::unordered_map<StreamEntryKey, Entry, Hash> map_;
  std::deque<StreamEntryKey> order_;  // oldest first; keys of gone entries too (once each)
};

}  // namespace tutti
