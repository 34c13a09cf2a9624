// A broadcast area: one shared-memory segment that every rank of a communicator on one host
// maps, for one-to-many copies. The FIFOs between pairs of ranks carry a broadcast's bytes
// hop by hop (the ring chain: each rank copies every chunk out of one slot and into the next,
// 2(n-1) copies in all) or once per receiver from the root's buffer (single copy, which runs
// at a fraction of memcpy's speed here). In the area the root copies each chunk once into a
// slot and every other rank copies it out: n copies, all plain memcpy.
//
// Layout (every counter on a cache line of its own):
//   line 0: magic, nranks, slots, chunk bytes
//   line 1: written -- chunks ever published into the area (by whichever rank was root)
//   line 2: claimed -- chunks ever claimed by a root: each root claims its range at once, so
//           two ranks that both think they are the root cannot both write (the second fails)
//   then one line per slot: the operation's total bytes, root and number (its place among the
//   communicator's broadcasts and all-gathers), for the readers to check
//   then one line per rank: done -- chunks that rank has finished with
//   then `slots` slots of `chunk` bytes, page aligned.
// Chunk c goes into slot c % slots. Every rank counts chunks alike (all call the same
// broadcasts and all-gathers; an all-gather is every rank's block broadcast in turn), so the root
// of chunk c waits until every other rank's done >= c + 1 - slots, copies, sets the slot's line,
// then written = c + 1 and its own done = c + 1; a reader waits for written >= c + 1, copies out,
// then sets done = c + 1. Roots change from one broadcast to the next: a new root was a reader of
// the previous chunk, so written cannot move under it. The slot's operation number protects a rank
// that waits in the area while the others took another path (ranks that called sizes on both sides
// of the area's threshold); as with every size threshold, the ranks on the other path are not
// protected by it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "runtime/status.h"

namespace tutti::transport {

class ShmArea {
 public:
  struct SlotLine {
    std::atomic<uint64_t> totalBytes;
    std::atomic<int64_t> root;
    std::atomic<uint64_t> op;  // which broadcast or all-gather of the communicator wrote it
  };
  // Rank 0: makes the segment (name: "/tutti-<pid>-..." like the links' segments).
  static Result<std::unique_ptr<ShmArea>> create(const std::string& name, int nranks, int slots,
                                                 size_t chunkBytes);
  // The others: maps it and checks that it is laid out as they expect.
  static Result<std::unique_ptr<ShmArea>> open(const std::string& name, int nranks, int slots,
                                               size_t chunkBytes);
  ~ShmArea();
  // Once every rank has mapped it (rank 0, after their word): nothing is left in /dev/shm.
  void unlink();

  int slots() const { return slots_; }
  size_t chunkBytes() const { return chunk_; }
  std::atomic<uint64_t>& written() { return *at<std::atomic<uint64_t>>(kLine); }
  std::atomic<uint64_t>& claimed() { return *at<std::atomic<uint64_t>>(2 * kLine); }
  SlotLine& slotLine(uint64_t chunk) {
    return *at<SlotLine>(slotLineOff(chunk % uint64_t(slots_)));
  }
  std::atomic<uint64_t>& done(int rank) {
    return *at<std::atomic<uint64_t>>(doneOff(size_t(rank)));
  }
  uint8_t* slot(uint64_t chunk) {
    return static_cast<uint8_t*>(base_) + dataOff() + size_t(chunk % uint64_t(slots_)) * chunk_;
  }
  // The whole segment's size for these parameters.
  static size_t bytesFor(int nranks, int slots, size_t chunkBytes);

 private:
  static constexpr size_t kLine = 64;
  ShmArea(std::string name, void* base, size_t bytes, int nranks, int slots, size_t chunk)
      : name_(std::move(name)),
        base_(base),
        bytes_(bytes),
        nranks_(nranks),
        slots_(slots),
        chunk_(chunk) {}
  template <class T>
  T* at(size_t off) {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(base_) + off);
  }
  size_t slotLineOff(uint64_t s) const { return 3 * kLine + size_t(s) * kLine; }
  size_t doneOff(size_t r) const { return slotLineOff(uint64_t(slots_)) + r * kLine; }
  size_t dataOff() const { return dataOffFor(nranks_, slots_); }
  static size_t dataOffFor(int nranks, int slots);

  std::string name_;
  void* base_;
  size_t bytes_;
  int nranks_, slots_;
  size_t chunk_;
  bool linked_ = true;
};

}  // namespace tutti::transport
