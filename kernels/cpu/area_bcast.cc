// The broadcast through a shared area (transports/shm/area.h): the root copies each chunk
// into a slot once, every other rank copies it out.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/host_prims.h"
#include "kernels/cpu/ring_dispatch.h"
#include "transports/shm/area.h"

namespace tutti::cpu {

void runAreaBroadcast(const CollArgs& op, size_t bytes, int rank, int n, transport::ShmArea& area,
                      uint64_t first, uint64_t opNumber, const FlatLinks& links, Waiter* w) {
  const size_t chunk = area.chunkBytes();
  const uint64_t chunks = (bytes + chunk - 1) / chunk, slots = uint64_t(area.slots());
  const int root = op.root;
  uint8_t* out = static_cast<uint8_t*>(op.recv);
  std::atomic<uint64_t>& written = area.written();
  std::atomic<uint64_t>& mine = area.done(rank);
  if (rank == root) {
    const uint8_t* in = static_cast<const uint8_t*>(op.send);
    uint64_t expect = first;
    if (chunks > 0 && !area.claimed().compare_exchange_strong(expect, first + chunks,
                                                              std::memory_order_acq_rel)) {
      return failMismatch(w, "rank " + std::to_string(rank) +
                                 ": another rank broadcasts as root into the shared area at "
                                 "the same time (it claimed the area's chunks up to " +
                                 std::to_string(expect) + "; this rank's start at " +
                                 std::to_string(first) + ")");
    }
    for (uint64_t k = 0; k < chunks && !w->failed(); ++k) {
      const uint64_t c = first + k;
      const size_t off = size_t(k) * chunk, len = std::min(chunk, bytes - off);
      // The slot is free once every other rank is done with the chunk it held before.
      for (int j = 0; j < n && c >= slots; ++j) {
        std::atomic<uint64_t>& theirs = area.done(j);
        const uint64_t need = c + 1 - slots;
        if (j == rank || theirs.load(std::memory_order_acquire) >= need) continue;
        if (!w->until([&] { return theirs.load(std::memory_order_acquire) >= need; },
                      *links.send[size_t(j)], Waiter::Dir::kSend)) {
          return;
        }
      }
      memcpy(area.slot(c), in + off, len);
      transport::ShmArea::SlotLine& line = area.slotLine(c);
      line.totalBytes.store(bytes, std::memory_order_relaxed);
      line.root.store(root, std::memory_order_relaxed);
      line.op.store(opNumber, std::memory_order_relaxed);
      written.store(c + 1, std::memory_order_release);
      mine.store(c + 1, std::memory_order_release);
    }
    // While the others copy out.
    if (in != out && !w->failed()) simd::copyBig(out, in, bytes);
    return;
  }
  for (uint64_t k = 0; k < chunks && !w->failed(); ++k) {
    const uint64_t c = first + k;
    const size_t off = size_t(k) * chunk, len = std::min(chunk, bytes - off);
    if (written.load(std::memory_order_acquire) <= c &&
        !w->until([&] { return written.load(std::memory_order_acquire) > c; },
                  *links.recv[size_t(root)], Waiter::Dir::kRecv)) {
      return;
    }
    transport::ShmArea::SlotLine& line = area.slotLine(c);
    const uint64_t theirBytes = line.totalBytes.load(std::memory_order_relaxed);
    const int64_t theirRoot = line.root.load(std::memory_order_relaxed);
    const uint64_t theirOp = line.op.load(std::memory_order_relaxed);
    if (theirOp != opNumber) {
      // Ranks that called different sizes can take different paths (the area is chosen by
      // size): this rank waited in the area while the others went another way, and a later
      // call's chunk turned up.
      return failMismatch(w, "rank " + std::to_string(rank) + ": the shared area holds rank " +
                                 std::to_string(theirRoot) + "'s broadcast or all-gather number " +
                                 std::to_string(theirOp) + " where this rank is at number " +
                                 std::to_string(opNumber) + " (" + std::to_string(bytes) +
                                 " bytes from rank " + std::to_string(root) + ")");
    }
    if (theirBytes != bytes || theirRoot != root) {
      return failMismatch(w, "rank " + std::to_string(rank) + ": rank " +
                                 std::to_string(theirRoot) + " sends " +
                                 std::to_string(theirBytes) + " bytes where this rank expects " +
                                 std::to_string(bytes) + " from rank " + std::to_string(root));
    }
    memcpy(out + off, area.slot(c), len);
    mine.store(c + 1, std::memory_order_release);
  }
}

}  // namespace tutti::cpu
