// The p2p transport's memory that outlives a link's ends (transports/p2p/p2p.cc alone uses
// this): the broken words of same-process links, pooled, and the FIFOs an abort kept.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/cuda_scope.h"
#include "runtime/env.h"

namespace tutti::transport::p2p {

// Broken words of same-process links: one per FIFO, shared by its two ends (both connections
// of this process). A word goes back to a pool when the last of them goes, never to CUDA: a
// free waits for the GPU, and the last holder may be the peer's thread while a kernel on that
// GPU waits for that very thread. The pool grows by pinned pages of 64 words; a word's device
// address (the same for every GPU: the page is portable) is looked up once, with its page.
class BrokenWords {
 public:
  struct Word {
    uint32_t* host = nullptr;
    uint32_t* dev = nullptr;
  };
  // A word, zero, with one holder (the receiver); host nullptr (and *err) if none could be
  // had. A new page is made outside the lock (CUDA calls may wait; a drop must not).
  static Word make(cudaError_t* err) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu());
        if (!pool().empty()) {
          const Word w = pool().back();
          pool().pop_back();
          __atomic_store_n(w.host, 0u, __ATOMIC_RELEASE);
          held()[w.host] = Held{1, w.dev, nullptr};
          return w;
        }
      }
      void* p = nullptr;
      void* d = nullptr;
      *err = cudaHostAlloc(&p, kPage, cudaHostAllocMapped | cudaHostAllocPortable);
      if (*err != cudaSuccess) return {};
      *err = cudaHostGetDevicePointer(&d, p, 0);
      if (*err != cudaSuccess) {
        cudaFreeHost(p);
        return {};
      }
      std::lock_guard<std::mutex> lock(mu());
      for (size_t off = kPage; off >= kStride; off -= kStride) {  // lowest address first out
        pool().push_back(Word{reinterpret_cast<uint32_t*>(static_cast<char*>(p) + off - kStride),
                              reinterpret_cast<uint32_t*>(static_cast<char*>(d) + off - kStride)});
      }
    }
  }
  // The sender holds it too; host nullptr if the receiver let it go already.
  static Word hold(uint32_t* host) {
    std::lock_guard<std::mutex> lock(mu());
    auto it = held().find(host);
    if (it == held().end()) return {};
    ++it->second.refs;
    return Word{host, it->second.dev};
  }
  // Lets a holder go. The receiver passes the FIFO it allocated: whichever end lets go last
  // gets it back to free (nullptr otherwise), so that a FIFO of two ranks of one process stays
  // while either end's communicator lives -- the other's kernel may still write into it (an
  // idle rank aborted while its peer's kernel sends to it).
  static char* drop(uint32_t* host, char* fifo = nullptr) {
    std::lock_guard<std::mutex> lock(mu());
    auto it = held().find(host);
    if (it == held().end()) return fifo;
    if (fifo) it->second.fifo = fifo;
    if (--it->second.refs > 0) return nullptr;
    char* last = it->second.fifo;
    pool().push_back(Word{host, it->second.dev});
    held().erase(it);
    return last;
  }

 private:
  static constexpr size_t kPage = 4096;
  static constexpr size_t kStride = 64;  // a word per cache line
  struct Held {
    int refs;
    uint32_t* dev;
    char* fifo;  // the receiver's FIFO once the receiver let go (freed by the last holder)
  };
  // Never destroyed: a communicator may be destroyed during exit, after function statics.
  static std::mutex& mu() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::map<uint32_t*, Held>& held() {
    static auto* h = new std::map<uint32_t*, Held>;
    return *h;
  }
  static std::vector<Word>& pool() {
    static auto* v = new std::vector<Word>;
    return *v;
  }
};

// FIFOs in GPU memory that an abort kept because senders in other processes may still write
// into them (keepIfOtherProcessWrites): a later communicator's p2p links free those kept long
// enough that every such sender has seen the broken word (its kernel stops at its next wait,
// microseconds on; a kernel that starts later waits at once, for slots it never gets). So
// repeated aborts (a framework's teardown, an in-process restart) do not pile them up.
class KeptFifos {
 public:
  static void keep(char* dev, size_t bytes) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return;  // (not freed, then)
    std::lock_guard<std::mutex> lock(mu());
    list().push_back({dev, device, bytes, std::chrono::steady_clock::now()});
  }
  // Frees those kept TUTTI_ABORT_KEEP_S (10 s unless set) or more: the bytes.
  static size_t freeOld() {
    static const double keepS = env::getDouble("TUTTI_ABORT_KEEP_S", 10);
    const auto now = std::chrono::steady_clock::now();
    std::vector<Kept> old;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto& l = list();
      for (size_t i = 0; i < l.size();) {
        if (std::chrono::duration<double>(now - l[i].since).count() >= keepS) {
          old.push_back(l[i]);
          l[i] = l.back();
          l.pop_back();
        } else {
          ++i;
        }
      }
    }
    size_t bytes = 0;
    CaptureModeRelaxed relaxed;  // another thread may be capturing in the global mode
    for (const Kept& k : old) {
      // (The guard clears a failure of ours, not an error the application has yet to read.)
      DeviceGuard guard(k.device);
      if (cudaFree(k.dev) == cudaSuccess) bytes += k.bytes;
    }
    return bytes;
  }

 private:
  struct Kept {
    char* dev;
    int device;
    size_t bytes;
    std::chrono::steady_clock::time_point since;
  };
  static std::mutex& mu() {
    static std::mutex* m = new std::mutex;  // never destroyed: links may go during exit
    return *m;
  }
  static std::vector<Kept>& list() {
    static std::vector<Kept>* l = new std::vector<Kept>;
    return *l;
  }
};

}  // namespace tutti::transport::p2p
